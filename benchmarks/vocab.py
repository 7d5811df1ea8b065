"""Vocabulary learner benchmarks (BENCHMARKS.md, section vocab).

compare: the same language-weighted word counts from the sample corpora (Multi30k train en/de/fr/cs
    + UDHR in many scripts) go to three learners, each in its own subprocess so peak memory is
    its own: this project's learner (`vocab.learn`), TF Text's `learn()` (the paper's tool) and HF
    `tokenizers`' WordPiece trainer. Prints seconds, peak RSS, and per Tatoeba language the
    subwords per word and [UNK] share of each vocabulary, and the speed ratio.

    .venv/bin/python benchmarks/vocab.py compare --vocab-size 8000 --multi30k-lines 10000

scale: a synthetic Zipfian table of 10 million distinct words in 30 scripts -> 500,000 tokens,
    time and peak memory of `vocab.learn` alone.

    nice .venv/bin/python benchmarks/vocab.py scale --num-words 10000000 --vocab-size 500000

prune: the same synthetic table, learned in full and pruned to each `--max-words` (the top words by
    count, ties by the word: `vocab.prune.keep_top`, what the counting step keeps for one
    language), each learner in a child process (load the counts TSV as labse-vocab does + learn):
    peak RSS, time, tokens shared with the unpruned vocabulary, [UNK] share and subwords per word on
    held-out words drawn by count and on words drawn uniformly from the table.

    nice .venv/bin/python benchmarks/vocab.py prune --num-words 2000000 --vocab-size 200000 --max-words 0,1000000,500000

real: labse-vocab (Beam counting + learner + report) on real text -- UDHR (388 files, by ISO 639-3
    code), Tatoeba (every language side), the Wikipedia samples (en, ltg) -- once per `--max-words`;
    per language the held-out [UNK] share and subwords per word, and the tokens shared with the
    unpruned vocabulary.

    nice .venv/bin/python benchmarks/vocab.py real --vocab-size 32000 --max-words 0,320000,160000,80000
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("LABSE_DATA", REPO.parent / "shared" / "data"))

# Tatoeba (ISO 639-3) -> the UDHR file with the same language, so each script is in the counts.
TATOEBA_UDHR = {
    "deu": "deu", "fra": "fra", "rus": "rus", "cmn": "cmn_hans,cmn_hant", "jpn": "jpn", "kor": "kor",
    "ara": "arb", "hin": "hin", "tha": "tha", "heb": "heb", "ell": "ell_monotonic", "tur": "tur",
    "spa": "spa", "ukr": "ukr", "pes": "pes_1", "ben": "ben", "tam": "tam", "vie": "vie", "kat": "kat",
}
# Unicode blocks for the synthetic scripts (40 letters from each start).
SCRIPT_STARTS = [
    0x0061, 0x0430, 0x03B1, 0x0627, 0x05D0, 0x0905, 0x0985, 0x0E01, 0x10D0, 0x0561, 0xAC00, 0x3041,
    0x30A1, 0x0B85, 0x0C05, 0x0C85, 0x0D05, 0x0A85, 0x0A05, 0x0B05, 0x0D85, 0x1780, 0x0E81, 0x0F40,
    0x1200, 0x1000, 0x1820, 0x13A0, 0x1401, 0x0710,
]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB


# --------------------------------------------------------------------------- synthetic scale run
def script_alphabet(start: int, letters_only: bool) -> list[str]:
    """40 code points from `start`; with `letters_only`, the first 40 letters and marks (the plain
    block of 40 runs past 'z' into punctuation and C1 controls, which a tokenizer cannot hold)."""
    if not letters_only:
        return [chr(start + i) for i in range(40)]
    import unicodedata

    letters, code = [], start
    while len(letters) < 40:
        if unicodedata.category(chr(code))[0] in "LM":
            letters.append(chr(code))
        code += 1
    return letters


def zipf_counts(num_words: int, num_scripts: int = 30, seed: int = 0,
                letters_only: bool = False) -> tuple[list[str], np.ndarray]:
    """`num_words` distinct words: 1-4 morphemes from a Zipfian inventory per script; Zipf counts."""
    rng = np.random.default_rng(seed)
    words: dict[str, None] = {}
    per_script = -(-num_words // num_scripts)
    for start in SCRIPT_STARTS[:num_scripts]:
        alphabet = np.array(script_alphabet(start, letters_only), dtype=object)
        lengths = rng.integers(1, 6, size=30_000)
        morphemes = np.array(
            ["".join(alphabet[rng.integers(0, 40, size=n)]) for n in lengths], dtype=object
        )
        prob = 1.0 / np.arange(1, len(morphemes) + 1) ** 1.1
        prob /= prob.sum()
        target = min(num_words, len(words) + per_script)
        while len(words) < target:
            batch = 2 * (target - len(words)) + 1000
            parts = rng.choice(len(morphemes), size=(batch, 4), p=prob)
            k = rng.integers(1, 5, size=batch)
            joined = morphemes[parts[:, 0]].copy()
            for j in range(1, 4):
                extra = morphemes[parts[:, j]]
                joined = np.where(k > j, joined + extra, joined)
            for word in joined:
                if len(words) >= target:
                    break
                words[word] = None
    word_list = list(words)
    order = rng.permutation(len(word_list))
    word_list = [word_list[i] for i in order]
    counts = np.maximum(1.0, np.floor(1e9 / np.arange(1, len(word_list) + 1) ** 1.05))
    return word_list, counts


def run_scale(args) -> dict:
    from vocab.learn import LearnerConfig, learn

    started = time.perf_counter()
    words, counts = zipf_counts(args.num_words, args.num_scripts, args.seed)
    generated = time.perf_counter() - started
    print(f"generated {len(words):,} words in {generated:.0f} s (peak RSS {peak_rss_gb():.1f} GB)", flush=True)
    rss_before = peak_rss_gb()
    started = time.perf_counter()
    cpu_started = cpu_seconds()
    result = learn(words, counts, LearnerConfig(vocab_size=args.vocab_size, num_unused=args.num_unused))
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu_started
    out = {
        "num_words": len(words),
        "num_scripts": args.num_scripts,
        "vocab_size": len(result.vocab),
        "requested": args.vocab_size,
        "learn_seconds": round(seconds, 1),
        "learn_cpu_seconds": round(cpu, 1),
        "generate_seconds": round(generated, 1),
        "peak_rss_gb_after_generation": round(rss_before, 2),
        "peak_rss_gb": round(peak_rss_gb(), 2),
        "search": result.search,
        "num_chars": result.num_chars,
    }
    print(json.dumps(out, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


# --------------------------------------------------------------------------- comparison run
def corpus_counts(udhr_files: list[str], multi30k_lines: int) -> dict[str, Counter]:
    from pipelines.text.pretokenize import pretokenize

    per_lang: dict[str, Counter] = {}
    for lang in ("en", "de", "fr", "cs"):
        counter = per_lang.setdefault(lang, Counter())
        with gzip.open(DATA / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            for i, line in enumerate(handle):
                if i >= multi30k_lines:
                    break
                counter.update(pretokenize(line))
    for name in udhr_files:
        counter = per_lang.setdefault("udhr-" + name, Counter())
        for line in (DATA / "udhr" / f"{name}.txt").read_text(encoding="utf-8").splitlines():
            counter.update(pretokenize(line))
    return per_lang


def weighted_integer_counts(per_lang: dict[str, Counter], alpha: float) -> Counter:
    """Language-smoothed counts, rounded so TF Text's learn() (integer thresholds) gets them too."""
    from vocab.smoothing import language_weights

    weights = language_weights({lang: sum(c.values()) for lang, c in per_lang.items()}, alpha)
    total: Counter = Counter()
    for lang, counter in per_lang.items():
        for word, count in counter.items():
            total[word] += count * weights[lang]
    return Counter({w: max(1, int(round(c))) for w, c in total.items()})


def load_tf_text_learner():
    """TF Text's learner module by file: it needs only numpy, and importing the package would load
    TensorFlow (~0.5 GB) into the measured process."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow_text")
    path = Path(spec.submodule_search_locations[0]) / "tools" / "wordpiece_vocab" / "wordpiece_tokenizer_learner_lib.py"
    module_spec = importlib.util.spec_from_file_location("tf_text_wordpiece_learner", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _learner_main(kind: str, counts_path: str, vocab_size: int, out_path: str) -> None:
    """Runs in a subprocess: one learner, timed, peak memory from getrusage."""
    from pipelines.text.wordpiece import SPECIAL_TOKENS

    counts = json.loads(Path(counts_path).read_text(encoding="utf-8"))
    started = time.perf_counter()
    cpu_started = cpu_seconds()
    if kind == "project":
        from vocab.learn import LearnerConfig, learn_from_counts

        vocab = learn_from_counts(counts, LearnerConfig(vocab_size=vocab_size, char_min_count=1, progress=False)).vocab
    elif kind == "tf_text":
        tf_learner = load_tf_text_learner()

        # bert_vocab_from_dataset's defaults, except: every character kept (as ours, so CJK is
        # not [UNK]) and no input cap; slack 0.5% so its size is comparable.
        vocab = tf_learner.learn(
            list(counts.items()), vocab_size, SPECIAL_TOKENS, upper_thresh=10_000_000, lower_thresh=1,
            num_iterations=4, max_input_tokens=-1, max_token_length=50, max_unique_chars=1_000_000,
            slack_ratio=0.005, include_joiner_token=True, joiner="##",
        )
    elif kind == "hf_tokenizers":
        from tokenizers import Tokenizer, models, trainers

        from pipelines.text.pretokenize import bert_normalizer, bert_pre_tokenizer

        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = bert_normalizer()
        tokenizer.pre_tokenizer = bert_pre_tokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, continuing_subword_prefix="##",
            show_progress=False, limit_alphabet=1_000_000,
        )

        def repeated():  # the trainer has no counts API: each word as often as its weighted count
            for word, count in counts.items():
                for _ in range(0, count, 1000):
                    yield " ".join([word] * min(1000, count))

        tokenizer.train_from_iterator(repeated(), trainer)
        mapping = tokenizer.get_vocab()
        vocab = sorted(mapping, key=mapping.get)
    else:
        raise ValueError(kind)
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu_started
    Path(out_path + ".txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    Path(out_path + ".json").write_text(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_rss_gb": peak_rss_gb(), "size": len(vocab)}))


def tatoeba_quality(vocab_path: str, langs: list[str]) -> dict[str, dict]:
    from vocab.report import tokenization_stats
    from pipelines.text.wordpiece import hf_tokenizer

    tokenizer = hf_tokenizer(vocab_path)
    out = {}
    for lang in langs:
        path = DATA / "tatoeba" / f"tatoeba.{lang}-eng.{lang}"
        out[lang] = tokenization_stats(tokenizer, path.read_text(encoding="utf-8").splitlines())
    return out


def run_compare(args) -> dict:
    langs = args.langs.split(",")
    started = time.perf_counter()
    udhr = [name for lang in langs if lang in TATOEBA_UDHR for name in TATOEBA_UDHR[lang].split(",")]
    per_lang = corpus_counts(udhr, args.multi30k_lines)
    counts = weighted_integer_counts(per_lang, args.smoothing)
    print(f"{len(counts):,} distinct words, {sum(counts.values()):,} weighted tokens, "
          f"{len(per_lang)} languages (counting took {time.perf_counter() - started:.0f} s)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="vocab_bench_"))
    counts_path = work / "counts.json"
    counts_path.write_text(json.dumps(counts), encoding="utf-8")
    results = {}
    for kind in args.learners.split(","):
        print(f"learning with {kind} ...", flush=True)
        out = str(work / kind)
        proc = subprocess.run(
            [sys.executable, __file__, "_learner", kind, str(counts_path), str(args.vocab_size), out],
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        if proc.returncode != 0:
            results[kind] = {"error": f"exit {proc.returncode}"}
            continue
        stats = json.loads(Path(out + ".json").read_text())
        stats["tatoeba"] = tatoeba_quality(out + ".txt", langs)
        results[kind] = stats
        print(f"  {kind}: {stats['seconds']:.1f} s ({stats['cpu_seconds']:.1f} s CPU), peak RSS {stats['peak_rss_gb']:.2f} GB, size {stats['size']}", flush=True)

    print(f"\n{'learner':<15}{'wall s':>9}{'CPU s':>9}{'peak GB':>9}{'size':>8}")
    for kind, stats in results.items():
        if "error" not in stats:
            print(f"{kind:<15}{stats['seconds']:>9.1f}{stats['cpu_seconds']:>9.1f}{stats['peak_rss_gb']:>9.2f}{stats['size']:>8}")
    ok = [k for k in results if "error" not in results[k]]
    print("\nsubwords per word / [UNK] share on Tatoeba (" + ", ".join(ok) + ")")
    for lang in langs:
        cells = [
            f"{results[k]['tatoeba'][lang]['subwords_per_word']:.3f}/{results[k]['tatoeba'][lang]['unk_share']:.3f}"
            for k in ok
        ]
        print(f"{lang:<6}" + "".join(f"{c:>18}" for c in cells))
    for k in ok:
        mean = np.mean([results[k]["tatoeba"][lang]["subwords_per_word"] for lang in langs])
        results[k]["mean_subwords_per_word"] = float(mean)
        print(f"mean subwords per word {k}: {mean:.4f}")
    if "project" in ok and "tf_text" in ok:
        speed = results["tf_text"]["seconds"] / results["project"]["seconds"]
        cpu_speed = results["tf_text"]["cpu_seconds"] / results["project"]["cpu_seconds"]
        rel = results["project"]["mean_subwords_per_word"] / results["tf_text"]["mean_subwords_per_word"] - 1
        overlap = len(set(Path(str(work / "project") + ".txt").read_text().split("\n"))
                      & set(Path(str(work / "tf_text") + ".txt").read_text().split("\n")))
        print(f"\nspeed-up vs TF Text learn(): {speed:.1f}x wall, {cpu_speed:.1f}x CPU time; subwords per word vs learn(): {100 * rel:+.2f}%; "
              f"shared tokens: {overlap}")
        results["speedup_vs_tf_text"] = speed
        results["cpu_speedup_vs_tf_text"] = cpu_speed
        results["subwords_per_word_vs_tf_text"] = rel
    if "project" in ok and "hf_tokenizers" in ok:
        print(f"time ratio HF tokenizers / project: {results['hf_tokenizers']['seconds'] / results['project']['seconds']:.2f} wall, "
              f"{results['hf_tokenizers']['cpu_seconds'] / results['project']['cpu_seconds']:.2f} CPU")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


# --------------------------------------------------------------------------- pruning: synthetic
def vm_peak_mb() -> float:
    """This process's own peak RSS (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _work_learner_main(work_dir: str, vocab_size: int, out_path: str) -> None:
    """Runs in a subprocess: what labse-vocab does after Beam (load the counts TSV, learn)."""
    import apache_beam.io.filesystems  # noqa: F401  (labse-vocab reads the counts through it)

    from vocab.builder import weighted_counts
    from vocab.learn import LearnerConfig, learn, write_vocab

    before = vm_peak_mb()
    started = time.perf_counter()
    cpu_started = cpu_seconds()
    words, counts = weighted_counts(work_dir, {"xx": 1.0})
    result = learn(words, counts, LearnerConfig(vocab_size=vocab_size, progress=False))
    write_vocab(result.vocab, out_path + ".txt")
    Path(out_path + ".json").write_text(json.dumps({
        "words": len(words), "seconds": time.perf_counter() - started, "cpu_seconds": cpu_seconds() - cpu_started,
        "peak_mb_after_imports": before, "peak_mb": vm_peak_mb(), "search_steps": len(result.search),
    }))


def _write_counts_tsv(work: Path, entries: list[tuple[int, str]]) -> None:
    (work / "counts").mkdir(parents=True)
    with open(work / "counts" / "counts-00000-of-00001.tsv", "w", encoding="utf-8") as handle:
        handle.writelines(f"xx\t{word}\t{count}\n" for count, word in entries)


def _word_lines(words: list[str], per_line: int = 50) -> list[str]:
    return [" ".join(words[i:i + per_line]) for i in range(0, len(words), per_line)]


def run_prune(args) -> dict:
    from vocab.prune import keep_top
    from vocab.report import tokenization_stats
    from pipelines.text.wordpiece import hf_tokenizer

    started = time.perf_counter()
    words, counts = zipf_counts(args.num_words, args.num_scripts, args.seed, letters_only=True)
    entries = [(int(c), w) for w, c in zip(words, counts)]
    rng = np.random.default_rng(args.seed + 1)
    by_count = [words[i] for i in rng.choice(len(words), size=args.heldout_words, p=counts / counts.sum())]
    by_type = [words[i] for i in rng.choice(len(words), size=args.heldout_words)]
    del words, counts
    print(f"generated {len(entries):,} words in {time.perf_counter() - started:.0f} s", flush=True)
    work = Path(tempfile.mkdtemp(prefix="vocab_prune_"))
    results = {}
    for max_words in [int(v) for v in args.max_words.split(",")]:
        kept = keep_top(entries, max_words) if max_words > 0 else entries
        run_dir = work / f"max{max_words}"
        _write_counts_tsv(run_dir, kept)
        del kept
        out = str(run_dir / "vocab")
        subprocess.run([sys.executable, __file__, "_work_learner", str(run_dir), str(args.vocab_size), out], check=True)
        row = json.loads(Path(out + ".json").read_text())
        tokenizer = hf_tokenizer(out + ".txt")
        row["heldout_by_count"] = tokenization_stats(tokenizer, _word_lines(by_count))
        row["heldout_by_type"] = tokenization_stats(tokenizer, _word_lines(by_type))
        results[max_words] = row
        print(f"max_words {max_words:>10,}: {row['words']:,} words, learn {row['seconds']:.0f} s "
              f"({row['cpu_seconds']:.0f} s CPU), peak {row['peak_mb']:.0f} MB ({row['peak_mb_after_imports']:.0f} after imports)", flush=True)
    reference = set(Path(work / f"max{0}" / "vocab.txt").read_text(encoding="utf-8").split("\n")) if 0 in results else None
    print(f"\n{'max words':>10} {'words':>10} {'learn s':>8} {'CPU s':>7} {'peak MB':>8} {'grown MB':>9} "
          f"{'shared':>7} {'unk(count)':>11} {'spw(count)':>11} {'unk(type)':>10} {'spw(type)':>10}")
    for max_words, row in results.items():
        tokens = set(Path(work / f"max{max_words}" / "vocab.txt").read_text(encoding="utf-8").split("\n"))
        row["shared_with_unpruned"] = len(tokens & reference) / len(reference) if reference else None
        shared = f"{100 * row['shared_with_unpruned']:.2f}%" if reference else "-"
        print(f"{max_words:>10,} {row['words']:>10,} {row['seconds']:>8.0f} {row['cpu_seconds']:>7.0f} {row['peak_mb']:>8.0f} "
              f"{row['peak_mb'] - row['peak_mb_after_imports']:>9.0f} {shared:>7} "
              f"{row['heldout_by_count']['unk_share']:>11.5f} {row['heldout_by_count']['subwords_per_word']:>11.4f} "
              f"{row['heldout_by_type']['unk_share']:>10.5f} {row['heldout_by_type']['subwords_per_word']:>10.4f}")
    grown = sorted((row["words"], row["peak_mb"] - row["peak_mb_after_imports"]) for row in results.values())
    if len(grown) >= 2:
        slope, fixed = np.polyfit([w for w, _ in grown], [g for _, g in grown], 1)
        print(f"\nlearner growth ~ {slope * 2**20:.0f} bytes x words + {fixed:.0f} MB (least squares over {len(grown)} runs)")
        results["fit"] = {"bytes_per_word": slope * 2**20, "fixed_mb": fixed}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


# --------------------------------------------------------------------------- pruning: real text
def real_text_files(folder: Path) -> dict[str, str]:
    """UDHR + Tatoeba + the Wikipedia samples as one text file per language (ISO 639-3 code)."""
    from pipelines.read.wikipedia import read_wikipedia_stream

    lines: dict[str, list[str]] = {}
    for path in sorted((DATA / "udhr").glob("*.txt")):
        lang = path.stem.split("_")[0]
        lines.setdefault(lang, []).extend(path.read_text(encoding="utf-8").splitlines())
    for path in sorted((DATA / "tatoeba").glob("tatoeba.*-eng.*")):
        lines.setdefault(path.name.rsplit(".", 1)[1], []).extend(path.read_text(encoding="utf-8").splitlines())
    for lang, name in (("eng", "enwiki"), ("ltg", "ltgwiki")):
        with open(DATA / "wikipedia" / f"{name}-pages-articles-sample.xml.bz2", "rb") as raw:
            for page in read_wikipedia_stream(raw, name):
                text = getattr(page, "text", None)
                if text:
                    lines.setdefault(lang, []).extend(text.splitlines())
    files = {}
    for lang, rows in sorted(lines.items()):
        rows = [row.strip() for row in rows if row.strip()]
        if rows:
            files[lang] = str(folder / f"{lang}.txt")
            Path(files[lang]).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return files


def run_real(args) -> dict:
    from vocab.builder import build
    from vocab.config import VocabConfig

    work = Path(tempfile.mkdtemp(prefix="vocab_real_"))
    files = real_text_files(work)
    print(f"{len(files)} languages: UDHR + Tatoeba + Wikipedia samples", flush=True)
    results = {}
    for max_words in [int(v) for v in args.max_words.split(",")]:
        config = VocabConfig(vocab_size=args.vocab_size, char_min_count=args.char_min_count, holdout_rate=args.holdout_rate,
                             max_words=max_words)
        started = time.perf_counter()
        result = build(str(work / f"max{max_words}" / "vocab.txt"), text_files=files, config=config,
                       beam_args=["--direct_num_workers", "1"])
        tally = result.stats["tally"]
        results[max_words] = {
            "seconds": time.perf_counter() - started, "learn_seconds": result.stats["seconds"]["learn"],
            "words_in": result.stats["learner"]["num_words_in"], "word_types_read": tally.get("word_types.read"),
            "word_types_kept": tally.get("word_types.kept"), "overall": result.report["overall"],
            "languages": result.report["languages"], "vocab": str(result.vocab_path),
        }
        print(f"max_words {max_words:>8,}: {tally.get('word_types.kept'):,} of {tally.get('word_types.read'):,} "
              f"(language, word) kept -> {results[max_words]['words_in']:,} distinct words; [UNK] "
              f"{result.report['overall']['unk_share']:.5f}, subwords/word {result.report['overall']['subwords_per_word']:.4f}", flush=True)
    if 0 not in results:
        return results
    reference = results[0]
    tokens0 = set(Path(reference["vocab"]).read_text(encoding="utf-8").split("\n"))
    langs = sorted(reference["languages"], key=lambda l: -reference["languages"][l]["sentences"])
    print(f"\n{'max words':>10} {'kept':>8} {'shared':>8} {'unk':>8} {'spw':>7} {'mean dspw':>10} {'worst dspw':>16} {'worst dunk':>16}")
    for max_words, row in results.items():
        tokens = set(Path(row["vocab"]).read_text(encoding="utf-8").split("\n"))
        row["shared_with_unpruned"] = len(tokens & tokens0) / len(tokens0)
        dspw = {l: row["languages"][l]["subwords_per_word"] / reference["languages"][l]["subwords_per_word"] - 1 for l in langs}
        dunk = {l: row["languages"][l]["unk_share"] - reference["languages"][l]["unk_share"] for l in langs}
        worst_spw = max(dspw, key=dspw.get)
        worst_unk = max(dunk, key=dunk.get)
        row["mean_rel_subwords_per_word"] = float(np.mean(list(dspw.values())))
        row["worst_rel_subwords_per_word"] = (worst_spw, dspw[worst_spw])
        row["worst_unk_increase"] = (worst_unk, dunk[worst_unk])
        print(f"{max_words:>10,} {row['word_types_kept']:>8,} {100 * row['shared_with_unpruned']:>7.2f}% "
              f"{row['overall']['unk_share']:>8.5f} {row['overall']['subwords_per_word']:>7.4f} "
              f"{100 * row['mean_rel_subwords_per_word']:>+9.2f}% {worst_spw:>6} {100 * dspw[worst_spw]:>+8.2f}% "
              f"{worst_unk:>6} {dunk[worst_unk]:>+9.5f}")
    print(f"\nper language (held-out sentences), subwords per word / [UNK] share, by --max-words {list(results)}:")
    for lang in langs[: args.show_languages]:
        cells = [f"{row['languages'][lang]['subwords_per_word']:.3f}/{row['languages'][lang]['unk_share']:.4f}"
                 for row in results.values()]
        print(f"{lang:<5} {reference['languages'][lang]['sentences']:>5} " + "".join(f"{c:>16}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_learner":
        _learner_main(argv[1], argv[2], int(argv[3]), argv[4])
        return 0
    if argv and argv[0] == "_work_learner":
        _work_learner_main(argv[1], int(argv[2]), argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    compare = sub.add_parser("compare", help="project vs TF Text learn() vs HF tokenizers on real counts")
    compare.add_argument("--vocab-size", type=int, default=8000)
    compare.add_argument("--multi30k-lines", type=int, default=10000, help="lines of each Multi30k train language")
    compare.add_argument("--smoothing", type=float, default=0.3)
    compare.add_argument("--langs", default="deu,fra,rus,cmn,jpn,kor,ara,hin,tha,heb,ell,tur")
    compare.add_argument("--learners", default="project,tf_text,hf_tokenizers")
    compare.add_argument("--json", default=None)
    scale = sub.add_parser("scale", help="synthetic Zipfian table -> large vocabulary, time and memory")
    scale.add_argument("--num-words", type=int, default=10_000_000)
    scale.add_argument("--num-scripts", type=int, default=30)
    scale.add_argument("--vocab-size", type=int, default=500_000)
    scale.add_argument("--num-unused", type=int, default=0)
    scale.add_argument("--seed", type=int, default=0)
    scale.add_argument("--json", default=None)
    prune = sub.add_parser("prune", help="synthetic table: learner memory and vocabulary with and without pruning")
    prune.add_argument("--num-words", type=int, default=2_000_000)
    prune.add_argument("--num-scripts", type=int, default=30)
    prune.add_argument("--vocab-size", type=int, default=200_000)
    prune.add_argument("--max-words", default="0,1000000,500000", help="comma-separated; 0 = unpruned")
    prune.add_argument("--heldout-words", type=int, default=200_000)
    prune.add_argument("--seed", type=int, default=0)
    prune.add_argument("--json", default=None)
    real = sub.add_parser("real", help="labse-vocab on UDHR + Tatoeba + Wikipedia with and without pruning")
    real.add_argument("--vocab-size", type=int, default=32_000)
    real.add_argument("--max-words", default="0,320000,160000,80000", help="comma-separated; 0 = unpruned")
    real.add_argument("--char-min-count", type=float, default=2.0)
    real.add_argument("--holdout-rate", type=float, default=0.1)
    real.add_argument("--show-languages", type=int, default=20)
    real.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.mode == "scale":
        run_scale(args)
    elif args.mode == "prune":
        run_prune(args)
    elif args.mode == "real":
        run_real(args)
    else:
        run_compare(args)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
