"""Gradient caching (GradCache, Gao et al. 2021): the in-batch softmax of a big batch with the
activation memory of a small chunk.

The contrastive loss couples every pair in the batch, so plain gradient accumulation cannot split it:
each micro-batch would only see its own negatives. The loss, however, depends on the encoder only
through the embeddings, and embeddings are small. So one step runs in three passes:

1. encode each chunk of C pairs WITHOUT autograd (no activations kept), remembering the RNG state
   each chunk started from;
2. compute the loss on the detached embeddings of the whole local batch (gathered across ranks as
   in the uncached step) and back-propagate it to the embeddings only: d loss / d embeddings;
3. encode each chunk again WITH autograd from its remembered RNG state (so dropout draws the same
   masks), and back-propagate the cached gradient through it with the surrogate
   `sum(embeddings * cached_gradient)`, whose gradient w.r.t. the parameters is exactly the chunk's
   share of d loss / d parameters (chain rule). The parameter gradients accumulate over the chunks.

Cost: one extra forward per chunk. Memory: one chunk's activations plus the batch's embeddings.
Under DDP only the last chunk's backward all-reduces (`no_sync` around the others), so a step still
makes one gradient all-reduce, of the accumulated gradients.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel

Batch = dict[str, torch.Tensor]
# The loss given the whole local batch's embeddings (each [local_batch, dim], in the order the model
# returns them), gathering negatives across ranks if the task does.
EmbeddingLoss = Callable[..., torch.Tensor]

LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class RandomState:
    """The CPU generator and, on CUDA, the device's generator: what dropout draws its masks from."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None
    device: torch.device

    @classmethod
    def capture(cls, device: torch.device) -> "RandomState":
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(cpu=torch.get_rng_state(), cuda=cuda, device=device)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def split_batch(batch: Batch, chunk_size: int) -> list[Batch]:
    """Rows [0, C), [C, 2C), ... of every tensor; the last chunk holds the remainder."""
    if chunk_size < 1:
        raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
    columns = {name: torch.split(tensor, chunk_size) for name, tensor in batch.items()}
    count = len(next(iter(columns.values())))
    return [{name: parts[index] for name, parts in columns.items()} for index in range(count)]


def _as_tuple(outputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)


def _full_precision(tensor: torch.Tensor) -> torch.Tensor:
    # The loss and the surrogate run in float32 under bf16 autocast: the cosines of a softmax scaled
    # by 20-100 and a product summed over the batch lose too many digits in 8 mantissa bits. float64
    # (the exactness tests) stays float64.
    return tensor.float() if tensor.dtype in LOW_PRECISION else tensor


def _gradient_sync(model: torch.nn.Module, is_last_chunk: bool) -> ContextManager:
    """DDP's `no_sync` for every chunk but the last: gradients accumulate locally, then the last
    chunk's backward all-reduces the accumulated gradients once."""
    if isinstance(model, DistributedDataParallel) and not is_last_chunk:
        return model.no_sync()
    return nullcontext()


def grad_cached_step(
    model: torch.nn.Module,
    batch: Batch,
    chunk_size: int,
    embedding_loss: EmbeddingLoss,
    autocast: Callable[[], ContextManager] = nullcontext,
) -> torch.Tensor:
    """Back-propagate `embedding_loss(*model(**batch))` into the parameters' `.grad`, C rows at a time.

    `model(**chunk)` returns one embedding tensor or a tuple of them (the dual encoder's source and
    target), row i belonging to row i of the chunk. `autocast` wraps the encoder's forwards only; the
    loss and the surrogate run outside it. Returns the loss, detached: it is already back-propagated.
    The parameter gradients equal those of the uncached step that draws the same dropout masks.
    """
    chunks = split_batch(batch, chunk_size)
    device = next(iter(batch.values())).device

    # Pass 1: embeddings without activations, and the RNG state each chunk's forward started from.
    states: list[RandomState] = []
    chunk_outputs: list[tuple[torch.Tensor, ...]] = []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RandomState.capture(device))
            with autocast():
                chunk_outputs.append(_as_tuple(model(**chunk)))

    # Pass 2: the loss over the whole batch, back-propagated to the embeddings only (they are leaves).
    embeddings = [_full_precision(torch.cat(parts)).requires_grad_() for parts in zip(*chunk_outputs)]
    del chunk_outputs
    loss = embedding_loss(*embeddings)
    loss.backward()
    cached_gradients = [tensor.grad for tensor in embeddings]

    # Pass 3: re-encode each chunk with its dropout masks and push the cached gradient through it.
    # Replaying chunk i's state also leaves the generator where pass 1 left it after the last chunk.
    rows = [next(iter(chunk.values())).shape[0] for chunk in chunks]
    gradient_chunks = [torch.split(gradient, rows) for gradient in cached_gradients]
    for index, (chunk, state) in enumerate(zip(chunks, states)):
        state.restore()
        with _gradient_sync(model, is_last_chunk=index == len(chunks) - 1):
            with autocast():
                outputs = _as_tuple(model(**chunk))
            surrogate = sum((_full_precision(output) * gradients[index]).sum()
                            for output, gradients in zip(outputs, gradient_chunks))
            surrogate.backward()
    return loss.detach()
