"""A static embedder: WordPiece tokens -> one table row each -> weighted mean -> unit length.

What `labse-distill` writes and every embedder option (`--embedder DIR`) loads. No network, no
attention, no matrix product per token: on one CPU thread it embeds tens of thousands of sentences a
second, which is what mining a crawl needs (docs/guides/distilling-a-static-miner.md).

The directory (`save_static_embedder` writes it, `StaticEmbedder` reads it):

* ``model.safetensors``: ``embeddings`` (float16, [vocabulary, dims]) and ``weights`` (float32,
  [vocabulary], each token's weight in the mean; model2vec's keys, so sentence-transformers folds
  them in when it loads the table);
* ``vocab.txt``: the project's WordPiece vocabulary (row i = token i) and ``tokenizer.json``, the
  same vocabulary with the project's cleaning rules as a `tokenizers` pipeline
  (`pipelines.text.wordpiece.hf_tokenizer`: the same ids as the TF Text tokenizer);
* ``static_embedder.json``: what it is and how it was made (format, dims, teacher, data, languages
  seen, how the weights were set, the training steps);
* ``modules.json``, ``config_sentence_transformers.json``, ``1_Normalize/``: the layout of a
  sentence-transformers model made of a `StaticEmbedding` module and `Normalize`, so
  ``SentenceTransformer(DIR)`` loads the same model (tests/test_embed_static.py checks both give
  the same vectors).

The sentence vector is sum(w_t * e_t) / |.|: sentence-transformers divides by the token count
instead of sum(w_t), a scalar that the final normalisation removes, so both agree.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipelines.embed.base import EmbedderError, l2_normalise

FORMAT = "labse-static-embedder"
FORMAT_VERSION = 1
METADATA_FILE = "static_embedder.json"
TABLE_FILE = "model.safetensors"
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
STATIC_EMBEDDING_TYPE = "sentence_transformers.models.StaticEmbedding"
NORMALIZE_TYPE = "sentence_transformers.models.Normalize"


class StaticEmbedderError(EmbedderError):
    """The directory is not a readable static embedder (missing files, shapes that disagree)."""


@dataclass
class StaticMetadata:
    """``static_embedder.json``: what the table is and where it came from."""

    dims: int
    vocab_size: int
    teacher: str = ""
    languages: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)
    weighting: str = "none"
    steps: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @classmethod
    def from_json(cls, payload: dict, where: Path) -> "StaticMetadata":
        if payload.get("format") != FORMAT:
            raise StaticEmbedderError(f"{where} is not a {FORMAT} file (format {payload.get('format')!r})")
        if int(payload.get("format_version", 0)) > FORMAT_VERSION:
            raise StaticEmbedderError(f"{where} has format version {payload['format_version']}; this toolkit "
                                      f"reads up to {FORMAT_VERSION}: upgrade labse-toolkit")
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in payload.items() if key in known})


def is_static_embedder_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / METADATA_FILE).is_file()


def tokenizer_json(vocab_path: str | os.PathLike) -> str:
    """``tokenizer.json`` for `vocab_path`: the project's WordPiece pipeline (`hf_tokenizer`) without
    its added-token list. `hf_tokenizer` keeps "[MASK]" typed in a sentence as text through a flag of
    the transformers wrapper that a bare ``tokenizers.Tokenizer`` (what sentence-transformers loads)
    neither saves nor reads; without the list the specials are ordinary vocabulary rows that only
    the WordPiece model can produce, so ids match the TF Text tokenizer on every input."""
    from pipelines.text.wordpiece import hf_tokenizer

    payload = json.loads(hf_tokenizer(vocab_path).backend_tokenizer.to_str())
    payload["added_tokens"] = []
    return json.dumps(payload, ensure_ascii=False)


def save_static_embedder(directory: str | os.PathLike, vocab_path: str | os.PathLike, embeddings: np.ndarray,
                         weights: np.ndarray | None, metadata: StaticMetadata) -> Path:
    """Write a static embedder directory (see the module docstring) atomically: the files go into a
    temporary folder beside `directory`, which then takes its name; an existing `directory` is
    replaced only once the new one is complete."""
    from safetensors.numpy import save_file

    from pipelines.text.wordpiece import load_vocab

    directory = Path(directory)
    vocab = load_vocab(vocab_path)
    embeddings = np.asarray(embeddings)
    weights = np.ones(len(vocab), np.float32) if weights is None else np.asarray(weights, np.float32)
    if embeddings.ndim != 2 or embeddings.shape[0] != len(vocab):
        raise ValueError(f"embeddings must be [{len(vocab)}, dims] (one row per token), got {embeddings.shape}")
    if weights.shape != (len(vocab),):
        raise ValueError(f"weights must be [{len(vocab)}], got {weights.shape}")
    if not (np.isfinite(embeddings).all() and np.isfinite(weights).all()):
        raise ValueError("embeddings and weights must be finite")
    metadata.dims, metadata.vocab_size = int(embeddings.shape[1]), len(vocab)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        save_file({"embeddings": np.ascontiguousarray(embeddings, np.float16),
                   "weights": np.ascontiguousarray(weights, np.float32)}, str(staging / TABLE_FILE))
        shutil.copyfile(vocab_path, staging / VOCAB_FILE)
        (staging / TOKENIZER_FILE).write_text(tokenizer_json(vocab_path), encoding="utf-8")
        modules = [{"idx": 0, "name": "0", "path": "", "type": STATIC_EMBEDDING_TYPE},
                   {"idx": 1, "name": "1", "path": "1_Normalize", "type": NORMALIZE_TYPE}]
        (staging / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
        (staging / "1_Normalize").mkdir()
        (staging / "1_Normalize" / "config.json").write_text("{}", encoding="utf-8")
        (staging / "config_sentence_transformers.json").write_text(json.dumps(
            {"model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
             "similarity_fn_name": "cosine"}, indent=2), encoding="utf-8")
        (staging / METADATA_FILE).write_text(json.dumps(metadata.__dict__, indent=2, ensure_ascii=False),
                                             encoding="utf-8")
        os.chmod(staging, 0o755)
        if directory.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
            os.replace(directory, retired / "old")
            os.replace(staging, directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def read_table(directory: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings float16 [V, d], weights float32 [V]) of a static embedder directory."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(directory) / TABLE_FILE
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise StaticEmbedderError(f"{path} is not a readable safetensors table ({error})") from None
    if "embeddings" not in tensors:
        raise StaticEmbedderError(f"{path} has no 'embeddings' tensor (keys: {sorted(tensors)})")
    embeddings = tensors["embeddings"]
    weights = tensors.get("weights")
    if weights is None:
        weights = np.ones(embeddings.shape[0], np.float32)
    if embeddings.ndim != 2 or weights.shape != (embeddings.shape[0],):
        raise StaticEmbedderError(f"{path}: embeddings {embeddings.shape} and weights {weights.shape} disagree")
    return embeddings, weights.astype(np.float32)


class StaticEmbedder:
    """A static embedder directory as an embedder (`encode(texts) -> float32 unit rows`).

    The table is kept with the weights folded in, in float32 (4 x vocabulary x dims bytes: 512 MB
    for 500,000 tokens at 256 dims, 33 MB for 32,000). Sentences are tokenised by the Rust `tokenizers`
    pipeline of ``tokenizer.json``; its threads are the `tokenizers` library's (``RAYON_NUM_THREADS``).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        if not directory.is_dir():
            raise StaticEmbedderError(f"static embedder directory not found: {directory}")
        meta_path = directory / METADATA_FILE
        if not meta_path.is_file():
            raise StaticEmbedderError(f"{directory} is not a static embedder (no {METADATA_FILE}; "
                                      "labse-distill writes one)")
        try:
            payload = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise StaticEmbedderError(f"{meta_path} is not readable JSON ({error})") from None
        self.metadata = StaticMetadata.from_json(payload, meta_path)
        embeddings, weights = read_table(directory)
        # float16 -> weights folded in float32 -> float16 (what sentence-transformers' loader does, so both
        # round alike) -> float32 for the sparse product, which has no float16 kernel.
        self.table = (embeddings.astype(np.float32) * weights[:, None]).astype(np.float16).astype(np.float32)
        from tokenizers import Tokenizer

        tokenizer_path = directory / TOKENIZER_FILE
        if not tokenizer_path.is_file():
            raise StaticEmbedderError(f"{directory} has no {TOKENIZER_FILE}")
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        if self._tokenizer.get_vocab_size() != self.table.shape[0]:
            raise StaticEmbedderError(f"{directory}: the tokenizer has {self._tokenizer.get_vocab_size():,} tokens "
                                      f"but the table {self.table.shape[0]:,} rows")
        self.name = str(directory)
        self.dim = int(self.table.shape[1])

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """WordPiece ids per text (no [CLS]/[SEP]), as the table sees them."""
        texts = [t if isinstance(t, str) else "" for t in texts]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode(self, texts: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for start in range(0, len(texts), batch_size):
            out[start:start + batch_size] = self._embed_batch(texts[start:start + batch_size])
        return l2_normalise(out)

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        # One sparse [texts, vocabulary] count matrix times the table: scipy's C loop is ~25x faster
        # here than gathering rows and summing them with numpy (np.add.reduceat).
        from scipy.sparse import csr_matrix

        ids = self.token_ids(texts)
        lengths = np.fromiter((len(row) for row in ids), np.int64, len(ids))
        flat = np.fromiter((i for row in ids for i in row), np.int64, int(lengths.sum()))
        rows = csr_matrix((np.ones(len(flat), np.float32), flat, np.concatenate([[0], np.cumsum(lengths)])),
                          shape=(len(ids), self.table.shape[0]))
        return np.asarray(rows @ self.table, dtype=np.float32)
