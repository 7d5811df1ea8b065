"""Main-content filtering: quality on held-out article pages, and speed, vs jusText, resiliparse and trafilatura.

Quality: the 181 article pages of ``maincontent/article-pages.warc.gz`` with their human main text
(``article-pages.ground-truth.json``). For every system, the kept text is compared with the human
main text and with the teacher's (trafilatura's) text: token F1 (bag of whitespace tokens), mean
over pages. Systems, all in this one run on the same pages:

  no filter            every line ``html_to_lines`` gives (what labse-clean sees)
  rule-based default   ``heuristic_main_content_scores >= 0.5`` (labse-clean without a model)
  classifier (CC)      our model trained by ``build-data`` + ``train`` on ``commoncrawl/*.warc.gz``
                       only (126 pages; the demo's model): the article pages are never seen
  classifier (CV)      5-fold cross-validation by page (fold = URL hash): each article page is
                       scored by a model trained on the CC pages plus the OTHER folds' article
                       pages, labelled by the teacher (never by the human text)
  jusText              ``justext.justext(html, English stoplist)``, non-boilerplate paragraphs
  resiliparse main     ``extract_plain_text(main_content=True)``
  teacher              ``trafilatura.extract(favor_precision=True)``, the labeller

Speed (CPU seconds of this process, best of several runs, so a busy shared machine slows the
numbers less than wall time would): lines/s of ``MainContentModel.score_lines`` (featurise +
one fastText call + page smoothing); pages/s of HTML -> lines -> classifier vs the teacher's
``trafilatura.extract``, and the CPU ms a page of its HTML feature (``html_main_flags``); and
pages/s of labse-clean's whole per-document text stage
(``pipelines.clean.document.clean_document``: lines, classifier, lid.176, sentences, filters) vs the
teacher.
The classifier rows are measured with the HTML feature (WARC input; ``clean_document`` passes the
page's HTML) and without it (text only, as for WET input).

    .venv/bin/python benchmarks/main_content.py --data ../shared/data
    .venv/bin/python benchmarks/main_content.py --data ../shared/data --speed-only [--model cc-model.bin]

``--speed-only`` skips the quality table and its cross-validation trainings: only the speed part
runs, with the CC model trained as above, or with ``--model`` (a model from ``labse-main-content
train``) and no training at all.

``--modes`` runs only the comparison of labse-clean's main-content modes (issue 35), side by side
in one run: the classifier, the classifier with ``--main-content-fallback`` (quality for each
share of ``--fallback``, speed for ``--speed-fallback``), the teacher mode, and the peers trafilatura (``trafilatura.extract``, default
settings) and resiliparse (``extract_plain_text(main_content=True)``). Quality: token F1 vs the
human main text of the 181 article pages, each mode's kept lines computed by labse-clean's own
per-page code (``prepare_document``). Speed: pages per CPU second of the WHOLE ``labse-clean``
command (``pipelines.clean.cli.run``, DirectRunner, one worker; reading, lid.176, sentences,
dedup, Parquet, stats.json) on the article pages plus the web-pages sample repeated ``--copies``
times, each run in a fresh process, the modes and peers alternated ``--runs`` times; the peers
loop over the same pages, decoded before their clock starts (in their favour). Reported: median
and min-max of pages per CPU second, and each mode's median ratio to trafilatura's.

``--label-quality`` runs only the comparison of labelling schemes: token F1 against the human main
text of the lines each voter and each scheme labels main content (the committee, trafilatura
alone), with the share of lines the committee agrees on or splits 2-2.

    .venv/bin/python benchmarks/main_content.py --data ../shared/data --label-quality
    .venv/bin/python benchmarks/main_content.py --data ../shared/data --modes [--model model.bin] [--timed classifier,fallback] \
        [--fallback 0.01,0.015,0.02,0.03] [--speed-fallback 0.02] [--copies 10] [--runs 2]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ARTICLES = "maincontent/article-pages.warc.gz"
TRUTH = "maincontent/article-pages.ground-truth.json"
CC = "commoncrawl/*.warc.gz"


def fold_of(url: str, folds: int) -> int:
    return int.from_bytes(hashlib.sha1(url.encode("utf-8")).digest()[:8], "big") % folds


def best_cpu_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="speed runs; the best is reported")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", dest="json_out", type=Path, default=None)
    parser.add_argument("--speed-only", action="store_true", help="skip the quality part and the CV trainings")
    parser.add_argument("--model", type=Path, default=None,
                        help="with --speed-only or --modes: measure this model instead of training the CC one")
    parser.add_argument("--modes", action="store_true", help="only compare labse-clean's main-content modes")
    parser.add_argument("--label-quality", action="store_true", help="only compare the labelling schemes")
    parser.add_argument("--fallback", default="0.01,0.015,0.02,0.03",
                        help="with --modes: fallback shares whose quality is measured, comma-separated")
    parser.add_argument("--speed-fallback", type=float, default=0.02,
                        help="with --modes: the fallback share whose speed is measured (default %(default)s)")
    parser.add_argument("--copies", type=int, default=2, help="with --modes: copies of the speed input")
    parser.add_argument("--runs", type=int, default=3, help="with --modes: speed runs per mode and peer")
    parser.add_argument("--timed", default="classifier,fallback,teacher,trafilatura,resiliparse",
                        help="with --modes: the modes and peers whose speed is measured (trafilatura always)")
    parser.add_argument("--one-run", nargs=3, metavar=("KIND", "INPUT", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_run:
        return one_speed_run(*args.one_run)
    if args.label_quality:
        return label_quality(args.data)
    if args.model and not (args.speed_only or args.modes):
        parser.error("--model needs --speed-only or --modes (the quality part trains its own models)")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from pipelines.main_content import cli
    from pipelines.main_content.config import TeacherConfig
    from pipelines.main_content.model import MainContentModel

    work = args.workdir or Path(tempfile.mkdtemp(prefix="main-content-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    # The demo's model: trained on the Common Crawl samples only.
    data_dir, cc_model_path = work / "cc-data", args.model or work / "cc-model.bin"
    if not args.model:
        assert cli.main(["build-data", "--input", str(args.data / CC), "--output", str(data_dir), "--overwrite"]) == 0
        assert cli.main(["train", "--data", str(data_dir), "--output", str(cc_model_path)]) == 0
    cc_model = MainContentModel.load(str(cc_model_path))
    if args.modes:
        modes = compare_modes(args, work, cc_model, cc_model_path)
        if args.json_out:
            args.json_out.write_text(json.dumps(modes, indent=2))
        return 0
    teacher = TeacherConfig()
    quality = {} if args.speed_only else measure_quality(args, work, data_dir, cc_model, teacher)
    speed = measure_speed(args, cc_model, cc_model_path, teacher)
    report(quality, speed)
    if args.json_out:
        args.json_out.write_text(json.dumps({"quality": quality, "speed": speed}, indent=2))
    return 0


def measure_quality(args, work: Path, data_dir: Path, cc_model, teacher) -> dict:
    """Token F1 of every system's kept text vs the human and the teacher's text (module docstring)."""
    import justext
    import numpy as np
    from resiliparse.extract.html2text import extract_plain_text

    from pipelines.main_content.config import BuildConfig, MainContentTrainConfig
    from pipelines.main_content.transforms import training_examples
    from pipelines.main_content.evaluate import html_pages, model_kept_text, token_f1
    from pipelines.main_content.labels import label_page, teacher_extract
    from pipelines.main_content.model import MainContentModel
    from pipelines.main_content.train import train_fasttext
    from pipelines.text.boilerplate import heuristic_main_content_scores
    from pipelines.text.html import html_to_lines

    truth = json.loads((args.data / TRUTH).read_text(encoding="utf-8"))
    articles = [(url, html) for url, html in html_pages(str(args.data / ARTICLES)) if url in truth]
    print(f"{len(articles)} article pages with human main text", file=sys.stderr, flush=True)

    # Teacher labels of the article pages (for CV training and the "vs teacher" column).
    labelled = {url: label_page(url, html, teacher) for url, html in articles}
    cc_rows = [row for row in (data_dir / "train.txt").read_text(encoding="utf-8").splitlines() if row]
    cv_scores: dict[str, np.ndarray] = {}
    cv_scores_text: dict[str, np.ndarray] = {}
    config = BuildConfig()
    for fold in range(args.folds):
        rows = list(cc_rows)
        for url, page in labelled.items():
            if fold_of(url, args.folds) != fold and page.lines:
                rows += [row for _lang, (_d, row) in training_examples(page.to_json(), config)]
        random.Random(fold).shuffle(rows)
        train_file = work / f"cv{fold}.txt"
        train_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
        model_path = work / f"cv{fold}.bin"
        train_fasttext(str(train_file), str(model_path), MainContentTrainConfig())
        model = MainContentModel.load(str(model_path))
        for url, page in labelled.items():
            if fold_of(url, args.folds) == fold and page.lines:
                cv_scores[url] = model.score_lines_with_flags(page.lines, page.html_main)
                cv_scores_text[url] = model.score_lines_with_flags(page.lines, None)
        print(f"fold {fold}: trained on {len(rows)} lines", file=sys.stderr, flush=True)

    def keep(lines, scores, threshold=0.5):
        return "\n".join(line for line, s in zip(lines, scores) if s >= threshold)

    def jus(html):
        paragraphs = justext.justext(html.encode("utf-8"), justext.get_stoplist("English"))
        return "\n".join(p.text for p in paragraphs if not p.is_boilerplate)

    systems = {
        "no filter (all html_to_lines text)": lambda url, html: "\n".join(html_to_lines(html)),
        "rule-based default (heuristic >= 0.5)": lambda url, html: keep(
            lines := html_to_lines(html), heuristic_main_content_scores(lines)),
        "classifier, trained on CC samples only": lambda url, html: model_kept_text(cc_model, html),
        "classifier, trained on CC samples only, text only (no HTML feature)": lambda url, html: model_kept_text(
            cc_model, html, use_html=False),
        f"classifier, {args.folds}-fold CV by page": lambda url, html: keep(labelled[url].lines,
                                                                              cv_scores.get(url, [])),
        f"classifier, {args.folds}-fold CV by page, text only": lambda url, html: keep(
            labelled[url].lines, cv_scores_text.get(url, [])),
        "jusText (English stoplist)": lambda url, html: jus(html),
        "resiliparse main_content=True": lambda url, html: extract_plain_text(
            html, preserve_formatting=True, main_content=True),
        "teacher: trafilatura favor_precision": lambda url, html: teacher_extract(html, teacher) or "",
    }
    quality = {}
    for name, extract in systems.items():
        started = time.process_time()
        kept = [(url, extract(url, html) or "") for url, html in articles]
        seconds = time.process_time() - started
        quality[name] = {
            "f1_vs_human": float(np.mean([token_f1(text, truth[url]) for url, text in kept])),
            "f1_vs_teacher": float(np.mean([token_f1(text, labelled[url].teacher_text) for url, text in kept])),
            "cpu_ms_per_page": 1000 * seconds / len(articles),
        }
        print(f"{name}: {quality[name]}", file=sys.stderr, flush=True)
    return quality


def measure_speed(args, cc_model, cc_model_path: Path, teacher) -> dict:
    """CPU-time speeds on the article pages plus the CC pages (module docstring)."""
    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.read.readers import check_pattern_matches, read_records
    from pipelines.main_content.labels import teacher_extract
    from pipelines.main_content.model import html_main_flags
    from pipelines.clean.config import CleanConfig
    from pipelines.clean.document import clean_document
    from pipelines.text.html import html_to_lines, parse_html, tree_to_lines
    from pipelines.text.langid import LanguageIdentifier

    docs = [r for pattern in (str(args.data / ARTICLES), str(args.data / CC))
            for path in check_pattern_matches(pattern) for r in read_records(path, "warc")
            if isinstance(r, Document) and r.kind == KIND_HTML]
    line_lists = [lines for lines in (html_to_lines(d.body) for d in docs) if lines]
    n_lines = sum(map(len, line_lists))
    classify = best_cpu_seconds(lambda: [cc_model.score_lines(lines) for lines in line_lists], args.repeats)
    predict_only = best_cpu_seconds(lambda: [cc_model.raw_scores(lines) for lines in line_lists], args.repeats)

    def classify_page(html):  # as labse-clean does it: one parse for the lines and the HTML feature
        tree = parse_html(html)
        lines = tree_to_lines(tree)
        return cc_model.score_lines_with_flags(lines, html_main_flags(lines, tree))

    pages_model = best_cpu_seconds(lambda: [classify_page(d.body) for d in docs], args.repeats)
    trees = [parse_html(d.body) for d in docs]
    tree_lines = [tree_to_lines(tree) for tree in trees]
    html_feature = best_cpu_seconds(lambda: [html_main_flags(lines, tree) for lines, tree in zip(tree_lines, trees)],
                                    args.repeats)
    pages_model_text = best_cpu_seconds(lambda: [cc_model.score_lines(html_to_lines(d.body)) for d in docs],
                                        args.repeats)
    pages_teacher = best_cpu_seconds(lambda: [teacher_extract(d.body, teacher) for d in docs], 2)
    lid = LanguageIdentifier()
    clean_config = CleanConfig(main_content_model=str(cc_model_path))
    pages_clean = best_cpu_seconds(lambda: [clean_document(d, lid, clean_config, cc_model) for d in docs], args.repeats)
    speed = {
        "lines": n_lines,
        "pages": len(docs),
        "score_lines_lines_per_cpu_s": n_lines / classify,
        "featurise_plus_fasttext_lines_per_cpu_s": n_lines / predict_only,
        "parse_lines_html_feature_classifier_pages_per_cpu_s": len(docs) / pages_model,
        "html_feature_cpu_ms_per_page": 1000 * html_feature / len(docs),
        "html_to_lines_plus_classifier_text_only_pages_per_cpu_s": len(docs) / pages_model_text,
        "clean_document_with_classifier_pages_per_cpu_s": len(docs) / pages_clean,
        "teacher_pages_per_cpu_s": len(docs) / pages_teacher,
    }
    speed["ratio_extraction_vs_teacher"] = (speed["parse_lines_html_feature_classifier_pages_per_cpu_s"]
                                            / speed["teacher_pages_per_cpu_s"])
    speed["ratio_extraction_text_only_vs_teacher"] = (speed["html_to_lines_plus_classifier_text_only_pages_per_cpu_s"]
                                                      / speed["teacher_pages_per_cpu_s"])
    speed["ratio_clean_stage_vs_teacher"] = speed["clean_document_with_classifier_pages_per_cpu_s"] / speed["teacher_pages_per_cpu_s"]
    return speed


def report(quality: dict, speed: dict) -> None:
    n_lines, pages = speed["lines"], speed["pages"]
    if quality:
        print_quality(quality)
    print(f"\nclassification: {speed['score_lines_lines_per_cpu_s']:,.0f} lines/s per core with page smoothing "
          f"({speed['featurise_plus_fasttext_lines_per_cpu_s']:,.0f} without), {n_lines} lines")
    print(f"HTML -> one parse -> lines + HTML feature -> classifier: "
          f"{speed['parse_lines_html_feature_classifier_pages_per_cpu_s']:.0f} pages/s per core; "
          f"teacher trafilatura.extract: {speed['teacher_pages_per_cpu_s']:.0f} pages/s per core; "
          f"ratio {speed['ratio_extraction_vs_teacher']:.1f}x ({pages} pages); of which the HTML feature "
          f"(html_main_flags on the parsed page) {speed['html_feature_cpu_ms_per_page']:.2f} ms per page")
    print(f"HTML -> lines -> classifier, text only (no HTML feature): "
          f"{speed['html_to_lines_plus_classifier_text_only_pages_per_cpu_s']:.0f} pages/s per core; "
          f"ratio {speed['ratio_extraction_text_only_vs_teacher']:.1f}x")
    print(f"labse-clean per-document stage with the classifier (lines, classifier, lid.176, sentences, filters): "
          f"{speed['clean_document_with_classifier_pages_per_cpu_s']:.0f} pages/s per core; "
          f"ratio vs teacher {speed['ratio_clean_stage_vs_teacher']:.1f}x")


# labse-clean's main-content modes (--modes): a kind is a mode ("classifier", "teacher",
# "fallback=SHARE") or a peer ("trafilatura", "resiliparse").
PEER_KINDS = ("trafilatura", "resiliparse")


def _mode_config(kind: str, model_path: str):
    from pipelines.clean.config import CleanConfig

    if kind == "teacher":
        return CleanConfig(main_content_teacher=True)
    if kind.startswith("fallback="):
        return CleanConfig(main_content_model=model_path, main_content_fallback=float(kind.split("=", 1)[1]))
    return CleanConfig(main_content_model=model_path)


def _peer(kind: str):
    if kind == "trafilatura":
        import trafilatura

        return trafilatura.extract
    from resiliparse.extract.html2text import extract_plain_text

    return lambda html: extract_plain_text(html, preserve_formatting=True, main_content=True)


def one_speed_run(kind: str, warc: str, model_path: str) -> int:
    """In this fresh process: the whole labse-clean command in mode `kind`, or the peer `kind` over
    the decoded pages; prints {"pages", "cpu"} as JSON."""
    import resource
    import shutil

    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.read.readers import read_records

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    if kind in PEER_KINDS:
        extract = _peer(kind)
        docs = [r.body for r in read_records(warc, "warc") if isinstance(r, Document) and r.kind == KIND_HTML]
        extract(docs[0])  # imports and lazy set-up outside the clock
        started = cpu()
        for html in docs:
            extract(html)
        pages = len(docs)
    else:
        from pipelines.clean.cli import run

        out = tempfile.mkdtemp(prefix="modes-clean-")
        started = cpu()
        stats = run([(warc, "warc")], out, _mode_config(kind, model_path), ["--direct_num_workers", "1"])
        pages = stats["documents_read"]
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"pages": pages, "cpu": cpu() - started}), flush=True)
    return 0


def compare_modes(args, work: Path, model, model_path: Path) -> dict:
    """Quality on the 181 article pages and whole-command speed of every mode and peer (module docstring)."""
    import statistics
    import subprocess

    import numpy as np

    from pipelines.clean.bundle import main_content_scorer, prepare_document
    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.main_content.evaluate import token_f1
    from pipelines.read.readers import read_records

    truth = json.loads((args.data / TRUTH).read_text(encoding="utf-8"))
    docs = [r for r in read_records(str(args.data / ARTICLES), "warc")
            if isinstance(r, Document) and r.kind == KIND_HTML and r.url in truth]
    shares = [float(x) for x in args.fallback.split(",") if x.strip()]
    kinds = ["classifier", *(f"fallback={share:g}" for share in shares), "teacher"]
    quality: dict = {}
    for kind in kinds:
        config = _mode_config(kind, str(model_path))
        scorer = main_content_scorer(config, None if kind == "teacher" else model)
        f1s, sent = [], 0
        for doc in docs:
            prepared = prepare_document(doc, config, scorer)
            sent += prepared.main_content_by == "fallback"
            kept = [line for line, score in zip(prepared.lines, prepared.scores or [])
                    if score >= config.main_content_threshold]
            f1s.append(token_f1("\n".join(kept), truth[doc.url]))
        quality[kind] = {"f1": float(np.mean(f1s)), "pages_to_teacher": sent if kind != "teacher" else len(docs)}
        print(f"{kind}: {quality[kind]}", file=sys.stderr, flush=True)
    for kind in PEER_KINDS:
        extract = _peer(kind)
        quality[kind] = {"f1": float(np.mean([token_f1(extract(d.body) or "", truth[d.url]) for d in docs]))}
        print(f"{kind}: {quality[kind]}", file=sys.stderr, flush=True)

    speed_input = work / "modes-input.warc.gz"
    raw = (args.data / ARTICLES).read_bytes() + (args.data / "commoncrawl/web-pages-sample.warc.gz").read_bytes()
    speed_input.write_bytes(raw * args.copies)  # concatenated gzip members are one valid .warc.gz
    wanted = {name.strip() for name in args.timed.split(",")} | {"trafilatura"}
    timed = [kind for kind in ["classifier", f"fallback={args.speed_fallback:g}", "teacher", *PEER_KINDS]
             if kind.split("=")[0] in wanted]
    rates: dict[str, list[float]] = {kind: [] for kind in timed}
    for run in range(args.runs):
        for kind in timed:  # alternated, so a change of the machine's load touches every kind alike
            done = subprocess.run([sys.executable, __file__, "--one-run", kind, str(speed_input), str(model_path)],
                                  check=True, stdout=subprocess.PIPE, text=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rates[kind].append(result["pages"] / result["cpu"])
            print(f"run {run + 1} {kind}: {result['pages']} pages, {result['cpu']:.1f} CPU s, "
                  f"{rates[kind][-1]:.1f} pages/CPU-s", file=sys.stderr, flush=True)
    reference = statistics.median(rates["trafilatura"]) if args.runs else 0.0
    # Each run's ratio to the trafilatura run of the same round: the spread of the ratio itself.
    speed = {kind: {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r,
                    "vs_trafilatura": statistics.median(r) / reference,
                    "vs_trafilatura_per_run": [ours / peer for ours, peer in zip(r, rates["trafilatura"])]}
             for kind, r in rates.items() if r}
    print(f"\n{len(docs)} article pages (quality); speed: {args.copies} copies of the article pages + web-pages "
          f"sample, {args.runs} runs each, load average {os.getloadavg()[0]:.1f}\n")
    print("| mode | token F1 (181 pages) | pages to trafilatura | pages per CPU-s, median (min-max) "
          "| vs trafilatura (per run) |")
    print("| --- | --- | --- | --- | --- |")
    for kind, q in quality.items():
        s = speed.get(kind)
        per_run = ", ".join(f"{ratio:.2f}x" for ratio in s["vs_trafilatura_per_run"]) if s else ""
        pace = (f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | {s['vs_trafilatura']:.2f}x ({per_run})"
                if s else "- | -")
        sent = q.get("pages_to_teacher")
        print(f"| {kind} | {q['f1']:.3f} | {'-' if sent is None else sent} | {pace} |")
    return {"quality": quality, "speed": speed}


def label_quality(data: Path) -> int:
    """Token F1 vs the human main text of the lines each voter / scheme labels main (module docstring)."""
    from dataclasses import replace

    import numpy as np

    from pipelines.main_content.config import TeacherConfig
    from pipelines.main_content.evaluate import html_pages, token_f1
    from pipelines.main_content.labels import (COMMITTEE_MAJORITY, justext_text, label_lines, label_page,
                                               teacher_extract)

    truth = json.loads((data / TRUTH).read_text(encoding="utf-8"))
    pages = [(url, html) for url, html in html_pages(str(data / ARTICLES)) if url in truth]
    recall_mode = replace(TeacherConfig(), favor_precision=False, favor_recall=True)
    scores: dict[str, list[float]] = {}
    agreed = disputed = lines_total = 0
    for url, html in pages:
        page = label_page(url, html)
        votes = {
            "trafilatura precision (single teacher, before)": label_lines(page.lines, page.teacher_text),
            "trafilatura recall": label_lines(page.lines, teacher_extract(html, recall_mode)),
            "resiliparse main content": list(page.html_main or [False] * len(page.lines)),
            "jusText, no stoplist": label_lines(page.lines, justext_text(html)),
        }
        count = [sum(v) for v in zip(*votes.values())]
        votes[f"committee: at least {COMMITTEE_MAJORITY} of 4 (default)"] = page.labels
        for name, labels in votes.items():
            kept = "\n".join(line for line, keep in zip(page.lines, labels) if keep)
            scores.setdefault(name, []).append(token_f1(kept, truth[url]))
        agreed += sum(1 for c in count if c in (0, 4))
        disputed += sum(page.disputed or [])
        lines_total += len(page.lines)
    print(f"\n{len(pages)} article pages, {lines_total} lines: all four agree on {agreed / lines_total:.1%}, "
          f"2-2 ties (not trained on) {disputed / lines_total:.1%}\n")
    print("| labels | token F1 vs human main text |\n| --- | --- |")
    for name, values in scores.items():
        print(f"| {name} | {np.mean(values):.4f} |")
    return 0


def print_quality(quality: dict) -> None:
    print("\n| system | token F1 vs human main text | token F1 vs teacher | CPU ms/page |")
    print("| --- | --- | --- | --- |")
    for name, q in quality.items():
        # CV scores are computed during the folds, so the per-page time of those rows means nothing.
        ms = "-" if "CV" in name else f"{q['cpu_ms_per_page']:.1f}"
        print(f"| {name} | {q['f1_vs_human']:.3f} | {q['f1_vs_teacher']:.3f} | {ms} |")


if __name__ == "__main__":
    sys.exit(main())
