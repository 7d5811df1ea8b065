"""One section per output found: the books every stage keeps, then what that stage's curator looks at.

Every section is built from the output's files alone. Large outputs are sampled, never read whole:
a histogram reads at most `MAX_SAMPLED_FILES` Parquet files and says so on the page.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any, Callable, Mapping

import pyarrow.parquet as pq
import regex

from pipelines.accounting import identity_violations
from pipelines.io import storage
from pipelines.report import charts
from pipelines.io.completion import STATS_BESIDE_SHARDS, STATS_FILE, SUCCESS_MARKER
from pipelines.report.discover import Found, RunRoot, TRAIN_SUMMARY, PRETRAIN_SUMMARY
from pipelines.report.page import Section, details, heading, image, paragraph, preformatted, table
from pipelines.text.filters import expected_scripts

MAX_SAMPLED_FILES = 64  # Parquet files read for a histogram; a crawl's output has thousands
MAX_PAIR_CHARTS = 8  # language pairs drawn one by one; the table lists every pair
TOO_SMALL_TO_SCORE = 20  # pages in a main-content test split below which its F1 means little
DEGENERATE_KEPT_SHARE = 0.01  # a stage keeping less than this of what it read is flagged
SCRIPT_NAMES = ("Latin", "Cyrillic", "Greek", "Armenian", "Georgian", "Arabic", "Hebrew", "Devanagari", "Bengali",
                "Tamil", "Telugu", "Kannada", "Malayalam", "Gujarati", "Gurmukhi", "Oriya", "Sinhala", "Thai", "Lao",
                "Khmer", "Myanmar", "Tibetan", "Ethiopic", "Thaana", "Hangul", "Hiragana", "Katakana", "Han")
_SCRIPT_OF = [(name, regex.compile(r"\p{Script=%s}" % name)) for name in SCRIPT_NAMES]


# ------------------------------------------------------------------------------------ the books
def kept_summary(stats: Mapping[str, Any]) -> str:
    """'kept K of R UNIT' for each unit of the books, the overview table's line."""
    return "; ".join(f"{section.get('kept', 0):,} of {section.get('read', 0):,} {unit}"
                     for unit, section in (stats.get("accounting") or {}).items())


def books(stats: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(flags, blocks) for a stats file's accounting section: one row per unit, the drop reasons
    ranked with their share of what was read, and a flag when the books do not balance."""
    flags = [f"books do not balance: {problem}" for problem in identity_violations(stats)]
    accounting = stats.get("accounting") or {}
    rows, blocks = [], []
    for unit, section in accounting.items():
        dropped = sum((section.get("dropped") or {}).values())
        read = section.get("read", 0)
        kept_share = section.get("kept", 0) / read if read else None
        rows.append((unit, read, section.get("kept", 0), dropped, section.get("errored", 0),
                     "—" if kept_share is None else f"{kept_share:.1%}"))
        if read and kept_share is not None and kept_share < DEGENERATE_KEPT_SHARE:
            flags.append(f"kept {kept_share:.2%} of {read:,} {unit} read")
    if rows:
        blocks.append(table(("unit", "read", "kept", "dropped", "errored", "kept share"), rows))
    for unit, section in accounting.items():
        reasons = dict(section.get("dropped") or {})
        reasons.update({f"error: {k}": v for k, v in (section.get("errors") or {}).items()})
        if not reasons:
            continue
        read = section.get("read", 0) or 1
        ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        blocks.append(heading(f"{unit}: why the rest were not kept"))
        blocks.append(table(("reason", unit, "share of read"), [(r, n, f"{n / read:.1%}") for r, n in ranked]))
        if len(ranked) > 1:
            blocks.append(image(charts.bars(dict(ranked), f"{unit} dropped by reason", xlabel=unit), f"{unit} drop reasons"))
    return flags, blocks


def configuration(stats: Mapping[str, Any]) -> list[str]:
    config = stats.get("config")
    if not isinstance(config, Mapping) or not config:
        return []
    rows = [(key, json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value)
            for key, value in sorted(config.items())]
    return [details("configuration", table(("option", "value"), rows))]


def _stage_stats(root: RunRoot, found: Found) -> dict[str, Any]:
    marker = found.meta.get("marker") or {}
    if isinstance(marker.get("stats"), Mapping) and marker["stats"]:
        return dict(marker["stats"])
    for name in (STATS_FILE, STATS_BESIDE_SHARDS):
        path = f"{found.path}/{name}"
        if root.exists(path):
            return root.read_json(path)
    return {}


def _parquet_column(root: RunRoot, folder: str, columns: list[str]) -> tuple[dict[str, list], int, int]:
    """The `columns` of up to MAX_SAMPLED_FILES Parquet files under `folder`: (values, files read, files)."""
    files = [storage.join(folder, name) for name in sorted(storage.walk(folder))
             if name.endswith(".parquet") and not name.startswith("errors/")]
    values: dict[str, list] = {column: [] for column in columns}
    for path in files[:MAX_SAMPLED_FILES]:
        with root.open(path) as handle:
            data = pq.read_table(handle, columns=columns)
        for column in columns:
            values[column].extend(data.column(column).to_pylist())
    return values, min(len(files), MAX_SAMPLED_FILES), len(files)


def _sampled_note(read: int, total: int) -> list[str]:
    return [] if read == total else [paragraph(f"drawn from {read} of {total} Parquet files")]


# ------------------------------------------------------------------------------------ per stage
def clean_extras(root: RunRoot, found: Found, stats: Mapping[str, Any]) -> list[str]:
    blocks = []
    per_language = stats.get("per_language") or {}
    if per_language:
        blocks.append(heading(f"sentences kept per language ({len(per_language)} languages)"))
        blocks.append(image(charts.bars(per_language, "sentences kept per language", xlabel="sentences", log=True),
                            "sentences kept per language"))
    sentences = (stats.get("accounting") or {}).get("sentences") or {}
    if sentences.get("read"):
        main_content = (sentences.get("dropped") or {}).get("main_content", 0)
        blocks.append(paragraph(f"main content: {main_content:,} of {sentences['read']:,} sentences read "
                                f"({main_content / sentences['read']:.1%}) were dropped as boilerplate"))
    return blocks


def mine_extras(root: RunRoot, found: Found, stats: Mapping[str, Any]) -> list[str]:
    values, read, total = _parquet_column(root, found.path, ["src_lang", "tgt_lang", "margin"])
    pairs = Counter(f"{s}-{t}" for s, t in zip(values["src_lang"], values["tgt_lang"]))
    blocks = [heading("pairs mined per language pair"), table(("language pair", "pairs"), sorted(pairs.items()))]
    min_margin = (stats.get("config") or {}).get("min_margin")
    blocks.append(image(charts.histogram(values["margin"], "margin of the mined pairs", xlabel="margin",
                                         threshold=min_margin, threshold_label="--min-margin"), "margin histogram"))
    return blocks + _sampled_note(read, total)


def score_extras(root: RunRoot, found: Found, stats: Mapping[str, Any]) -> list[str]:
    decisions = stats.get("per_language_pair") or {}
    blocks = []
    if decisions:
        rows = []
        for pair, d in sorted(decisions.items()):
            in_range = d.get("set_statistic_in_calibration_range")
            rows.append((pair, d.get("pairs"), d.get("kept"), d.get("threshold"), d.get("precision", d.get("target_precision")),
                         d.get("estimated_good_share"), "—" if in_range is None else ("yes" if in_range else "NO")))
        blocks += [heading("threshold per language pair"),
                   table(("language pair", "pairs scored", "kept", "threshold", "precision", "estimated good share",
                          "inside calibration range"), rows)]
    values, read, total = _parquet_column(root, found.path, ["src_lang", "tgt_lang", "score"])
    by_pair: dict[str, list[float]] = {}
    for s, t, score in zip(values["src_lang"], values["tgt_lang"], values["score"]):
        by_pair.setdefault(f"{s}-{t}", []).append(score)
    for pair in sorted(by_pair)[:MAX_PAIR_CHARTS]:
        threshold = (decisions.get(pair) or {}).get("threshold")
        blocks.append(image(charts.histogram(by_pair[pair], f"{pair}: scores of the kept pairs", xlabel="score",
                                             threshold=threshold), f"{pair} score histogram"))
    return blocks + _sampled_note(read, total)


def generic_facts(stats: Mapping[str, Any]) -> list[str]:
    """The stage's own scalar facts and count tables that the books do not already show."""
    skip = {"accounting", "identity_holds", "config", "per_language", "per_language_pair", "errors", "per_file", "tally"}
    scalars, tables = [], []
    for key, value in sorted(stats.items()):
        if key in skip or key.endswith(("_read", "_kept", "_errored")):
            continue
        if isinstance(value, (int, float, str, bool)):
            scalars.append((key, value))
        elif isinstance(value, Mapping) and value and all(isinstance(v, (int, float)) for v in value.values()) \
                and not key.endswith("_dropped"):
            tables.append(heading(key) + table((key, "value"), sorted(value.items())))
    inner = (table(("fact", "value"), scalars) if scalars else "") + "".join(tables)
    return [details("the stage's other figures", inner)] if inner else []


STAGE_EXTRAS: dict[str, Callable[[RunRoot, Found, Mapping[str, Any]], list[str]]] = {
    "labse-clean": clean_extras,
    "labse-mine": mine_extras,
    "labse-score": score_extras,
}


def stage_section(root: RunRoot, found: Found) -> Section:
    marker = found.meta.get("marker") or {}
    stats = _stage_stats(root, found)
    section = Section(found.kind, found.path, completed_at=marker.get("completed_at"))
    if marker.get("unreadable"):
        section.flags.append(f"{SUCCESS_MARKER} is not readable JSON")
    if not stats:
        section.flags.append("no stats found beside the output")
        return section
    flags, blocks = books(stats)
    if found.kind.startswith("labse-") or "accounting" in stats:  # every stage keeps books (contract 11)
        section.flags += flags
    section.blocks += blocks
    section.summary = kept_summary(stats)
    extras = STAGE_EXTRAS.get(found.kind)
    if extras is not None:
        section.blocks += extras(root, found, stats)
    section.blocks += generic_facts(stats) + configuration(stats)
    return section


def script_of(token: str) -> str:
    text = token[2:] if token.startswith("##") else token
    for ch in text:
        if ch.isalpha():
            for name, pattern in _SCRIPT_OF:
                if pattern.match(ch):
                    return name
            return "other letters"
    return "no letter (digits, marks)"


def vocab_section(root: RunRoot, found: Found) -> Section:
    stats = root.read_json(f"{found.path}/vocab.stats.json")
    section = Section("labse-vocab", found.path)
    flags, blocks = books(stats)
    section.flags += flags
    section.blocks += blocks
    if "vocab.txt" in found.meta.get("files", []):
        tokens = root.read_bytes(f"{found.path}/vocab.txt").decode("utf-8").splitlines()
        per_script = Counter(script_of(t) for t in tokens if not (t.startswith("[") and t.endswith("]")))
        section.summary = f"{len(tokens):,} tokens"
        section.blocks.append(heading(f"{len(tokens):,} tokens by script"))
        section.blocks.append(image(charts.bars(dict(per_script), "vocabulary tokens per script", xlabel="tokens", log=True),
                                    "tokens per script"))
    if "vocab.report.json" in found.meta.get("files", []):
        report = root.read_json(f"{found.path}/vocab.report.json")
        by_script: dict[str, list[tuple[str, Mapping]]] = {}
        for lang, row in sorted((report.get("languages") or {}).items()):
            by_script.setdefault("+".join(sorted(expected_scripts(lang))), []).append((lang, row))
        rows = []
        for script, languages in sorted(by_script.items()):
            words = sum(row.get("words", 0) for _, row in languages) or 1
            rows.append((script, ", ".join(lang for lang, _ in languages),
                         f"{sum(r.get('unk_share', 0) * r.get('words', 0) for _, r in languages) / words:.3%}",
                         sum(r.get("subwords_per_word", 0) * r.get("words", 0) for _, r in languages) / words,
                         f"{sum(r.get('whole_word_share', 0) * r.get('words', 0) for _, r in languages) / words:.1%}"))
        section.blocks.append(heading("coverage per script (held-out sentences, weighted by words)"))
        section.blocks.append(table(("script", "languages", "[UNK] share", "pieces per word", "whole words"), rows))
    section.blocks += configuration(stats)
    return section


def main_content_section(root: RunRoot, found: Found) -> Section:
    metrics = root.read_json(found.path)
    section = Section("main-content model", found.path)
    rows = []
    for split in ("dev", "dev_text_only", "test", "test_text_only"):
        row = metrics.get(split)
        if isinstance(row, Mapping):
            rows.append((split, row.get("pages"), row.get("lines"), row.get("precision"), row.get("recall"),
                         row.get("f1"), row.get("kept_text_token_f1_vs_teacher")))
            if split == "test" and (row.get("pages") or 0) < TOO_SMALL_TO_SCORE:
                section.flags.append(f"the test split has {row.get('pages')} pages: its F1 is too noisy to mean much "
                                     f"(want >= {TOO_SMALL_TO_SCORE})")
    test = metrics.get("test") or {}
    section.summary = f"test F1 {test.get('f1', '?')} on {test.get('pages', '?')} pages"
    section.blocks.append(paragraph("line-level scores against the teacher's labels"))
    section.blocks.append(table(("split", "pages", "lines", "precision", "recall", "F1", "kept-text token F1"), rows))
    section.blocks += configuration(metrics)
    return section


def _metrics_lines(root: RunRoot, folder: str) -> list[dict]:
    path = f"{folder}/metrics.jsonl"
    if not root.exists(path):
        return []
    return [json.loads(line) for line in root.read_bytes(path).decode("utf-8").splitlines() if line.strip()]


def _curve_blocks(lines: list[dict], what: str) -> list[str]:
    series: dict[str, dict[str, tuple[list, list]]] = {"loss": {}, "accuracy": {}}
    for line in lines:
        for key, value in line.items():
            if key == "step" or not isinstance(value, (int, float)):
                continue
            group = "loss" if "loss" in key else "accuracy" if "acc" in key else None
            if group:
                xs, ys = series[group].setdefault(key, ([], []))
                xs.append(line["step"])
                ys.append(value)
    return [image(charts.curves(values, f"{what}: {group}", ylabel=group), f"{what} {group} curve")
            for group, values in series.items() if values]


def _summary_table(summary: Mapping[str, Any]) -> str:
    return table(("fact", "value"), [(k, v) for k, v in sorted(summary.items()) if isinstance(v, (int, float, str))])


def training_section(root: RunRoot, found: Found) -> Section:
    summary = root.read_json(f"{found.path}/{TRAIN_SUMMARY}")
    section = Section("labse-train", found.path)
    lines = _metrics_lines(root, found.path)
    if not lines:
        section.flags.append("no metrics.jsonl: no curves")
    final = summary.get("final_loss")
    if isinstance(final, float) and final != final:
        section.flags.append("final loss is NaN")
    section.summary = f"{summary.get('step', '?')} steps, final loss " + (f"{final:.3f}" if isinstance(final, float) else str(final))
    section.blocks += [_summary_table(summary)] + _curve_blocks(lines, "training")
    if isinstance(summary.get("dev_accuracy"), Mapping):
        section.blocks.append(heading("dev retrieval accuracy"))
        section.blocks.append(_summary_table(summary["dev_accuracy"]))
    return section


def pretraining_section(root: RunRoot, found: Found) -> Section:
    summary = root.read_json(f"{found.path}/{PRETRAIN_SUMMARY}")
    section = Section("labse-pretrain", found.path)
    section.summary = f"{summary.get('step', '?')} steps"
    stages = summary.get("stages") or {}
    if stages:
        keys = sorted({k for s in stages.values() for k, v in s.items() if isinstance(v, (int, float))})
        # a row per figure, a column per stage: stages are few, figures many (a wide table would scroll)
        section.blocks.append(table(("figure", *stages), [(k, *(s.get(k, "—") for s in stages.values())) for k in keys]))
    section.blocks.append(_summary_table(summary))
    section.blocks += _curve_blocks(_metrics_lines(root, found.path), "pre-training")
    return section


def evaluation_section(root: RunRoot, found: Found) -> Section:
    results = found.meta["results"]
    section = Section(f"evaluation: {results['task']}", found.path)
    if isinstance(results.get("mean"), (int, float)):
        section.summary = f"mean accuracy {results['mean']:.1%}"
    if results["task"] == "tatoeba":
        rows = [(lang, row.get("pairs", "—"), row.get("xx->en", "—"), row.get("en->xx", "—"), row.get("mean"))
                for lang, row in sorted((results.get("languages") or {}).items())]
        section.blocks.append(table(("language", "pairs", "xx->en", "en->xx", "mean accuracy"), rows))
    else:
        rows = [(pair, row.get("pairs"), row.get("src->tgt"), row.get("tgt->src"), row.get("mean"))
                for pair, row in sorted((results.get("pairs") or {}).items())]
        section.blocks.append(table(("pair", "pairs", "src->tgt", "tgt->src", "mean accuracy"), rows))
    if "mean" in results:
        section.blocks.append(paragraph(f"mean accuracy {results['mean']:.1%} (model {results.get('model', '?')})"))
    return section


BUILDERS: dict[str, Callable[[RunRoot, Found], Section]] = {
    "vocab": vocab_section,
    "main-content-model": main_content_section,
    "train": training_section,
    "pretrain": pretraining_section,
    "eval": evaluation_section,
}


def section_for(root: RunRoot, found: Found) -> Section:
    """The found output's section; an output that cannot be read is a flagged section, not a crash."""
    builder = BUILDERS.get(found.kind, stage_section)
    try:
        return builder(root, found)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Section(found.kind, found.path, flags=[f"could not be read: {type(exc).__name__}: {exc}"],
                       blocks=[preformatted(repr(exc))])
