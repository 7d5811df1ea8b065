"""Two rounds of `python -m recipes.remine` on BUCC-style Multi30k sets (BENCHMARKS.md, "Re-mining").

    python benchmarks/remine.py --output /tmp/remine-bench [--langs cs,de] [--distractors 1000]
    python benchmarks/remine.py --output /tmp/remine-bench --heldout   # after it: each round's model on unseen sets

Per language: the 1,000 test_2016 pairs hidden among `--distractors` train sentences a side whose
partners are absent (benchmarks/mining.py `bucc_set`, distractors from train rows >= 2,000), both
sides shuffled; the scorers' positives and the extra `--parallel-text` are train rows 0-999, French
rows 0-999 the wrong-language negatives; the vocabulary (4,000 tokens) is the tests' WordPiece fixture on train rows
0-1,999 (tests/model_helpers.py). Prints the summary lines; OUT/summary.json has everything.

The rounds mine the same sentences they train on (test_2016 is in round 1's training pairs), so
`--heldout` also measures each round's exported model, and the bootstrap embedder `auto` picks, as a
miner on sets it never saw: Multi30k `val` hidden the same way (LASER's oracle-threshold F1, as
`labse-eval mining` reports it); one JSON line per (embedder, language).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mining import DATA, bucc_set, read_lines  # noqa: E402
from recipes.remine import main as remine_main  # noqa: E402
from model_helpers import build_vocab  # noqa: E402

POSITIVE_ROWS = 1000


def write_lines(path: Path, lines) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def heldout(args) -> int:
    import json

    from pipelines.embed.choice import choose_embedder
    from pipelines.score.bucc import evaluate_sets

    summary = json.loads((args.output / "out" / "summary.json").read_text(encoding="utf-8"))
    for lang in args.langs.split(","):
        train_rows = np.arange(2000, len(read_lines(DATA / f"multi30k/train.{lang}.gz")))
        src, tgt, gold = bucc_set(lang, args.distractors, args.seed, split="val", distractor_rows=train_rows)
        embedders = [("bootstrap", choose_embedder(lang, "en").embedder)]
        embedders += [(f"round {entry['round']}", entry["model"]) for entry in summary["rounds"]]
        for name, embedder in embedders:
            oracle = evaluate_sets(src, tgt, gold, embedder, lang, "en")["laser_oracle"]
            print(json.dumps({"lang": lang, "miner": name, "embedder": embedder, "val_true_pairs": len(gold),
                              **{k: oracle[k] for k in ("precision", "recall", "f1", "margin_threshold")}}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--langs", default="cs,de")
    parser.add_argument("--distractors", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", action="store_true", help="measure the finished rounds' models on val sets")
    args, remine_args = parser.parse_known_args(argv)
    if args.heldout:
        return heldout(args)
    sets = args.output / "sets"
    sets.mkdir(parents=True, exist_ok=True)
    langs = args.langs.split(",")
    argv = []
    for lang in langs:
        train_rows = np.arange(2000, len(read_lines(DATA / f"multi30k/train.{lang}.gz")))
        src, tgt, gold = bucc_set(lang, args.distractors, args.seed, distractor_rows=train_rows)
        write_lines(sets / f"{lang}.txt", src)
        write_lines(sets / f"en-for-{lang}.txt", tgt)
        write_lines(sets / f"gold.{lang}-en.tsv", (f"{i}\t{j}" for i, j in sorted(gold)))
        argv += ["--mine", f"{lang}:{sets / f'{lang}.txt'},en:{sets / f'en-for-{lang}.txt'}",
                 "--gold", f"{lang}-en:{sets / f'gold.{lang}-en.tsv'}",
                 "--positives", f"{lang}:{sets / f'pos.{lang}'},en:{sets / 'pos.en'}",
                 "--parallel-text", f"{lang}:{sets / f'pos.{lang}'},en:{sets / 'pos.en'}"]
    for lang in (*langs, "en", "fr"):
        write_lines(sets / f"pos.{lang}", read_lines(DATA / f"multi30k/train.{lang}.gz")[:POSITIVE_ROWS])
    vocab = build_vocab(DATA, sets / "vocab", vocab_size=4000, lines_per_lang=2000)
    argv += ["--other-language", f"fr:{sets / 'pos.fr'}", "--vocab", str(vocab), "--output", str(args.output / "out"),
             "--eval-data", str(DATA), "--scorer-max-pairs", str(POSITIVE_ROWS - 560), *remine_args]
    print("python -m recipes.remine " + " ".join(argv), flush=True)
    return remine_main(argv)


if __name__ == "__main__":
    sys.exit(main())
