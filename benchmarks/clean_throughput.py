"""Cleaning throughput: the labse-clean pipeline vs a `trafilatura.extract` loop, on the same pages.

The web-pages WARC (110 real pages) is repeated to at least --pages pages (default 10,000). Each of
our workloads is measured AT THE SAME TIME as its peer: ours runs in this process while the peer
runs in a second process (on the other core) over the same pages, decoded before it starts, in a
loop, until ours ends. Both rates are pages per CPU second of their own process over the same
wall-clock window, so a change of the machine's speed moves both alike: run one after the other,
two identical runs here differed by 10% (BENCHMARKS.md); run side by side, the pipeline's ratios
stayed within 3% over 3 runs (the text loop's, which holds all decoded pages in its process,
within 10%). Workloads and their peers:

  text loop         our text functions without Beam, as the pipeline's cleaning step runs them:
                    `prepare_document` per page (HTML to lines), then `clean_bundle` per bundle of
                    256 pages (heuristic main content, one lid.176 call, sentences, filters) and the
                    bundle's `dedup_keys`, plus a dict for dedup; given pages already decoded
  pipeline          the whole `labse-clean` Beam pipeline (DirectRunner, one in-process worker): WARC
                    reading and decompression, all of the above, dedup, Parquet, errors, stats.json
     peer of both:  `trafilatura.extract(html)` per page (what datatrove-style pipelines run), given
                    HTML already decoded by our reader (its reading is NOT timed: in its favour)
  ... + model       the text loop and the pipeline with the fastText main-content classifier
                    (`--main-content-model PATH`, else one is trained first with `labse-main-content
                    build-data` + `train` on commoncrawl/*.warc.gz; training is not timed), scoring
                    every line with the page's HTML feature
     peer of both:  `pipelines.main_content.labels.teacher_extract` (trafilatura, favor_precision,
                    tables): the classifier's teacher, issue 3's speed reference

Side by side, both processes run slower than alone (shared caches and memory bandwidth).
--alternate N adds a check without that contention (but with the drift back): N rounds of the peer
(on 3,300 pages) and then the pipeline, each alone on the machine in a fresh process.

--runs N repeats all four pairs; ratios are printed per run and as mean (min-max). "Beam overhead" =
(text loop vs peer) / (pipeline vs peer), the pipeline's extra CPU per page with the drift
cancelled. Last, the CPU cost of each step of the text path per page, each step timed alone.

    .venv/bin/python benchmarks/clean_throughput.py --data ../shared/data [--pages 10000] [--runs 3] \
        [--main-content-model model.bin | --no-model] [--alternate 4]
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WEB_PAGES = "commoncrawl/web-pages-sample.warc.gz"
# Measure the code of this checkout, not whatever `pipelines` the environment installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
BUNDLE = 256  # documents per clean_bundle call, as the pipeline's default (DEFAULT_BUNDLE_DOCUMENTS)
PEERS = ("trafilatura", "teacher")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg()) + " (1/5/15 min)"


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (the peer is waited for only after
    our workload's time is taken)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def peer_extractor(kind: str):
    if kind == "trafilatura":
        import trafilatura

        return trafilatura.extract
    from pipelines.main_content.labels import teacher_extract

    return teacher_extract


def run_peer(kind: str, warc: str, stop_file: str) -> int:
    """The peer process: decode the pages (not timed), say "ready", extract pages in a loop until
    `stop_file` exists, then print pages done and CPU / wall seconds as JSON."""
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records

    extract = peer_extractor(kind)
    docs = [r for r in read_records(warc, "warc") if isinstance(r, Document)]
    extract(docs[0].body)  # imports and lazy set-up outside the window
    print("ready", flush=True)
    pages, started_cpu, started_wall = 0, time.process_time(), time.perf_counter()
    while not os.path.exists(stop_file):
        for doc in docs:
            extract(doc.body)
            pages += 1
            if pages % 16 == 0 and os.path.exists(stop_file):
                break
    print(json.dumps({"pages": pages, "cpu": time.process_time() - started_cpu,
                      "wall": time.perf_counter() - started_wall}), flush=True)
    return 0


ALONE_PEER_PAGES = 3300  # 30 passes over the 110 distinct pages: the peer's rate, in a fraction of the time


def run_alone(kind: str, warc: str, model: str | None, out: str) -> int:
    """One measurement alone in this fresh process: a peer on the first ALONE_PEER_PAGES pages
    (decoded before the clock starts), or the labse-clean pipeline on the whole WARC. Prints pages
    and CPU seconds as JSON."""
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records

    if kind in PEERS:
        extract = peer_extractor(kind)
        docs = [r for r in read_records(warc, "warc") if isinstance(r, Document)][:ALONE_PEER_PAGES]
        extract(docs[0].body)
        started = time.process_time()
        for doc in docs:
            extract(doc.body)
        print(json.dumps({"pages": len(docs), "cpu": time.process_time() - started}), flush=True)
        return 0
    from pipelines.clean.cli import run
    from pipelines.clean.config import CleanConfig

    shutil.rmtree(out, ignore_errors=True)
    started = cpu_seconds()
    stats = run([(warc, "warc")], out, CleanConfig(main_content_model=model), ["--direct_num_workers", "1"])
    print(json.dumps({"pages": stats["documents_read"], "cpu": cpu_seconds() - started}), flush=True)
    return 0


def alone_rate(kind: str, warc: Path, model: str | None, workdir: Path) -> float:
    """Pages per CPU second of `run_alone` in a fresh process."""
    argv = [sys.executable, __file__, "--alone", kind, "--alone-input", str(warc), "--alone-out", str(workdir / "out")]
    if model:
        argv += ["--alone-model", model]
    done = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["pages"] / result["cpu"]


class BesidePeer:
    """Time a workload of ours (CPU and wall) while `peer` extracts pages in a second process."""

    def __init__(self, peer: str, warc: Path, workdir: Path):
        self.peer, self.warc, self.stop_file = peer, warc, workdir / f"stop-{peer}"

    def __enter__(self):
        self.stop_file.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--peer", self.peer, "--peer-input", str(self.warc),
             "--peer-stop", str(self.stop_file)], stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"peer {self.peer} did not start")
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, exc_type, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = cpu_seconds() - self.cpu
        self.stop_file.touch()
        line = self.process.stdout.readline()
        self.process.wait()
        self.stop_file.unlink(missing_ok=True)
        if exc_type is None:
            self.peer_result = json.loads(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--pages", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3, help="repetitions of the four measurements")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--main-content-model", default=None, metavar="PATH",
                        help="main-content model for the '+ model' rows (default: train one first, untimed)")
    parser.add_argument("--no-model", action="store_true", help="skip the '+ model' rows")
    parser.add_argument("--alternate", type=int, default=0, metavar="N",
                        help="also N rounds of peer and pipeline alternated, each alone in a fresh process")
    parser.add_argument("--alone", choices=(*PEERS, "pipeline"), help=argparse.SUPPRESS)  # internal
    parser.add_argument("--alone-input", help=argparse.SUPPRESS)
    parser.add_argument("--alone-model", help=argparse.SUPPRESS)
    parser.add_argument("--alone-out", help=argparse.SUPPRESS)
    parser.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)  # the peer process (internal)
    parser.add_argument("--peer-input", help=argparse.SUPPRESS)
    parser.add_argument("--peer-stop", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.WARNING)
    if args.peer:
        return run_peer(args.peer, args.peer_input, args.peer_stop)
    if args.alone:
        return run_alone(args.alone, args.alone_input, args.alone_model, args.alone_out)

    import pipelines
    from pipelines.clean.cli import run
    from pipelines.io.documents import Document
    from pipelines.read.readers import read_records
    from pipelines.clean.bundle import clean_bundle, prepare_document
    from pipelines.clean.config import CleanConfig
    from pipelines.text.langid import LanguageIdentifier
    from pipelines.text.normalise import dedup_keys

    print(f"code: {Path(pipelines.__file__).parent}; load average {load()}", file=sys.stderr, flush=True)

    source = args.data / WEB_PAGES
    pages_once = [r for r in read_records(str(source), "warc") if isinstance(r, Document)]
    copies = math.ceil(args.pages / len(pages_once))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="clean-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    repeated = workdir / "web-pages-repeated.warc.gz"
    raw = source.read_bytes()
    repeated.write_bytes(raw * copies)  # concatenated gzip streams are one valid .warc.gz
    docs = [r for r in read_records(str(repeated), "warc") if isinstance(r, Document)]
    n = len(docs)
    print(f"{n} pages ({len(pages_once)} distinct x {copies}), {sum(len(d.body) for d in docs) / 1e6:.0f} MB of HTML",
          file=sys.stderr, flush=True)
    model_path = None
    if not args.no_model:
        model_path = args.main_content_model or train_model(args.data, workdir)

    def text_loop(config: CleanConfig) -> str:
        model = None
        lid = LanguageIdentifier()
        if config.main_content_model:
            from pipelines.main_content.model import MainContentModel

            model = MainContentModel.load(config.main_content_model)
        seen: dict[bytes, tuple] = {}
        for start in range(0, len(docs), BUNDLE):
            prepared = [prepare_document(doc, config, model) for doc in docs[start:start + BUNDLE]]
            result = clean_bundle(prepared, lid, config)
            for key, row in zip(dedup_keys(result.text, result.lang), result.row_tuples()):
                seen.setdefault(key, row[:2])
        return f"{len(seen)} unique sentences"

    def pipeline(config: CleanConfig) -> str:
        out = workdir / "out"
        shutil.rmtree(out, ignore_errors=True)
        stats = run([(str(repeated), "warc")], str(out), config, ["--direct_num_workers", "1"])
        assert stats["documents_read"] >= n and stats["identity_holds"]
        return f"{stats['sentences_kept']} sentences kept"

    plain, with_model = CleanConfig(), CleanConfig(main_content_model=str(model_path) if model_path else None)
    workloads = [("text functions, bundles of 256, no Beam", text_loop, plain, "trafilatura"),
                 ("labse-clean pipeline (DirectRunner)", pipeline, plain, "trafilatura")]
    if model_path:
        workloads += [("text functions + main-content model, no Beam", text_loop, with_model, "teacher"),
                      ("labse-clean pipeline + main-content model", pipeline, with_model, "teacher")]
    ratios: dict[str, list[float]] = {name: [] for name, *_ in workloads}
    print("| run | what | ours: CPU s, pages/s/core | peer (beside it) | peer: pages, CPU s, pages/s/core | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run_index in range(1, args.runs + 1):
        for name, workload, config, peer in workloads:
            with BesidePeer(peer, repeated, workdir) as timed:
                outcome = workload(config)
            theirs = timed.peer_result
            ours_rate, peer_rate = n / timed.cpu, theirs["pages"] / theirs["cpu"]
            ratios[name].append(ours_rate / peer_rate)
            print(f"| {run_index} | {name} | {timed.cpu:.1f}, {ours_rate:.0f} | {peer} | {theirs['pages']}, "
                  f"{theirs['cpu']:.1f}, {peer_rate:.1f} | {ours_rate / peer_rate:.2f}x |", flush=True)
            print(f"  ({outcome}; {timed.wall:.1f} s wall; load average {load()})", file=sys.stderr, flush=True)

    print(f"\n{n} pages of {WEB_PAGES} repeated x{copies}; {args.runs} runs; load average {load()} at the end\n")
    print("| what | vs | ratio, mean (min-max) |")
    print("| --- | --- | --- |")
    for name, *_, peer in workloads:
        values = ratios[name]
        if not values:  # --runs 0: only the alternated check
            continue
        print(f"| {name} | {peer} | {sum(values) / len(values):.2f}x ({min(values):.2f}-{max(values):.2f}) |")
    names = [name for name, *_ in workloads]
    for suffix, loop, pipe in zip((" without the model", " with the model"), names[0::2], names[1::2]):
        if ratios[pipe]:
            overhead = [a / b for a, b in zip(ratios[loop], ratios[pipe])]
            print(f"\nBeam overhead{suffix} ((text loop vs peer) / (pipeline vs peer)): "
                  f"{sum(overhead) / len(overhead):.2f}x ({min(overhead):.2f}-{max(overhead):.2f})")
    if args.alternate:
        pairs = [("labse-clean pipeline", "trafilatura", None)]
        if model_path:
            pairs.append(("labse-clean pipeline + main-content model", "teacher", str(model_path)))
        alternated: dict[str, list[float]] = {name: [] for name, *_ in pairs}
        print(f"\nAlternated, each alone in a fresh process ({args.alternate} rounds; the peer on "
              f"{ALONE_PEER_PAGES} pages, ours on {n}):\n")
        print("| round | what | ours pages/s/core | peer | peer pages/s/core | ratio |")
        print("| --- | --- | --- | --- | --- | --- |")
        for round_index in range(1, args.alternate + 1):
            for name, peer, model in pairs:
                peer_rate = alone_rate(peer, repeated, None, workdir)
                ours_rate = alone_rate("pipeline", repeated, model, workdir)
                alternated[name].append(ours_rate / peer_rate)
                print(f"| {round_index} | {name} | {ours_rate:.0f} | {peer} | {peer_rate:.1f} | "
                      f"{ours_rate / peer_rate:.2f}x |", flush=True)
        for name, peer, _ in pairs:
            values = alternated[name]
            print(f"\n{name} vs {peer}, alternated: {sum(values) / len(values):.2f}x "
                  f"({min(values):.2f}-{max(values):.2f})")
    print("\nWhere one page's CPU time goes (ms per page; each step timed alone, best of 3 passes over "
          f"the {len(pages_once)} distinct pages x10, bundles of {BUNDLE}; steps after the heuristic on the "
          "lines it keeps):\n")
    print("| step | ms/page |")
    print("| --- | --- |")
    for step, ms in stage_costs(source, pages_once).items():
        print(f"| {step} | {ms:.2f} |")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def stage_costs(source: Path, pages: list, copies: int = 10, passes: int = 3) -> dict[str, float]:
    """CPU ms per page of each step of the cleaning step (rule-based main content), each timed
    alone: the per-page steps on every page, the bundle steps on bundles of BUNDLE pages."""
    from collections import Counter

    import numpy as np

    from pipelines.read.readers import read_records
    from pipelines.text.boilerplate import heuristic_scores_of_documents
    from pipelines.clean.bundle import clean_bundle, prepare_document
    from pipelines.clean.config import CleanConfig
    from pipelines.text.filters import first_failure_codes
    from pipelines.text.html import parse_html, tree_to_lines
    from pipelines.text.langid import DEFAULT_THRESHOLD, LanguageIdentifier, decide_language
    from pipelines.text.normalise import clean_text, dedup_keys
    from pipelines.text.sentences import split_sentences

    config = CleanConfig()
    lid = LanguageIdentifier()
    first_failure_codes(["Warm-up of the filter tables."], ["en"])
    docs = pages * copies
    best: dict[str, float] = {}

    def keep_best(name: str, seconds: float, count: int) -> None:
        best[name] = min(best.get(name, float("inf")), 1000 * seconds / count)

    for _ in range(passes):
        started = time.process_time()
        list(read_records(str(source), "warc"))
        keep_best("read WARC + inflate + decode (FastWARC, ISA-L)", time.process_time() - started, len(pages))
        spent: Counter = Counter()
        page_lines = []
        for doc in docs:
            t0 = time.process_time()
            tree = parse_html(doc.body)
            t1 = time.process_time()
            page_lines.append(tree_to_lines(tree))
            spent["resiliparse parse"] += t1 - t0
            spent["resiliparse extract + line clean-up"] += time.process_time() - t1
        for start in range(0, len(docs), BUNDLE):
            bundle = page_lines[start:start + BUNDLE]
            lines = [line for page in bundle for line in page]
            bounds = np.concatenate(([0], np.cumsum([len(page) for page in bundle])))
            t2 = time.process_time()
            scores = heuristic_scores_of_documents(lines, bounds)
            t3 = time.process_time()
            wanted = [line for line, score in zip(lines, scores.tolist())
                      if score >= config.main_content_threshold and len(line) >= config.min_chars]
            predictions = lid.predict(wanted)
            t4 = time.process_time()
            spent["heuristic main-content scores (per bundle)"] += t3 - t2
            spent["lid.176 (one call per bundle)"] += t4 - t3
            texts, langs = [], []
            for line, (lang, probability) in zip(wanted, predictions):
                decision = decide_language(lang, probability, None, DEFAULT_THRESHOLD)
                if decision.lang is None:
                    continue
                t5 = time.process_time()
                cleaned = clean_text(line)
                t6 = time.process_time()
                sentences = split_sentences(cleaned, decision.lang)
                t7 = time.process_time()
                texts += sentences
                langs += [decision.lang] * len(sentences)
                spent["clean_text"] += t6 - t5
                spent["sentencex"] += t7 - t6
            t8 = time.process_time()
            codes = first_failure_codes(texts, langs, config.filters())
            t9 = time.process_time()
            kept = (codes < 0).tolist()
            dedup_keys([t for t, k in zip(texts, kept) if k], [g for g, k in zip(langs, kept) if k])
            t10 = time.process_time()
            spent["filters (per bundle)"] += t9 - t8
            spent["dedup keys (per bundle)"] += t10 - t9
        for name, seconds in spent.items():
            keep_best(name, seconds, len(docs))
        started = time.process_time()
        for start in range(0, len(docs), BUNDLE):
            result = clean_bundle([prepare_document(doc, config) for doc in docs[start:start + BUNDLE]], lid, config)
            dedup_keys(result.text, result.lang)
            result.row_tuples()
        keep_best("prepare_document + clean_bundle + dedup keys + rows: all of the above but reading",
                  time.process_time() - started, len(docs))
    return best


def train_model(data: Path, workdir: Path) -> Path:
    """A main-content model trained on the Common Crawl samples, as `make demo` does (not timed)."""
    from pipelines.main_content.cli import main as main_content

    data_dir, model = workdir / "main-content-data", workdir / "main-content.bin"
    print("training a main-content model (not timed) ...", file=sys.stderr, flush=True)
    if main_content(["build-data", "--input", str(data / "commoncrawl/*.warc.gz"), "--output", str(data_dir), "--overwrite"]) != 0:
        raise RuntimeError("labse-main-content build-data failed")
    if main_content(["train", "--data", str(data_dir), "--output", str(model)]) != 0:
        raise RuntimeError("labse-main-content train failed")
    return model


if __name__ == "__main__":
    sys.exit(main())
