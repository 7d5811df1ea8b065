"""Training batches from TFRecord shards (contract 8), without TensorFlow, in memory bounded by a window.

    loader = build_train_loader("shards/*.tfrecord", global_batch_size=4096, rank=r, world_size=n,
                                seed=0, num_workers=2, start_step=resumed_step)
    for step, batch in enumerate(loader, start=resumed_step): ...

Guarantees
----------
* With the seed fixed, the global batch at step ``s`` is the same whatever the world size and the
  number of DataLoader workers; rank ``r`` receives rows ``[r*B, (r+1)*B)`` of it
  (``B = global_batch_size // world_size``), dynamically padded to its own longest sequence. So a
  run resumed with another number of processes continues the same global sequence.
* Every rank yields the same number of steps (epochs end on a whole global batch; the remainder
  of an epoch is dropped, as with ``drop_last``), so uneven shard counts can never hang a
  collective in the trainer. Within an epoch no record is seen twice.
* ``start_step=s`` reproduces exactly the batches an uninterrupted run yields from step ``s``:
  nothing is replayed, the position is computed. The resume state is (seed, epoch, position in the
  epoch) — `TrainLoader.state` — and everything else is a pure function of it.
* Epochs repeat forever with a fresh order per epoch (``seed``, ``epoch``); the trainer stops at
  its ``max_steps``.

The order (`labse_model.shuffle`)
---------------------------------
labse-tfrecords shuffles globally when it writes, so each shard is a random sample of the corpus.
Per epoch the shards are put in a seeded order and cut into *windows* of ``shuffle_window`` shards;
the records of a window are visited in the order of a keyed bijection (a Feistel permutation keyed
by seed, epoch and window). Position ``p`` of the epoch maps to (shard, record) arithmetically, and
the record is read at the offset its shard's offset index (``NAME.tfrecord.index``, written by
labse-tfrecords beside each shard: 8 bytes a record) gives: one read from its offset to the next
record's, length and data CRCs checked.

Memory
------
Each process that reads (the rank itself, or each of its ``num_workers`` DataLoader workers) holds
the offset indexes of the windows its current batch falls in — one window, two while a batch
straddles a window boundary — plus the epoch's plan (about 40 bytes a shard) and one batch::

    peak bytes per reading process ~= 2 * shuffle_window * records_per_shard * 8
                                      + 40 * num_shards + one batch

independent of the number of records in the run. With the defaults (``shuffle_window`` 8,
labse-tfrecords' shards of about 10^6 records) that is ~128 MB at a window boundary, ~64 MB
otherwise, at 10^6 or 6 * 10^9 pairs alike.

Indexes
-------
A shard without its index (written by an older labse-tfrecords or another tool) gets one on first
read: one pass over its record headers, written atomically beside it. On object storage the loader
does not write into the input bucket: it refuses in one line, naming the command that builds the
indexes (``python -m labse_model.data index 'gs://B/shards/*.tfrecord'``). Shards on object storage
are read in place: the index whole (one ranged read per block), then each batch's records by byte
ranges (``cat_ranges``), never a scan. Every folder holding shards there must carry the
``_SUCCESS`` that labse-tfrecords writes last: a half-copied or still-running output is refused
before training starts.
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

from pipelines.io.atomic import write_bytes_atomic
from pipelines.io.tfrecord import (FOOTER_SIZE, HEADER_SIZE, INDEX_SUFFIX, TFRecordCorruptError, decode_index, decode_pair,
                                   encode_index, index_open_records, index_path, unframe_record)

from pipelines.io import storage
from .config import file_sha256
from .shuffle import ORDER_NAME, EpochPlan
from pipelines.io.config_options import UsageError

__all__ = [
    "SCHEMA_FILENAME",
    "ShardSet",
    "build_index",
    "resolve_shards",
    "load_schema",
    "check_schema_vocab",
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
            # Temp files of an interrupted writer, markers, the schema/stats and the offset indexes are not shards.
            name = path.rsplit("/", 1)[-1]
            if (".tmp-" not in name and not name.startswith(("_", "."))
                    and not name.endswith((".json", INDEX_SUFFIX))):
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


INDEX_COMMAND = "python -m labse_model.data index"


@dataclass(frozen=True)
class ShardSet:
    """The shards of a run and their record counts; record ``i`` of shard ``k`` is found through its
    offset index, opened only while the shard is in the loader's window."""

    paths: tuple[str, ...]
    counts: np.ndarray

    @classmethod
    def open(cls, paths: list[str], pattern: str | None = None) -> "ShardSet":
        """Record counts from the indexes' sizes (one listing per folder); a missing local index is
        built in one pass, a missing one on object storage is refused in one line."""
        index_sizes: dict[str, int] = {}
        for folder in sorted({storage.dirname(p) for p in paths}):
            if storage.is_remote(folder):
                index_sizes.update((storage.join(folder, name), size) for name, size in storage.walk(folder).items()
                                   if "/" not in name and name.endswith(INDEX_SUFFIX))
            else:
                index_sizes.update((p, os.path.getsize(p)) for p in storage.glob_files(os.path.join(folder, "*" + INDEX_SUFFIX)))
        counts = []
        for path in paths:
            size = index_sizes.get(index_path(path) if storage.is_remote(path) else os.path.abspath(index_path(path)))
            if size is not None:
                counts.append(size // 8)
            elif storage.is_remote(path):
                raise UsageError(f"{path} has no offset index ({index_path(path).rsplit('/', 1)[-1]}, written by this "
                                 f"labse-tfrecords); build the indexes once: {INDEX_COMMAND} '{pattern or path}'")
            else:
                counts.append(len(build_index(path)))
        return cls(tuple(paths), np.asarray(counts, dtype=np.int64))

    @property
    def num_records(self) -> int:
        return int(self.counts.sum())

    def digest(self) -> str:
        """Names and record counts, hashed: a resumed run must read the same shards in the same order."""
        import hashlib

        names = "\n".join(f"{p.rsplit('/', 1)[-1]}\t{c}" for p, c in zip(self.paths, self.counts.tolist()))
        return hashlib.sha256(names.encode("utf-8")).hexdigest()[:16]


def build_index(path: str) -> np.ndarray:
    """Scan a shard's record headers once and write its offset index beside it (local or object storage)."""
    with storage.open_input(path) as f:
        offsets = index_open_records(f, path, getattr(f, "size", None) or storage.size(path))
    target = index_path(path)
    try:
        if storage.is_remote(path):
            storage.write_bytes(target, encode_index(offsets))
        else:
            write_bytes_atomic(target, encode_index(offsets))
    except OSError as exc:
        raise UsageError(f"cannot write the offset index {target} ({exc.strerror or exc}); build the indexes "
                         f"where the shards can be written: {INDEX_COMMAND} '{path}'") from None
    logger.info("built the offset index of %s (%d records)", path, len(offsets))
    return offsets


class _OpenShard:
    """A shard in the window: its offset index and (for a local file) an open handle."""

    def __init__(self, path: str, expected: int):
        self.path = path
        self.url = storage.is_remote(path)
        with storage.open_input(index_path(path)) as f:
            self.offsets = decode_index(f.read(), index_path(path))
        if len(self.offsets) != expected:
            raise UsageError(f"{index_path(path)} lists {len(self.offsets)} records but held {expected} when the run "
                             f"started: the shards changed under the run; restart it on a complete labse-tfrecords output")
        self.size = storage.size(path)
        if len(self.offsets) and self.size < int(self.offsets[-1]) + HEADER_SIZE + FOOTER_SIZE:
            raise TFRecordCorruptError(path, int(self.offsets[-1]), f"truncated: the offset index places a record "
                                       f"there but the file has {self.size} bytes")
        self.file = None if self.url else open(path, "rb", buffering=0)

    def read(self, records: np.ndarray) -> list[bytes]:
        """The framed bytes of `records` (record numbers, any order), each one exact range."""
        starts = self.offsets[records]
        following = np.minimum(records + 1, len(self.offsets) - 1)
        ends = np.where(records + 1 < len(self.offsets), self.offsets[following], self.size)
        if self.url:
            fs, stripped = storage.filesystem(self.path)
            return fs.cat_ranges([stripped] * len(records), starts.tolist(), ends.tolist())
        out = []
        for start, end in zip(starts.tolist(), ends.tolist()):
            self.file.seek(start)
            out.append(self.file.read(end - start))
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


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


DEFAULT_SHUFFLE_WINDOW = 8


class PairBatchStream(IterableDataset):
    """This rank's slice of the global batch for steps ``start_step, start_step+1, ...``.

    Under a DataLoader with W workers, worker w yields steps ``start_step + w + k*W``.
    """

    def __init__(
        self,
        shards: ShardSet,
        *,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        pad_id: int = 0,
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
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
        if shuffle_window < 1:
            raise ValueError(f"shuffle_window must be >= 1 shard, got {shuffle_window}")
        self.shards = shards
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // world_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.pad_id = pad_id
        self.shuffle_window = shuffle_window
        self.start_step = start_step
        self.num_steps = num_steps
        self.max_seq_length = max_seq_length
        self.check_crc = check_crc
        self.vocab_size = vocab_size
        self.steps_per_epoch = shards.num_records // global_batch_size
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"the shards hold {shards.num_records} records, fewer than one global batch of {global_batch_size}"
            )
        self._plan: EpochPlan | None = None
        self._open: dict[int, _OpenShard] = {}

    def plan(self, epoch: int) -> EpochPlan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = EpochPlan(self.shards.counts, self.seed, epoch, self.shuffle_window)
        return self._plan

    def state(self, step: int) -> dict[str, Any]:
        """The resume state before `step`: (seed, epoch, position) and what must match to continue it (< 1 KB)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        return {"order": ORDER_NAME, "seed": self.seed, "epoch": epoch, "position": within * self.global_batch_size,
                "global_batch_size": self.global_batch_size, "shuffle_window": self.shuffle_window,
                "num_records": self.shards.num_records, "num_shards": len(self.shards.paths),
                "shards_digest": self.shards.digest()}

    def global_records(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard, record number) of every row of the global batch at `step` (all ranks)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.global_batch_size
        return self.plan(epoch).locate(np.arange(start, start + self.global_batch_size, dtype=np.int64))

    def _shard(self, shard: int) -> _OpenShard:
        opened = self._open.get(shard)
        if opened is None:
            opened = self._open[shard] = _OpenShard(self.shards.paths[shard], int(self.shards.counts[shard]))
        return opened

    def _keep_only(self, epoch: int, positions: np.ndarray) -> None:
        """Close the shards outside the windows `positions` fall in: memory stays one or two windows."""
        plan = self.plan(epoch)
        keep = {int(k) for w in np.unique(plan.window_of(positions)).tolist() for k in plan.window_shards(w)}
        for shard in [k for k in self._open if k not in keep]:
            self._open.pop(shard).close()

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
        epoch, within = divmod(step, self.steps_per_epoch)
        first = within * self.global_batch_size + self.rank * self.local_batch_size
        positions = np.arange(first, first + self.local_batch_size, dtype=np.int64)
        self._keep_only(epoch, positions)
        shards, records = self.plan(epoch).locate(positions)
        offsets = np.empty(len(positions), dtype=np.int64)
        src: list[list[int]] = [[]] * len(positions)
        tgt: list[list[int]] = [[]] * len(positions)
        for shard in np.unique(shards).tolist():
            rows = np.flatnonzero(shards == shard)
            rows = rows[np.argsort(records[rows], kind="stable")]  # file order: readahead and fewer seeks
            opened = self._shard(shard)
            offsets[rows] = opened.offsets[records[rows]]
            for row, framed in zip(rows.tolist(), opened.read(records[rows])):
                offset = int(offsets[row])
                pair = decode_pair(unframe_record(framed, opened.path, offset, self.check_crc), opened.path, offset)
                if not pair.src_ids or not pair.tgt_ids:
                    raise TFRecordCorruptError(opened.path, offset, "empty src_ids or tgt_ids")
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
        raise UsageError(f"TFRecord shard {self.shards.paths[int(shards[row])]}, record at byte offset "
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
        for opened in self._open.values():
            opened.close()
        self._open.clear()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_open"] = {}  # open files and indexes do not travel to worker processes
        return state


class TrainLoader:
    """Iterator over this rank's batches (contract 8), with the facts a trainer wants to log."""

    def __init__(self, stream: PairBatchStream, num_workers: int, schema: dict | None):
        self.stream = stream
        self.num_workers = num_workers
        self.schema = schema
        self.steps_per_epoch = stream.steps_per_epoch
        self.num_records = stream.shards.num_records
        self.num_shards = len(stream.shards.paths)
        self._iterator: Iterator[dict[str, torch.Tensor]] | None = None

    def state(self, step: int) -> dict[str, Any]:
        """The loader's part of a checkpoint taken before `step` (`PairBatchStream.state`)."""
        return self.stream.state(step)

    def check_resume(self, saved: dict[str, Any] | None, step: int) -> None:
        """Refuse to resume at `step` into another order than the checkpoint's (other shards, window,
        order definition or batch size): the run would silently see records twice or never."""
        if saved is None:
            return  # a checkpoint of a run before the loader saved its state: the step alone places it
        expected = self.state(step)
        changed = [f"{key} {saved.get(key)!r} -> {value!r}" for key, value in expected.items() if saved.get(key) != value]
        if changed:
            raise UsageError(f"the checkpoint's data order cannot be continued ({'; '.join(changed)}): resume with the "
                             "same shards and settings, or start a new run with --init-from")

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
        seed: the order of shards and records, per epoch; the same seed gives the same global
            batches for any ``world_size`` and ``num_workers``.
        pad_id: the id padding each rank's slice to its longest sequence (``[PAD]`` = 0).
        shuffle_window: shards whose records are shuffled together (their offset indexes are the
            loader's memory: 8 bytes a record, see the module docstring).
        start_step: the first step to yield; a resumed run passes its checkpoint's step and gets
            exactly the batches an uninterrupted run would have seen.
        num_steps: stop after this many steps (default: infinite, epochs repeat).
        max_seq_length: truncate longer sequences (keeping the final ``[SEP]``).
        check_crc: check each record's data CRC when it is read (headers are always checked).
        vocab_size: refuse a record holding an id outside ``[0, vocab_size)`` (ValueError naming
            the shard and offset); None reads ids unchecked.

    A shard without its offset index gets one built beside it (local) or is refused (object storage).

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
    shards = ShardSet.open(paths, pattern)
    stream = PairBatchStream(shards, **stream_settings)
    logger.info(
        "training data: %d records in %d shards, %d steps per epoch of %d (rank %d of %d, %d workers, "
        "shuffle window %d shards)", shards.num_records, len(paths), stream.steps_per_epoch,
        stream.global_batch_size, stream.rank, stream.world_size, num_workers, stream.shuffle_window,
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


def main(argv: list[str] | None = None) -> int:
    """``python -m labse_model.data index PATTERN``: write the offset index of every shard lacking one."""
    import argparse

    from .cli import exit_status

    parser = argparse.ArgumentParser(prog="python -m labse_model.data", description=main.__doc__)
    parser.add_argument("command", choices=["index"])
    parser.add_argument("pattern", help="the shards: a glob, a directory or a comma-separated list (local or gs://)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def build_missing() -> None:
        paths = resolve_shards(args.pattern)
        built = 0
        for number, path in enumerate(paths, 1):
            if not storage.isfile(index_path(path)):
                build_index(path)
                built += 1
            if number % 100 == 0:
                logger.info("%d of %d shards checked", number, len(paths))
        print(f"offset indexes: {built} built, {len(paths) - built} already there, {len(paths)} shards")

    return exit_status(build_missing)


if __name__ == "__main__":
    raise SystemExit(main())
