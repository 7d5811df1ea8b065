"""`vectors:DIR`: an embedder that looks sentences up in vectors computed earlier.

For mining (or re-mining) sentences that were already embedded, e.g. by a GPU job, or with vectors
that no embedder here produces. `DIR` holds pairs of files with the same stem:

* `NAME.npy` — a float32 (or float16/float64) matrix `[n, dim]`, one row per sentence;
* `NAME.txt` — UTF-8, n lines: line i is the sentence whose vector is row i.

Every pair must have the same `dim`. A sentence is looked up by its text with runs of whitespace
collapsed to one space (labse-mine's own normalisation, so its key is the sentence it mines); the
first occurrence of a repeated text wins. Vectors are memory-mapped, so a worker holds the text
index (about 100 bytes a sentence) and only the rows it reads; rows are L2-normalised when read.
A sentence with no saved vector is a one-line `EmbedderError` naming it: the vectors do not match
the sentences given, which only the user can fix. A row that is not finite (NaN or inf) is served as
it is: labse-mine drops such a sentence with the counted reason `non_finite_vector`.
"""
from __future__ import annotations

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


def vector_files(directory: Path) -> list[tuple[Path, Path]]:
    """The (NAME.npy, NAME.txt) pairs in `directory`; raises SavedVectorsError when there are none
    or an .npy has no .txt beside it."""
    if not directory.is_dir():
        raise SavedVectorsError(f"saved vectors directory not found: {directory}")
    pairs = []
    for matrix in sorted(directory.glob("*.npy")):
        texts = matrix.with_suffix(".txt")
        if not texts.is_file():
            raise SavedVectorsError(f"{matrix} has no {texts.name} beside it (one sentence a line, row i = line i)")
        pairs.append((matrix, texts))
    if not pairs:
        raise SavedVectorsError(f"{directory} holds no NAME.npy + NAME.txt pairs of saved vectors")
    return pairs


class SavedVectorsEmbedder:
    """Vectors looked up by sentence text in `vectors:DIR` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.name = f"{PREFIX}{directory}"
        self._matrices: list[np.ndarray] = []
        self._where: dict[str, tuple[int, int]] = {}
        dims = set()
        for file_number, (matrix_path, texts_path) in enumerate(vector_files(directory)):
            try:
                matrix = np.load(matrix_path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as error:
                raise SavedVectorsError(f"{matrix_path} is not a readable .npy matrix ({error})") from None
            if matrix.ndim != 2 or matrix.dtype.kind != "f":
                raise SavedVectorsError(f"{matrix_path} must be a 2-D float matrix, got {matrix.dtype} {matrix.shape}")
            try:
                with open(texts_path, encoding="utf-8") as handle:
                    texts = handle.read().split("\n")
            except UnicodeDecodeError as error:
                line = texts_path.read_bytes()[:error.start].count(b"\n") + 1
                raise SavedVectorsError(f"{texts_path} is not UTF-8 text (line {line:,}, byte {error.start:,}: "
                                        f"{error.reason}): save the sentences as UTF-8") from None
            if texts and texts[-1] == "":
                texts.pop()
            if len(texts) != matrix.shape[0]:
                raise SavedVectorsError(f"{texts_path} has {len(texts):,} lines but {matrix_path.name} has "
                                        f"{matrix.shape[0]:,} rows: they must match one to one")
            dims.add(matrix.shape[1])
            self._matrices.append(matrix)
            for row, text in enumerate(texts):
                self._where.setdefault(normalised_key(text), (file_number, row))
        if len(dims) > 1:
            raise SavedVectorsError(f"the .npy files in {directory} have different widths {sorted(dims)}")
        self.dim = dims.pop()

    def __len__(self) -> int:
        return len(self._where)

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        found = [self._where.get(normalised_key(text)) for text in texts]
        missing = [text for text, where in zip(texts, found) if where is None]
        if missing:
            raise SavedVectorsError(f"{len(missing):,} of {len(texts):,} sentences have no saved vector in "
                                    f"{self.name[len(PREFIX):]}, e.g. {missing[0][:80]!r}: save a vector for every "
                                    "sentence mined")
        out = np.zeros((len(texts), self.dim), np.float32)
        if found:
            files, rows = np.array(found, dtype=np.int64).T
            for file_number in np.unique(files):  # one gather per file, rows in file order
                on_file = np.flatnonzero(files == file_number)
                order = on_file[np.argsort(rows[on_file], kind="stable")]
                out[order] = self._matrices[file_number][rows[order]]
        return l2_normalise(out)
