"""Bidirectional additive-margin softmax (AMS) over in-batch negatives, local or gathered.

For L2-normalised source x_i and target y_j, the paper's translation-ranking loss is

    L_s2t = -1/B sum_i log( e^{s(cos(x_i,y_i) - m)} / (e^{s(cos(x_i,y_i) - m)} + sum_{j != i} e^{s cos(x_i,y_j)}) )

with the margin m subtracted from the positive only, plus the same from target to source
(L = L_s2t + L_t2s, as TF Model Garden's bidirectional dual encoder sums them).

Gathered negatives (OpenCLIP's ClipLoss with `local_loss=True, gather_with_grad=True`): rank r holds
B local rows; it scores them against all N*B gathered columns, and its labels are offset by r*B.
Its loss is the mean over its B rows, i.e. loss_r = (1/B) sum_{rows of r}. Why no extra scaling:

    big-batch loss   L = 1/(NB) sum_{all rows} = (1/N) sum_r loss_r
    rank r's grad    g_r = d(sum_r' loss_r')/d(theta) through rank r's own embeddings, because the
                     gather's backward SUMS the gradients every rank sends to r's slice
    DDP              averages: (1/N) sum_r g_r = (1/N) d(sum_r' loss_r')/d(theta) = dL/d(theta)

so DDP's averaging already supplies the 1/N. (Summing instead of averaging, or a gather without
gradient, would each be off by a factor or miss the cross-rank terms; tests/test_distributed.py
checks parameters after one step against one process with batch N*B.)
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from labse_model.distributed import all_gather_with_grad, get_rank, get_world_size, synchronize


def additive_margin_logits(
    queries: torch.Tensor, keys: torch.Tensor, *, additive_margin: float, scale: float, label_offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled cosine logits [B, K] with `additive_margin` taken off each row's positive, and the labels.

    Row i's positive is column `label_offset + i` (its own pair inside the gathered keys).
    Inputs must already be L2-normalised, so the dot product is the cosine.
    """
    cosines = queries @ keys.transpose(0, 1)
    labels = torch.arange(queries.shape[0], device=queries.device) + label_offset
    positive = F.one_hot(labels, num_classes=keys.shape[0]).to(cosines.dtype)
    return scale * (cosines - additive_margin * positive), labels


def additive_margin_loss(
    queries: torch.Tensor, keys: torch.Tensor, *, additive_margin: float, scale: float, label_offset: int = 0
) -> torch.Tensor:
    """One direction: mean cross-entropy of each query against all keys (mean over local rows)."""
    logits, labels = additive_margin_logits(queries, keys, additive_margin=additive_margin, scale=scale,
                                   label_offset=label_offset)
    if logits.dtype in (torch.float16, torch.bfloat16):
        # float32 for the softmax under autocast: logits reach +-scale and bf16 keeps 8 bits.
        logits = logits.float()
    return F.cross_entropy(logits, labels)


class BidirectionalAMSLoss(nn.Module):
    """Source->target plus target->source additive-margin softmax, negatives local or gathered.

    Args:
        additive_margin: subtracted from each positive's cosine only (the paper's 0.3).
        scale: multiplies the cosines before the softmax (20 here; TF Model Garden's LaBSE
            config uses 100 from a pre-trained encoder; docs/reference/labse-train.md, Loss).
        bidirectional: add the target->source direction (True, as the paper); False gives the
            source->target loss alone.
        gather_negatives: in a distributed run, score this rank's rows against every rank's
            embeddings (gathered with gradient; labels offset by rank * B), as LaBSE's
            cross-accelerator negatives. Without a process group it is the local loss.

    `forward(src, tgt)` takes L2-normalised [B, d] embeddings where row i of `src` and of `tgt`
    are a translation pair, and returns the scalar loss: the mean over the B local rows of each
    direction's cross-entropy, summed over directions. Every rank must pass the same B.
    `gather_seconds` accumulates the time spent in the forward gathers (device synchronised).

    Example::

        loss_fn = BidirectionalAMSLoss(additive_margin=0.3, scale=20.0, gather_negatives=True)
        src = F.normalize(torch.randn(8, 16), dim=-1)
        tgt = F.normalize(src + 0.1 * torch.randn(8, 16), dim=-1)
        loss = loss_fn(src, tgt)   # one process: 7 negatives per row, each direction;
                                   # under torchrun with N processes: 8N - 1
    """

    def __init__(self, additive_margin: float = 0.3, scale: float = 20.0, bidirectional: bool = True,
                 gather_negatives: bool = False):
        super().__init__()
        self.additive_margin = additive_margin
        self.scale = scale
        self.bidirectional = bidirectional
        self.gather_negatives = gather_negatives
        self.gather_seconds = 0.0

    def _gathered(self, src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        if not self.gather_negatives or get_world_size() == 1:
            return src, tgt, 0
        synchronize(src.device)
        started = time.perf_counter()
        all_src, all_tgt = all_gather_with_grad(src), all_gather_with_grad(tgt)
        synchronize(src.device)
        self.gather_seconds += time.perf_counter() - started
        return all_src, all_tgt, get_rank() * src.shape[0]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        if src.shape != tgt.shape:
            raise ValueError(f"source and target embeddings differ in shape: {tuple(src.shape)} vs {tuple(tgt.shape)}")
        all_src, all_tgt, label_offset = self._gathered(src, tgt)
        loss = additive_margin_loss(src, all_tgt, additive_margin=self.additive_margin, scale=self.scale,
                                    label_offset=label_offset)
        if self.bidirectional:
            loss = loss + additive_margin_loss(
                tgt, all_src, additive_margin=self.additive_margin, scale=self.scale, label_offset=label_offset
            )
        return loss

    def extra_repr(self) -> str:
        return (f"additive_margin={self.additive_margin}, scale={self.scale}, bidirectional={self.bidirectional}, "
                f"gather_negatives={self.gather_negatives}")

