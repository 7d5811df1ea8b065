"""The training order of an epoch as a pure function of (seed, epoch, position), in O(shards) memory.

labse-tfrecords already shuffles globally when it writes (each record goes to the shard its hash
key names, sorted by key within the shard), so every shard is a random sample of the corpus. Per
epoch the loader then

1. puts the shards in a seeded random order (``numpy.random.Generator.permutation`` over the
   shard numbers, seeded with ``(seed, epoch)``),
2. cuts that order into *windows* of ``window`` consecutive shards, and
3. within a window of ``N`` records, visits its records in the order of a keyed bijection of
   ``[0, N)``: a 6-round Feistel network over ``2h`` bits (``4**h >= N``) with splitmix64 round
   functions keyed by ``(seed, epoch, window)``, cycle-walked into ``[0, N)``.

Position ``p`` of the epoch is therefore located without holding any per-record state: the window
is found from the windows' record counts, the bijection maps ``p`` to a record of the window, and
the window's record counts map that to (shard, record number). Nothing is drawn sequentially, so
any position of any epoch is computed directly: resuming at step ``s`` costs the same as step 0.

This is the global-index shuffle of grain/ArrayRecord (a keyed permutation instead of a shuffle
buffer) restricted to windows of shards, so that only the windows' record indexes need to be open.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FEISTEL_ROUNDS", "keyed_permutation", "EpochPlan", "ORDER_NAME"]

FEISTEL_ROUNDS = 6
# Saved in checkpoints: a change of the order's definition must not resume silently into another order.
ORDER_NAME = "shard-window-feistel/1"
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _half_bits(n: int) -> int:
    bits = max(1, (int(n) - 1).bit_length())
    return (bits + 1) // 2


def keyed_permutation(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Images of `positions` (each in ``[0, n)``) under the bijection of ``[0, n)`` keyed by `keys`
    (uint64, one per Feistel round). Vectorised; on average fewer than 4 network passes a value."""
    positions = np.asarray(positions, dtype=np.uint64)
    if n <= 1:
        return positions.astype(np.int64)
    h = np.uint64(_half_bits(n))
    mask = np.uint64((1 << int(h)) - 1)

    def network(x: np.ndarray) -> np.ndarray:
        left, right = x >> h, x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << h) | right

    out = network(positions)
    outside = out >= np.uint64(n)
    while outside.any():  # cycle walking: the cycle through a value below n returns below n
        out[outside] = network(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


@dataclass(frozen=True)
class EpochPlan:
    """Where each position of one epoch reads: shard order, windows and their keys (O(shards) memory)."""

    counts: np.ndarray  # records per shard, in shard-number order
    seed: int
    epoch: int
    window: int

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64)
        order = np.random.default_rng([int(self.seed), int(self.epoch)]).permutation(len(counts))
        window_counts = np.add.reduceat(counts[order], np.arange(0, len(counts), self.window)) if len(counts) else counts
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "shard_order", order)
        object.__setattr__(self, "window_starts", np.concatenate([[0], np.cumsum(window_counts)]).astype(np.int64))

    @property
    def num_records(self) -> int:
        return int(self.window_starts[-1])

    def window_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.window_starts, positions, side="right") - 1

    def window_shards(self, window: int) -> np.ndarray:
        """The shard numbers of `window`, in the epoch's order."""
        return self.shard_order[window * self.window : (window + 1) * self.window]

    def _keys(self, window: int) -> np.ndarray:
        rng = np.random.default_rng([int(self.seed), int(self.epoch), int(window), 0xF135])
        return rng.integers(0, 2**64, size=FEISTEL_ROUNDS, dtype=np.uint64, endpoint=False)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, record number within the shard) of each epoch position."""
        positions = np.asarray(positions, dtype=np.int64)
        windows = self.window_of(positions)
        shards = np.empty(len(positions), dtype=np.int64)
        records = np.empty(len(positions), dtype=np.int64)
        for window in np.unique(windows).tolist():
            rows = np.flatnonzero(windows == window)
            start, end = self.window_starts[window], self.window_starts[window + 1]
            inside = keyed_permutation(positions[rows] - start, int(end - start), self._keys(window))
            members = self.window_shards(window)
            member_starts = np.concatenate([[0], np.cumsum(self.counts[members])]).astype(np.int64)
            member = np.searchsorted(member_starts, inside, side="right") - 1
            shards[rows] = members[member]
            records[rows] = inside - member_starts[member]
        return shards, records
