"""Three small choices in the code, measured: the figures their comments used to carry.

    .venv/bin/python benchmarks/code_choices.py --data ../shared/data [--part pretokenize|smoothing|tensorboard]

- pretokenize: `pipelines.text.pretokenize` splits words with a Python regex equal to HF `tokenizers`' BERT
  pre-tokeniser; per sentence of Multi30k train (de and en, 10,000 lines each), the regex against
  the pre-tokeniser's `pre_tokenize_str`, both on the same normalised text, best of 3.
- smoothing: `pipelines.main_content.model` smooths pages shorter than `_NUMPY_FROM_LINES` lines in
  plain Python and longer ones with numpy (the same float64 operations); per page size, both
  implementations on real lines of the sample WARCs, best of 5, to find where numpy starts to win.
- tensorboard: `labse_model.run_log.summary_writer` registers `tensorboard.compat.notf` so that
  TensorBoard does not import TensorFlow; a fresh process writing one scalar with and without the
  marker (wall time, peak RSS).
Prints one JSON line per measurement.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository's packages, not benchmarks/vocab.py as `vocab`


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench_pretokenize(data: Path) -> None:
    from pipelines.text.pretokenize import _normalizer, _word_pattern, bert_pre_tokenizer

    lines: list[str] = []
    for lang in ("de", "en"):
        with gzip.open(data / f"multi30k/train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += [line.rstrip("\n") for _, line in zip(range(10_000), f)]
    normalised = [_normalizer(True).normalize_str(line) for line in lines]
    pattern, pre_tokenizer = _word_pattern(), bert_pre_tokenizer()
    assert all(pattern.findall(t) == [w for w, _ in pre_tokenizer.pre_tokenize_str(t)] for t in normalised[:2000])
    ours = best_of(3, lambda: [pattern.findall(t) for t in normalised])
    theirs = best_of(3, lambda: [pre_tokenizer.pre_tokenize_str(t) for t in normalised])
    emit({"part": "pretokenize", "sentences": len(lines),
          "regex_us_per_sentence": round(ours / len(lines) * 1e6, 2),
          "hf_pre_tokenize_str_us_per_sentence": round(theirs / len(lines) * 1e6, 2),
          "speed-up": round(theirs / ours, 2)})


def bench_smoothing(data: Path) -> None:
    import numpy as np

    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.read.readers import read_records
    from pipelines.main_content import model
    from pipelines.text.boilerplate import heuristic_main_content_scores
    from pipelines.text.html import html_to_lines

    lines: list[str] = []
    for record in read_records(str(data / "commoncrawl/web-pages-sample.warc.gz"), "warc"):
        if isinstance(record, Document) and record.kind == KIND_HTML:
            lines += html_to_lines(record.body)
    raw = [float(s) for s in heuristic_main_content_scores(lines)]
    args = (model.REGION_MIN_SHARE, model.OUTSIDE_REGION_FACTOR)
    for size in (25, 50, 75, 100, 150, 200, 400):
        pages = [(raw[i:i + size], lines[i:i + size]) for i in range(0, len(lines) - size, size)][:200]
        for scores, page in pages[:5]:  # the two implementations agree
            short = np.array(model._postprocess_short(scores, page, 0.5, *args), dtype=np.float32)
            long_ = model._postprocess_long(np.array(scores), page, 2, 0.5, *args)
            assert np.array_equal(short, np.asarray(long_, dtype=np.float32))
        python_s = best_of(5, lambda: [model._postprocess_short(s, p, 0.5, *args) for s, p in pages])
        numpy_s = best_of(5, lambda: [model._postprocess_long(np.array(s), p, 2, 0.5, *args) for s, p in pages])
        emit({"part": "smoothing", "lines_per_page": size, "pages": len(pages),
              "python_us_per_page": round(python_s / len(pages) * 1e6, 1),
              "numpy_us_per_page": round(numpy_s / len(pages) * 1e6, 1),
              "numpy_vs_python": round(numpy_s / python_s, 2)})


TENSORBOARD_CHILD = """
import resource, sys, tempfile, time, types
started = time.perf_counter()
if sys.argv[1] == "notf":
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
from torch.utils.tensorboard import SummaryWriter
with tempfile.TemporaryDirectory() as d:
    writer = SummaryWriter(d)
    writer.add_scalar("loss", 1.0, 0)
    writer.close()
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      "tensorflow" in sys.modules)
"""


def bench_tensorboard(repeats: int = 2) -> None:
    for mode in ("notf", "default") * repeats:
        out = subprocess.run([sys.executable, "-c", TENSORBOARD_CHILD, mode], check=True, capture_output=True,
                             text=True, cwd=ROOT).stdout.split()
        emit({"part": "tensorboard", "mode": mode, "seconds_to_first_scalar": round(float(out[-3]), 2),
              "peak_rss_mb": round(float(out[-2])), "tensorflow_imported": out[-1] == "True"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--part", choices=("pretokenize", "smoothing", "tensorboard"), action="append")
    args = parser.parse_args(argv)
    parts = args.part or ["pretokenize", "smoothing", "tensorboard"]
    if "pretokenize" in parts:
        bench_pretokenize(args.data)
    if "smoothing" in parts:
        bench_smoothing(args.data)
    if "tensorboard" in parts:
        bench_tensorboard()
    return 0


if __name__ == "__main__":
    sys.exit(main())
