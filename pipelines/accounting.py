"""Counting by reason, shared by every stage: Beam counters for monitoring, and a tally that
travels WITH the data so `stats.json` is exact on every runner.

Beam metrics are the live view (Dataflow's UI, `PipelineResult.metrics()`), but they are not a
reliable source for a file written at the end of the run: DirectRunner's multi_processing mode and
retried bundles make them hard to query exactly. So each stage also emits small `Tally` dicts
(flat counter name -> int) as a side output, sums them with one `CombineGlobally`, and writes
`stats.json` from that sum as the run's last step, atomically.

Tally keys are dotted: `documents.read`, `documents.dropped.<reason>`, `sentences.errored`, ...
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

import apache_beam as beam

Tally = dict[str, int]

COUNTER_NAMESPACE = "labse"


class ReasonCounters:
    """Beam counters named `<unit>.<outcome>[.<reason>]`, created lazily (one object per name)."""

    def __init__(self, namespace: str = COUNTER_NAMESPACE):
        self.namespace = namespace
        self._counters: dict[str, object] = {}

    def inc(self, name: str, value: int = 1) -> None:
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = beam.metrics.Metrics.counter(self.namespace, name)
        counter.inc(value)

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


def _section(tally: Mapping[str, int], unit: str) -> dict:
    dropped_prefix = f"{unit}.dropped."
    dropped = {
        name[len(dropped_prefix):]: value
        for name, value in sorted(tally.items())
        if name.startswith(dropped_prefix) and value
    }
    return {
        f"{unit}_read": int(tally.get(f"{unit}.read", 0)),
        f"{unit}_kept": int(tally.get(f"{unit}.kept", 0)),
        f"{unit}_dropped": dropped,
        f"{unit}_errored": int(tally.get(f"{unit}.errored", 0)),
    }


def identity_violations(stats: Mapping) -> list[str]:
    """Units for which read != kept + sum(dropped) + errored (empty when the books balance)."""
    bad = []
    for unit in ("documents", "sentences"):
        read = stats[f"{unit}_read"]
        accounted = stats[f"{unit}_kept"] + sum(stats[f"{unit}_dropped"].values()) + stats[f"{unit}_errored"]
        if read != accounted:
            bad.append(f"{unit}: read {read} != kept + dropped + errored {accounted}")
    return bad


def build_stats(tally: Mapping[str, int], per_language: Mapping[str, int], config: Mapping) -> dict:
    stats: dict = {}
    stats.update(_section(tally, "documents"))
    stats.update(_section(tally, "sentences"))
    stats["per_language"] = dict(sorted(per_language.items(), key=lambda kv: (-kv[1], kv[0])))
    stats["identity_holds"] = not identity_violations(stats)
    stats["config"] = dict(config)
    return stats


