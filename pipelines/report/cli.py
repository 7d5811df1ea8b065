"""labse-report RUN_ROOT: one self-contained HTML page with every stage's books, pictures and curves.

Finds the stage outputs under RUN_ROOT (the demo's layout, a bucket's, or any other: outputs are
recognised by the files they carry), and writes one static page: images embedded, no script, no
network. Stages whose books do not balance are flagged at the top.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time

from pipelines.io import storage
from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.console import add_verbose_option, start_logging
from pipelines.io.config_options import HelpFormatter, UsageError, add_config_options, config_from_args
from pipelines.report.config import DEFAULT_NAME, ReportConfig
from pipelines.report.discover import RunRoot, data_flow_position, discover
from pipelines.report.page import render
from pipelines.report.sections import section_for

PROG = "labse-report"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("root", metavar="RUN_ROOT", help="the run's root folder (local or gs://), e.g. demo_out")
    add_config_options(parser, ReportConfig)
    return add_verbose_option(parser)


def write_report(root_url: str, config: ReportConfig) -> tuple[str, int, int]:
    """Write the page; returns (where, sections, flags)."""
    root = RunRoot(root_url)
    if not root.exists(root.root):
        raise UsageError(f"RUN_ROOT {root_url} does not exist")
    found = sorted(discover(root, max_depth=config.max_depth), key=data_flow_position)
    sections = []
    for index, item in enumerate(found, 1):
        started = time.perf_counter()
        sections.append(section_for(root, item))
        print(f"{PROG}: [{index}/{len(found)}] {item.kind} at {item.path} "
              f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    generated = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    page = render(config.title or f"Run report: {root_url}", root_url, generated, sections)
    output = config.output or storage.join(root_url, DEFAULT_NAME)
    write_bytes_atomic(output, page.encode("utf-8"))  # whole or not at all, local or gs://
    return output, len(sections), sum(len(s.flags) for s in sections)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(start_logging(argv, "%(levelname)s %(message)s"))
    try:
        config = config_from_args(ReportConfig, args)
        output, sections, flags = write_report(args.root, config)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{PROG}: {sections} sections, {flags} flagged, written to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
