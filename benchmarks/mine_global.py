"""Global mining at scale (issue 30, items 1, 2, 6): labse-index on the vectors of
benchmarks/mine_million.py, recall@1 of its compressed index against exact search on a query
sample, its search cost per query, and the stopes recipe on the same vectors.

    python benchmarks/mine_million.py build --out DIR --n 2000000 --dim 256        # the vectors
    python benchmarks/mine_global.py index --out DIR --factory OPQ32,IVF4096,PQ32 --train-sample 200000
    python benchmarks/mine_global.py recall --out DIR --nprobe 8,16,32,64 [--peer] [--repeats 2]
    python benchmarks/mine_global.py quantiser --out DIR --lists 65536,262144 --nprobe 16,32

`index` runs the command (`python -m pipelines.index.cli`, DirectRunner, one worker) on the target
side, CPU and peak memory polled (benchmarks/scale_table.py's `measure`), and reads its measured
bytes a sentence. `recall` loads the index the command wrote, searches a sample of source
sentences (batched, one FAISS thread, CPU time of this process) at each nprobe, and compares the
first hit with exact search (IndexFlatIP over all targets, cached in DIR). `--stopes-settings` searches the same index with stopes' settings (k 16, nprobe 128); `--peer` builds
stopes' index for this size (OPQ64,IVF<by size>,PQ64, its table in mine_million.py), trained on
the same sample size, and searches it as stopes does (k 16, nprobe 128). `quantiser` times the
coarse quantiser alone (flat and HNSW32) at list counts a 2M sample cannot train, so the cost model
of benchmarks/snapshot_cost.py reads that term measured rather than scaled. One JSON line each.
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

from mine_million import emit, load_vectors, run_measured, stopes_index_type  # noqa: E402 (sibling script)

from pipelines.index.config import DEFAULT_SHARD_SENTENCES  # noqa: E402 (after the path)


def side_folder(out: Path, side: str) -> Path:
    """DIR/vectors_<side>: the one side's saved vectors, as labse-index reads a language."""
    folder = out / f"vectors_{side}"
    folder.mkdir(exist_ok=True)
    for suffix in (".npy", ".txt"):
        link = folder / f"{side}{suffix}"
        if not link.exists():
            link.symlink_to(out / "vectors" / f"{side}{suffix}")
    return folder


def bench_index(args) -> None:
    out = Path(args.out)
    index = out / (args.name or f"index_{args.side}")
    command = [sys.executable, "-m", "pipelines.index.cli", "--vectors", str(side_folder(out, args.side)),
               "--lang", args.side, "--output", str(index), "--overwrite", "--factory", args.factory,
               "--train-sample", str(args.train_sample), "--shard-sentences", str(args.shard_sentences),
               "--direct_num_workers", "1"]
    measured = run_measured(command, out / f"{index.name}.log")
    stats = json.loads((index / "_stats.json").read_text()) if measured["rc"] == 0 else {}
    sentences = stats.get("accounting", {}).get("vectors", {}).get("kept", 0)
    emit({"part": "index", "factory": args.factory, "train_sample": args.train_sample, "sentences": sentences,
          "shards": len(stats.get("index", {}).get("shards", [])), **measured,
          "cpu_us_per_sentence": round(measured["cpu_s"] / max(sentences, 1) * 1e6, 2),
          "bytes_per_sentence": stats.get("index", {}).get("bytes_per_sentence")})


def exact_first(out: Path, queries_rows: np.ndarray, queries: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Exact top-1 of each sampled query (cached per sample: it is the expensive part)."""
    import faiss

    cache = out / f"exact_top1_{len(queries_rows)}.npz"
    if cache.exists():
        saved = np.load(cache)
        if np.array_equal(saved["rows"], queries_rows):
            return saved["top1"]
    index = faiss.IndexFlatIP(base.shape[1])
    index.add(base)
    started = time.process_time()
    _, ids = index.search(queries, 1)
    emit({"part": "exact", "queries": len(queries), "base": len(base), "cpu_s": round(time.process_time() - started, 1)})
    np.savez(cache, rows=queries_rows, top1=ids[:, 0])
    return ids[:, 0]


def timed_search(index, queries: np.ndarray, k: int, batch: int) -> tuple[np.ndarray, float]:
    started = time.process_time()
    ids = np.concatenate([index.search(queries[i:i + batch], k)[1] for i in range(0, len(queries), batch)])
    return ids, time.process_time() - started


def load_index(folder: Path):
    from pipelines.index.shards import IndexManifest, from_bytes

    manifest = IndexManifest.from_dict(json.loads((folder / "_stats.json").read_text())["index"])
    if len(manifest.shards) != 1:
        raise SystemExit("recall expects a one-shard index (give --shard-sentences >= n to `index`)")
    return manifest, from_bytes((folder / f"{manifest.shards[0]['name']}.faiss").read_bytes())


def bench_recall(args) -> None:
    import faiss

    from pipelines.index.shards import set_nprobe, train_index

    faiss.omp_set_num_threads(1)
    out = Path(args.out)
    src, tgt, _ = load_vectors(out)
    rows = np.random.default_rng(0).choice(len(src), args.queries, replace=False)
    queries = np.ascontiguousarray(src[rows])
    reference = exact_first(out, rows, queries, tgt)
    manifest, index = load_index(out / (args.name or "index_tgt"))
    for nprobe in (int(x) for x in args.nprobe.split(",")) if not args.rerank_only else ():
        set_nprobe(index, nprobe)
        for repeat in range(args.repeats):
            ids, cpu = timed_search(index, queries, args.k, args.batch)
            emit({"part": "recall", "project": manifest.factory, "n": manifest.sentences, "nprobe": nprobe, "k": args.k,
                  "repeat": repeat, "queries": len(queries), "recall_at_1": round(float((ids[:, 0] == reference).mean()), 4),
                  "cpu_ms_per_query": round(cpu / len(queries) * 1e3, 3),
                  "bytes_per_sentence": manifest.bytes_per_sentence,
                  "load_average": [round(x, 2) for x in os.getloadavg()]})
    for depth in (int(x) for x in args.rerank.split(",") if x):
        # what re-ranking the index's first `depth` hits with the saved float vectors would give:
        # the exact cosine decides among them (the vectors are on disk beside the index)
        for nprobe in (int(x) for x in args.nprobe.split(",")):
            set_nprobe(index, nprobe)
            ids, cpu = timed_search(index, queries, depth, args.batch)
            started = time.process_time()
            exact = np.einsum("qd,qkd->qk", queries, tgt[np.maximum(ids, 0)])
            first = ids[np.arange(len(ids)), np.where(ids >= 0, exact, -np.inf).argmax(axis=1)]
            cpu += time.process_time() - started
            emit({"part": "recall", "project": f"{manifest.factory} + re-rank {depth} with saved vectors",
                  "n": manifest.sentences, "nprobe": nprobe, "k": depth, "queries": len(queries),
                  "recall_at_1": round(float((first == reference).mean()), 4),
                  "cpu_ms_per_query": round(cpu / len(queries) * 1e3, 3),
                  "load_average": [round(x, 2) for x in os.getloadavg()]})
    if args.stopes_settings:
        # stopes' search on the same index: k 16, nprobe 128 (its own index type for this size is
        # trained by --peer)
        set_nprobe(index, 128)
        for repeat in range(args.repeats):
            ids, cpu = timed_search(index, queries, 16, args.batch)
            emit({"part": "recall", "peer": f"stopes search settings on {manifest.factory}", "n": manifest.sentences,
                  "nprobe": 128, "k": 16, "repeat": repeat, "queries": len(queries),
                  "recall_at_1": round(float((ids[:, 0] == reference).mean()), 4),
                  "cpu_ms_per_query": round(cpu / len(queries) * 1e3, 3),
                  "load_average": [round(x, 2) for x in os.getloadavg()]})
    if args.peer:
        factory = stopes_index_type(len(tgt))
        sample = tgt[np.random.default_rng(0).choice(len(tgt), min(len(tgt), manifest.trained_on), replace=False)]
        started = time.process_time()
        peer = train_index(sample, factory)
        train_s = time.process_time() - started
        started = time.process_time()
        for lo in range(0, len(tgt), 100_000):
            peer.add(tgt[lo:lo + 100_000])
        add_s = time.process_time() - started
        set_nprobe(peer, 128)
        for repeat in range(args.repeats):
            ids, cpu = timed_search(peer, queries, 16, args.batch)
            emit({"part": "recall", "peer": f"stopes {factory}", "n": len(tgt), "nprobe": 128, "k": 16, "repeat": repeat,
                  "trained_on": len(sample), "train_cpu_s": round(train_s, 1),
                  "cpu_us_per_sentence_added": round(add_s / len(tgt) * 1e6, 2),
                  "queries": len(queries), "recall_at_1": round(float((ids[:, 0] == reference).mean()), 4),
                  "cpu_ms_per_query": round(cpu / len(queries) * 1e3, 3),
                  "load_average": [round(x, 2) for x in os.getloadavg()]})


def bench_quantiser(args) -> None:
    """The coarse quantiser alone at the size table's list counts: a flat one compares a query with
    every centroid, an HNSW32 one (`IVF<n>_HNSW32`) walks a graph with `efSearch` candidates (FAISS
    uses max(efSearch, nprobe)). `lists` target vectors stand in for the centroids (a search costs
    the same whatever the points; training `lists` real centroids needs 39 x lists vectors). Also
    the share of the flat quantiser's nprobe lists the graph finds, the coarse recall (queries whose
    exact first neighbour's list is probed: flat, and HNSW with the neighbour added as labse-index
    adds it), and the coarse k-means that
    training costs at a size this sample can train (`--train-lists`), to be scaled by sample x lists."""
    import faiss

    faiss.omp_set_num_threads(1)
    out = Path(args.out)
    src, tgt, _ = load_vectors(out)
    queries = np.ascontiguousarray(src[np.random.default_rng(0).choice(len(src), args.queries, replace=False)])
    if args.train_lists:
        sample = np.ascontiguousarray(tgt[np.random.default_rng(0).choice(len(tgt), args.train_sample, replace=False)])
        coarse = faiss.index_factory(tgt.shape[1], f"IVF{args.train_lists},Flat", faiss.METRIC_INNER_PRODUCT)
        started = time.process_time()
        coarse.train(sample)
        emit({"part": "train", "lists": args.train_lists, "sample": len(sample),
              "cpu_s": round(time.process_time() - started, 2), "load_average": [round(x, 2) for x in os.getloadavg()]})
    rows = np.random.default_rng(0).choice(len(src), args.queries, replace=False)
    nearest = tgt[exact_first(out, rows, queries, tgt)]  # each query's exact first neighbour
    for lists in (int(x) for x in args.lists.split(",") if x):
        centroids = np.ascontiguousarray(tgt[np.random.default_rng(1).choice(len(tgt), lists, replace=False)])
        flat = faiss.IndexFlatIP(tgt.shape[1])
        flat.add(centroids)
        hnsw = faiss.IndexHNSWFlat(tgt.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        started = time.process_time()
        hnsw.add(centroids)
        build_s = time.process_time() - started
        # the list each query's exact neighbour is added to: by the flat quantiser, and by the HNSW
        # one as labse-index adds (FAISS's efSearch 16)
        hnsw.hnsw.efSearch = 16
        home = {"flat": flat.search(nearest, 1)[1][:, 0], "hnsw": hnsw.search(nearest, 1)[1][:, 0]}
        for nprobe in (int(x) for x in args.nprobe.split(",")):
            for repeat in range(args.repeats):
                exact, flat_cpu = timed_search(flat, queries, nprobe, args.batch)
                # coarse recall: the share of queries whose exact neighbour's list is among those probed
                # (an upper bound of recall@1 that the codes and re-ranking can only lower)
                record = {"part": "quantiser", "lists": lists, "nprobe": nprobe, "repeat": repeat, "queries": len(queries),
                          "flat_ms_per_query": round(flat_cpu / len(queries) * 1e3, 3), "hnsw_build_s": round(build_s, 1),
                          "flat_coarse_recall": round(float((exact == home["flat"][:, None]).any(axis=1).mean()), 4)}
                for ef in (int(x) for x in args.ef_search.split(",")):
                    hnsw.hnsw.efSearch = ef
                    found, hnsw_cpu = timed_search(hnsw, queries, nprobe, args.batch)
                    record[f"hnsw_ef{ef}_ms_per_query"] = round(hnsw_cpu / len(queries) * 1e3, 3)
                    record[f"hnsw_ef{ef}_list_recall"] = round(float(np.mean(
                        [len(set(a) & set(b)) / nprobe for a, b in zip(exact, found)])), 4)
                    record[f"hnsw_ef{ef}_coarse_recall"] = round(float((found == home["hnsw"][:, None]).any(axis=1).mean()), 4)
                emit(record | {"load_average": [round(x, 2) for x in os.getloadavg()]})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = parser.add_subparsers(dest="part", required=True)
    i = parts.add_parser("index")
    i.add_argument("--out", required=True)
    i.add_argument("--side", default="tgt", choices=("src", "tgt"))
    i.add_argument("--factory", default="auto")
    i.add_argument("--train-sample", type=int, default=200_000)
    i.add_argument("--shard-sentences", type=int, default=DEFAULT_SHARD_SENTENCES)
    i.add_argument("--name", default=None, help="the index folder under --out (default index_SIDE)")
    r = parts.add_parser("recall")
    r.add_argument("--out", required=True)
    r.add_argument("--queries", type=int, default=2000)
    r.add_argument("--name", default=None, help="the target index folder under --out (default index_tgt)")
    r.add_argument("--nprobe", default="8,16,32,64")
    r.add_argument("--k", type=int, default=4)
    r.add_argument("--batch", type=int, default=1000)
    r.add_argument("--repeats", type=int, default=1)
    r.add_argument("--rerank", default="", help="comma-separated depths: re-rank that many hits with the saved vectors")
    r.add_argument("--rerank-only", action="store_true", help="skip the plain PQ searches")
    r.add_argument("--peer", action="store_true", help="also train and search stopes' index type for this size")
    r.add_argument("--stopes-settings", action="store_true", help="also search the same index as stopes does")
    q = parts.add_parser("quantiser")
    q.add_argument("--out", required=True)
    q.add_argument("--lists", default="65536,262144")
    q.add_argument("--nprobe", default="16,32")
    q.add_argument("--queries", type=int, default=2000)
    q.add_argument("--batch", type=int, default=1000)
    q.add_argument("--repeats", type=int, default=2)
    q.add_argument("--ef-search", default="16,64", help="the HNSW quantiser's efSearch values")
    q.add_argument("--train-lists", type=int, default=4096, help="also time the coarse k-means of this many lists (0: no)")
    q.add_argument("--train-sample", type=int, default=160_000)
    args = parser.parse_args(argv)
    {"index": bench_index, "recall": bench_recall, "quantiser": bench_quantiser}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
