"""`make demo`: every stage on the sample data with DirectRunner, then one summary.

Each stage owns a `run_demo(data, out, artifacts) -> list[str]` next to its CLI; this module only
orders them, times them and prints what they report. A stage records the paths it wrote in
`artifacts` (for example `artifacts["clean_output"]`) for the stages after it.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

# (title, module defining run_demo), in data-flow order.
STAGES = [
    ("main-content classifier", "pipelines.main_content.cli"),
    ("cleaning", "pipelines.clean"),
    ("vocabulary", "vocab.cli"),
    ("mining and scoring", "pipelines.mine"),
    ("TFRecords, training, export, Tatoeba", "labse_model.demo"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared sample data folder")
    parser.add_argument("--output", type=Path, default=Path("demo_out"))
    parser.add_argument("--only", default=None, help="comma-separated stage modules to run (debugging)")
    args = parser.parse_args(argv)

    if not (args.data / "README.md").is_file():
        print(f"error: sample data not found at {args.data} (set LABSE_DATA)", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    artifacts: dict[str, str] = {}
    report: list[tuple[str, float, list[str]]] = []
    selected = set(args.only.split(",")) if args.only else None
    for title, module_name in STAGES:
        if selected is not None and module_name not in selected:
            continue
        print(f"\n=== {title} ({module_name}) ===", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(module_name)
        lines = module.run_demo(args.data.resolve(), args.output.resolve(), artifacts)
        seconds = time.perf_counter() - started
        report.append((title, seconds, lines))
        print(f"--- {title}: {seconds:.0f} s", flush=True)

    print("\n================ demo summary ================")
    total = 0.0
    for title, seconds, lines in report:
        total += seconds
        print(f"\n## {title} ({seconds:.0f} s)")
        for line in lines:
            print(line)
    print(f"\nall stages: {total:.0f} s; outputs under {args.output}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
