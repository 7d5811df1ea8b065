"""The table's starting point, in numpy: model2vec's recipe on the project's vocabulary.

Each vocabulary token's teacher vector, projected by a PCA to `dims` (fitted on the teacher's
*sentence* vectors, the space the table must imitate, and applied to the tokens and to every
training target alike), and SIF weights a / (a + p(token)) with p counted on the corpus, so frequent
pieces (punctuation, `the`, `##s`) weigh little in a sentence's mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Projection:
    """x -> (x - mean) @ components.T, then unit length: the teacher's space in `dims` dimensions."""

    mean: np.ndarray        # [teacher dims]
    components: np.ndarray  # [dims, teacher dims]
    explained: float        # share of the sentence vectors' variance the components keep

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        projected = (np.asarray(vectors, np.float32) - self.mean) @ self.components.T
        norms = np.linalg.norm(projected, axis=1, keepdims=True)
        return (projected / np.maximum(norms, 1e-12)).astype(np.float32)


def fit_projection(vectors: np.ndarray, dims: int) -> Projection:
    """PCA of `vectors` ([n, teacher dims]) to `dims` components (all of them when dims is the width)."""
    vectors = np.asarray(vectors, np.float64)
    if dims > vectors.shape[1]:
        raise ValueError(f"dims {dims} is wider than the teacher's {vectors.shape[1]} dimensions")
    mean = vectors.mean(axis=0)
    _, singular, vt = np.linalg.svd(vectors - mean, full_matrices=False)
    variance = singular ** 2
    return Projection(mean.astype(np.float32), vt[:dims].astype(np.float32),
                      float(variance[:dims].sum() / max(variance.sum(), 1e-30)))


def token_counts(token_ids: list[list[int]], vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, np.int64)
    if token_ids:
        flat = np.fromiter((i for row in token_ids for i in row), np.int64)
        counts += np.bincount(flat, minlength=vocab_size)
    return counts


def sif_weights(counts: np.ndarray, coefficient: float) -> np.ndarray:
    """a / (a + p) per token, p = its share of the corpus' tokens (unseen tokens weigh 1)."""
    total = max(int(counts.sum()), 1)
    return (coefficient / (coefficient + counts / total)).astype(np.float32)


def initial_table(vocab: list[str], surface_vectors: dict[str, np.ndarray], projection: Projection) -> tuple[np.ndarray, int]:
    """[vocab, dims] rows: each token's projected teacher vector (by its surface, `corpus.token_text`),
    zero for the reserved tokens and any token without a vector; and how many tokens had one."""
    from pipelines.distill.corpus import token_text
    from pipelines.text.wordpiece import SPECIAL_TOKENS

    table = np.zeros((len(vocab), projection.components.shape[0]), np.float32)
    rows = [i for i, token in enumerate(vocab) if token not in SPECIAL_TOKENS and token_text(token) in surface_vectors]
    if rows:
        table[rows] = projection(np.stack([surface_vectors[token_text(vocab[i])] for i in rows]))
    return table, len(rows)
