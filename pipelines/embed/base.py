"""What every embedder shares: its one user-facing error and unit-length rows. A module of its own so
that embedders kept in other modules (`saved_vectors`) need not import the dispatcher that loads them."""
from __future__ import annotations

import numpy as np


NOT_TENSORS = ("holds Python objects other than tensors, so it was not loaded (nothing in it was run): it is not a "
               "model file this tool wrote or can read safely")


def error_line(error: BaseException, limit: int = 300) -> str:
    """`Type: first line` of a library's error, for a one-line message. PyTorch's refusal of a
    pickle (`weights_only=True`) goes on to advise loading the file with `weights_only=False`, which
    would run whatever code it holds: that advice never reaches a user, `NOT_TENSORS` does instead."""
    seen = error
    while seen is not None:
        if "weights only load failed" in str(seen).lower() or "weights_only" in str(seen):
            return NOT_TENSORS
        seen = seen.__cause__ or seen.__context__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:limit]}" if text else type(error).__name__


class EmbedderError(Exception):
    """The embedder spec cannot be loaded (unknown name, missing directory, missing package)."""


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float32; all-zero rows stay zero instead of becoming NaN, and a row
    with a NaN or an infinity stays non-finite, silently: what becomes of it is the caller's
    (labse-mine and labse-index drop it with a counted reason)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    with np.errstate(invalid="ignore"):  # inf / inf in a non-finite row: no warning a batch
        return np.ascontiguousarray(vectors / norms, dtype=np.float32)

