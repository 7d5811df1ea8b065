"""The demo's text steps on LABSE_DATA's sample files: the main-content classifier, cleaning and the
vocabulary, each through its stage's real command (`make demo`, recipes/demo.py).

The sample file names live here, not in the product commands, which take paths only. Each step is
`step(data, out, artifacts) -> list[str]`: it reads the sample data folder `data`, writes under `out`,
records the paths it wrote in `artifacts` for the steps after it, and returns its summary lines.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from pipelines.clean.cli import main as clean_main
from pipelines.main_content.cli import main as main_content_main
from vocab.cli import main as vocab_main


MAIN_CONTENT_INPUT = "commoncrawl/*.warc.gz"
MAIN_CONTENT_ARTICLES = "maincontent/article-pages.warc.gz"
MAIN_CONTENT_TRUTH = "maincontent/article-pages.ground-truth.json"


def main_content_step(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Build data from the two Common Crawl sample WARCs, train, and measure on held-out article pages.

    The 181 article pages are never used for training, so their F1 against the human main text is
    a held-out number. Writes under out/main_content/; sets artifacts["main_content_model"].
    """
    stage = out / "main_content"
    data_dir, model_path = stage / "data", stage / "model.bin"
    started = time.perf_counter()
    argv = ["build-data", "--input", str(data / MAIN_CONTENT_INPUT), "--output", str(data_dir), "--overwrite"]
    print("labse-main-content " + " ".join(argv), flush=True)
    if main_content_main(argv) != 0:
        raise RuntimeError("labse-main-content build-data failed")
    build_seconds = time.perf_counter() - started
    # One thread: fastText's training repeats exactly only single-threaded, and every later stage of
    # the demo (vocabulary, mining, training) depends on the sentences this model keeps.
    argv = ["train", "--data", str(data_dir), "--output", str(model_path), "--threads", "1"]
    print("labse-main-content " + " ".join(argv), flush=True)
    if main_content_main(argv) != 0:
        raise RuntimeError("labse-main-content train failed")
    artifacts["main_content_model"] = str(model_path)
    stats = json.loads((data_dir / "stats.json").read_text(encoding="utf-8"))
    report = json.loads(Path(str(model_path) + ".metrics.json").read_text(encoding="utf-8"))
    test = report["test"]
    lines = [
        f"build-data on {MAIN_CONTENT_INPUT}: {stats['documents_kept']} HTML pages labelled by "
        f"{'a committee of teachers' if stats.get('config', {}).get('labels', 'committee') == 'committee' else 'trafilatura'} "
        f"(train/dev/test pages {stats['pages']['train']}/{stats['pages']['dev']}/{stats['pages']['test']}), "
        f"{stats['train_examples']} balanced training lines, {build_seconds:.0f} s",
        f"model {model_path} ({report['model_bytes'] / 1e6:.1f} MB), trained in {report['train_seconds']:.1f} s",
        f"test split vs teacher ({test['pages']} pages, {test['lines']} lines): P {test['precision']:.3f} "
        f"R {test['recall']:.3f} F1 {test['f1']:.3f}, agreement {test['agreement']:.3f} "
        f"(text only: F1 {report['test_text_only']['f1']:.3f}, agreement {report['test_text_only']['agreement']:.3f})",
    ]
    articles, truth_file = data / MAIN_CONTENT_ARTICLES, data / MAIN_CONTENT_TRUTH
    if articles.is_file() and truth_file.is_file():
        from pipelines.main_content.evaluate import html_pages, mean_token_f1_vs_truth, model_kept_text
        from pipelines.main_content.model import MainContentModel

        model = MainContentModel.load(str(model_path))
        truth = json.loads(truth_file.read_text(encoding="utf-8"))
        pages = html_pages(str(articles))
        f1, count = mean_token_f1_vs_truth(lambda html: model_kept_text(model, html), pages, truth)
        f1_text, _ = mean_token_f1_vs_truth(lambda html: model_kept_text(model, html, use_html=False), pages, truth)
        lines.append(f"held-out article pages ({count}, never trained on), kept-text token F1 vs human main text: "
                     f"{f1:.3f} with the HTML feature, {f1_text:.3f} text only "
                     f"(data README: all visible text 0.594, trafilatura 0.955)")
    return lines


CLEAN_INPUTS = [
    ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "warc"),
    ("commoncrawl/web-pages-sample.warc.gz", "warc"),
    ("maincontent/article-pages.warc.gz", "warc"),
    ("wikipedia/enwiki-pages-articles-sample.xml.bz2", "wikipedia"),
    ("wikipedia/ltgwiki-pages-articles-sample.xml.bz2", "wikipedia"),
]


def clean_step(data: Path, out: Path, artifacts: dict) -> list[str]:
    """labse-clean on every sample in LABSE_DATA, through the real CLI, into out/clean/."""
    output = out / "clean"
    argv = []
    for relative, fmt in CLEAN_INPUTS:
        argv += ["--input", str(data / relative)]
    argv += ["--output", str(output), "--overwrite"]
    model = artifacts.get("main_content_model")
    if model:
        argv += ["--main-content-model", str(model)]
    print(f"labse-clean {' '.join(argv)}", flush=True)
    code = clean_main(argv)
    if code != 0:
        raise RuntimeError(f"labse-clean failed with exit code {code}")
    stats = json.loads((output / "stats.json").read_text(encoding="utf-8"))
    artifacts["clean_output"] = str(output)
    lines = [
        f"inputs: {len(CLEAN_INPUTS)} sample files; main content by "
        + (f"the model {model}" if model else "heuristic rules (no main-content model available)"),
        f"documents read {stats['documents_read']}: kept {stats['documents_kept']}, "
        f"dropped {sum(stats['documents_dropped'].values())}, errored {stats['documents_errored']}",
        f"sentences read {stats['sentences_read']}: kept {stats['sentences_kept']}, "
        f"dropped {sum(stats['sentences_dropped'].values())} "
        f"(duplicates {stats['sentences_dropped'].get('duplicate', 0)}), errored {stats['sentences_errored']}",
        f"accounting identity read = kept + dropped + errored: {'holds' if stats['identity_holds'] else 'BROKEN'}",
        f"input files {stats['per_file']['files']}, with errored documents {stats['per_file']['files_with_errors']} "
        "(stats.json per_file)",
        "lang  sentences",
    ]
    for lang, count in list(stats["per_language"].items())[:15]:
        lines.append(f"{lang:<5} {count}")
    if len(stats["per_language"]) > 15:
        rest = list(stats["per_language"].values())[15:]
        lines.append(f"(+{len(rest)} more languages, {sum(rest)} sentences)")
    lines.append(f"output: {output}/sentences (lang=XX/*.parquet), errors/, stats.json")
    return lines


def vocab_step(data: Path, out: Path, artifacts: dict) -> list[str]:
    """Demo step: a 32k vocabulary from the demo's cleaned text plus Multi30k train (en/de/fr/cs)."""
    out_dir = out / "vocab"
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["--output", str(out_dir / "vocab.txt"), "--vocab-size", "32000", "--char-min-count", "2", "--overwrite"]
    clean = artifacts.get("clean_output")
    sentences = Path(clean) / "sentences" if clean else None
    if sentences is not None and any(sentences.glob("lang=*/*.parquet")):
        argv += ["--input", str(sentences)]
    for lang in ("en", "de", "fr", "cs"):
        path = data / "multi30k" / f"train.{lang}.gz"
        if not path.is_file():
            raise FileNotFoundError(f"demo vocabulary needs {path}")
        argv += ["--input-text", f"{lang}={path}"]
    argv += ["--direct_num_workers", "1"]
    code = vocab_main(argv)
    if code != 0:
        raise RuntimeError(f"labse-vocab failed with exit code {code}")
    artifacts["vocab"] = str(out_dir / "vocab.txt")
    report = json.loads((out_dir / "vocab.report.json").read_text(encoding="utf-8"))
    stats = json.loads((out_dir / "vocab.stats.json").read_text(encoding="utf-8"))
    lines = [
        f"vocab.txt: {report['vocab_size']:,} tokens ({stats['learner']['num_chars']} characters, alone and as ##c) "
        f"from {stats['learner']['num_words_in']:,} distinct words in {len(stats['languages'])} languages"
        + (" (cleaned demo text + Multi30k train)" if "--input" in argv else " (Multi30k train; no cleaned text found)"),
        f"learning took {stats['seconds']['learn']:.0f} s, counting with Beam {stats['seconds']['count']:.0f} s",
    ]
    ranked = sorted(report["languages"].items(), key=lambda kv: -kv[1]["sentences"])[:8]
    lines.append("held-out sentences, per language: [UNK] share / subwords per word / words kept whole")
    for lang, row in ranked:
        lines.append(f"  {lang}: {row['unk_share']:.4f} / {row['subwords_per_word']:.3f} / {row['whole_word_share']:.3f}"
                     f"  ({row['sentences']} sentences)")
    return lines
