"""Saved vectors (`vectors:DIR`: NAME.npy rows = NAME.txt lines), read by row range on local disk or
gs:// (Beam FileSystems), so that an index worker reads only the rows of its shard.

The same files `pipelines.embed.saved_vectors` serves to labse-mine: embedding happens once per
sentence, and the index, every language pair and the cascade read these rows.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import numpy as np

from pipelines.embed.saved_vectors import KEYS_SUFFIX, SavedVectorsError, normalised_key, read_matrix_header


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def open_file(path: str):
    """A file (local or gs://) opened for binary reading through Beam's FileSystems, uncompressed
    whatever its name: seekable, so a worker reads only the byte range it needs."""
    from apache_beam.io.filesystem import CompressionTypes

    return _filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)


@dataclass(frozen=True)
class MatrixFile:
    """One NAME.npy (and NAME.txt beside it): where its rows start and what they are."""

    matrix: str
    texts: str
    rows: int
    dim: int
    dtype: str
    data_offset: int
    # (NAME.npy bytes, its modification time, NAME.txt bytes, its modification time) as the
    # filesystem reported them when listed: with the path, what names this file (`source_identity`)
    stamps: tuple = ()

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as float32, one ranged read."""
        dtype = np.dtype(self.dtype)
        row_bytes = dtype.itemsize * self.dim
        with open_file(self.matrix) as handle:
            handle.seek(self.data_offset + start * row_bytes)
            raw = handle.read((stop - start) * row_bytes)
        if len(raw) != (stop - start) * row_bytes:
            raise SavedVectorsError(f"{self.matrix} ends before row {stop:,}: the file is truncated")
        return np.frombuffer(raw, dtype=dtype).reshape(stop - start, self.dim).astype(np.float32)

    def iter_chunks(self, start: int, stop: int, chunk: int):
        """(float32 rows, their texts) of rows [start, stop), `chunk` rows at a time: a worker
        holds one chunk, not its whole range; the text file is read through once."""
        import io

        with open_file(self.texts) as handle:
            lines = io.TextIOWrapper(handle, encoding="utf-8", newline="\n")
            for _ in itertools.islice(lines, start):
                pass
            for lo in range(start, stop, chunk):
                hi = min(stop, lo + chunk)
                texts = [normalised_key(line.rstrip("\n")) for line in itertools.islice(lines, hi - lo)]
                if len(texts) != hi - lo:
                    raise SavedVectorsError(f"{self.texts} has fewer lines than {self.matrix} has rows")
                yield self.read_rows(lo, hi), texts


def matrix_header(path: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of the .npy matrix at `path` (local or gs://), from its first
    64 KB; SavedVectorsError unless it is a 2-D float matrix in C order (`read_matrix_header`)."""
    import io

    with open_file(path) as handle:
        head = handle.read(1 << 16)
    return read_matrix_header(io.BytesIO(head), path)


def list_matrix_files(directory: str) -> list[MatrixFile]:
    """Every NAME.npy + NAME.txt of `directory`, checked (2-D float, not Fortran order, one width),
    in name order. Raises SavedVectorsError (a one-line usage error) when they cannot serve."""
    directory = directory.rstrip("/")
    found = []
    text_files = listed_files(f"{directory}/*.txt")
    for metadata in sorted(listed_files(f"{directory}/*.npy").values(), key=lambda m: m.path):
        matrix = metadata.path
        if matrix.endswith(KEYS_SUFFIX):  # the sentence lookup table beside NAME.txt, not a matrix
            continue
        texts = matrix[:-len(".npy")] + ".txt"
        text_metadata = text_files.get(normal_path(texts))
        if text_metadata is None:
            raise SavedVectorsError(f"{matrix} has no {texts.rsplit('/', 1)[-1]} beside it (one sentence a line, "
                                    "row i = line i)")
        shape, dtype, offset = matrix_header(matrix)
        found.append(MatrixFile(matrix, texts, shape[0], shape[1], dtype.str, offset,
                                _stamps(metadata) + _stamps(text_metadata)))
    if not found:
        raise SavedVectorsError(f"{directory} holds no NAME.npy + NAME.txt pairs of saved vectors")
    dims = sorted({f.dim for f in found})
    if len(dims) > 1:
        raise SavedVectorsError(f"the .npy files in {directory} have different widths {dims}")
    return found


def listed_files(pattern: str) -> dict:
    """{`normal_path`: Beam's FileMetadata} of the files matching `pattern` ({} where none does), one
    listing."""
    try:
        return {normal_path(m.path): m for m in _filesystems().match([pattern])[0].metadata_list}
    except Exception:
        return {}


def _stamps(metadata) -> tuple:
    return int(metadata.size_in_bytes), float(metadata.last_updated_in_seconds)


def normal_path(path: str) -> str:
    """A local path with its links followed (two names of one file are one), a remote one as it is."""
    return path if "://" in path else os.path.realpath(path)


def file_identity(matrix: str, stamps: tuple) -> dict:
    """What names a saved vector file for a later reader: its path and `MatrixFile.stamps` (a rewrite
    changes its modification times; a copy elsewhere has another path)."""
    npy_bytes, npy_updated, txt_bytes, txt_updated = stamps
    return {"path": normal_path(matrix), "npy_bytes": npy_bytes, "npy_updated": npy_updated, "txt_bytes": txt_bytes,
            "txt_updated": txt_updated}


def source_identity(file: MatrixFile) -> dict:
    """What an index records of a file it was built from: its `file_identity` and its rows (the
    bound of the rows its `.ids.npy` may name)."""
    return {**file_identity(file.matrix, file.stamps), "rows": file.rows}


def identity_of_pair(matrix: str, texts: str, listed: dict) -> dict | None:
    """`file_identity` of a store's (NAME.npy, NAME.txt) pair, from `listed` (their folder's
    `listed_files`); None where either file is not there."""
    found, text_found = listed.get(normal_path(matrix)), listed.get(normal_path(texts))
    if found is None or text_found is None:
        return None
    return file_identity(matrix, _stamps(found) + _stamps(text_found))
