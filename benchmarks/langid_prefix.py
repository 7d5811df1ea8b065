"""How long a prefix of each line lid.176 needs: decisions changed and CPU time per prefix length.

labse-clean identifies the language of every main-content line (`pipelines.text.langid`, cut to
`MAX_LID_CHARS`). On the main-content lines of the three WARC samples (lines the rule-based scorer
keeps, at least 10 characters), for each prefix length: lid.176's CPU time (best of 3) and how many
lines get another keep/drop language decision (`decide_language`, web threshold) than with the
whole line, in one run.

    .venv/bin/python benchmarks/langid_prefix.py --data ../shared/data
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SAMPLES = ("commoncrawl/web-pages-sample.warc.gz", "commoncrawl/CC-MAIN-2020-34-sample.warc.gz",
           "maincontent/article-pages.warc.gz")
PREFIXES = (100, 150, 200, 300, 400)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    args = parser.parse_args(argv)

    from pipelines.io.documents import KIND_HTML, Document
    from pipelines.read.readers import read_records
    from pipelines.text import langid
    from pipelines.text.boilerplate import heuristic_main_content_scores
    from pipelines.text.html import html_to_lines

    lines: list[str] = []
    for sample in SAMPLES:
        for record in read_records(str(args.data / sample), "warc"):
            if isinstance(record, Document) and record.kind == KIND_HTML:
                page = html_to_lines(record.body)
                lines += [line for line, score in zip(page, heuristic_main_content_scores(page))
                          if score >= 0.5 and len(line) >= 10]
    longest = max(map(len, lines))
    print(f"{len(lines)} main-content lines, mean {sum(map(len, lines)) / len(lines):.0f} characters, "
          f"longest {longest}")

    identifier = langid.LanguageIdentifier()
    configured = langid.MAX_LID_CHARS

    def decisions_and_seconds(prefix: int) -> tuple[list, float]:
        langid.MAX_LID_CHARS = prefix
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            predictions = identifier.predict(lines)
            best = min(best, time.process_time() - started)
        decided = [langid.decide_language(lang, p, None, langid.DEFAULT_THRESHOLD) for lang, p in predictions]
        return [(d.lang, d.drop_reason) for d in decided], best

    try:
        reference, whole_seconds = decisions_and_seconds(longest)
        print("\n| prefix (characters) | lines longer | decisions changed vs whole line | lid.176 CPU s | time vs whole line |")
        print("| --- | --- | --- | --- | --- |")
        for prefix in PREFIXES:
            decisions, seconds = decisions_and_seconds(prefix)
            changed = sum(a != b for a, b in zip(decisions, reference))
            mark = " (labse-clean)" if prefix == configured else ""
            print(f"| {prefix}{mark} | {sum(len(line) > prefix for line in lines)} | {changed} "
                  f"({100 * changed / len(lines):.2f}%) | {seconds:.3f} | {seconds / whole_seconds:.2f} |")
        print(f"| whole line | 0 | 0 | {whole_seconds:.3f} | 1.00 |")
    finally:
        langid.MAX_LID_CHARS = configured
    return 0


if __name__ == "__main__":
    sys.exit(main())
