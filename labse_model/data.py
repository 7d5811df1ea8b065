"""Training batches from TFRecord shards (contract 8), without TensorFlow.

    loader = build_train_loader("shards/*.tfrecord", global_batch_size=4096, rank=r, world_size=n,
                                seed=0, num_workers=2, start_step=resumed_step)
    for step, batch in enumerate(loader, start=resumed_step): ...

Guarantees
----------
* With the seed fixed, the global batch at step ``s`` is the same whatever the world size and the
  number of DataLoader workers; rank ``r`` receives rows ``[r*B, (r+1)*B)`` of it
  (``B = global_batch_size // world_size``), dynamically padded to its own longest sequence.
* Every rank yields the same number of steps (epochs end on a whole global batch; the remainder
  of an epoch is dropped, as with ``drop_last``), so uneven shard counts can never hang a
  collective in the trainer.
* ``start_step=s`` reproduces exactly the batches an uninterrupted run yields from step ``s``:
  nothing is replayed, the position is computed.
* Epochs repeat forever with a fresh shard order and shuffle per epoch (``seed``, ``epoch``); the
  trainer stops at its ``max_steps``.

How the work is split (and why)
-------------------------------
Splitting *shards* across ranks (the tf.data way) makes the global batch depend on the world
size and leaves ranks with unequal work when the shard count is uneven.  Making every rank read
*every* record and keep its slice fixes both but multiplies the parsing work by the world size
and gives DataLoader workers nothing to share.  This module does the ordering in *index space*:

1. At start-up each process scans the record headers of every shard (12 bytes per record, length
   CRC checked; a truncated shard fails here, naming the file and offset) and keeps the byte offset
   of each record: 8 bytes per record (100 M records -> 800 MB per process; for more, point each
   run of ``labse-train`` at a subset of shards).
2. The epoch's order is computed on record numbers only, identically in every process: the shards
   in a seeded order, interleaved round-robin (robust even to shards holding one language pair
   each), then passed through a seeded shuffle buffer of ``shuffle_buffer`` records (the tf.data
   semantics: buffer full, emit a random slot, refill it).  This costs a few integer operations per
   record per epoch and no I/O.
3. Each process then reads and parses *only the records of its own rows*, by seeking to their
   offsets (data CRC checked), and DataLoader worker ``w`` of ``W`` builds steps ``w, w+W, ...`` —
   PyTorch returns an iterable dataset's items round-robin over workers, so the step order holds.

So parsing is split exactly ``world_size * num_workers`` ways, the global batch is independent of
both, and the reads of a batch are near each shard's read cursor (the buffer spans a window of
``shuffle_buffer`` records across the shards), which the page cache and readahead handle well on
local disk.

Shards on object storage (``--data 'gs://B/shards/*.tfrecord'``) are read in place, never copied
first (`pipelines.io.storage.open_input`: 8 MiB blocks, read ahead): the index scan streams each
shard once (headers only are kept), and each process then opens only the shards its rows fall in
and fetches the blocks holding its records (with the shuffle buffer spanning a window of records
across shards, consecutive batches reuse the same blocks). Every folder holding shards there must
carry the ``_SUCCESS`` that labse-tfrecords writes last: a half-copied or still-running output is
refused before training starts.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipelines.io.tfrecord import TFRecordCorruptError, decode_pair, index_open_records, read_record_at

from pipelines.io import storage
from .config import file_sha256
from pipelines.io.config_options import UsageError

__all__ = [
    "SCHEMA_FILENAME",
    "ShardIndex",
    "resolve_shards",
    "load_schema",
    "check_schema_vocab",
    "epoch_order",
    "pad_batch",
    "PairBatchStream",
    "TrainLoader",
    "build_train_loader",
    "iter_pairs",
]

logger = logging.getLogger(__name__)

SCHEMA_FILENAME = "schema.json"
SUPPORTED_SCHEMA_VERSIONS = (1,)


def resolve_shards(pattern: str) -> list[str]:
    """Sorted shard paths for a glob pattern, a directory, or a comma-separated list of either;
    each must lie in a complete labse-tfrecords output (its `_SUCCESS`), local or gs://."""
    from pipelines.io.completion import require_stage_output

    paths: set[str] = set()
    for part in (p.strip() for p in pattern.split(",")):
        if not part:
            continue
        require_stage_output(part, f"TFRecord shards {part}")
        if storage.isdir(part):
            part = storage.join(part, "*.tfrecord*")
        for path in storage.glob_files(part):
            # Temp files of an interrupted writer, markers and the schema/stats beside the shards are not shards.
            name = path.rsplit("/", 1)[-1]
            if ".tmp-" not in name and not name.startswith(("_", ".")) and not name.endswith(".json"):
                paths.add(path)
    if not paths:
        raise FileNotFoundError(f"no TFRecord shards match {pattern!r}")
    return sorted(paths)


def load_schema(shard_paths: list[str]) -> dict | None:
    """The `schema.json` written by `labse-tfrecords` beside the shards, if there is one.

    An unsupported schema version raises; shards without a schema (written by another tool) are
    accepted as long as their Examples carry int64 `src_ids` and `tgt_ids`.
    """
    directories = sorted({storage.dirname(p) for p in shard_paths})
    for directory in directories:
        path = storage.join(directory, SCHEMA_FILENAME)
        if storage.isfile(path):
            with storage.open_input(path) as f:
                schema = json.loads(f.read().decode("utf-8"))
            version = schema.get("version")
            if version not in SUPPORTED_SCHEMA_VERSIONS:
                raise UsageError(
                    f"{path}: TFRecord schema version {version!r} is not supported by this reader "
                    f"(supported: {SUPPORTED_SCHEMA_VERSIONS}); rewrite the shards with this labse-tfrecords"
                )
            return schema
    return None


def check_schema_vocab(schema: dict | None, vocab_path: str | os.PathLike, init_from: str | None = None) -> None:
    """Raise if the shards were tokenised with another vocabulary than `vocab_path` (ids would be garbage).

    `init_from`: the run starts from that model, whose vocabulary `vocab_path` is; the message then says so.
    """
    if not schema or "vocab" not in schema:
        return
    digest = file_sha256(vocab_path)
    if digest != schema["vocab"].get("sha256"):
        remedy = "train with the vocab.txt given to labse-tfrecords"
        if init_from:
            remedy = (f"the run starts from --init-from {init_from}, which tokenises with that vocabulary: make the "
                      f"shards with labse-tfrecords --vocab {vocab_path}")
        raise UsageError(
            f"the shards were written with a different vocabulary (sha256 {schema['vocab'].get('sha256', '?')[:12]}…) "
            f"than {vocab_path} (sha256 {digest[:12]}…): {remedy}"
        )


@dataclass(frozen=True)
class ShardIndex:
    """Record byte offsets of every shard; record number ``g`` is record ``g - starts[k]`` of shard ``k``."""

    paths: tuple[str, ...]
    offsets: tuple[np.ndarray, ...]

    @classmethod
    def build(cls, paths: list[str]) -> "ShardIndex":
        offsets = []
        for path in paths:
            with storage.open_input(path) as f:
                # An object-store file knows its size from opening; a local one asks the disk.
                offsets.append(index_open_records(f, path, getattr(f, "size", None) or storage.size(path)))
        return cls(tuple(paths), tuple(offsets))

    @property
    def counts(self) -> np.ndarray:
        return np.asarray([len(o) for o in self.offsets], dtype=np.int64)

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @property
    def num_records(self) -> int:
        return int(self.counts.sum())

    def locate(self, record_numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, byte offset) of each global record number."""
        starts = self.starts
        shard = np.searchsorted(starts, record_numbers, side="right") - 1
        offsets = np.fromiter(
            (self.offsets[k][g - starts[k]] for k, g in zip(shard.tolist(), record_numbers.tolist())),
            dtype=np.int64,
            count=len(record_numbers),
        )
        return shard, offsets


def epoch_order(counts: np.ndarray, seed: int, epoch: int, shuffle_buffer: int) -> np.ndarray:
    """The global record numbers of one epoch, in training order; depends only on its arguments.

    Shards in a seeded order, interleaved round-robin (record j of every shard before record j+1 of
    any), then a seeded shuffle buffer (``shuffle_buffer <= 1`` disables it).
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    rng = np.random.default_rng([int(seed), int(epoch)])
    shard_rank = np.empty(len(counts), dtype=np.int64)
    shard_rank[rng.permutation(len(counts))] = np.arange(len(counts))
    shard_of = np.repeat(np.arange(len(counts)), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    record_numbers = np.arange(total, dtype=np.int64)
    within = record_numbers - starts[shard_of]
    stream = record_numbers[np.lexsort((shard_rank[shard_of], within))]

    size = min(int(shuffle_buffer), total)
    if size <= 1:
        return stream
    buffer = stream[:size].tolist()
    slots = rng.integers(0, size, size=total - size).tolist()
    emitted: list[int] = []
    emit = emitted.append
    for slot, record in zip(slots, stream[size:].tolist()):
        emit(buffer[slot])
        buffer[slot] = record
    tail = np.asarray(buffer, dtype=np.int64)
    rng.shuffle(tail)
    return np.concatenate([np.asarray(emitted, dtype=np.int64), tail])


def pad_batch(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) LongTensors [B, longest] from lists of token ids."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    mask = np.arange(int(lengths.max())) < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    ids[mask] = np.fromiter((t for s in sequences for t in s), dtype=np.int64, count=int(lengths.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def _truncate(ids: list[int], max_len: int | None) -> list[int]:
    if max_len is None or len(ids) <= max_len:
        return ids
    return ids[: max_len - 1] + ids[-1:]  # keep the closing [SEP]


class PairBatchStream(IterableDataset):
    """This rank's slice of the global batch for steps ``start_step, start_step+1, ...``.

    Under a DataLoader with W workers, worker w yields steps ``start_step + w + k*W``.
    """

    def __init__(
        self,
        index: ShardIndex,
        *,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        pad_id: int = 0,
        shuffle_buffer: int = 10000,
        start_step: int = 0,
        num_steps: int | None = None,
        max_seq_length: int | None = None,
        check_crc: bool = True,
        vocab_size: int | None = None,
    ):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if global_batch_size % world_size:
            raise ValueError(f"global_batch_size {global_batch_size} is not divisible by world_size {world_size}")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.index = index
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // world_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.pad_id = pad_id
        self.shuffle_buffer = shuffle_buffer
        self.start_step = start_step
        self.num_steps = num_steps
        self.max_seq_length = max_seq_length
        self.check_crc = check_crc
        self.vocab_size = vocab_size
        self.steps_per_epoch = index.num_records // global_batch_size
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"the shards hold {index.num_records} records, fewer than one global batch of {global_batch_size}"
            )
        self._order_epoch: int | None = None
        self._order: np.ndarray | None = None
        self._files: dict[int, object] = {}

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            self._order = epoch_order(self.index.counts, self.seed, epoch, self.shuffle_buffer)
            self._order_epoch = epoch
        assert self._order is not None
        return self._order

    def global_record_numbers(self, step: int) -> np.ndarray:
        """Record numbers of the whole global batch at `step` (all ranks)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.global_batch_size
        return self._epoch_order(epoch)[start : start + self.global_batch_size]

    def _read(self, shard: int, offset: int) -> bytes:
        f = self._files.get(shard)
        if f is None:
            f = self._files[shard] = storage.open_input(self.index.paths[shard])
        return read_record_at(f, self.index.paths[shard], int(offset), self.check_crc)  # type: ignore[arg-type]

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        src, tgt = self.pairs(step)
        src_ids, src_mask = pad_batch(src, self.pad_id)
        tgt_ids, tgt_mask = pad_batch(tgt, self.pad_id)
        return {
            "src_input_ids": src_ids,
            "src_attention_mask": src_mask,
            "tgt_input_ids": tgt_ids,
            "tgt_attention_mask": tgt_mask,
        }

    def pairs(self, step: int) -> tuple[list[list[int]], list[list[int]]]:
        """This rank's (source ids, target ids) rows of the global batch at `step`, unpadded."""
        numbers = self.global_record_numbers(step)
        mine = numbers[self.rank * self.local_batch_size : (self.rank + 1) * self.local_batch_size]
        shards, offsets = self.index.locate(mine)
        src: list[list[int]] = [[]] * len(mine)
        tgt: list[list[int]] = [[]] * len(mine)
        # Read in file order for locality, fill rows in batch order.
        for row in np.lexsort((offsets, shards)).tolist():
            shard, offset = int(shards[row]), int(offsets[row])
            path = self.index.paths[shard]
            pair = decode_pair(self._read(shard, offset), path, offset)
            if not pair.src_ids or not pair.tgt_ids:
                raise TFRecordCorruptError(path, offset, "empty src_ids or tgt_ids")
            src[row] = _truncate(pair.src_ids, self.max_seq_length)
            tgt[row] = _truncate(pair.tgt_ids, self.max_seq_length)
        if self.vocab_size is not None:
            self._check_ids(src, tgt, shards, offsets)
        return src, tgt

    def _check_ids(self, src: list[list[int]], tgt: list[list[int]], shards: np.ndarray, offsets: np.ndarray) -> None:
        """An id outside the vocabulary is an IndexError deep in the model otherwise, naming nothing:
        one min and max over the batch, and the offending record is looked for only when they fail."""
        rows = src + tgt
        if min(map(min, rows)) >= 0 and max(map(max, rows)) < self.vocab_size:
            return
        row = next(i for i, ids in enumerate(rows) if min(ids) < 0 or max(ids) >= self.vocab_size)
        bad = next(i for i in rows[row] if not 0 <= i < self.vocab_size)
        row %= len(src)
        raise UsageError(f"TFRecord shard {self.index.paths[int(shards[row])]}, record at byte offset "
                         f"{int(offsets[row])}: token id {bad} is outside the vocabulary of {self.vocab_size} ids: "
                         "the shards were tokenised with another vocabulary")

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start_step + worker
        end = None if self.num_steps is None else self.start_step + self.num_steps
        try:
            while end is None or step < end:
                yield self.batch(step)
                step += num_workers
        finally:
            self.close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
        self._files.clear()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_files"] = {}  # open files do not travel to worker processes
        return state


class TrainLoader:
    """Iterator over this rank's batches (contract 8), with the facts a trainer wants to log."""

    def __init__(self, stream: PairBatchStream, num_workers: int, schema: dict | None):
        self.stream = stream
        self.num_workers = num_workers
        self.schema = schema
        self.steps_per_epoch = stream.steps_per_epoch
        self.num_records = stream.index.num_records
        self.num_shards = len(stream.index.paths)
        self._iterator: Iterator[dict[str, torch.Tensor]] | None = None

    def __iter__(self) -> "TrainLoader":
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._iterator is None:
            if self.num_workers > 0:
                # A generator of its own: by default the DataLoader draws its workers' base seed from the
                # global torch RNG, which shifts every later dropout mask, so a run with workers differed
                # from one without and a resumed run (one more draw after the restore) from an
                # uninterrupted one. The workers draw nothing random: the order is computed.
                loader = DataLoader(
                    self.stream, batch_size=None, num_workers=self.num_workers, persistent_workers=False,
                    generator=torch.Generator(),
                )
                self._iterator = iter(loader)
            else:
                self._iterator = iter(self.stream)
        return next(self._iterator)


def build_train_loader(pattern: str, *, num_workers: int = 0, **stream_settings: Any) -> TrainLoader:
    """This rank's batches for steps ``start_step, start_step + 1, ...`` (see the module docstring).

    Args:
        pattern: the shards: a glob (``"shards/*.tfrecord*"``), a directory, or a comma-separated
            list of either. A ``schema.json`` beside them (labse-tfrecords) must have a supported
            version; shards of other tools need int64 ``src_ids`` and ``tgt_ids``.
        num_workers: DataLoader worker processes parsing this rank's rows (0: in this process).
        stream_settings: `PairBatchStream`'s keyword arguments (defaults there), which are:
        global_batch_size: pairs per step over all ranks; divisible by ``world_size``.
        rank, world_size: this process and the number of processes; rank ``r`` gets rows
            ``[r*B, (r+1)*B)`` of the global batch, ``B = global_batch_size // world_size``.
        seed: the order of shards and the shuffle buffer, per epoch; the same seed gives the same
            global batches for any ``world_size`` and ``num_workers``.
        pad_id: the id padding each rank's slice to its longest sequence (``[PAD]`` = 0).
        shuffle_buffer: records in the seeded shuffle buffer (tf.data semantics).
        start_step: the first step to yield; a resumed run passes its checkpoint's step and gets
            exactly the batches an uninterrupted run would have seen.
        num_steps: stop after this many steps (default: infinite, epochs repeat).
        max_seq_length: truncate longer sequences (keeping the final ``[SEP]``).
        check_crc: check each record's data CRC when it is read (headers are always checked).
        vocab_size: refuse a record holding an id outside ``[0, vocab_size)`` (ValueError naming
            the shard and offset); None reads ids unchecked.

    Yields ``{"src_input_ids", "src_attention_mask", "tgt_input_ids", "tgt_attention_mask"}``
    LongTensors of shape [global_batch_size // world_size, longest in the slice]. Raises
    FileNotFoundError when nothing matches ``pattern``, ``TFRecordCorruptError`` for a truncated
    or corrupt shard, ValueError for bad settings or fewer records than one global batch.

    Example::

        loader = build_train_loader("shards/*.tfrecord", global_batch_size=4096, rank=rank,
                                    world_size=world_size, seed=0, num_workers=2, start_step=step)
        batch = next(loader)
        batch["src_input_ids"].shape      # torch.Size([4096 // world_size, L])
        loader.steps_per_epoch            # num_records // 4096
    """
    paths = resolve_shards(pattern)
    schema = load_schema(paths)
    index = ShardIndex.build(paths)
    stream = PairBatchStream(index, **stream_settings)
    logger.info(
        "training data: %d records in %d shards, %d steps per epoch of %d (rank %d of %d, %d workers)",
        index.num_records, len(paths), stream.steps_per_epoch, stream.global_batch_size, stream.rank,
        stream.world_size, num_workers,
    )
    return TrainLoader(stream, num_workers, schema)


def iter_pairs(pattern: str, check_crc: bool = True):
    """Every `PairRecord` of the shards in file order (for inspection and evaluation, not training)."""
    from pipelines.io.tfrecord import HEADER_SIZE, FOOTER_SIZE, iter_records

    for path in resolve_shards(pattern):
        offset = 0
        for data in iter_records(path, check_crc):
            yield decode_pair(data, path, offset)
            offset += HEADER_SIZE + len(data) + FOOTER_SIZE
