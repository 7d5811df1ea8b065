"""Readers for the cleaning pipeline: WARC, WET and Wikipedia dumps to Documents.

`read_records(path, fmt)` is a plain generator (usable in a REPL or a test) that streams one file,
record by record, and yields exactly one `Document`, `Dropped` or `ReadError` per record.
`ReadDocuments(pattern, fmt)` is the Beam source: match the pattern, spread the files over workers,
read each with `read_records` and count every outcome by reason.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterator

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines.accounting import ReasonCounters
from pipelines.io.documents import Document, Dropped, ReaderLimits, ReadError, ReadResult

FORMATS = ("warc", "wet", "wikipedia")
METRICS_NAMESPACE = "read"


def read_records(
    path: str,
    fmt: str,
    *,
    limits: ReaderLimits = ReaderLimits(),
    stats: Counter | None = None,
) -> Iterator[ReadResult]:
    """Stream one file of format `fmt` ("warc", "wet" or "wikipedia").

    Never raises for bad input: a file that cannot be opened yields one ReadError("open_failed"),
    an empty file one ReadError("empty_file"). `stats`, if given, receives counts of things that
    are neither drops nor errors (e.g. "charset_fallback": a declared charset failed to decode).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    try:
        raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as exc:  # FileNotFoundError, BeamIOError, permission errors, ...
        yield ReadError("open_failed", path, 0, f"{type(exc).__name__}: {exc}")
        return
    try:
        if fmt == "wikipedia":
            from pipelines.io.wikipedia import read_wikipedia_stream

            yield from read_wikipedia_stream(raw, path, limits=limits, stats=stats)
        else:
            from pipelines.io.warc import read_warc_stream

            yield from read_warc_stream(raw, path, wet=(fmt == "wet"), limits=limits, stats=stats)
    finally:
        raw.close()


def check_pattern_matches(pattern: str) -> list[str]:
    """The files a Beam file pattern matches; a clear FileNotFoundError when it matches none.

    CLIs call this before building the pipeline, so that a typo fails at once instead of producing
    an empty output after a full pipeline start (which on Dataflow takes minutes).
    """
    try:
        results = FileSystems.match([pattern])
    except Exception as exc:  # BeamIOError wraps "no such directory" and bad schemes
        raise FileNotFoundError(f"input pattern {pattern!r} cannot be matched: {exc}") from exc
    paths = [m.path for result in results for m in result.metadata_list]
    if not paths:
        raise FileNotFoundError(f"input pattern {pattern!r} matches no files")
    return sorted(paths)


class _ReadFileFn(beam.DoFn):
    """Reads one file path; counts documents, drops and errors by reason."""

    def __init__(self, fmt: str, limits: ReaderLimits):
        self._fmt = fmt
        self._limits = limits

    def setup(self):
        self._counters = ReasonCounters(METRICS_NAMESPACE)

    def process(self, path: str) -> Iterator[ReadResult]:
        stats: Counter = Counter()
        counters = self._counters
        counters.inc("files")
        for result in read_records(path, self._fmt, limits=self._limits, stats=stats):
            if isinstance(result, Document):
                counters.inc("documents")
            elif isinstance(result, Dropped):
                counters.inc(f"dropped:{result.reason}")
            else:
                counters.inc(f"errors:{result.reason}")
            yield result
        for note, count in stats.items():
            counters.inc(f"note:{note}", count)


def _metadata_path(metadata) -> str:
    return metadata.path


class ReadDocuments(beam.PTransform):
    """Pattern -> PCollection of Document | Dropped | ReadError, files spread over workers.

    A pattern that matches nothing gives an empty PCollection here; CLIs should call
    `check_pattern_matches(pattern)` first to fail early with a clear message.
    """

    def __init__(self, pattern: str, fmt: str, limits: ReaderLimits = ReaderLimits()):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self._pattern = pattern
        self._fmt = fmt
        self._limits = limits

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(self._pattern, empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW)
            | "Paths" >> beam.Map(_metadata_path).with_output_types(str)
            # One file is one unit of work; a reshuffle moves files from the matching worker to many.
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(_ReadFileFn(self._fmt, self._limits))
        )
