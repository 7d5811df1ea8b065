"""Does a DirectRunner worker grow with the data it sends through a GroupByKey? A pipeline with
none of labse-toolkit's code, of the cleaning stage's shape, measured like the scale table.

    files -> Reshuffle -> a DoFn emitting `rows` (16-byte key, ~300-byte row) pairs in all ->
        drop:    Filter(False)            nothing leaves the worker but a count
        gbk:     GroupByKey               every row goes to the runner and comes back grouped
        combine: CombinePerKey(min)       the same, through a lifted combine (as clean's dedup)
    -> Count.Globally

`--direct_running_mode multi_processing --direct_num_workers 2` (the scale table's); each cell runs
in a subprocess polled by `scale_table.measure` (peak RSS per process, the kernel's VmHWM).

    .venv/bin/python benchmarks/runner_memory.py [--rows 60000,600000] [--variants drop,gbk,combine]

Why the worker grows (apache_beam/runners/portability/fn_api_runner/execution.py,
`GroupingBuffer.partition`): the runner encodes each worker's whole share of a grouped
PCollection into ONE bytes object, and `data_plane.SizeBasedBufferingClosableOutputStream`
sends it as one Data message, so the worker holds its whole share (in the message and as bytes)
while it decodes it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

FILES = 30
BEAM = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]


def run_pipeline(rows: int, variant: str) -> None:
    import apache_beam as beam

    from pipelines.stage import beam_pipeline  # the DirectRunner as every stage runs it (no Prism attempt)

    per_file = rows // FILES

    def emit(file: int):
        for i in range(per_file):
            text = (f"file {file} sentence {i} " * 12)[:300]
            yield hashlib.blake2b(text.encode(), digest_size=16).digest(), (f"file-{file}", i, text)

    with beam_pipeline(BEAM) as pipeline:
        emitted = pipeline | beam.Create(range(FILES)) | beam.Reshuffle() | beam.FlatMap(emit)
        if variant == "drop":
            emitted = emitted | beam.Filter(lambda _: False)
        elif variant == "gbk":
            emitted = emitted | beam.GroupByKey()
        else:
            emitted = emitted | beam.CombinePerKey(min)
        _ = emitted | beam.combiners.Count.Globally() | beam.Map(print)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="60000,600000")
    parser.add_argument("--variants", default="drop,gbk,combine")
    parser.add_argument("--logs", default="/tmp/runner_memory")
    parser.add_argument("--run", nargs=2, metavar=("ROWS", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        run_pipeline(int(args.run[0]), args.run[1])
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scale_table import measure

    print("| variant | rows | wall s | CPU s | worker peaks MB | main MB | load |\n|---|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        for rows in map(int, args.rows.split(",")):
            cell = measure([sys.executable, __file__, "--run", str(rows), variant],
                           Path(args.logs) / f"{variant}-{rows}.log")
            if cell["rc"]:
                raise SystemExit(f"{variant} {rows}: failed, see {cell['log']}")
            peaks = " / ".join(f"{mb:.0f}" for mb in cell["worker_peaks_mb"] if mb > 10)
            print(f"| {variant} | {rows:,} | {cell['wall_s']:.0f} | {cell['cpu_s']:.1f} | {peaks} | "
                  f"{cell['main_peak_mb']:.0f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
