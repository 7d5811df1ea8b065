"""`vectors:DIR`: an embedder that looks sentences up in vectors computed earlier.

For mining (or re-mining) sentences that were already embedded, e.g. by a GPU job, or with vectors
that no embedder here produces. `DIR` holds pairs of files with the same stem:

* `NAME.npy` — a float32 (or float16/float64) matrix `[n, dim]`, one row per sentence;
* `NAME.txt` — UTF-8, n lines: line i is the sentence whose vector is row i;
* `NAME.keys.npy` (optional, written by `python -m pipelines.embed.saved_vectors keys DIR`) — the
  lookup table: a uint64 `[3, n]` array, row 0 the 64-bit hashes of the sentences sorted, row 1
  each one's row, row 2 the byte offset of its line in NAME.txt.

A folder holding no pair but sub-folders that do (labse-embed's output: `DIR/LANG/LANG-*.npy`)
serves the pairs of all of them; such an output its run has not finished (no `_SUCCESS`, but its
stats, its lock or a half-written file: `refuse_unfinished_output`) is refused. Every pair must have the same `dim`. A sentence is looked up by its text with runs of whitespace
collapsed to one space (labse-mine's own normalisation, so its key is the sentence it mines); the
first occurrence of a repeated text wins. The lookup is a binary search of the hash in the keys
table, and the candidate's line is read back from NAME.txt and compared, so a hash collision never
serves the wrong vector. With `NAME.keys.npy` the table and the text are memory-mapped, and a
worker holds no per-sentence Python object whatever the language's size; without it the table is
built when the embedder loads (24 bytes a sentence in numpy arrays, a pass over NAME.txt).
Vector rows are read by offset (`os.pread`), not through a mapping, so the rows a worker has
served do not stay in its memory; they are L2-normalised when read.
`DIR` may be on object storage (`vectors:gs://BUCKET/vectors/de`, labse-embed's output there): a
worker copies a file's keys table and text to its host's cache (`storage.cached_copy`: once per
host, under `$LABSE_CACHE`, ~24 bytes a sentence plus the text) the first time it looks a sentence
up in it, and reads vector rows by ranged requests, so the vectors themselves are never copied. On
object storage every NAME.txt needs its NAME.keys.npy (labse-embed writes it).
A sentence with no saved vector is a one-line `EmbedderError` naming it: the vectors do not match
the sentences given, which only the user can fix. A row that is not finite (NaN or inf) is served as
it is: labse-mine drops such a sentence with the counted reason `non_finite_vector`.
"""
from __future__ import annotations

import hashlib
import io
import mmap
import os
import sys
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np

from pipelines.embed.base import EmbedderError, l2_normalise

PREFIX = "vectors:"


class SavedVectorsError(EmbedderError):
    """The directory or its files cannot serve as saved vectors, or a sentence has no vector."""


def is_saved_vectors_spec(spec: str) -> bool:
    return str(spec).startswith(PREFIX)


def normalised_key(text: str) -> str:
    return " ".join(str(text).split())


KEYS_SUFFIX = ".keys.npy"
REMOTE_GAP_BYTES = 1 << 20  # rows of a remote file this close are fetched in one ranged request
HEADER_BYTES = 1 << 16  # read from the start of each NAME.npy: its header is shorter


def key_hash(key: str) -> int:
    """The 64-bit hash a normalised sentence is filed under (stable across processes and runs)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def keys_path(texts: Path) -> Path:
    return texts.with_name(texts.name[:-len(".txt")] + KEYS_SUFFIX)


def build_keys(texts_path: Path) -> np.ndarray:
    """The keys table of NAME.txt (see the module docstring), read through once in binary."""
    hashes, offsets = [], []
    offset = 0
    with open(texts_path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise SavedVectorsError(f"{texts_path} is not UTF-8 text (line {number:,}, byte "
                                        f"{offset + error.start:,}: {error.reason}): save the sentences as UTF-8") from None
            hashes.append(key_hash(normalised_key(text)))
            offsets.append(offset)
            offset += len(line)
    hashes = np.array(hashes, dtype=np.uint64)
    order = np.argsort(hashes, kind="stable")  # equal hashes keep file order: the first occurrence first
    return np.stack([hashes[order], order.astype(np.uint64), np.array(offsets, dtype=np.uint64)[order]])


def write_keys(directory: str | Path) -> list[Path]:
    """NAME.keys.npy beside every NAME.txt of `directory` (atomically); returns the files written."""
    from pipelines.io.atomic import atomic_path

    written = []
    for _matrix, texts in vector_files(Path(directory)):
        target = keys_path(texts)
        with atomic_path(str(target)) as tmp, open(tmp, "wb") as handle:
            np.save(handle, build_keys(texts), allow_pickle=False)
        written.append(target)
    return written


def read_matrix_header(stream, path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of the .npy at the start of the binary `stream` (read from
    `path`); SavedVectorsError unless it is a 2-D float matrix in C order."""
    try:
        version = np.lib.format.read_magic(stream)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(stream)
    except (ValueError, OSError) as error:
        raise SavedVectorsError(f"{path} is not a readable .npy matrix ({error})") from None
    if len(shape) != 2 or dtype.kind != "f" or fortran:
        raise SavedVectorsError(f"{path} must be a 2-D float matrix in C order, got {dtype} {shape}")
    return shape, dtype, stream.tell()


def vector_files(directory: Path) -> list[tuple[Path, Path]]:
    """The (NAME.npy, NAME.txt) pairs in `directory`, or where it holds none, in its sub-folders (a
    labse-embed output, one folder per language); raises SavedVectorsError when there are none or an
    .npy has no .txt beside it."""
    if not directory.is_dir():
        raise SavedVectorsError(f"saved vectors directory not found: {directory}")
    pairs = []
    matrices = sorted(m for m in directory.glob("*.npy") if not m.name.endswith(KEYS_SUFFIX))
    if not matrices:  # a labse-embed output: one folder per language, each language's shards in it
        matrices = sorted(m for m in directory.glob("*/*.npy") if not m.name.endswith(KEYS_SUFFIX))
    for matrix in matrices:
        texts = matrix.with_suffix(".txt")
        if not texts.is_file():
            raise SavedVectorsError(f"{matrix} has no {texts.name} beside it (one sentence a line, row i = line i)")
        pairs.append((matrix, texts))
    if not pairs:
        raise SavedVectorsError(f"{directory} holds no NAME.npy + NAME.txt pairs of saved vectors")
    return pairs


def store_files(directory: str) -> list[tuple[str, str]]:
    """`vector_files` for a folder on local disk or object storage: its (NAME.npy, NAME.txt) pairs, or
    its sub-folders' where it holds none. On object storage each NAME.txt needs its NAME.keys.npy:
    a lookup reads it, never the text in full."""
    from pipelines.io import storage

    if not storage.is_remote(directory):
        return [(str(matrix), str(texts)) for matrix, texts in vector_files(Path(directory))]
    directory = directory.rstrip("/")
    listed = storage.glob_files(f"{directory}/*")
    if not any(_is_matrix(name) for name in listed):  # a labse-embed output: one folder per language
        listed = storage.glob_files(f"{directory}/*/*")
    names = set(listed)
    pairs = []
    for matrix in sorted(name for name in listed if _is_matrix(name)):
        texts = matrix[:-len(".npy")] + ".txt"
        if texts not in names:
            raise SavedVectorsError(f"{matrix} has no {texts.rsplit('/', 1)[-1]} beside it (one sentence a line, "
                                    "row i = line i)")
        if texts[:-len(".txt")] + KEYS_SUFFIX not in names:
            raise SavedVectorsError(f"{texts} has no {KEYS_SUFFIX[1:]} table beside it: saved vectors on object "
                                    "storage are looked up through it (labse-embed writes it; for a folder made by "
                                    "hand run python -m pipelines.embed.saved_vectors keys on a local copy and "
                                    "upload the .keys.npy files)")
        pairs.append((matrix, texts))
    if not pairs:
        if not storage.isdir(directory):
            raise SavedVectorsError(f"saved vectors directory not found: {directory}")
        raise SavedVectorsError(f"{directory} holds no NAME.npy + NAME.txt pairs of saved vectors")
    return pairs


def _is_matrix(name: str) -> bool:
    return name.endswith(".npy") and not name.endswith(KEYS_SUFFIX)


def refuse_unfinished_output(directory: str | Path) -> None:
    """SavedVectorsError (one line) when `directory` (local or gs://) is a labse-embed output, or a
    language folder of one, that the stage has not finished: no `_SUCCESS` but the stage kit's
    traces (`unfinished_traces`). A hand-made folder of pairs (no traces) is served as it is."""
    from pipelines.io import storage
    from pipelines.io.completion import SUCCESS_MARKER, marker_path_of, unfinished_traces

    folder = storage.strip(str(directory)) if storage.is_remote(str(directory)) else os.path.abspath(directory)
    for place in (folder, storage.parent(folder)):
        if place is None or storage.exists(marker_path_of(place)):
            return
        # above a language folder only the output's own files count: its siblings may be mid-write
        traces = unfinished_traces(place, temporary_files=place == folder)
        if traces:
            raise SavedVectorsError(f"{directory} is a stage's output without {SUCCESS_MARKER} (found {traces[0]}): the "
                                    "run that writes it was interrupted or is still running: rerun labse-embed")


class _KeyedFile:
    """One NAME.npy + NAME.txt pair: rows looked up by sentence through its keys table. `head` is
    the start of NAME.npy (its header); a remote pair's table and text are copied to the host's
    cache on the first lookup, its rows read by ranged requests."""

    def __init__(self, matrix_path: str, texts_path: str, head: bytes):
        from pipelines.io import storage

        (self.rows, self.dim), self.dtype, self.data_offset = read_matrix_header(io.BytesIO(head), matrix_path)
        self.matrix_path, self.texts_path = matrix_path, texts_path
        self.keys_path = texts_path[:-len(".txt")] + KEYS_SUFFIX
        self.remote = storage.is_remote(matrix_path)
        self._line_starts: np.ndarray | None = None  # by row, built on the first `lines` call
        if self.remote:
            self.keys = self.hashes = self.text = None  # loaded by `load_tables` on the first lookup
            return
        self._open_tables(Path(self.keys_path), Path(texts_path))
        self._fd = os.open(matrix_path, os.O_RDONLY)
        # closed once: by `close`, when the file is collected, or at exit before modules are torn down
        self._closer = weakref.finalize(self, os.close, self._fd)

    def check_keys_head(self, head: bytes) -> None:
        """SavedVectorsError unless `head` (the start of NAME.keys.npy) is the keys of this pair's rows:
        a remote table is checked where the run starts, not when a worker first needs it."""
        try:
            stream = io.BytesIO(head)
            version = np.lib.format.read_magic(stream)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = read(stream)
        except (ValueError, OSError) as error:
            raise SavedVectorsError(f"{self.keys_path} is not a readable .npy table ({error})") from None
        self._check_keys(shape, dtype)

    def _check_keys(self, shape: tuple, dtype: np.dtype) -> None:
        if shape != (3, self.rows) or dtype != np.uint64:
            raise SavedVectorsError(f"{self.keys_path} is {dtype} {shape}, not the keys of {self.rows:,} rows: "
                                    "rebuild it (python -m pipelines.embed.saved_vectors keys "
                                    f"{self.matrix_path.rsplit('/', 1)[0]})")

    def _open_tables(self, saved_keys: Path, texts_path: Path) -> None:
        """The keys table (memory-mapped, or built from the text when there is none) and the text."""
        if saved_keys.is_file():
            self.keys = np.load(saved_keys, mmap_mode="r", allow_pickle=False)
            self._check_keys(self.keys.shape, self.keys.dtype)
        else:
            self.keys = build_keys(texts_path)
            if self.keys.shape[1] != self.rows:
                raise SavedVectorsError(f"{self.texts_path} has {self.keys.shape[1]:,} lines but "
                                        f"{self.matrix_path.rsplit('/', 1)[-1]} has {self.rows:,} rows: they must "
                                        "match one to one")
        self.hashes = self.keys[0]  # a contiguous row: searchsorted reads it in place
        with open(texts_path, "rb") as handle:
            self.text = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if self.rows else b""

    def load_tables(self) -> None:
        """A remote pair's keys table and text, from the host's cache (copied there the first time);
        a local pair's are open from the start."""
        if self.keys is None:
            from pipelines.io import storage

            self._open_tables(storage.cached_copy(self.keys_path), storage.cached_copy(self.texts_path))

    def find(self, keys: Sequence[str], hashes: np.ndarray) -> np.ndarray:
        """The row of each key (-1 where absent): binary search, then the line read back and compared
        (a colliding hash moves on to the next entry with the same hash)."""
        found = np.full(len(keys), -1, np.int64)
        if not self.rows:
            return found
        self.load_tables()
        starts = np.searchsorted(self.hashes, hashes, side="left")
        at = np.minimum(starts, self.rows - 1)
        candidates = np.flatnonzero((starts < self.rows) & (np.asarray(self.hashes[at]) == hashes))
        rows, offsets = np.asarray(self.keys[1, at[candidates]]), np.asarray(self.keys[2, at[candidates]])
        for i, row, offset in zip(candidates.tolist(), rows.tolist(), offsets.tolist()):
            if self._line(offset) == keys[i]:
                found[i] = row
                continue
            entry = int(at[i]) + 1
            while entry < self.rows and self.hashes[entry] == hashes[i]:  # a collision: the next same hash
                if self._line(int(self.keys[2, entry])) == keys[i]:
                    found[i] = int(self.keys[1, entry])
                    break
                entry += 1
        self.release()  # the pages this lookup touched: a worker does not keep them into its later steps
        return found

    def lines(self, rows: np.ndarray) -> list[str]:
        """The sentences of `rows` (normalised, as they are looked up)."""
        if self._line_starts is None:
            self.load_tables()
            starts = np.empty(self.rows, np.uint64)
            starts[np.asarray(self.keys[1], dtype=np.int64)] = np.asarray(self.keys[2])
            self._line_starts = starts
        lines = [self._line(int(offset)) for offset in self._line_starts[np.asarray(rows, dtype=np.int64)]]
        self.release()
        return lines

    def _line(self, offset: int) -> str:
        end = self.text.find(b"\n", offset)
        return normalised_key(self.text[offset:end if end >= 0 else len(self.text)].decode("utf-8"))

    def read(self, rows: np.ndarray) -> np.ndarray:
        """float32 rows by offset: consecutive rows in one read, and on object storage also rows
        apart by up to `REMOTE_GAP_BYTES` (a request costs more than the bytes it skips)."""
        row_bytes = self.dtype.itemsize * self.dim
        out = np.empty((len(rows), self.dim), np.float32)
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        gap_rows = REMOTE_GAP_BYTES // row_bytes if self.remote else 0
        breaks = np.flatnonzero(np.diff(sorted_rows) > 1 + gap_rows) + 1
        for run in np.split(np.arange(len(rows)), breaks):
            if not len(run):
                continue
            first, count = int(sorted_rows[run[0]]), int(sorted_rows[run[-1]] - sorted_rows[run[0]]) + 1
            raw = self._read_at(self.data_offset + first * row_bytes, count * row_bytes)
            if len(raw) != count * row_bytes:
                raise SavedVectorsError(f"{self.matrix_path} ends before row {first + count:,}: the file is truncated")
            out[order[run]] = np.frombuffer(raw, dtype=self.dtype).reshape(count, self.dim)[sorted_rows[run] - first]
        return out

    def _read_at(self, offset: int, length: int) -> bytes:
        if self.remote:
            from pipelines.io import storage

            return storage.read_range(self.matrix_path, offset, length)
        return os.pread(self._fd, length, offset)

    def release(self) -> None:
        """Drop the mapped pages a lookup touched from this process (the page cache keeps them), so a
        worker's resident memory does not grow with the sentences it has looked up: after every
        `find` and `lines` (at 200,000 sentences a side the pages left between two releases were
        ~7 MB a side at a mining worker's peak)."""
        for mapping in (getattr(self.keys, "_mmap", None), self.text):
            if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
                mapping.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        if not self.remote:
            self._closer()


class SavedVectorsEmbedder:
    """Vectors looked up by sentence text in `vectors:DIR` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        from pipelines.io import storage

        directory = str(directory) if storage.is_remote(directory) else str(Path(directory))
        self.name = f"{PREFIX}{directory}"
        refuse_unfinished_output(directory)
        pairs = store_files(directory)
        heads = storage.read_heads([matrix for matrix, _ in pairs], HEADER_BYTES)
        self._files = [_KeyedFile(matrix, texts, head) for (matrix, texts), head in zip(pairs, heads)]
        remote = [keyed for keyed in self._files if keyed.remote]
        for keyed, head in zip(remote, storage.read_heads([keyed.keys_path for keyed in remote], HEADER_BYTES)):
            keyed.check_keys_head(head)
        dims = sorted({f.dim for f in self._files})
        if len(dims) > 1:
            raise SavedVectorsError(f"the .npy files in {directory} have different widths {dims}")
        self.dim = dims[0]

    def __len__(self) -> int:
        """Distinct sentences (by their 64-bit keys)."""
        for keyed in self._files:
            keyed.load_tables()
        return len(np.unique(np.concatenate([np.asarray(f.hashes) for f in self._files])))

    def close(self) -> None:
        """Close the vector files now (otherwise they close when the embedder is collected or at exit)."""
        for keyed in self._files:
            keyed.close()

    def find(self, texts: Sequence[str]) -> np.ndarray:
        """`locate` without the error: (file number, row), or (-1, -1) for a sentence with no vector."""
        keys = [normalised_key(text) for text in texts]
        hashes = np.array([key_hash(key) for key in keys], dtype=np.uint64)
        located = np.full((len(texts), 2), -1, np.int64)
        for number, keyed in enumerate(self._files):
            open_ = np.flatnonzero(located[:, 0] < 0)
            if not len(open_):
                break
            found = keyed.find([keys[i] for i in open_], hashes[open_])
            hit = found >= 0
            located[open_[hit], 0], located[open_[hit], 1] = number, found[hit]
        return located

    def locate(self, texts: Sequence[str]) -> np.ndarray:
        """Where each sentence's vector is: an int64 `[n, 2]` array of (file number, row), the first
        file that has the sentence serving it (lookups vectorised over the whole batch); raises
        SavedVectorsError naming a sentence that has none. labse-mine's global layout carries
        these references instead of the vectors and reads the rows where it searches them."""
        located = self.find(texts)
        missing = [text for text, number in zip(texts, located[:, 0]) if number < 0]
        if missing:
            raise SavedVectorsError(f"{len(missing):,} of {len(texts):,} sentences have no saved vector in "
                                    f"{self.name[len(PREFIX):]}, e.g. {missing[0][:80]!r}: save a vector for every "
                                    "sentence mined")
        return located

    def read_located(self, located: np.ndarray) -> np.ndarray:
        """The L2-normalised float32 rows of `locate`'s (file number, row) references, in their order."""
        located = np.asarray(located, dtype=np.int64).reshape(-1, 2)
        out = np.zeros((len(located), self.dim), np.float32)
        for number in np.unique(located[:, 0]):
            on_file = np.flatnonzero(located[:, 0] == number)
            out[on_file] = self._files[number].read(located[on_file, 1])
        return l2_normalise(out)

    def sentences(self, located: np.ndarray) -> list[str]:
        """The sentences (normalised) of (file number, row) references, in their order."""
        located = np.asarray(located, dtype=np.int64).reshape(-1, 2)
        out: list[str] = [""] * len(located)
        for number in np.unique(located[:, 0]):
            on_file = np.flatnonzero(located[:, 0] == number)
            for i, line in zip(on_file.tolist(), self._files[number].lines(located[on_file, 1])):
                out[i] = line
        return out

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        return self.read_located(self.locate(texts))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipelines.embed.saved_vectors keys DIR`: write NAME.keys.npy for every pair of DIR."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.embed.saved_vectors",
                                     description="Write the keys table (NAME.keys.npy) of a vectors:DIR folder, so "
                                                 "that labse-mine memory-maps its sentence lookup.")
    parser.add_argument("command", choices=("keys",))
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    try:
        for path in write_keys(args.directory.removeprefix(PREFIX)):
            print(f"wrote {path}")
    except SavedVectorsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
