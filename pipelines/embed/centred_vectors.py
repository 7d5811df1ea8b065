"""`python -m pipelines.embed.centred_vectors IN_DIR OUT_DIR`: a language's saved vectors centred on
their mean, for the global cascade's cheap pass.

The cells cascade centres each side's cheap vectors on their mean before its search (the direction
every sentence of a language shares, strong in a static miner's vectors: `pipelines.mine.cascade`,
BENCHMARKS.md). In the global layout the cheap vectors are searched in an index built from saved
vectors, so the centring happens once, on the saved vectors of a language: every row made unit
length, the folder's mean row taken away, unit length again (`pipelines.mine.cascade.centred` over the
whole language). OUT_DIR gets the same NAME.npy + NAME.txt pairs (float32, or float16 where the input
was; NAME.keys.npy copied where there is one) and serves labse-index and labse-mine's `vectors:OUT_DIR` as the input did. Rows are read and
written in chunks, so memory does not grow with the language.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from pipelines.embed.base import l2_normalise
from pipelines.embed.saved_vectors import PREFIX, SavedVectorsError, keys_path, vector_files

CHUNK = 65_536  # rows held at a time


def mean_row(matrices: Sequence[np.ndarray]) -> np.ndarray:
    """The mean of the unit rows of every matrix (float64 sums, chunk by chunk)."""
    total, count = None, 0
    for matrix in matrices:
        for start in range(0, len(matrix), CHUNK):
            chunk = l2_normalise(matrix[start:start + CHUNK]).astype(np.float64)
            total = chunk.sum(axis=0) if total is None else total + chunk.sum(axis=0)
            count += len(chunk)
    if not count:
        raise SavedVectorsError("the saved vectors hold no rows: nothing to centre")
    return (total / count).astype(np.float32)


def write_centred(source: str | Path, target: str | Path) -> int:
    """OUT_DIR's files from IN_DIR's (module docstring); returns the rows written."""
    from pipelines.io.atomic import atomic_path

    source, target = Path(str(source).removeprefix(PREFIX)), Path(str(target).removeprefix(PREFIX))
    pairs = vector_files(source)
    if target.resolve() == source.resolve():
        raise SavedVectorsError(f"{target} is the input folder: write the centred vectors to another one")
    matrices = [np.load(matrix, mmap_mode="r", allow_pickle=False) for matrix, _ in pairs]
    centre = mean_row(matrices)
    target.mkdir(parents=True, exist_ok=True)
    rows = 0
    for (matrix_path, texts_path), matrix in zip(pairs, matrices):
        dtype = np.float16 if matrix.dtype == np.float16 else np.float32
        shutil.copyfile(texts_path, target / texts_path.name)
        if keys_path(texts_path).is_file():  # the same sentences: the same lookup table
            shutil.copyfile(keys_path(texts_path), target / keys_path(texts_path).name)
        with atomic_path(str(target / matrix_path.name)) as tmp:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=matrix.shape)
            for start in range(0, len(matrix), CHUNK):
                out[start:start + CHUNK] = l2_normalise(l2_normalise(matrix[start:start + CHUNK]) - centre)
            out.flush()
            del out
        rows += len(matrix)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from pipelines.stage_options import usage_error

    parser = argparse.ArgumentParser(prog="python -m pipelines.embed.centred_vectors",
                                     description="Centre a language's saved vectors (vectors:DIR) on their mean, "
                                                 "for the global cascade's cheap pass.")
    parser.add_argument("input", help="a language's saved vectors: NAME.npy + NAME.txt pairs")
    parser.add_argument("output", help="the folder for the centred NAME.npy + NAME.txt pairs")
    args = parser.parse_args(argv)
    try:
        rows = write_centred(args.input, args.output)
    except SavedVectorsError as error:
        return usage_error(parser.prog, str(error))
    print(f"centred {rows:,} vectors of {args.input} into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
