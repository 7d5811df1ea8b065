"""`labse-main-content build-data`: teacher-labelled lines from WARC files, as fastText training data.

    labse-main-content build-data --input 'crawl/*.warc.gz' --output DIR [Beam options]

For every HTML page: ``html_to_lines`` (the lines ``labse-clean`` scores), the teacher's main text
(trafilatura), a main/boilerplate label per line (``labels.py``), the page's language (lid.176 on
its main text) and its split, from a hash of the URL, so no page is on both sides. Writes:

- ``DIR/train.txt``: balanced training examples in fastText format (``__label__main FEATURES``):
  per page the majority class is downsampled and the page capped (``balance_page``), then every
  language is capped at ``--max-lines-per-language`` (deterministic: smallest hashes kept);
- ``DIR/dev.txt``, ``DIR/test.txt``: ALL lines of the dev/test pages, in page order, same format
  (the natural class balance, which is what the filter meets in production);
- ``DIR/dev.pages.jsonl``, ``DIR/test.pages.jsonl``: those pages with their lines, labels and the
  teacher's text, for page-level evaluation (``train`` reports on them);
- ``DIR/stats.json``: the accounting section (README, contract 11): every input record
  (``documents``) and every line of a labelled page (``lines``: written to train/dev/test, or
  dropped by ``page_balance`` / ``language_cap``) counted, read = kept + dropped + errored; lines
  per split and label, training examples per language, and the configuration.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, replace
from typing import Iterator

import apache_beam as beam

from pipelines.accounting import TALLY, CountByName, MergeTallies, ReasonCounters, Tally, accounting_section
from pipelines.io.completion import mark_complete, write_stats_json
from pipelines.main_content.config import BuildConfig
from pipelines.main_content.labels import LabelledPage, balance_page, label_page, split_of
from pipelines.main_content.model import LABEL_BOILERPLATE, LABEL_MAIN, featurise_document

logger = logging.getLogger(__name__)
SPLITS = ("train", "dev", "test")
COUNTER_NAMESPACE = "main_content"  # Beam counters: one namespace per stage, its name
# What stats.json accounts for: input records, and the lines of the labelled (kept) pages.
UNITS = ("documents", "lines")


def page_language(page: LabelledPage, lid) -> str:
    """lid.176's language of the page's main text (all its text when the teacher kept nothing)."""
    main = [line for line, is_main in zip(page.lines, page.labels) if is_main] or page.lines
    lang, _prob = lid.predict([" ".join(main)[:2000]])[0]
    return lang


class LabelPagesFn(beam.DoFn):
    """Reader result -> (split, LabelledPage as dict); a tally for every record whatever happens."""

    def __init__(self, config: BuildConfig):
        self.config = config

    def setup(self) -> None:
        from pipelines.text.langid import LanguageIdentifier

        self.lid = LanguageIdentifier()
        self.counters = ReasonCounters(COUNTER_NAMESPACE)

    def process(self, record) -> Iterator:
        tally: Tally = {"documents.read": 1}
        labelled = self._label(record, tally)
        self.counters.inc_tally(tally)
        yield beam.pvalue.TaggedOutput(TALLY, tally)
        if labelled is not None:
            yield labelled

    def _label(self, record, tally: Tally) -> tuple[str, dict] | None:
        from pipelines.io.documents import KIND_HTML, Document, Dropped

        if isinstance(record, Dropped):
            tally[f"documents.dropped.{record.reason}"] = 1
            return None
        if not isinstance(record, Document):
            tally[f"documents.errored.{record.reason}"] = 1
            return None
        if record.kind != KIND_HTML:
            tally["documents.dropped.not_html"] = 1
            return None
        try:
            page = label_page(record.url, record.body, self.config.teacher, self.config.labels)
        except Exception:  # the teacher is third-party code: one odd page must not stop the run
            logger.warning("teacher failed on %s", record.url, exc_info=True)
            tally["documents.errored.teacher_failed"] = 1
            return None
        if not page.lines:
            tally["documents.dropped.no_lines"] = 1
            return None
        if not any(page.labels):
            # Kept: a page without main content teaches what pure boilerplate looks like.
            tally["documents.no_main_content"] = 1
        page = replace(page, lang=page_language(page, self.lid))
        split = split_of(record.url or record.doc_id, self.config.dev_fraction, self.config.test_fraction)
        tally["documents.kept"] = 1
        tally[f"pages.{split}"] = 1
        main = sum(page.labels)
        tally["lines.read"] = len(page.labels)
        tally[f"lines.{split}.main"] = main
        tally[f"lines.{split}.boilerplate"] = len(page.labels) - main
        return split, page.to_json()


def training_examples(page_json: dict, config: BuildConfig) -> Iterator[tuple[str, tuple[int, str]]]:
    """(language, (hash, fastText line)) for the balanced lines of one training page.

    Featurisation sees the WHOLE page (context features), then only the sampled lines are emitted;
    lines the committee disputed (``LabelledPage.disputed``) are never examples.
    """
    page = LabelledPage.from_json(page_json)
    html_main = None if drops_html_feature(page.url, config.html_feature_dropout) else page.html_main
    features = featurise_document(page.lines, html_main)
    candidates = [i for i, disputed in enumerate(page.disputed or [False] * len(page.lines)) if not disputed]
    sampled = balance_page([page.lines[i] for i in candidates], [page.labels[i] for i in candidates], seed=page.url,
                           max_lines_per_page=config.max_lines_per_page, max_ratio=config.max_class_ratio)
    for i in (candidates[k] for k in sampled):
        row = f"{LABEL_MAIN if page.labels[i] else LABEL_BOILERPLATE} {features[i]}"
        digest = int.from_bytes(hashlib.sha1(f"{page.url}\t{i}".encode("utf-8", "replace")).digest()[:8], "big")
        yield page.lang or "und", (digest, row)


class _BalancePageFn(beam.DoFn):
    """A training page -> its balanced examples (`training_examples`), and a tally of the page's
    lines left out: disputed by the committee (`lines.dropped.disputed_label`), or by balancing
    (`lines.dropped.page_balance`)."""

    def __init__(self, config: BuildConfig):
        self.config = config

    def process(self, item: tuple[str, dict]):
        page_json = item[1]
        examples = 0
        for example in training_examples(page_json, self.config):
            examples += 1
            yield example
        disputed = sum(page_json.get("disputed") or ())
        left_out = len(page_json["labels"]) - examples - disputed
        if left_out or disputed:
            yield beam.pvalue.TaggedOutput(TALLY, {"lines.dropped.page_balance": left_out,
                                                   "lines.dropped.disputed_label": disputed})


def drops_html_feature(url: str, share: float) -> bool:
    """Deterministic per page: featurise this training page without its HTML feature?"""
    return int.from_bytes(hashlib.sha1(f"html-dropout\t{url}".encode("utf-8", "replace")).digest()[:8], "big") < share * 2**64


def all_examples(page_json: dict) -> list[str]:
    page = LabelledPage.from_json(page_json)
    return [f"{LABEL_MAIN if is_main else LABEL_BOILERPLATE} {feats}"
            for feats, is_main in zip(featurise_document(page.lines, page.html_main), page.labels)]


def _split_is(item: tuple[str, dict], split: str) -> bool:
    return item[0] == split


class LabelPages(beam.PTransform):
    """Reader results -> {"pages": (split, page dict), "tally": per-record tallies}."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, records: beam.PCollection) -> dict:
        out = records | "Label" >> beam.ParDo(LabelPagesFn(self.config)).with_outputs(TALLY, main="pages")
        return {"pages": out.pages, "tally": out[TALLY]}


class BalancedTrainingExamples(beam.PTransform):
    """Training pages -> {"rows": fastText lines, "per_language": (lang, count), "tally": the
    lines left out by page balancing and by the per-language cap}."""

    def __init__(self, config: BuildConfig):
        super().__init__()
        self.config = config

    def expand(self, pages: beam.PCollection) -> dict:
        config = self.config
        balanced = pages | "Balance" >> beam.ParDo(_BalancePageFn(config)).with_outputs(TALLY, main="examples")
        keyed = balanced.examples
        capped = keyed | "CapPerLanguage" >> beam.combiners.Top.SmallestPerKey(config.max_lines_per_language)
        rows = capped | "Rows" >> beam.FlatMap(lambda kv: [row for _digest, row in kv[1]])
        per_language = capped | "CountPerLanguage" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
        offered = keyed | "CountOffered" >> beam.combiners.Count.PerKey()
        cap_tally = (
            offered
            | "CapDrops" >> beam.Map(lambda kv: {
                "train_examples.offered": kv[1],
                "lines.dropped.language_cap": max(0, kv[1] - config.max_lines_per_language)})
        )
        tally = (balanced[TALLY], cap_tally) | "BalanceTally" >> MergeTallies()
        return {"rows": rows, "per_language": per_language, "tally": tally}


def _write_text(pcoll: beam.PCollection, path: str, label: str) -> beam.PCollection:
    prefix, suffix = path.rsplit(".", 1)
    return pcoll | label >> beam.io.WriteToText(prefix, file_name_suffix="." + suffix, num_shards=1,
                                                shard_name_template="")


class _WriteStats(beam.DoFn):
    def __init__(self, output: str, config: dict):
        self.output = output
        self.config = config

    def process(self, tally: Tally, per_language: list, *written) -> Iterator[dict]:
        stats = build_stats(tally, dict(per_language), self.config)
        write_stats_json(f"{self.output}/stats.json", stats)
        mark_complete(self.output, stats, stage="labse-main-content build-data")  # the last write
        yield stats


def build_stats(tally: Tally, per_language: dict, config: dict) -> dict:
    """stats.json from the summed tally: the accounting section (`UNITS`), plus the legacy
    `documents_*` keys (`documents_errored` by reason), pages and lines per split, examples."""
    section = accounting_section(tally, UNITS)
    documents = section["accounting"]["documents"]
    lines = {split: {"main": tally.get(f"lines.{split}.main", 0),
                     "boilerplate": tally.get(f"lines.{split}.boilerplate", 0)} for split in SPLITS}
    line_drops = section["accounting"]["lines"]["dropped"]
    examples = sum(per_language.values())
    return {
        "documents_read": documents["read"],
        "documents_kept": documents["kept"],
        "documents_dropped": documents["dropped"],
        "documents_errored": documents.get("errors", {}),
        **section,
        "pages_without_main_content": tally.get("documents.no_main_content", 0),
        "pages": {split: tally.get(f"pages.{split}", 0) for split in SPLITS},
        "lines": lines,
        "train_examples": examples,
        "train_examples_dropped": {"disputed_label": line_drops.get("disputed_label", 0),
                                   "page_balance": line_drops.get("page_balance", 0),
                                   "language_cap": line_drops.get("language_cap", 0)},
        "train_examples_per_language": dict(sorted(per_language.items(), key=lambda kv: (-kv[1], kv[0]))),
        "config": config,
    }


class BuildTrainingData(beam.PTransform):
    """Reader results -> train/dev/test files and stats.json under ``output``; yields the stats."""

    def __init__(self, output: str, config: BuildConfig = BuildConfig()):
        super().__init__()
        self.output = output.rstrip("/")
        self.config = config

    def expand(self, records: beam.PCollection) -> beam.PCollection:
        labelled = records | "LabelPages" >> LabelPages(self.config)
        pages = labelled["pages"]
        train = (pages | "TrainPages" >> beam.Filter(_split_is, "train")
                 | "BalancedExamples" >> BalancedTrainingExamples(self.config))
        written = [_write_text(train["rows"], f"{self.output}/train.txt", "WriteTrain")]
        # lines kept: the rows actually written to train.txt, dev.txt and test.txt
        kept_tallies = [train["rows"] | "CountTrainRows" >> CountByName(lambda _row: "lines.kept")]
        for split in ("dev", "test"):
            split_pages = pages | f"{split}Pages" >> beam.Filter(_split_is, split)
            rows = split_pages | f"{split}Examples" >> beam.FlatMap(lambda item: all_examples(item[1]))
            kept_tallies.append(rows | f"Count{split}Rows" >> CountByName(lambda _row: "lines.kept"))
            written.append(_write_text(rows, f"{self.output}/{split}.txt", f"Write{split}"))
            jsonl = split_pages | f"{split}Json" >> beam.Map(lambda item: json.dumps(item[1], ensure_ascii=False))
            written.append(_write_text(jsonl, f"{self.output}/{split}.pages.jsonl", f"Write{split}Pages"))
        tally = (labelled["tally"], train["tally"], *kept_tallies) | "Tally" >> MergeTallies()
        config = asdict(self.config)
        return tally | "WriteStats" >> beam.ParDo(
            _WriteStats(self.output, config), beam.pvalue.AsList(train["per_language"]),
            *[beam.pvalue.AsList(w) for w in written])
