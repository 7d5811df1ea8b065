"""What the launcher checks of issue 26 cost before a Beam stage starts (no pipeline runs).

  parse        a Beam command's options with 6 Beam options: the check that every unknown option
               is one of Beam's (stage_parser), per call
  root         require_stage_output on a glob inside a labse-clean output (walks up from the real
               path), per call
  pairs-types  labse-score's column-type check over a labse-mine-like output of N real Multi30k
               pairs (Parquet schemas only)
  labelled     labse-score's --labelled check when no pair matches (the worst case: the src and tgt
               columns are read in full; a match stops at once)

    nice -n 10 .venv/bin/python benchmarks/launcher_checks.py --data ../shared/data --work bench_out/checks \\
        [--pairs 500000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import time
from pathlib import Path


def _timed(function, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


def _report(name: str, seconds: list[float], unit: str = "ms") -> None:
    scale = 1000.0 if unit == "ms" else 1.0
    print(f"{name}: median {statistics.median(seconds) * scale:.2f} {unit} "
          f"(min {min(seconds) * scale:.2f}, max {max(seconds) * scale:.2f}; {len(seconds)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="LABSE_DATA (multi30k/train.*.gz)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines import score
    from pipelines.io.completion import mark_complete, require_stage_output

    shutil.rmtree(args.work, ignore_errors=True)
    argv = ["--pairs", "p", "--output", "o", "--model", "m", "--runner", "DirectRunner", "--direct_num_workers",
            "2", "--temp_location", "/tmp/t"]
    _report("parse", _timed(lambda: score.make_parser().parse_known_args(argv), args.repeats * 20))

    clean = args.work / "clean"
    (clean / "sentences" / "lang=de").mkdir(parents=True)
    mark_complete(clean, {}, stage="benchmark")
    _report("root", _timed(lambda: require_stage_output(f"{clean}/sentences/lang=*/*.parquet"), args.repeats * 20))

    def lines(lang: str) -> list[str]:
        with gzip.open(args.data / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle]

    de, en = lines("de"), lines("en")
    n = args.pairs
    src = [de[i % len(de)] for i in range(n)]
    tgt = [en[i % len(en)] for i in range(n)]
    pairs = args.work / "pairs"
    pairs.mkdir()
    per_file = 200_000  # labse-mine's rows per shard
    for number, start in enumerate(range(0, n, per_file)):
        stop = min(n, start + per_file)
        table = pa.table({"src": src[start:stop], "tgt": tgt[start:stop], "src_lang": ["de"] * (stop - start),
                          "tgt_lang": ["en"] * (stop - start), "cosine": pa.array([0.8] * (stop - start), pa.float32()),
                          "margin": pa.array([1.1] * (stop - start), pa.float32())})
        pq.write_table(table, pairs / f"part-{number:05d}.parquet")
    mark_complete(pairs, {}, stage="benchmark")
    _report("pairs-types", _timed(lambda: score.check_pair_column_types(str(pairs)), args.repeats))
    unmatched = {("ein Satz, der fehlt", "a missing sentence"): 1}

    def labelled_worst_case() -> None:
        try:
            score.check_labelled_matches(str(pairs), unmatched, "rated.tsv")
        except ValueError:
            return
        raise AssertionError("the unmatched sample matched")

    _report(f"labelled ({n:,} pairs, none rated)", _timed(labelled_worst_case, args.repeats), unit="s")


if __name__ == "__main__":
    main()
