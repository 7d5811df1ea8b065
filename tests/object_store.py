"""A `labsetest://` Beam filesystem stored in a local folder: code paths for object stores
(gs://, s3://) run in tests without network. Importing this module registers the scheme."""
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem


class ObjectStoreOnDisk(LocalFileSystem):
    PREFIX = "labsetest://"

    @classmethod
    def scheme(cls):
        return "labsetest"

    def _local(self, path: str) -> str:
        return path[len(self.PREFIX):] if path.startswith(self.PREFIX) else path

    def create(self, path, *args, **kwargs):
        return super().create(self._local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)

    def exists(self, path):
        return super().exists(self._local(path))

    def delete(self, paths):
        return super().delete([self._local(p) for p in paths])

    def rename(self, sources, destinations):
        return super().rename([self._local(p) for p in sources], [self._local(p) for p in destinations])

    def _list(self, dir_or_prefix):
        # Listed like an object store: every object below the prefix, named with the scheme.
        for metadata in super()._list(self._local(dir_or_prefix)):
            yield FileMetadata(self.PREFIX + metadata.path, metadata.size_in_bytes, metadata.last_updated_in_seconds)


# The same store for fsspec (pipelines.io.storage: markers, stats, locks, listings), so both stacks
# see one set of files.
import fsspec  # noqa: E402
from fsspec.implementations.local import LocalFileSystem as _FsspecLocal  # noqa: E402


class FsspecObjectStoreOnDisk(_FsspecLocal):
    protocol = ("labsetest",)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith(ObjectStoreOnDisk.PREFIX):
            path = path[len(ObjectStoreOnDisk.PREFIX):]
        return super()._strip_protocol(path)

    def unstrip_protocol(self, name):
        return ObjectStoreOnDisk.PREFIX + name

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        # Object stores show an object whole; make parent "prefixes" as a bucket would.
        self.makedirs(self._parent(self._strip_protocol(path)), exist_ok=True)
        super().pipe_file(path, value, mode=mode, **kwargs)


fsspec.register_implementation("labsetest", FsspecObjectStoreOnDisk, clobber=True)
