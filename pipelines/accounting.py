"""Counting by reason, shared by every stage: Beam counters for monitoring, a tally that travels
WITH the data so the stats JSON is exact on every runner, and the one accounting section every
stage's stats JSON carries (README, contract 11).

Beam metrics are the live view (Dataflow's UI, `PipelineResult.metrics()`), but they are not a
reliable source for a file written at the end of the run: DirectRunner's multi_processing mode and
retried bundles make them hard to query exactly. So each stage also emits small `Tally` dicts
(flat counter name -> int) as a side output (or counts a PCollection with `CountByName`), sums them
with one `CombineGlobally(SumTallies())` (`MergeTallies`), and writes its stats from that sum as
the run's last step, atomically.

Tally keys are dotted, `<unit>.<outcome>[.<reason>]` (`tally_key`): `documents.read`,
`documents.dropped.<reason>`, `sentences.errored`, `files.errored.unreadable_file`, ... A unit is
what a stage counts one by one (documents, sentences, pairs, files); its name has no dot. Every
unit a stage reads ends in exactly one outcome, so for every unit

    read = kept + sum(dropped) + errored

`accounting_section(tally, units)` turns the tally into the stats JSON's

    "accounting": {UNIT: {"read": n, "kept": n, "dropped": {reason: n}, "errored": n
                          [, "errors": {reason: n}]}, ...},
    "identity_holds": true

and `identity_violations(stats)` is the one check of it (empty when the books balance). Other keys
of the tally (`words.de`, `sentences.heldout`, ...) are the stage's own facts and are not part of
the section.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Mapping, Sequence

import apache_beam as beam

from pipelines.progress import worker_tracker

Tally = dict[str, int]
TALLY = "tally"  # the tagged output a step's tallies travel on

OUTCOMES = ("read", "kept", "dropped", "errored")


def tally_key(unit: str, outcome: str, reason: str | None = None) -> str:
    """`documents.read`, `pairs.dropped.below_min_score`, `files.errored.unreadable_file`."""
    if "." in unit or outcome not in OUTCOMES:
        raise ValueError(f"bad tally key: unit {unit!r} (no dots), outcome {outcome!r} (one of {OUTCOMES})")
    if reason is None:
        return f"{unit}.{outcome}"
    if outcome in ("read", "kept"):
        raise ValueError(f"{outcome} has no reason")
    return f"{unit}.{outcome}.{reason}"


class ReasonCounters:
    """Beam counters named `<unit>.<outcome>[.<reason>]`, created lazily (one object per name)."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        self._counters: dict[str, object] = {}

    def inc(self, name: str, value: int = 1) -> None:
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = beam.metrics.Metrics.counter(self.namespace, name)
        counter.inc(value)
        if name.endswith(".read") and name.count(".") == 1:  # a unit read: the local progress board's count
            worker_tracker(name[: -len(".read")]).advance(value)

    def inc_tally(self, tally: Mapping[str, int]) -> None:
        for name, value in tally.items():
            if value:
                self.inc(name, value)


class SumTallies(beam.CombineFn):
    """Sums tallies; the empty sum is `{}` so a run over no input still writes stats."""

    def create_accumulator(self) -> Counter:
        return Counter()

    def add_input(self, acc: Counter, tally: Mapping[str, int]) -> Counter:
        acc.update(tally)
        return acc

    def merge_accumulators(self, accs: Iterable[Counter]) -> Counter:
        total: Counter = Counter()
        for acc in accs:
            total.update(acc)
        return total

    def extract_output(self, acc: Counter) -> Tally:
        return dict(acc)


class CountByName(beam.PTransform):
    """A PCollection -> one tally `{name_of(element): count}` (a one-element PCollection).

    `name_of` gives the element's tally key (`tally_key(...)`), or None to leave it uncounted;
    with a `namespace` each count is also a Beam counter (the live view). An empty input gives
    `{}`. Example: `rows | "CountKept" >> CountByName(lambda _row: "pairs.kept")`.
    """

    def __init__(self, name_of: Callable[[object], str | None], namespace: str | None = None):
        super().__init__()
        self.name_of = name_of
        self.namespace = namespace

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (pcoll
                | "Name" >> beam.ParDo(_NameFn(self.name_of, self.namespace))
                | "Sum" >> beam.CombineGlobally(SumTallies()))


class _NameFn(beam.DoFn):
    def __init__(self, name_of: Callable[[object], str | None], namespace: str | None):
        self.name_of = name_of
        self.namespace = namespace

    def setup(self) -> None:
        self.counters = ReasonCounters(self.namespace) if self.namespace is not None else None

    def process(self, element):
        name = self.name_of(element)
        if name is not None:
            if self.counters is not None:
                self.counters.inc(name)
            yield {name: 1}


class MergeTallies(beam.PTransform):
    """Several PCollections of tallies -> their sum, one tally: `(a, b) | MergeTallies()` (a
    tuple: Beam takes a list on the left of `|` as data to create)."""

    def expand(self, tallies) -> beam.PCollection:
        return tuple(tallies) | "Flatten" >> beam.Flatten() | "Sum" >> beam.CombineGlobally(SumTallies())


# ---------------------------------------------------------------------------------------------
# The accounting section of every stage's stats JSON.

def unit_accounting(tally: Mapping[str, int], unit: str) -> dict:
    """`{"read", "kept", "dropped": {reason: n}, "errored"[, "errors": {reason: n}]}` of one unit.

    `errored` is `<unit>.errored` plus every `<unit>.errored.<reason>`; `errors` (only when some
    reason is known) breaks it down, an unnamed rest as `unspecified`, so it always sums to it.
    Reasons with a zero count are left out.
    """
    def under(outcome: str) -> dict[str, int]:
        prefix = f"{unit}.{outcome}."
        return {name[len(prefix):]: int(value) for name, value in sorted(tally.items())
                if name.startswith(prefix) and value}

    errors = under("errored")
    unnamed = int(tally.get(f"{unit}.errored", 0))
    section = {
        "read": int(tally.get(f"{unit}.read", 0)),
        "kept": int(tally.get(f"{unit}.kept", 0)),
        "dropped": under("dropped"),
        "errored": unnamed + sum(errors.values()),
    }
    if errors:
        if unnamed:
            errors["unspecified"] = errors.get("unspecified", 0) + unnamed
        section["errors"] = dict(sorted(errors.items()))
    return section


def build_accounting(tally: Mapping[str, int], units: Sequence[str]) -> dict:
    """`{unit: unit_accounting(tally, unit)}` for the stage's units, in the order given."""
    return {unit: unit_accounting(tally, unit) for unit in units}


def accounting_violations(accounting: Mapping[str, Mapping]) -> list[str]:
    """Units of an accounting section whose books do not balance (empty when all do): read !=
    kept + sum(dropped) + errored, a negative count, or `errors` not summing to `errored`."""
    bad = []
    for unit, section in accounting.items():
        dropped = section.get("dropped", {})
        accounted = section["kept"] + sum(dropped.values()) + section["errored"]
        if section["read"] != accounted:
            bad.append(f"{unit}: read {section['read']} != kept + dropped + errored {accounted}")
        counts = [section["read"], section["kept"], section["errored"], *dropped.values()]
        if min(counts) < 0:
            bad.append(f"{unit}: a negative count {section}")
        if "errors" in section and sum(section["errors"].values()) != section["errored"]:
            bad.append(f"{unit}: errors by reason {section['errors']} do not sum to errored {section['errored']}")
    return bad


def accounting_section(tally: Mapping[str, int], units: Sequence[str]) -> dict:
    """`{"accounting": ..., "identity_holds": bool}`: what every stage's stats JSON carries."""
    accounting = build_accounting(tally, units)
    return {"accounting": accounting, "identity_holds": not accounting_violations(accounting)}


def identity_violations(stats: Mapping) -> list[str]:
    """Where a stage's stats (with an `accounting` section) break read = kept + dropped + errored;
    empty when every unit balances. The one check, for every stage."""
    accounting = stats.get("accounting")
    if not accounting:
        return ["no accounting section"]
    return accounting_violations(accounting)


def flat_unit_keys(accounting: Mapping[str, Mapping], unit: str) -> dict:
    """`{unit}_read`, `{unit}_kept`, `{unit}_dropped`, `{unit}_errored`: labse-clean's (and
    build-data's) top-level keys, the same numbers as the accounting section."""
    section = accounting[unit]
    return {f"{unit}_{outcome}": section[outcome] for outcome in OUTCOMES}


# ---------------------------------------------------------------------------------------------
# labse-clean's stats.json (the per-file breakdown and the writing are in pipelines.clean.transforms).

CLEAN_UNITS = ("documents", "sentences")


def main_content_section(tally: Mapping[str, int]) -> dict:
    """Pages scored by each main-content decider (`main_content.<by>`: classifier, fallback,
    teacher, and fallback_failed / teacher_failed where trafilatura raised; pipelines.main_content.
    scoring) and the share the fallback sent to trafilatura, of the pages the model scored."""
    by = {name[len("main_content."):]: int(value) for name, value in sorted(tally.items())
          if name.startswith("main_content.") and value}
    sent = by.get("fallback", 0) + by.get("fallback_failed", 0)
    model_pages = by.get("classifier", 0) + sent
    return {"pages": by, "fallback_share": round(sent / model_pages, 4) if model_pages else 0.0}


def build_stats(tally: Mapping[str, int], per_language: Mapping[str, int], config: Mapping) -> dict:
    section = accounting_section(tally, CLEAN_UNITS)
    stats: dict = {}
    for unit in CLEAN_UNITS:
        stats.update(flat_unit_keys(section["accounting"], unit))
    stats["per_language"] = dict(sorted(per_language.items(), key=lambda kv: (-kv[1], kv[0])))
    stats.update(section)
    stats["main_content"] = main_content_section(tally)
    stats["config"] = dict(config)
    return stats


def summary_text(stage: str, stats: Mapping, unit: str, decisions: Sequence[str] = (),
                 warnings: Sequence[str] = ()) -> str:
    """The closing lines every stage prints (through run_stage's `summarise`), from the accounting
    section of its stats: `unit`s read, kept, dropped (the top three reasons) and errored; then the
    stage's key decisions; then a WARNING line for each degenerate result, kept < 1% of read added here."""
    books = stats.get("accounting", {}).get(unit, {})
    read, kept, errored = books.get("read", 0), books.get("kept", 0), books.get("errored", 0)
    dropped = books.get("dropped", {})
    top = sorted(dropped.items(), key=lambda item: -item[1])[:3]
    reasons = f" ({', '.join(f'{reason} {n:,}' for reason, n in top)}{', ...' if len(dropped) > 3 else ''})" if top else ""
    alerts = list(warnings)
    if read and kept < 0.01 * read:
        alerts.append(f"only {kept:,} of {read:,} {unit} kept (< 1%)")
    return closing_lines(f"{stage}: {read:,} {unit} read, {kept:,} kept, {sum(dropped.values()):,} dropped{reasons}, "
                         f"{errored:,} errored", decisions, alerts)


def closing_lines(headline: str, decisions: Sequence[str] = (), warnings: Sequence[str] = ()) -> str:
    """summary_text's layout for a command whose work is not units read and kept (the trainers): the
    headline, the key decisions indented, a WARNING line each."""
    return "\n".join([headline, *(f"  {decision}" for decision in decisions),
                      *(f"WARNING {warning}" for warning in warnings)])
