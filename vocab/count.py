"""Beam: sentences -> word counts per language (`CombinePerKey`), plus held-out sentences.

    (lang, text) --hold out ~1% by a stable hash--> held-out sentences (for the report)
                 --pre-tokenise, count per batch--> ((lang, word), n) --CombinePerKey(sum)-->
                 counts TSV shards: `lang \\t word \\t count`  (words never contain whitespace)

Inputs: `labse-clean`'s `DIR/sentences/lang=XX/*.parquet` (columns `text`, `lang`), or one plain
text file (pattern) per language, one sentence per line.

The tally accounts for two units (`pipelines.accounting`, README contract 11): `sentences` (read ->
kept: counted into the vocabulary, or dropped: `no_lang`, `empty`, `no_words`, `held_out`) and
`heldout_sentences` (the held-out ones -> kept: written to heldout.jsonl for the report, or dropped:
`over_report_limit`, beyond `heldout_per_language` in a language).
"""
from __future__ import annotations

import json
import zlib
from collections import Counter
from typing import Iterable, Mapping

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.accounting import MergeTallies, ReasonCounters
from pipelines.text.pretokenize import pretokenize

COUNTER_NAMESPACE = "vocab"  # Beam counters: one namespace per stage, its name
HOLDOUT_SCALE = 1_000_000
UNITS = ("sentences", "heldout_sentences")


def is_heldout(text: str, rate: float) -> bool:
    """Deterministic (crc32, not Python's salted hash) so every run holds out the same sentences."""
    return zlib.crc32(text.encode("utf-8")) % HOLDOUT_SCALE < rate * HOLDOUT_SCALE


def count_batch(rows: Iterable[tuple[str, str]], holdout_rate: float) -> tuple[Counter, list, Counter]:
    """(lang, text) rows -> word counts keyed (lang, word), held-out rows, and a tally by reason."""
    counts: Counter = Counter()
    heldout: list[tuple[str, str]] = []
    tally: Counter = Counter()
    for lang, text in rows:
        tally["sentences.read"] += 1
        if not lang:
            tally["sentences.dropped.no_lang"] += 1
            continue
        if text is None or not text.strip():
            tally["sentences.dropped.empty"] += 1
            continue
        if holdout_rate > 0 and is_heldout(text, holdout_rate):
            # not counted: held out for the report, where it is read as a held-out sentence
            tally["sentences.dropped.held_out"] += 1
            tally["heldout_sentences.read"] += 1
            heldout.append((lang, text))
            continue
        words = pretokenize(text)
        if not words:
            tally["sentences.dropped.no_words"] += 1
            continue
        tally["sentences.kept"] += 1
        tally[f"words.{lang}"] += len(words)
        for word in words:
            counts[(lang, word)] += 1
    return counts, heldout, tally


class _CountBatches(beam.DoFn):
    """Counts words over a whole bundle before emitting: one element per distinct (lang, word)
    per bundle instead of one per batch, which is what makes DirectRunner slow."""

    def __init__(self, holdout_rate: float, flush_at: int = 500_000):
        self.holdout_rate = holdout_rate
        self.flush_at = flush_at

    def setup(self):
        self.counters = ReasonCounters(COUNTER_NAMESPACE)

    def start_bundle(self):
        self.pending: Counter = Counter()

    def process(self, batch: list[tuple[str, str]]):
        counts, heldout, tally = count_batch(batch, self.holdout_rate)
        self.counters.inc_tally({k: v for k, v in tally.items() if not k.startswith("words.")})
        self.counters.inc("words.counted", sum(counts.values()))
        self.pending.update(counts)
        for row in heldout:
            yield beam.pvalue.TaggedOutput("heldout", row)
        yield beam.pvalue.TaggedOutput("tally", dict(tally))
        if len(self.pending) >= self.flush_at:  # bounds memory on huge bundles
            yield from self.pending.items()
            self.pending = Counter()

    def finish_bundle(self):
        for item in self.pending.items():
            yield WindowedValue(item, MIN_TIMESTAMP, [GlobalWindow()])
        self.pending = Counter()


class CountWords(beam.PTransform):
    """PCollection[(lang, text)] -> {"counts": ((lang, word), n), "heldout": (lang, [texts]), "tally": dict}.

    The tally accounts for `UNITS`: the held-out sentences kept are those in `heldout` (at most
    `heldout_per_language` a language), the rest are `heldout_sentences.dropped.over_report_limit`.
    """

    def __init__(self, holdout_rate: float = 0.01, heldout_per_language: int = 2000):
        super().__init__()
        self.holdout_rate = holdout_rate
        self.heldout_per_language = heldout_per_language

    def expand(self, sentences):
        parts = (
            sentences
            | "Batch" >> beam.BatchElements(min_batch_size=512, max_batch_size=8192)
            | "CountBatch" >> beam.ParDo(_CountBatches(self.holdout_rate)).with_outputs("heldout", "tally", main="counts")
        )
        counts = parts.counts | "SumPerKey" >> beam.CombinePerKey(sum)
        limit = self.heldout_per_language
        heldout = parts.heldout | "FirstByHash" >> beam.combiners.Top.PerKey(
            limit, key=lambda text: zlib.crc32(text.encode("utf-8"))
        )
        over_limit = (
            parts.heldout
            | "HeldOutPerLanguage" >> beam.combiners.Count.PerKey()
            | "OverLimit" >> beam.Map(lambda kv: {"heldout_sentences.dropped.over_report_limit": max(0, kv[1] - limit)})
        )
        reported = heldout | "CountReported" >> beam.Map(lambda kv: {"heldout_sentences.kept": len(kv[1])})
        tally = (parts.tally, over_limit, reported) | "SumTallies" >> MergeTallies()
        return {"counts": counts, "heldout": heldout, "tally": tally}


def _parquet_rows(record: Mapping) -> tuple[str, str]:
    return record.get("lang"), record.get("text")


class ReadSentenceParquet(beam.PTransform):
    """`labse-clean` output (`DIR/sentences`, hive `lang=XX`) -> (lang, text)."""

    def __init__(self, sentences_dir: str):
        super().__init__()
        self.pattern = sentences_dir.rstrip("/") + "/lang=*/*.parquet"

    def expand(self, pbegin):
        return (
            pbegin
            | "ReadParquet" >> beam.io.ReadFromParquet(self.pattern, columns=["text", "lang"])
            | "ToLangText" >> beam.Map(_parquet_rows)
        )


class ReadLanguageTexts(beam.PTransform):
    """{lang: file pattern} of plain text, one sentence per line -> (lang, text)."""

    def __init__(self, files: Mapping[str, str]):
        super().__init__()
        self.files = dict(files)

    def expand(self, pbegin):
        collections = [
            pbegin
            | f"Read[{lang}]" >> beam.io.ReadFromText(pattern)
            | f"Tag[{lang}]" >> beam.Map(lambda line, lang=lang: (lang, line))
            for lang, pattern in sorted(self.files.items())
        ]
        return collections | "Flatten" >> beam.Flatten()


def format_count(item: tuple[tuple[str, str], int]) -> str:
    (lang, word), count = item
    return f"{lang}\t{word}\t{count}"


def parse_count(line: str) -> tuple[str, str, int]:
    lang, word, count = line.split("\t")
    return lang, word, int(count)


class WriteCounts(beam.PTransform):
    """Counts, held-out sentences and the tally as text files under `work_dir`."""

    def __init__(self, work_dir: str):
        super().__init__()
        self.work_dir = work_dir.rstrip("/")

    def expand(self, outputs):
        counts = outputs["counts"] | "FormatCounts" >> beam.Map(format_count) | "WriteCounts" >> beam.io.WriteToText(
            f"{self.work_dir}/counts/counts", file_name_suffix=".tsv"
        )
        heldout = (
            outputs["heldout"]
            | "FormatHeldout" >> beam.Map(lambda kv: json.dumps({"lang": kv[0], "texts": kv[1]}, ensure_ascii=False))
            | "WriteHeldout" >> beam.io.WriteToText(f"{self.work_dir}/heldout", file_name_suffix=".jsonl", shard_name_template="")
        )
        tally = (
            outputs["tally"]
            | "FormatTally" >> beam.Map(lambda t: json.dumps(t, sort_keys=True))
            | "WriteTally" >> beam.io.WriteToText(f"{self.work_dir}/tally", file_name_suffix=".json", shard_name_template="")
        )
        return {"counts": counts, "heldout": heldout, "tally": tally}
