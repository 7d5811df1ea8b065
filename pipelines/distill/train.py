"""The table's training, in torch on one machine: (b) fit the table to the teacher's sentence
vectors (tokenlearn's idea: the static mean of a sentence should point where the teacher's vector
points), then (c) in-batch-negatives training on translation pairs (MultipleNegativesRankingLoss,
both directions, temperature ~0.05, never the same text twice in a batch), with the alignment loss
kept beside it so the table stays in the teacher's space.

Resumable: after every epoch the table and the optimiser's moments go to a safetensors checkpoint
(tensors and a small JSON header, nothing pickled); a rerun with the same inputs and settings
continues after the last finished epoch.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

logger = logging.getLogger(__name__)

ALIGN, CONTRASTIVE = "align", "contrastive"


@dataclass
class TrainingData:
    """Token ids of the monolingual sentences with their projected teacher targets, and pairs of ids."""

    sentences: list[np.ndarray]
    targets: np.ndarray                      # [sentences, dims], unit rows
    pairs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    pair_keys: list[tuple[str, str]] = field(default_factory=list)  # texts, to keep repeats out of a batch


def _bag(ids: Sequence[np.ndarray]):
    import torch

    lengths = np.fromiter((len(row) for row in ids), np.int64, len(ids))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return torch.from_numpy(np.concatenate(ids).astype(np.int64)), torch.from_numpy(offsets)


class StaticTable:
    """The trainable table: sum of weighted rows (EmbeddingBag, sparse gradients), unit length."""

    def __init__(self, table: np.ndarray, weights: np.ndarray):
        import torch

        self.embedding = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(np.array(table, np.float32)),
                                                               freeze=False, mode="sum", sparse=True)
        self.weights = torch.from_numpy(np.asarray(weights, np.float32))

    def __call__(self, ids: Sequence[np.ndarray]):
        import torch

        flat, offsets = _bag(ids)
        out = self.embedding(flat, offsets, per_sample_weights=self.weights[flat])
        return torch.nn.functional.normalize(out, dim=-1)

    def numpy(self) -> np.ndarray:
        return self.embedding.weight.detach().numpy().copy()


def pair_batches(keys: list[tuple[str, str]], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Shuffled batches of pair indices in which no source and no target text repeats (a repeat is
    a false negative for its twin); a pair that would repeat one waits for a later batch."""
    order = list(rng.permutation(len(keys)))
    batches = []
    while order:
        batch, seen_src, seen_tgt, later = [], set(), set(), []
        for index in order:
            src, tgt = keys[index]
            if len(batch) < batch_size and src not in seen_src and tgt not in seen_tgt:
                batch.append(index)
                seen_src.add(src)
                seen_tgt.add(tgt)
            else:
                later.append(index)
        batches.append(batch)
        order = later
    return [batch for batch in batches if len(batch) >= 2]


class Checkpoint:
    """`path` (safetensors): table, optimiser moments, and a JSON header: phase, epochs done, history."""

    def __init__(self, path: str | os.PathLike, fingerprint: str):
        self.path, self.fingerprint = Path(path), fingerprint

    def load(self) -> tuple[dict, dict[str, np.ndarray]] | None:
        from safetensors import safe_open

        if not self.path.is_file():
            return None
        with safe_open(str(self.path), framework="numpy") as handle:
            header = json.loads(handle.metadata()["state"])
            if header.get("fingerprint") != self.fingerprint:
                logger.warning("checkpoint %s is from other inputs or settings: starting over", self.path)
                return None
            return header, {key: handle.get_tensor(key) for key in handle.keys()}

    def save(self, header: dict, tensors: dict[str, np.ndarray]) -> None:
        from safetensors.numpy import save_file

        header = {**header, "fingerprint": self.fingerprint}
        tmp = self.path.with_name(self.path.name + ".tmp")
        save_file({key: np.ascontiguousarray(value) for key, value in tensors.items()}, str(tmp),
                  metadata={"state": json.dumps(header)})
        os.replace(tmp, self.path)


def _optimizer(table: StaticTable, learning_rate: float, moments: dict[str, np.ndarray] | None, step: int):
    import torch

    optimizer = torch.optim.SparseAdam(list(table.embedding.parameters()), lr=learning_rate)
    if moments:
        state = optimizer.state_dict()
        state["state"] = {0: {"step": torch.tensor(float(step)), "exp_avg": torch.from_numpy(moments["exp_avg"]),
                              "exp_avg_sq": torch.from_numpy(moments["exp_avg_sq"])}}
        optimizer.load_state_dict(state)
    return optimizer


def _moments(optimizer) -> tuple[dict[str, np.ndarray], int]:
    state = optimizer.state_dict()["state"].get(0)
    if not state:
        return {}, 0
    return ({"exp_avg": state["exp_avg"].numpy(), "exp_avg_sq": state["exp_avg_sq"].numpy()},
            int(float(state["step"])))


def align_loss(table: StaticTable, data: TrainingData, index: np.ndarray):
    import torch

    out = table([data.sentences[i] for i in index])
    return 1 - (out * torch.from_numpy(data.targets[index])).sum(-1).mean()


def contrastive_loss(table: StaticTable, data: TrainingData, batch: list[int], temperature: float):
    import torch

    src = table([data.pairs[i][0] for i in batch])
    tgt = table([data.pairs[i][1] for i in batch])
    logits = src @ tgt.T / temperature
    labels = torch.arange(len(batch))
    return (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels)) / 2


def train(table: np.ndarray, weights: np.ndarray, data: TrainingData, config, checkpoint: Checkpoint,
          log: Callable[[str], None] = logger.info) -> tuple[np.ndarray, list[dict]]:
    """The trained table and the per-epoch history; resumes from `checkpoint` when it matches. Runs
    on `config.threads` torch threads and gives the caller's thread count back (a library call must
    not change how the rest of the process computes)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(table, weights, data, config, checkpoint, log)
    finally:
        torch.set_num_threads(previous)


def _train(table: np.ndarray, weights: np.ndarray, data: TrainingData, config, checkpoint: Checkpoint,
           log: Callable[[str], None]) -> tuple[np.ndarray, list[dict]]:
    import torch

    torch.manual_seed(config.seed)
    model = StaticTable(table, weights)
    plan = [(ALIGN, epoch) for epoch in range(config.align_epochs)]
    if data.pairs:
        plan += [(CONTRASTIVE, epoch) for epoch in range(config.contrastive_epochs)]
    history: list[dict] = []
    moments, step, resumed_phase = None, 0, None
    saved = checkpoint.load()
    if saved is not None:
        header, tensors = saved
        done = {(row["phase"], row["epoch"]) for row in header["history"]}
        history = header["history"]
        model.embedding.weight.data.copy_(torch.from_numpy(tensors["table"]))
        moments = {k: tensors[k] for k in ("exp_avg", "exp_avg_sq") if k in tensors}
        step, resumed_phase = header.get("step", 0), header.get("phase")
        plan = [item for item in plan if item not in done]
        log(f"resuming from {checkpoint.path}: {len(done)} epoch(s) done, {len(plan)} to go")
    optimizer, phase_of_optimizer = None, None
    for phase, epoch in plan:
        if phase != phase_of_optimizer:
            keep = moments if phase == resumed_phase else None
            rate = config.align_learning_rate if phase == ALIGN else config.contrastive_learning_rate
            optimizer = _optimizer(model, rate, keep, step if keep else 0)
            phase_of_optimizer = phase
        rng = np.random.default_rng([config.seed, epoch, 0 if phase == ALIGN else 1])
        started, losses = time.perf_counter(), []
        mono = rng.permutation(len(data.sentences))
        if phase == ALIGN:
            batches = [mono[i:i + config.batch_size] for i in range(0, len(mono), config.batch_size)]
            for index in batches:
                optimizer.zero_grad()
                loss = align_loss(model, data, index)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        else:
            batches = pair_batches(data.pair_keys, config.batch_size, rng)
            for number, batch in enumerate(batches):
                optimizer.zero_grad()
                loss = contrastive_loss(model, data, batch, config.temperature)
                if config.align_weight > 0 and len(mono):
                    start = (number * config.batch_size) % len(mono)
                    loss = loss + config.align_weight * align_loss(model, data, mono[start:start + config.batch_size])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        row = {"phase": phase, "epoch": epoch, "steps": len(batches), "loss": round(float(np.mean(losses)), 5)
               if losses else None, "seconds": round(time.perf_counter() - started, 1)}
        history.append(row)
        log(f"{phase} epoch {epoch + 1}: {row['steps']} steps, loss {row['loss']}, {row['seconds']} s")
        moments_now, step = _moments(optimizer)
        checkpoint.save({"history": history, "phase": phase, "step": step},
                        {"table": model.numpy(), **moments_now})
    return model.numpy(), history
