"""The Beam pieces of labse-embed: read each language's sentences, keep one of each, embed every
shard in one worker, write the books and `_SUCCESS` last (layout in `pipelines.vectors.shards`).

    sentences (per --input) -> key (whitespace collapsed; empty ones dropped, counted)
      -> one per (language, key) (a lifted CombinePerKey: repeats counted, `duplicate`)
      -> (language, shard) by the key's hash, the shard count from the language's unique count
      -> GroupByKey: one element per shard holds its sentences (never vectors)
      -> `_EmbedShard`: the embedder (loaded once per worker, shared by its threads) embeds the
         shard's sorted sentences chunk by chunk into its files -> a tally per shard
      -> stats.json, _SUCCESS

Accounting (stats.json, README contract 11): per language and for all `sentences`: records read ->
kept (embedded and written once) or dropped (`empty_text`, `duplicate`: the same sentence again,
in any input of the language); `input_files`: matched -> kept (read through) or errored
(`unreadable_file`, listed in `errors`).
"""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam

from pipelines.accounting import CountByName, MergeTallies
from pipelines.io.completion import finish_output
from pipelines.embed.embedders import held_embedder
from pipelines.mine.transforms import ReadSentences
from pipelines.progress import worker_tracker
from pipelines.stage import MAX_LISTED_ERRORS
from pipelines.vectors.config import EmbedConfig
from pipelines.vectors.shards import (embed_stats, language_folder, sentence_key, shard_count, shard_name, shard_of,
                                      write_shard)

STAGE = "labse-embed"
EMPTY_TEXT, DUPLICATE = "empty_text", "duplicate"


def _keyed(tagged):
    """(lang, text) -> (lang, key), or the language on `dropped` for an empty sentence."""
    lang, text = tagged
    key = sentence_key(text)
    if key is None:
        yield beam.pvalue.TaggedOutput("dropped", lang)
    else:
        yield lang, key


def _duplicates(counted) -> dict:
    (lang, _key), copies = counted
    return {f"{lang}.dropped.{DUPLICATE}": copies - 1}


def _shard_markers(lang: str, unique: dict, per_shard: int):
    """Every shard of `lang` as a key, so that a shard (or a language) without sentences still
    gets its files."""
    shards = shard_count(unique.get(lang, 0), per_shard)
    for shard in range(shards):
        yield (lang, shard, shards), None


def _route(sentence, unique: dict, per_shard: int):
    lang, key = sentence
    shards = shard_count(unique[lang], per_shard)
    return (lang, shard_of(key, shards), shards), key


class _EmbedShard(beam.DoFn):
    """((lang, shard, shards), its sentences) -> the shard's files written; yields its tally."""

    def __init__(self, config: EmbedConfig, output: str):
        from apache_beam.utils.shared import Shared

        self.config, self.output = config, output
        self._shared = Shared()

    def setup(self):
        # Held for the DoFn's life: Shared keeps only a weak reference to what it built.
        self._held = held_embedder(self._shared, self.config.embedder, self.config.embedder_threads)

    def process(self, keyed):
        (lang, shard, shards), keys = keyed
        texts = sorted(key for key in keys if key is not None)  # sorted: reruns embed the same chunks
        embedder, batch_size = self._held.embedder, self.config.batch_size
        written = write_shard(texts, lambda chunk: embedder.encode(chunk, batch_size=batch_size), embedder.dim,
                              language_folder(self.output, lang), shard_name(lang, shard, shards),
                              dtype=self.config.dtype, advance=worker_tracker("sentences").advance)
        yield {f"{lang}.kept": written["rows"], f"{lang}.shards": 1, f"{lang}.non_finite": written["non_finite"],
               f"{lang}.bytes": written["bytes"]}


class EmbedSentences(beam.PTransform):
    """PBegin -> the tally of the run, after every shard of every language is written.

    `inputs`: (lang, path) pairs, a path being anything labse-mine's --src reads (a labse-clean
    `sentences/lang=XX` folder, Parquet or text files, a glob); several paths of one language are
    one set of sentences. Outputs {"tally": one dict, "errors": unreadable files}."""

    def __init__(self, inputs: Sequence[tuple[str, str]], config: EmbedConfig, output: str):
        super().__init__()
        self.inputs, self.config, self.output = list(inputs), config, output.rstrip("/")

    def expand(self, pbegin):
        reads = [pbegin | f"Read{number}_{lang}" >> ReadSentences(path, lang, lang)
                 for number, (lang, path) in enumerate(self.inputs)]
        tagged = tuple(read["records"] | f"Tag{number}" >> beam.Map(lambda record, lang: (lang, record.get("text")), lang)
                       for number, (read, (lang, _)) in enumerate(zip(reads, self.inputs))) | "All" >> beam.Flatten()
        keyed = tagged | "Key" >> beam.FlatMap(_keyed).with_outputs("dropped", main="sentences")
        counted = (keyed.sentences
                   | "One" >> beam.Map(lambda sentence: (sentence, 1))
                   | "CountCopies" >> beam.CombinePerKey(sum))
        unique = counted | "Unique" >> beam.Keys()
        per_language = beam.pvalue.AsDict(unique
                                          | "ByLanguage" >> beam.Map(lambda sentence: (sentence[0], 1))
                                          | "CountUnique" >> beam.CombinePerKey(sum))
        per_shard = self.config.shard_sentences
        markers = (pbegin
                   | "Languages" >> beam.Create(sorted({lang for lang, _ in self.inputs}))
                   | "Shards" >> beam.FlatMap(_shard_markers, per_language, per_shard))
        routed = unique | "Route" >> beam.Map(_route, per_language, per_shard)
        written = ((routed, markers)
                   | "WithMarkers" >> beam.Flatten()
                   | "GroupShards" >> beam.GroupByKey()
                   | "EmbedShards" >> beam.ParDo(_EmbedShard(self.config, self.output)))
        tallies = [read["tally"] for read in reads] + [
            tagged | "CountRead" >> CountByName(lambda t: f"{t[0]}.read"),
            keyed.dropped | "CountEmpty" >> CountByName(lambda lang: f"{lang}.dropped.{EMPTY_TEXT}"),
            counted | "CountDuplicates" >> beam.Map(_duplicates),
            written,
        ]
        errors = tuple(read["errors"] for read in reads) | "Errors" >> beam.Flatten()
        return {"tally": tuple(tallies) | "Total" >> MergeTallies(), "errors": errors}


def _finish(_, tally: dict, errors: list, langs: list, config: EmbedConfig, output: str):
    from dataclasses import asdict

    stats = embed_stats(tally, langs, output)
    stats["errors"] = errors[:MAX_LISTED_ERRORS]
    stats["config"] = asdict(config)
    finish_output(output, stats, stage=STAGE)  # the last write: stats.json, then _SUCCESS
    yield stats


def build_pipeline(pipeline: beam.Pipeline, inputs: Sequence[tuple[str, str]], output: str, config: EmbedConfig):
    """Wire read -> embed per shard -> stats.json and _SUCCESS into `pipeline`."""
    output = output.rstrip("/")
    embedded = pipeline | "Embed" >> EmbedSentences(inputs, config, output)
    return (pipeline
            | "Once" >> beam.Create([None])
            | "Stats" >> beam.FlatMap(_finish, beam.pvalue.AsSingleton(embedded["tally"]),
                                      beam.pvalue.AsList(embedded["errors"]), sorted({lang for lang, _ in inputs}),
                                      config, output))
