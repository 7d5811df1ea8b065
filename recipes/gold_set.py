"""`python -m recipes.gold_set`: a mining test set with a known answer, made from line-aligned text.

The guides' `labse-eval mining` and `recipes.remine --gold` examples need two monolingual sentence
files and a gold alignment between them; the sample data has aligned text (Multi30k, Tatoeba), not
such sets. This takes `--pairs` aligned rows as the true pairs, adds `--distractors` rows on each side
whose partner is left out (the source's from the rows after the pairs, the target's from the rows
after those, so no distractor has its translation on the other side), shuffles each side on its own
and writes OUT/src.txt, OUT/tgt.txt (one sentence a line) and OUT/gold.tsv (0-based
`SRC_LINE<TAB>TGT_LINE`, the format `labse-eval mining --gold` and `recipes.remine --gold` read).
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Callable, Sequence

from pipelines.io.atomic import write_text_atomic
from pipelines.io.text_lines import read_lines


def hide_pairs(true_src: Sequence[str], true_tgt: Sequence[str], distractor_src: Sequence[str],
               distractor_tgt: Sequence[str], permutation: Callable[[int], Sequence[int]]
               ) -> tuple[list[str], list[str], set[tuple[int, int]]]:
    """True pairs (`true_src[i]`, `true_tgt[i]`) hidden among distractors whose partners are absent,
    each side shuffled: (source lines, target lines, gold {(source line, target line)}).
    `permutation(n)` is a random order of range(n), drawn for the source side, then the target
    side (`gold_set`'s seeded `random.Random`; the mining benchmarks pass a numpy generator's)."""
    src, tgt = list(true_src) + list(distractor_src), list(true_tgt) + list(distractor_tgt)
    src_order, tgt_order = list(permutation(len(src))), list(permutation(len(tgt)))
    src_line = {int(row): line for line, row in enumerate(src_order)}
    tgt_line = {int(row): line for line, row in enumerate(tgt_order)}
    gold = {(src_line[i], tgt_line[i]) for i in range(len(true_src))}
    return [src[i] for i in src_order], [tgt[i] for i in tgt_order], gold


def gold_set(source: list[str], target: list[str], pairs: int, distractors: int,
             seed: int = 0) -> tuple[list[str], list[str], list[tuple[int, int]]]:
    """(source lines, target lines, gold (source line, target line) pairs, sorted): the first `pairs`
    aligned rows hidden among the next `distractors` source rows and the `distractors` target rows
    after those (`hide_pairs`), both sides shuffled."""
    needed = pairs + 2 * distractors
    if min(len(source), len(target)) < needed:
        raise ValueError(f"--pairs {pairs} and --distractors {distractors} need {needed} aligned lines; "
                         f"the files have {min(len(source), len(target))}")
    rng = random.Random(seed)

    def permutation(n: int) -> list[int]:
        order = list(range(n))
        rng.shuffle(order)
        return order

    src, tgt, gold = hide_pairs(source[:pairs], target[:pairs], source[pairs:pairs + distractors],
                                target[pairs + distractors:needed], permutation)
    return src, tgt, sorted(gold)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.gold_set", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--src", required=True, help="source side of line-aligned text (plain or .gz)")
    parser.add_argument("--tgt", required=True, help="target side, line i the translation of --src line i")
    parser.add_argument("--pairs", type=int, default=500, help="true pairs (the first aligned lines)")
    parser.add_argument("--distractors", type=int, default=250,
                        help="sentences per side whose partner is left out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffles")
    parser.add_argument("--output", required=True, help="folder for src.txt, tgt.txt and gold.tsv")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.distractors < 0:
        parser.error("--pairs must be at least 1 and --distractors not negative")
    try:
        source, target, gold = gold_set(read_lines(args.src), read_lines(args.tgt), args.pairs,
                                        args.distractors, args.seed)
    except (OSError, ValueError) as error:
        print(f"python -m recipes.gold_set: {error}", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "src.txt", "".join(line + "\n" for line in source))
    write_text_atomic(out / "tgt.txt", "".join(line + "\n" for line in target))
    write_text_atomic(out / "gold.tsv", "".join(f"{s}\t{t}\n" for s, t in gold))
    print(f"gold set: {len(source)} source and {len(target)} target sentences, {len(gold)} gold pairs -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
