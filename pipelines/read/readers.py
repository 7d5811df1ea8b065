"""Readers for the cleaning pipeline: WARC, WET and Wikipedia dumps to Documents.

`read_records(path, fmt)` is a plain generator (usable in a REPL or a test) that streams one file,
record by record, and yields exactly one `Document`, `Dropped` or `ReadError` per record.
`ReadDocuments(pattern, fmt)` is the Beam source: match the pattern, spread the files over workers,
read each with `read_records` and count every outcome by reason.
"""
from __future__ import annotations

import glob
import os
import stat
from collections import Counter
from typing import Iterator, Union

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines.accounting import ReasonCounters
from pipelines.io.documents import Document, Dropped, ReaderLimits, ReadError, ReadResult

FORMATS = ("warc", "wet", "wikipedia")


def read_records(
    path: str,
    fmt: str,
    *,
    limits: ReaderLimits = ReaderLimits(),
    stats: Counter | None = None,
    name: str | None = None,
) -> Iterator[ReadResult]:
    """Stream one file of format `fmt` ("warc", "wet" or "wikipedia").

    Never raises for bad input: a file that cannot be opened (a dangling symbolic link included)
    yields one ReadError("open_failed"), a local file that is not a regular file (a named pipe,
    a device: opening one can block forever) one ReadError("not_regular_file") without opening
    it, an empty file one ReadError("empty_file"). `stats`, if given, receives counts of things
    that are neither drops nor errors (e.g. "charset_fallback": a declared charset failed to
    decode). `name` is the file name recorded in the results (default: `path`).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    name = path if name is None else name
    problem = local_file_problem(path)
    if problem is not None:
        yield ReadError(problem[0], name, 0, problem[1])
        return
    try:
        raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as exc:  # FileNotFoundError, BeamIOError, permission errors, ...
        yield ReadError("open_failed", name, 0, f"{type(exc).__name__}: {exc}")
        return
    try:
        if fmt == "wikipedia":
            from pipelines.read.wikipedia import read_wikipedia_stream

            yield from read_wikipedia_stream(raw, name, limits=limits, stats=stats)
        else:
            from pipelines.read.warc import read_warc_stream

            yield from read_warc_stream(raw, name, wet=(fmt == "wet"), limits=limits, stats=stats)
    finally:
        raw.close()


def local_file_problem(path: str) -> tuple[str, str] | None:
    """(reason, detail) when a local path must not be opened as a file, else None.

    A named pipe would block `open` until a writer appears; a dangling symbolic link fails to open
    (and Beam's matching drops it silently, see `dangling_links`).
    """
    if "://" in path:
        return None
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return "open_failed", f"dangling symbolic link to {os.readlink(path)!r}"
        return None  # the open reports it
    except OSError as exc:
        return "open_failed", f"{type(exc).__name__}: {exc}"
    if stat.S_ISREG(mode):
        return None
    kind = ("named pipe" if stat.S_ISFIFO(mode) else "directory" if stat.S_ISDIR(mode)
            else "socket" if stat.S_ISSOCK(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "special file")
    return "not_regular_file", f"not a regular file: {kind}"


def dangling_links(pattern: str) -> list[str]:
    """Local symbolic links matched by `pattern` whose target is gone. Beam's local matching skips
    them without a word; the cleaning stage reads them so each is one counted `open_failed`."""
    if "://" in pattern:
        return []
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.islink(p) and not os.path.exists(p))


def printable_file_name(path: str) -> str:
    """`path` as valid UTF-8: a local name that is not (byte 0xFF, read by Python as a lone
    surrogate) would break Beam's string coder, Parquet and JSON; its bad bytes are shown as \\xff."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")


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

    def __init__(self, fmt: str, limits: ReaderLimits, namespace: str):
        self._fmt = fmt
        self._limits = limits
        self._namespace = namespace

    def setup(self):
        self._counters = ReasonCounters(self._namespace)

    def process(self, path: Union[str, bytes]) -> Iterator[ReadResult]:
        stats: Counter = Counter()
        counters = self._counters
        counters.inc("files")
        # A local name that is not UTF-8 travels as its bytes (see `_metadata_path`).
        real = os.fsdecode(path) if isinstance(path, bytes) else path
        for result in read_records(real, self._fmt, limits=self._limits, stats=stats,
                                   name=printable_file_name(real)):
            if isinstance(result, Document):
                counters.inc("documents")
            elif isinstance(result, Dropped):
                counters.inc(f"dropped:{result.reason}")
            else:
                counters.inc(f"errors:{result.reason}")
            yield result
        for note, count in stats.items():
            counters.inc(f"note:{note}", count)


def _metadata_path(metadata) -> Union[str, bytes]:
    # Beam's string coder cannot carry a name that is not valid UTF-8 (surrogate-escaped bytes):
    # such a local path moves between workers as bytes, and is read under its real name.
    try:
        metadata.path.encode("utf-8")
        return metadata.path
    except UnicodeEncodeError:
        return os.fsencode(metadata.path)


class ReadDocuments(beam.PTransform):
    """Pattern -> PCollection of Document | Dropped | ReadError, files spread over workers.

    A pattern that matches nothing gives an empty PCollection here; CLIs should call
    `check_pattern_matches(pattern)` first to fail early with a clear message. Its Beam counters
    (files, documents, drops and errors by reason) go to `namespace`, the reading stage's.
    """

    def __init__(self, pattern: str, fmt: str, limits: ReaderLimits = ReaderLimits(), *, namespace: str):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self._pattern = pattern
        self._fmt = fmt
        self._limits = limits
        self._namespace = namespace

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        paths = (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(self._pattern, empty_match_treatment=fileio.EmptyMatchTreatment.ALLOW)
            | "Paths" >> beam.Map(_metadata_path).with_output_types(Union[str, bytes])
        )
        dangling = [_metadata_path(_Named(p)) for p in dangling_links(self._pattern)]
        if dangling:  # matched by the pattern, so they must be accounted for: one open_failed each
            paths = (paths, pbegin | "DanglingLinks" >> beam.Create(dangling).with_output_types(Union[str, bytes])
                     ) | "WithDanglingLinks" >> beam.Flatten()
        return (
            paths
            # One file is one unit of work; a reshuffle moves files from the matching worker to many.
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(_ReadFileFn(self._fmt, self._limits, self._namespace))
        )


class _Named:
    def __init__(self, path: str):
        self.path = path
