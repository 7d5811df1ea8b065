"""What every embedder shares: its one user-facing error and unit-length rows. A module of its own so
that embedders kept in other modules (`saved_vectors`) need not import the dispatcher that loads them."""
from __future__ import annotations

import numpy as np


class EmbedderError(Exception):
    """The embedder spec cannot be loaded (unknown name, missing directory, missing package)."""


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float32; all-zero rows stay zero instead of becoming NaN."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)

