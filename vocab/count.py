"""Beam: sentences -> word counts per language (`CombinePerKey`), plus held-out sentences.

    (lang, text) --hold out ~1% by a stable hash--> held-out sentences (for the report)
                 --pre-tokenise, count per batch--> ((lang, word), n) --CombinePerKey(sum)-->
                 counts TSV shards: `lang \\t word \\t count`  (words never contain whitespace)

Inputs: `labse-clean`'s `DIR/sentences/lang=XX/*.parquet` (columns `text`, `lang`), or one plain
text file (pattern) per language, one sentence per line.

The counts written are only the words the learner may see: at most `max_words` distinct words,
each language's most frequent within its share (`vocab.prune`, `PruneWords`), so the learner's
memory is bounded whatever the corpus size.

The tally accounts for three units (`pipelines.accounting`, README contract 11): `sentences` (read ->
kept: counted into the vocabulary, or dropped: `no_lang`, `empty`, `no_words`, `held_out`),
`heldout_sentences` (the held-out ones -> kept: written to heldout.jsonl for the report, or dropped:
`over_report_limit`, beyond `heldout_per_language` in a language) and `word_types` (distinct
(language, word) pairs -> kept: written for the learner, or dropped: `over_language_budget`), with
`pruned_types.LANG` and `pruned_words.LANG` (occurrences) per language, and
`folded_character_entries` (one-character lines added for the characters of pruned words). With
Parquet input a fourth unit, `input_files` (read -> kept, or errored: `unreadable_file`).
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

from pipelines.accounting import MergeTallies, ReasonCounters, SumTallies
from pipelines.text.pretokenize import pretokenize
from vocab.prune import (DEFAULT_MAX_WORDS, fold_pruned_characters, keep_top, language_budgets, prune_tally,
                         rank_key, word_characters)

COUNTER_NAMESPACE = "vocab"  # Beam counters: one namespace per stage, its name
HOLDOUT_SCALE = 1_000_000
UNITS = ("sentences", "heldout_sentences", "word_types", "input_files")


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

    def __init__(self, holdout_rate: float = 0.01, heldout_per_language: int = 2000,
                 max_words: int = DEFAULT_MAX_WORDS, smoothing: float = 0.3):
        super().__init__()
        self.holdout_rate = holdout_rate
        self.heldout_per_language = heldout_per_language
        self.max_words = max_words
        self.smoothing = smoothing

    def expand(self, sentences):
        parts = (
            sentences
            | "Batch" >> beam.BatchElements(min_batch_size=512, max_batch_size=8192)
            | "CountBatch" >> beam.ParDo(_CountBatches(self.holdout_rate)).with_outputs("heldout", "tally", main="counts")
        )
        summed = parts.counts | "SumPerKey" >> beam.CombinePerKey(sum)
        pruned = summed | "Prune" >> PruneWords(self.max_words, self.smoothing)
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
        tally = (parts.tally, over_limit, reported, pruned["tally"]) | "SumTallies" >> MergeTallies()
        return {"counts": pruned["counts"], "heldout": heldout, "tally": tally}


def _by_language(item: tuple[tuple[str, str], int]) -> tuple[str, tuple[int, str]]:
    (lang, word), count = item
    return lang, (count, word)


def _budget_plan(sizes: dict, smoothing: float, max_words: int) -> dict:
    return {"sizes": sizes, "budgets": language_budgets(sizes, smoothing, max_words)}


def _keep_within_budget(item: tuple[str, list[tuple[int, str]]], plan: dict, characters: dict):
    lang, entries = item
    kept = keep_top(entries, plan["budgets"].get(lang, 0))
    written = fold_pruned_characters(kept, characters[lang])
    for count, word in written:
        yield (lang, word), count
    tally = prune_tally(lang, kept, plan["sizes"][lang])
    tally["folded_character_entries"] = len(written) - len(kept)
    yield beam.pvalue.TaggedOutput("tally", tally)


class PruneWords(beam.PTransform):
    """((lang, word), n) summed -> {"counts": the same for the words kept, "tally": dict}.

    At most `max_words` distinct words pass (0: all), split over languages by `vocab.prune`, plus
    the characters of the pruned words folded into one-character entries (at most one a distinct
    character). One top-`max_words` per language and its characters' counts are the only state a
    worker holds: no global ranking of all words.
    """

    def __init__(self, max_words: int = DEFAULT_MAX_WORDS, smoothing: float = 0.3):
        super().__init__()
        self.max_words = max_words
        self.smoothing = smoothing

    def expand(self, counts):
        by_language = counts | "ByLanguage" >> beam.Map(_by_language)
        sizes = (
            by_language
            | "OccurrencesAndTypes" >> beam.Map(lambda kv: (kv[0], (kv[1][0], 1)))
            | "SumSizes" >> beam.CombinePerKey(beam.combiners.TupleCombineFn(sum, sum))
        )
        if self.max_words <= 0:
            tally = sizes | "KeptAll" >> beam.Map(lambda kv: {"word_types.read": kv[1][1], "word_types.kept": kv[1][1]})
            return {"counts": counts, "tally": tally}
        plan = (
            sizes
            | "SizesByLanguage" >> beam.combiners.ToDict()
            | "Budgets" >> beam.Map(_budget_plan, self.smoothing, self.max_words)
        )
        characters = (
            by_language
            | "WordCharacters" >> beam.Map(lambda kv: (kv[0], word_characters(kv[1])))
            | "CharactersPerLanguage" >> beam.CombinePerKey(SumTallies())  # {char: count}, summed as tallies are
        )
        kept = (
            by_language
            | "TopPerLanguage" >> beam.combiners.Top.PerKey(self.max_words, key=rank_key, reverse=True)
            | "KeepWithinBudget" >> beam.FlatMap(
                _keep_within_budget, plan=beam.pvalue.AsSingleton(plan), characters=beam.pvalue.AsDict(characters))
            .with_outputs("tally", main="counts")
        )
        return {"counts": kept.counts, "tally": kept.tally}


class _ReadParquetFile(beam.DoFn):
    """One Parquet file -> (lang, text) rows and a tally for the file: `input_files.kept` when read
    through, else `input_files.errored.unreadable_file` (a truncated or damaged file, a missing
    column), logged with its name: the run goes on, as in the other stages. Rows read before a file
    turned out damaged are kept."""

    def process(self, readable_file):
        import logging

        from pipelines.io.parquet import iter_parquet_rows

        path = readable_file.metadata.path
        try:
            with readable_file.open() as handle:
                for row in iter_parquet_rows(handle, path, ["text", "lang"]):
                    yield row.get("lang"), row.get("text")
        except Exception as error:  # noqa: BLE001 - a damaged file must not kill the run: it is counted
            logging.getLogger(__name__).warning("labse-vocab: %s is unreadable, counted as errored: %s",
                                                path, str(error).strip().splitlines()[0][:300] if str(error) else
                                                type(error).__name__)
            yield beam.pvalue.TaggedOutput("tally", {"input_files.read": 1, "input_files.errored.unreadable_file": 1})
        else:
            yield beam.pvalue.TaggedOutput("tally", {"input_files.read": 1, "input_files.kept": 1})


class ReadSentenceParquet(beam.PTransform):
    """`labse-clean` output (`DIR/sentences`, hive `lang=XX`) -> {"sentences": (lang, text),
    "tally": the input files read, kept (read through) or errored (`unreadable_file`)}."""

    def __init__(self, sentences_dir: str):
        super().__init__()
        self.pattern = sentences_dir.rstrip("/") + "/lang=*/*.parquet"

    def expand(self, pbegin):
        from apache_beam.io import fileio

        read = (
            pbegin
            | "Match" >> fileio.MatchFiles(self.pattern)
            | "Open" >> fileio.ReadMatches()
            | "ReadParquet" >> beam.ParDo(_ReadParquetFile()).with_outputs("tally", main="sentences")
        )
        return {"sentences": read.sentences, "tally": read.tally}


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
