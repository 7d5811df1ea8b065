"""How well a vocabulary covers each language: `vocab.report.json` and a PNG bar chart.

Measured per language on held-out sentences (never counted for learning), tokenised exactly as in
training (`pipelines.text.wordpiece.hf_tokenizer`, same ids as TF Text):
  unk_share          [UNK] tokens / all tokens
  subwords_per_word  word pieces / pre-tokenised words (1.0 = every word whole)
  whole_word_share   words that are a single, known token
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from pipelines.io.atomic import write_bytes_atomic
from pipelines.text.wordpiece import UNK_ID

BATCH = 1024


def tokenization_stats(tokenizer, sentences: Sequence[str]) -> dict:
    """unk_share, subwords_per_word, whole_word_share of `sentences` under a HF fast tokenizer."""
    sentences = [s for s in sentences if s and s.strip()]
    words = tokens = unks = whole = 0
    backend = tokenizer.backend_tokenizer
    for start in range(0, len(sentences), BATCH):
        for encoding in backend.encode_batch(sentences[start : start + BATCH], add_special_tokens=False):
            ids = encoding.ids
            per_word: dict[int, list[int]] = {}
            for token_id, word_id in zip(ids, encoding.word_ids):
                per_word.setdefault(word_id, []).append(token_id)
            words += len(per_word)
            tokens += len(ids)
            unks += sum(1 for token_id in ids if token_id == UNK_ID)
            whole += sum(1 for pieces in per_word.values() if len(pieces) == 1 and pieces[0] != UNK_ID)
    return {
        "sentences": len(sentences),
        "words": words,
        "tokens": tokens,
        "unk_share": unks / tokens if tokens else 0.0,
        "subwords_per_word": tokens / words if words else 0.0,
        "whole_word_share": whole / words if words else 0.0,
    }


def build_report(vocab_path: str, heldout: Mapping[str, Sequence[str]], extra: Mapping | None = None) -> dict:
    from pipelines.text.wordpiece import hf_tokenizer, load_vocab

    tokenizer = hf_tokenizer(vocab_path)
    per_language = {lang: tokenization_stats(tokenizer, heldout[lang]) for lang in sorted(heldout)}
    all_sentences = [s for lang in sorted(heldout) for s in heldout[lang]]
    return {
        "vocab": str(vocab_path),
        "vocab_size": len(load_vocab(vocab_path)),
        "overall": tokenization_stats(tokenizer, all_sentences),
        "languages": per_language,
        **(dict(extra) if extra else {}),
    }


def write_report(report: dict, json_path: str | Path, png_path: str | Path | None = None) -> None:
    from pipelines.io.completion import strict_json

    # str, not Path: the paths may be gs://... (Path would fold the double slash)
    write_bytes_atomic(str(json_path), strict_json(report, indent=1).encode("utf-8"))
    if png_path is not None and report["languages"]:
        plot_report(report, str(png_path))


def plot_report(report: dict, png_path: str | Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    langs = list(report["languages"])
    metrics = [("unk_share", "[UNK] share"), ("subwords_per_word", "subwords per word"),
               ("whole_word_share", "words kept whole")]
    height = max(3.0, 0.28 * len(langs) + 1.2)
    fig, axes = plt.subplots(1, 3, figsize=(13, height), sharey=True)
    for ax, (key, title) in zip(axes, metrics):
        values = [report["languages"][lang][key] for lang in langs]
        labels = [f"{lang} ({report['languages'][lang]['sentences']})" for lang in langs]
        ax.barh(labels, values, color="#4C72B0")
        ax.set_title(title)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"vocabulary of {report['vocab_size']:,} tokens on held-out sentences (count per language)")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    write_bytes_atomic(png_path, buffer.getvalue())
