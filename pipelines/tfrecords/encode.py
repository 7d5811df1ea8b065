"""labse-tfrecords' logic as plain functions, no Beam: a pair row -> a `tf.train.Example` record.

    pair = normalise_pair(row)                       # a clean pair dict, or the drop reason
    tokenizer = load_tfte_tokenizer("vocab.txt")     # the project tokenizer (contract 5)
    src, tgt = tokenize_texts(tokenizer, [pair["src"], pair["tgt"]])
    shard, (key, data, facts) = encode_pair(pair, src, tgt, cls_id=2, sep_id=3, config=TFRecordsConfig())

Also the schema (contract 8: `FEATURES_DOC`, `SCHEMA_VERSION`) and what `schema.json` and
`stats.json` hold (`build_manifests`). The Beam transforms that run these over a corpus are in
`pipelines.tfrecords.transforms`; the TFRecord framing is `pipelines.io.tfrecord`.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
from collections import Counter
from dataclasses import asdict
from typing import Sequence

from pipelines.io.tfrecord import encode_example
from pipelines.text.normalise import is_blank
from pipelines.text.wordpiece import VocabError, vocab_lines
from pipelines.tfrecords.config import TFRecordsConfig

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SHARD_PREFIX = "pairs"
UNKNOWN_LANG = "und"

FEATURES_DOC = {
    "src_ids": {"dtype": "int64", "shape": "[n], 2 <= n <= max_seq_length",
                "description": "word-piece ids of the source sentence: [CLS] first, [SEP] last"},
    "tgt_ids": {"dtype": "int64", "shape": "[n], 2 <= n <= max_seq_length",
                "description": "word-piece ids of the target sentence: [CLS] first, [SEP] last"},
    "src_lang": {"dtype": "bytes", "shape": "[1]", "description": "lid.176 language code of the source (utf-8), 'und' if unknown"},
    "tgt_lang": {"dtype": "bytes", "shape": "[1]", "description": "lid.176 language code of the target (utf-8), 'und' if unknown"},
    "score": {"dtype": "float32", "shape": "[1]",
              "description": "pair quality score from labse-score (1.0 for --parallel-text, NaN if the input had none)"},
}
TEXT_FEATURES_DOC = {
    "src_text": {"dtype": "bytes", "shape": "[1]", "description": "the source sentence (utf-8), only with --include-text"},
    "tgt_text": {"dtype": "bytes", "shape": "[1]", "description": "the target sentence (utf-8), only with --include-text"},
}


def vocab_facts(raw: bytes, vocab_path: str) -> dict:
    """File name, sha256, size and special-token ids of the bytes of a vocab.txt (for schema.json).

    Raises VocabError for a line `vocab_lines` refuses (not UTF-8, empty, whitespace inside, a
    repeat) or a missing special token, naming the file and the line: the tokenizer would fail in
    every worker.
    """
    tokens = vocab_lines(raw, vocab_path)
    first_line = {token: number for number, token in enumerate(tokens, 1)}
    special = {t: first_line[t] - 1 for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in first_line}
    missing = {"[CLS]", "[SEP]", "[PAD]", "[UNK]"} - set(special)
    if missing:
        raise VocabError(f"{vocab_path}: vocabulary lacks {sorted(missing)}")
    return {"file": os.path.basename(vocab_path), "sha256": hashlib.sha256(raw).hexdigest(), "size": len(tokens),
            "special_ids": special}


def wrap_and_truncate(pieces: Sequence[int], cls_id: int, sep_id: int, max_seq_length: int) -> tuple[list[int], bool]:
    """`[CLS] pieces [SEP]` cut to max_seq_length (the [SEP] kept); returns (ids, was_truncated)."""
    room = max_seq_length - 2
    truncated = len(pieces) > room
    return [cls_id, *pieces[:room], sep_id], truncated


def normalise_pair(row: dict, default_score: float = float("nan")) -> dict | str:
    """A clean pair dict from an input row, or the reason it is dropped."""
    src, tgt = row.get("src"), row.get("tgt")
    if not isinstance(src, str) or not isinstance(tgt, str):
        return "missing_text"
    if is_blank(src) or is_blank(tgt):  # whitespace and invisible characters only
        return "empty_text"
    src, tgt = src.strip(), tgt.strip()
    score = row.get("score", default_score)
    try:
        score = float(score) if score is not None else default_score
    except (TypeError, ValueError):
        return "bad_score"
    return {
        "src": src,
        "tgt": tgt,
        "src_lang": str(row.get("src_lang") or UNKNOWN_LANG),
        "tgt_lang": str(row.get("tgt_lang") or UNKNOWN_LANG),
        "score": score,
    }


def passes_min_score(score: float, min_score: float | None) -> str | None:
    """None if the pair is kept, else the drop reason."""
    if min_score is None:
        return None
    if math.isnan(score):
        return "score_missing"
    return None if score >= min_score else "below_min_score"


def shuffle_key(seed: int, pair: dict) -> int:
    """A 64-bit key from the seed and the pair's content: the global shuffle order."""
    h = hashlib.blake2b(digest_size=8, key=str(seed).encode())
    for name in ("src_lang", "tgt_lang", "src", "tgt"):
        h.update(pair[name].encode("utf-8"))
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little")


def shard_name(shard: int, num_shards: int) -> str:
    return f"{SHARD_PREFIX}-{shard:05d}-of-{num_shards:05d}.tfrecord"


def load_tfte_tokenizer(vocab_path: str):
    """The project tokenizer (contract 5); imported here so TensorFlow loads only in workers that tokenise."""
    from pipelines.text.wordpiece import TFTextTokenizer

    return TFTextTokenizer(vocab_path)


def tokenize_texts(tokenizer, texts: list[str]) -> list[list[int] | None]:
    """Word-piece ids of each text (no [CLS]/[SEP]); None for a text the tokenizer fails on.

    The batch is tokenised in one call; if that fails, one text at a time, so that one bad string
    does not lose the batch.
    """
    try:
        return [list(map(int, ids)) for ids in tokenizer.tokenize_ids(texts)]
    except Exception:  # one bad string must not lose the batch: retry one by one
        out: list[list[int] | None] = []
        for text in texts:
            try:
                out.append([int(i) for i in tokenizer.tokenize_ids([text])[0]])
            except Exception as exc:
                logger.warning("tokenizer failed on %r: %s", text[:80], exc)
                out.append(None)
        return out


def encode_pair(pair: dict, src_pieces: list[int] | None, tgt_pieces: list[int] | None, cls_id: int, sep_id: int,
                config: TFRecordsConfig) -> tuple[int, tuple[int, bytes, tuple]] | str:
    """`(shard, (key, serialized Example, facts))` for a normalised pair and its word pieces, or
    the drop reason (`tokenizer_error`, `no_word_pieces`).

    `facts` = (language pair, source ids, target ids, source truncated, target truncated), what
    the shard writer sums into stats.json.
    """
    if src_pieces is None or tgt_pieces is None:
        return "tokenizer_error"
    if not src_pieces or not tgt_pieces:
        return "no_word_pieces"
    src_ids, src_cut = wrap_and_truncate(src_pieces, cls_id, sep_id, config.max_seq_length)
    tgt_ids, tgt_cut = wrap_and_truncate(tgt_pieces, cls_id, sep_id, config.max_seq_length)
    features: dict[str, object] = {
        "src_ids": src_ids,
        "tgt_ids": tgt_ids,
        "src_lang": pair["src_lang"],
        "tgt_lang": pair["tgt_lang"],
        "score": float(pair["score"]),
    }
    if config.include_text:
        features["src_text"] = pair["src"]
        features["tgt_text"] = pair["tgt"]
    key = shuffle_key(config.seed, pair)
    facts = (f"{pair['src_lang']}-{pair['tgt_lang']}", len(src_ids), len(tgt_ids), src_cut, tgt_cut)
    return key % config.num_shards, (key, encode_example(features), facts)


def build_manifests(shards: list[dict], drops: dict[str, int], *, config: TFRecordsConfig, vocab: dict,
                    inputs: dict, input_pairs: int | None = None, accounting: dict | None = None) -> tuple[dict, dict]:
    """(schema.json, stats.json) contents from the shard summaries and drop counts.

    `accounting`: the stage's accounting section (`{"accounting": ..., "identity_holds": ...}`,
    README contract 11), built by the Beam side from its tallies; stats.json carries it as given.
    """
    shards = sorted(shards, key=lambda s: s["file"])
    total = sum(s["num_records"] for s in shards)
    features = dict(FEATURES_DOC)
    if config.include_text:
        features.update(TEXT_FEATURES_DOC)
    schema = {
        "format": "labse-tfrecords",
        "version": SCHEMA_VERSION,
        "record": "tf.train.Example, one translation pair per record; uncompressed TFRecord framing with masked CRC32C",
        "features": features,
        "max_seq_length": config.max_seq_length,
        "vocab": vocab,
        "shuffle": {"seed": config.seed, "method": "blake2b-64 key of (seed, langs, texts): shard = key mod num_shards, records sorted by key"},
        "num_shards": config.num_shards,
        "num_records": total,
        "index": "beside each shard, FILE.index: the byte offset of every record's header, "
                 "little-endian uint64 (8 bytes a record), in file order",
        "shards": [{k: s[k] for k in ("file", "index", "num_records", "num_bytes") if k in s} for s in shards],
    }
    langs: Counter = Counter()
    for s in shards:
        langs.update(s["language_pairs"])
    dropped = dict(sorted(drops.items()))
    dup = sum(s["duplicate_pair"] for s in shards)
    if dup:
        dropped["duplicate_pair"] = dup
    stats = {
        "stage": "labse-tfrecords",
        **(accounting or {}),
        "config": asdict(config),
        "inputs": inputs,
        "input_pairs": input_pairs,
        "written_pairs": total,
        "dropped": dropped,
        "language_pairs": dict(sorted(langs.items())),
        "mean_src_tokens": round(sum(s["src_tokens"] for s in shards) / total, 2) if total else None,
        "mean_tgt_tokens": round(sum(s["tgt_tokens"] for s in shards) / total, 2) if total else None,
        "truncated_src": sum(s["truncated_src"] for s in shards),
        "truncated_tgt": sum(s["truncated_tgt"] for s in shards),
        "empty_shards": config.num_shards - len(shards),
    }
    return schema, stats
