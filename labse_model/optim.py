"""AdamW with BERT's weight-decay groups, and the warm-up + linear-decay schedule."""
from __future__ import annotations

from typing import Callable

import torch

from labse_model.config import TrainerSettings


def build_optimizer(model: torch.nn.Module, settings: TrainerSettings) -> torch.optim.AdamW:
    """AdamW without weight decay on biases and LayerNorm weights (the BERT convention), with the
    learning rate, decay, betas and eps of a trainer's config (TrainConfig or PretrainConfig)."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.learning_rate, betas=settings.adam_betas, eps=settings.adam_eps,
    )


def lr_lambda(warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    """Linear warm-up to the peak over `warmup_steps`, then linear decay to 0 at `max_steps`.

    The one difference from `transformers.get_linear_schedule_with_warmup`: there the first step
    runs at learning rate 0 (factor step / warmup), here it already moves (factor (step+1) / warmup),
    so a run of N steps makes N real updates. After the warm-up both are the same line.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int,
                    max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup_steps, max_steps))
