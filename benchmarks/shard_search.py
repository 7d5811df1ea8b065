"""Searching an index in S shards (issue 30, items 2 and 6): labse-mine's packed search against the
per-shard search it replaced and against FAISS's own sharded IVF, on the same vectors and shards.

    python benchmarks/mine_million.py build --out DIR --n 2000000 --dim 256   # the vectors (once)
    python benchmarks/shard_search.py --out DIR --factory IVF4096_HNSW32,PQ128x4fs --shards 1,10,50

One index is trained on a sample of the target side (cached in DIR) and filled into S shards of
consecutive rows, each a copy of the trained index with its rows added (labse-index's way), with
the rows as float16 for re-ranking. A sample of source sentences (the queries of
benchmarks/mine_global.py's `recall`, whose exact nearest neighbours it caches) is searched three
ways, on one thread, CPU time of this process, `--repeats` times each:

- `project`: labse-mine's packed search (`_SearchPackedShards`' steps): each query's lists assigned
  once (`coarse_assignment`), every shard searched with them, re-ranked at the index's depth
  (`RerankFloor`), the top k merged shard by shard (`merge_top`).
- `per_shard`: the search before it, and the text-keyed path's still: each shard searched on its
  own (its quantiser, `--rerank` hits re-ranked in it), the top k merged.
- `peer`: FAISS's `IndexShardsIVF` (the library's sharded IVF: one coarse assignment, each shard's
  lists scanned, the `--rerank` best by codes merged), then those re-ranked by exact cosine: what
  the index in one shard does, which needs every shard in memory at once.

Each line gives CPU ms a query, recall@1 against exact search and the rows re-ranked a query; the
summary line gives per_shard / project and project / peer (medians over the repeats, with ranges).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mine_global import exact_first  # noqa: E402 (sibling script)
from mine_million import emit, load_vectors  # noqa: E402

from pipelines.index.shards import (RerankFloor, coarse_assignment, exact_similarities, faiss_threads,  # noqa: E402
                                    from_bytes, search_shard_arrays, set_nprobe, to_bytes, train_index)
from pipelines.mine.packed_search import merge_top  # noqa: E402


def trained_index(out: Path, base: np.ndarray, factory: str, sample: int) -> bytes:
    """The trained, empty index (cached in DIR: training is the slow part)."""
    cache = out / f"shard_search_{factory.replace(',', '_')}_{sample}.faiss"
    if cache.exists():
        return cache.read_bytes()
    rows = np.sort(np.random.default_rng(1).choice(len(base), min(sample, len(base)), replace=False))
    started = time.process_time()
    data = to_bytes(train_index(np.ascontiguousarray(base[rows]), factory))
    emit({"part": "train", "factory": factory, "sample": len(rows), "cpu_s": round(time.process_time() - started, 1)})
    cache.write_bytes(data)
    return data


def fill_shards(trained: bytes, base: np.ndarray, shards: int, nprobe: int) -> list[tuple[object, np.ndarray, int]]:
    """[(shard index, its float16 rows, its first row)] for `shards` runs of consecutive rows."""
    filled = []
    for rows in np.array_split(np.arange(len(base)), shards):
        index = from_bytes(trained)
        index.add(np.ascontiguousarray(base[rows[0]:rows[-1] + 1]))
        set_nprobe(index, nprobe)
        filled.append((index, base[rows[0]:rows[-1] + 1].astype(np.float16), int(rows[0])))
    return filled


def _as_top(found: tuple[np.ndarray, np.ndarray], start: int, ids: np.ndarray) -> dict:
    sims, positions = found
    return {"ids": ids, "sims": sims, "hits": np.where(positions >= 0, positions + start, -1)}


def project(shards, queries: np.ndarray, k: int, depth: int) -> tuple[np.ndarray, int]:
    ids, top = np.arange(len(queries)), None
    assigned, floor = coarse_assignment(shards[0][0], queries), RerankFloor(len(queries), depth)
    for index, rows, start in shards:
        found = _as_top(search_shard_arrays(index, queries, k, rows, depth, assigned=assigned, floor=floor), start, ids)
        top = found if top is None else merge_top([top, found], k)
    return top["hits"], floor.reranked


def per_shard(shards, queries: np.ndarray, k: int, depth: int) -> tuple[np.ndarray, int]:
    ids = np.arange(len(queries))
    parts = [_as_top(search_shard_arrays(index, queries, k, rows, depth), start, ids) for index, rows, start in shards]
    return merge_top(parts, k)["hits"], sum(min(depth, index.ntotal) for index, _, _ in shards) * len(queries)


def peer_index(shards):
    """FAISS's IndexShardsIVF over the same shards (one quantiser, the shards' lists; an index
    without pre-transforms)."""
    import faiss

    first = faiss.extract_index_ivf(shards[0][0])
    quantiser = faiss.clone_index(first.quantizer)
    searched = faiss.downcast_index(first.quantizer)
    if isinstance(searched, faiss.IndexHNSW):  # labse-mine's candidate count (`set_nprobe`)
        faiss.downcast_index(quantiser).hnsw.efSearch = searched.hnsw.efSearch
    sharded = faiss.IndexShardsIVF(quantiser, first.nlist, False, True)
    for index, _rows, _start in shards:  # it searches with the first shard's nprobe
        sharded.add_shard(index)
    sharded.referenced_objects = [quantiser, *(index for index, _, _ in shards)]  # FAISS holds bare pointers
    return sharded


def peer(sharded, rows: np.ndarray, queries: np.ndarray, k: int, depth: int) -> tuple[np.ndarray, int]:
    _, ids = sharded.search(queries, depth)
    exact = exact_similarities(queries, ids, rows)
    order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ids, order, axis=1), int((ids >= 0).sum())


def add_search_options(parser) -> None:
    """The search settings of the shard benchmarks (labse-mine's defaults) and their repeats."""
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--rerank", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="benchmarks/mine_million.py build's folder")
    parser.add_argument("--factory", default="IVF4096_HNSW32,PQ128x4fs")
    parser.add_argument("--train-sample", type=int, default=200_000)
    parser.add_argument("--shards", default="1,10,50")
    parser.add_argument("--queries", type=int, default=2000)
    add_search_options(parser)
    args = parser.parse_args(argv)
    out = Path(args.out)
    src, tgt, _gold = load_vectors(out)
    rows = np.random.default_rng(0).choice(len(src), args.queries, replace=False)  # mine_global.py recall's
    queries = np.ascontiguousarray(src[rows])
    reference = exact_first(out, rows, queries, tgt)
    trained = trained_index(out, tgt, args.factory, args.train_sample)
    all_rows = tgt.astype(np.float16)
    summary = {}
    for count in (int(s) for s in args.shards.split(",")):
        shards = fill_shards(trained, tgt, count, args.nprobe)
        sharded = peer_index(shards)
        runs = {"project": lambda: project(shards, queries, args.k, args.rerank),
                "per_shard": lambda: per_shard(shards, queries, args.k, args.rerank),
                "peer": lambda: peer(sharded, all_rows, queries, args.k, args.rerank)}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for name, run in runs.items():  # interleaved
                with faiss_threads(1):
                    started = time.process_time()
                    hits, reranked = run()
                    cpu = time.process_time() - started
                times[name].append(cpu / len(queries) * 1e3)
                emit({"part": "search", "method": name, "shards": count, "repeat": repeat, "factory": args.factory,
                      "nprobe": args.nprobe, "rerank": args.rerank, "queries": len(queries),
                      "cpu_ms_per_query": round(times[name][-1], 4),
                      "recall_at_1": round(float((hits[:, 0] == reference).mean()), 4),
                      "reranked_per_query": round(reranked / len(queries), 1)})
        median = {name: float(np.median(values)) for name, values in times.items()}
        summary[count] = {
            "per_shard_over_project": round(median["per_shard"] / median["project"], 2),
            "project_over_peer": round(median["project"] / median["peer"], 2),
            "ms_per_query_median_min_max": {name: [round(median[name], 3), round(min(v), 3), round(max(v), 3)]
                                            for name, v in times.items()}}
    emit({"part": "summary", "factory": args.factory, "repeats": args.repeats, "by_shards": summary})


if __name__ == "__main__":
    main()
