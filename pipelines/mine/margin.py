"""Margin-based bitext mining (Artetxe & Schwenk 2019; LASER `source/mine_bitexts.py`).

For source x and target y with L2-normalised embeddings, with NN_k(x) the k nearest targets of x
and NN_k(y) the k nearest sources of y:

    fwd_mean(x) = mean_{z in NN_k(x)} cos(x, z)      bwd_mean(y) = mean_{z in NN_k(y)} cos(y, z)
    margin(x, y) = M(cos(x, y), (fwd_mean(x) + bwd_mean(y)) / 2)

with M = `ratio` a / b, `distance` a - b or `absolute` a (plain cosine). Candidates are each
sentence's k nearest neighbours; each sentence takes its best-margin candidate. Strategies:

* `fwd`: every source with its best target; `bwd`: every target with its best source;
* `intersect`: pairs that are best in both directions;
* `max`: all forward and backward bests, sorted by margin, taken greedily so that each source and
  each target sentence is used at most once (LASER's default).

`backward="candidates"` searches one side in full (`side_searched_in_full`) and of the other only
the sentences among those k-nearest lists (the ones whose kNN mean a margin needs): every forward
list and margin is the full search's; the sentences in no list get no best candidate of their own
(-1 in `select`), which only `max` (and the `bwd` side of a limited target side) could have used.

The pure functions here are shared by the in-memory miner (`mine`) and the Beam pipeline
(`pipelines/mine.py`), which computes the same quantities across shards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, TypeVar

import numpy as np

from pipelines.mine.search import SearchConfig, knn

# The kind of margin (how a cosine is set against its neighbours' mean): not the trainer's additive
# margin (labse_model.loss), which is a number taken off the positive's cosine.
MARGIN_KINDS = ("ratio", "distance", "absolute")
STRATEGIES = ("max", "intersect", "fwd", "bwd")
BACKWARD_SEARCHES = ("candidates", "all")  # labse-mine's --backward-search
UNEVEN = 2  # the target side is searched in full instead of the source when it has under 1/UNEVEN of its sentences
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class MarginConfig:
    k: int = 4                 # neighbours for the margin means and candidates (LASER: 4)
    margin_kind: str = "ratio"  # LASER's default and the paper's best
    strategy: str = "max"
    threshold: float | None = None   # keep pairs with margin >= threshold (None: keep all)
    backward: str = "all"  # "candidates": the other side searched only for the full side's candidates

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError("k must be >= 1")
        if self.margin_kind not in MARGIN_KINDS:
            raise ValueError(f"margin_kind must be one of {MARGIN_KINDS}, got {self.margin_kind!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.backward not in BACKWARD_SEARCHES:
            raise ValueError(f"backward must be one of {BACKWARD_SEARCHES}, got {self.backward!r}")


def side_searched_in_full(n_src: int, n_tgt: int, strategy: str) -> str:
    """With the backward search limited to the candidates, the side ("src" or "tgt") whose every
    sentence is searched. `fwd` needs every source's best, `bwd` every target's; for `max` and
    `intersect` the smaller side, so that the larger (English, the hub) is searched at most k times
    the smaller's sentences: the target side when it has under 1/UNEVEN of the sources' sentences,
    else the source side (sides of similar size keep the usual forward direction)."""
    if strategy in ("fwd", "bwd"):
        return "src" if strategy == "fwd" else "tgt"
    return "tgt" if n_tgt * UNEVEN < n_src else "src"


def margin_function(margin_kind: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    if margin_kind == "ratio":
        # LASER divides without a guard; only an exactly-zero denominator is nudged
        return lambda a, b: a / np.where(b == 0, 1e-12, b)
    if margin_kind == "distance":
        return lambda a, b: a - b
    if margin_kind == "absolute":
        return lambda a, b: a
    raise ValueError(f"margin kind must be one of {MARGIN_KINDS}, got {margin_kind!r}")


def margin_scores(cosines, fwd_means, bwd_means, margin_kind: str):
    """Margin of candidate pairs from their cosine and both sides' kNN means (broadcasts)."""
    cosines = np.asarray(cosines, dtype=np.float64)
    denominator = (np.asarray(fwd_means, dtype=np.float64) + np.asarray(bwd_means, dtype=np.float64)) / 2
    return margin_function(margin_kind)(cosines, denominator)


def greedy_unique(candidates: Iterable[tuple[float, K, K]]) -> list[tuple[float, K, K]]:
    """LASER's `max` selection: by descending score, keep a pair only if neither side is used yet.

    `candidates` are (score, source key, target key); ties are broken by the keys so the result
    does not depend on input order (Beam delivers candidates in no particular order).
    """
    ordered = sorted(candidates, key=lambda c: (-c[0], c[1], c[2]))
    used_src: set = set()
    used_tgt: set = set()
    kept = []
    for score, src, tgt in ordered:
        if src in used_src or tgt in used_tgt:
            continue
        used_src.add(src)
        used_tgt.add(tgt)
        kept.append((score, src, tgt))
    return kept


def greedy_unique_columns(margins, sources, targets) -> np.ndarray:
    """`greedy_unique` over columns (Arrow or numpy: float margins, string keys, or numpy integer
    keys such as store ids): a bool mask of the candidates kept, the same choice (the same order:
    margin descending, then source, then target; Arrow orders strings by their UTF-8 bytes, which
    is Python's code point order). For labse-mine's `max` over a whole language pair: a candidate
    costs ~40 bytes plus its two texts here (numpy alone with integer keys), where a Python tuple
    of items cost ~500."""
    if all(isinstance(keys, np.ndarray) and keys.dtype.kind in "iu" for keys in (sources, targets)):
        order = np.lexsort((targets, sources, -np.asarray(margins, np.float64)))
        codes = [np.unique(keys, return_inverse=True)[1].reshape(-1).astype(np.int64)[order]
                 for keys in (sources, targets)]
    else:
        order, codes = _arrow_order_and_codes(margins, sources, targets)
    return _greedy_mask(order, codes)


def _arrow_order_and_codes(margins, sources, targets) -> tuple[np.ndarray, list[np.ndarray]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    def column(values, kind):
        return values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, kind)

    table = pa.table({"margin": column(margins, pa.float64()), "src": column(sources, pa.string()),
                      "tgt": column(targets, pa.string())})
    order = pc.sort_indices(table, sort_keys=[("margin", "descending"), ("src", "ascending"),
                                              ("tgt", "ascending")]).to_numpy()
    return order, [pc.dictionary_encode(table[name]).combine_chunks().indices.to_numpy().astype(np.int64)[order]
                   for name in ("src", "tgt")]


def _greedy_mask(order: np.ndarray, codes: list[np.ndarray]) -> np.ndarray:
    """The greedy over candidates in `order`, each side's key as a code: which candidates it keeps."""
    used_src, used_tgt = np.zeros(len(order) + 1, bool), np.zeros(len(order) + 1, bool)
    kept = np.zeros(len(order), bool)
    for position, (src, tgt) in enumerate(zip(memoryview(codes[0]), memoryview(codes[1]))):
        if used_src[src] or used_tgt[tgt]:
            continue
        used_src[src] = used_tgt[tgt] = True
        kept[order[position]] = True
    return kept


@dataclass
class MinedPairs:
    """Pairs as row indices into the source and target matrices, with cosine and margin."""

    src: np.ndarray
    tgt: np.ndarray
    margin: np.ndarray
    cosine: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def empty(cls) -> "MinedPairs":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))


@dataclass
class Neighbours:
    """kNN of both directions: sims/ids [n, k] and their means."""

    fwd_sims: np.ndarray
    fwd_ids: np.ndarray
    bwd_sims: np.ndarray
    bwd_ids: np.ndarray

    @property
    def fwd_mean(self) -> np.ndarray:
        return self.fwd_sims.mean(axis=1) if self.fwd_sims.shape[1] else np.zeros(len(self.fwd_sims))

    @property
    def bwd_mean(self) -> np.ndarray:
        return self.bwd_sims.mean(axis=1) if self.bwd_sims.shape[1] else np.zeros(len(self.bwd_sims))


def neighbours(x: np.ndarray, y: np.ndarray, k: int, search: SearchConfig = SearchConfig()) -> Neighbours:
    fwd_sims, fwd_ids = knn(x, y, k, search)
    bwd_sims, bwd_ids = knn(y, x, k, search)
    return Neighbours(fwd_sims, fwd_ids, bwd_sims, bwd_ids)


def best_candidates(cand_sims: np.ndarray, cand_ids: np.ndarray, own_mean: np.ndarray,
                    other_mean: np.ndarray, margin_kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each row: (best candidate id, its margin, its cosine) among its k candidates."""
    scores = margin_scores(cand_sims, own_mean[:, None], other_mean[cand_ids], margin_kind)
    best = scores.argmax(axis=1)
    rows = np.arange(len(best))
    return cand_ids[rows, best], scores[rows, best], cand_sims[rows, best].astype(np.float64)


def select(fwd: tuple[np.ndarray, np.ndarray, np.ndarray], bwd: tuple[np.ndarray, np.ndarray, np.ndarray],
           strategy: str) -> MinedPairs:
    """Apply a strategy to each source's best (fwd) and each target's best (bwd) candidate."""
    fwd_best, fwd_margin, fwd_cos = fwd
    bwd_best, bwd_margin, bwd_cos = bwd
    n_src = len(fwd_best)
    if strategy == "fwd":
        rows = np.flatnonzero(fwd_best >= 0)  # -1: a sentence not searched (backward="candidates")
        return MinedPairs(rows, fwd_best[rows], fwd_margin[rows], fwd_cos[rows])
    if strategy == "bwd":
        rows = np.flatnonzero(bwd_best >= 0)
        return MinedPairs(bwd_best[rows], rows, bwd_margin[rows], bwd_cos[rows])
    if strategy == "intersect":
        mutual = (fwd_best >= 0) & (bwd_best[np.maximum(fwd_best, 0)] == np.arange(n_src))
        rows = np.flatnonzero(mutual)
        return MinedPairs(rows, fwd_best[rows], fwd_margin[rows], fwd_cos[rows])
    if strategy == "max":
        cosine = {}
        candidates = []
        for i, (j, m, c) in enumerate(zip(fwd_best, fwd_margin, fwd_cos)):
            if j >= 0:
                candidates.append((float(m), i, int(j)))
                cosine[(i, int(j))] = float(c)
        for j, (i, m, c) in enumerate(zip(bwd_best, bwd_margin, bwd_cos)):
            if i >= 0:
                candidates.append((float(m), int(i), j))
                cosine[(int(i), j)] = float(c)
        kept = greedy_unique(candidates)
        if not kept:
            return MinedPairs.empty()
        return MinedPairs(
            np.array([s for _, s, _ in kept], np.int64), np.array([t for _, _, t in kept], np.int64),
            np.array([m for m, _, _ in kept]), np.array([cosine[(s, t)] for _, s, t in kept]),
        )
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


def margin_pairs(nn: Neighbours, margin_kind: str, strategy: str) -> MinedPairs:
    """The pairs a strategy selects from both directions' full kNN lists."""
    fwd_mean, bwd_mean = nn.fwd_mean, nn.bwd_mean
    return select(best_candidates(nn.fwd_sims, nn.fwd_ids, fwd_mean, bwd_mean, margin_kind),
                  best_candidates(nn.bwd_sims, nn.bwd_ids, bwd_mean, fwd_mean, margin_kind), strategy)


def mine(x: np.ndarray, y: np.ndarray, config: MarginConfig = MarginConfig(),
         search: SearchConfig = SearchConfig()) -> MinedPairs:
    """Mine pairs between source vectors `x` and target vectors `y` (both L2-normalised)."""
    if len(x) == 0 or len(y) == 0:
        return MinedPairs.empty()
    if config.backward == "candidates":
        pairs = _mine_candidates_backward(x, y, config, search)
    else:
        pairs = margin_pairs(neighbours(x, y, config.k, search), config.margin_kind, config.strategy)
    if config.threshold is not None and len(pairs):
        keep = pairs.margin >= config.threshold
        pairs = MinedPairs(pairs.src[keep], pairs.tgt[keep], pairs.margin[keep], pairs.cosine[keep])
    return pairs


def _mine_candidates_backward(x: np.ndarray, y: np.ndarray, config: MarginConfig, search: SearchConfig) -> MinedPairs:
    """`mine` with the backward search limited to the full side's candidates (module doc)."""
    if side_searched_in_full(len(x), len(y), config.strategy) == "tgt":  # mined the other way round
        mirrored = {"fwd": "bwd", "bwd": "fwd"}.get(config.strategy, config.strategy)
        pairs = _mine_candidates_backward(y, x, MarginConfig(config.k, config.margin_kind, mirrored), search)
        return MinedPairs(pairs.tgt, pairs.src, pairs.margin, pairs.cosine)
    fwd_sims, fwd_ids = knn(x, y, config.k, search)
    asked = np.unique(fwd_ids[fwd_ids >= 0])
    asked_sims, asked_ids = knn(y[asked], x, config.k, search)
    fwd_mean = fwd_sims.mean(axis=1)
    bwd_mean = np.full(len(y), np.nan)
    bwd_mean[asked] = asked_sims.mean(axis=1)
    bwd = [np.full(len(y), -1, np.int64), np.zeros(len(y)), np.zeros(len(y))]
    for whole, part in zip(bwd, best_candidates(asked_sims, asked_ids, bwd_mean[asked], fwd_mean, config.margin_kind)):
        whole[asked] = part
    return select(best_candidates(fwd_sims, fwd_ids, fwd_mean, bwd_mean, config.margin_kind), tuple(bwd),
                  config.strategy)


def precision_recall_f1(predicted: Iterable[tuple[int, int]], gold: set[tuple[int, int]]) -> dict[str, float]:
    predicted = set(predicted)
    correct = len(predicted & gold)
    precision = correct / len(predicted) if predicted else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "predicted": len(predicted),
            "correct": correct, "gold": len(gold)}


def best_threshold_f1(pairs: MinedPairs, gold: set[tuple[int, int]]) -> tuple[float, dict[str, float]]:
    """The oracle threshold on margin that maximises F1 against `gold` (LASER's BUCC protocol)."""
    if len(pairs) == 0:
        return float("inf"), precision_recall_f1([], gold)
    order = np.argsort(-pairs.margin, kind="stable")
    hits = np.array([(int(pairs.src[i]), int(pairs.tgt[i])) in gold for i in order], dtype=np.float64)
    correct = np.cumsum(hits)
    kept = np.arange(1, len(order) + 1)
    precision = correct / kept
    recall = correct / max(len(gold), 1)
    f1 = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0)
    best = int(f1.argmax())
    threshold = float(pairs.margin[order[best]])
    chosen = [(int(pairs.src[i]), int(pairs.tgt[i])) for i in order[: best + 1]]
    return threshold, precision_recall_f1(chosen, gold)
