"""Masked-LM targets the way BERT's `create_pretraining_data.py` draws them, vectorised per batch.

Per sequence of `n` tokens (its [CLS]/[SEP] included, padding not), `min(max_predictions,
max(1, round_half_up(n * mask_prob)))` positions are chosen uniformly among the sequence's
non-special tokens (never [PAD], [CLS], [SEP], [UNK] or [MASK]); of those, 80% become [MASK], 10% a
random non-special token, 10% stay as they are. Unlike Hugging Face's collator (a Bernoulli draw
per token) the count per sequence is fixed, as in BERT and LaBSE (20%, at most 80).

Every draw comes from the numpy generator the caller passes; the trainer seeds it with
(seed, step, rank), so a resumed run draws the same masks as an uninterrupted one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MaskingSpec:
    mask_prob: float
    max_predictions: int
    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]  # never chosen as targets, never drawn as random replacements

    def __post_init__(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.max_predictions < 1:
            raise ValueError(f"max_predictions must be >= 1, got {self.max_predictions}")
        if len(set(self.special_ids)) >= self.vocab_size:
            raise ValueError("the vocabulary holds no token besides the special ones")


@dataclass
class MaskedBatch:
    """Inputs with masks applied, and the targets as flat (row, column, label) triples."""

    input_ids: np.ndarray  # [B, L] int64
    rows: np.ndarray  # [N] int64, row of each prediction
    columns: np.ndarray  # [N] int64, position of each prediction
    labels: np.ndarray  # [N] int64, the original token there


def predictions_per_sequence(lengths: np.ndarray, spec: MaskingSpec, candidates: np.ndarray) -> np.ndarray:
    """How many positions each sequence masks: BERT's formula, capped by its maskable tokens."""
    wanted = np.floor(lengths * spec.mask_prob + 0.5).astype(np.int64)
    return np.minimum(np.minimum(spec.max_predictions, np.maximum(1, wanted)), candidates)


def _replacement_table(spec: MaskingSpec) -> np.ndarray:
    special = np.zeros(spec.vocab_size, dtype=bool)
    special[list(spec.special_ids)] = True
    return np.flatnonzero(~special)


def mask_tokens(input_ids: np.ndarray, attention_mask: np.ndarray, spec: MaskingSpec,
                rng: np.random.Generator) -> MaskedBatch:
    """Choose and apply masks for a padded batch (`input_ids` is not modified)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    real = np.asarray(attention_mask).astype(bool)
    candidate = real & ~np.isin(ids, np.asarray(spec.special_ids, dtype=np.int64))
    counts = predictions_per_sequence(real.sum(axis=1), spec, candidate.sum(axis=1))
    # A uniform random subset of each row's candidates: the `count` smallest random keys.
    keys = rng.random(ids.shape)
    keys[~candidate] = 2.0
    order = np.argsort(keys, axis=1, kind="stable")
    width = int(counts.max()) if len(counts) else 0
    chosen = order[:, :width]
    keep = np.arange(width)[None, :] < counts[:, None]
    rows = np.broadcast_to(np.arange(len(ids))[:, None], chosen.shape)[keep]
    columns = chosen[keep]
    labels = ids[rows, columns]

    masked = ids.copy()
    action = rng.random(len(rows))
    to_mask = action < 0.8
    to_random = (action >= 0.8) & (action < 0.9)
    masked[rows[to_mask], columns[to_mask]] = spec.mask_id
    replacements = _replacement_table(spec)
    masked[rows[to_random], columns[to_random]] = replacements[rng.integers(0, len(replacements), int(to_random.sum()))]
    return MaskedBatch(input_ids=masked, rows=rows.astype(np.int64), columns=columns.astype(np.int64),
                       labels=labels.astype(np.int64))
