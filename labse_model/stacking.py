"""Progressive stacking (Gong et al., 2019), as LaBSE pre-trains: L/4 -> L/2 -> L layers.

Training time is split into stages by relative fractions (LaBSE: 2/15, 4/15, 9/15 of the steps).
At a stage boundary the deeper model is the shallower one stacked on itself: with k trained layers,
new layer i is a copy of trained layer i mod k (so layer i + k = layer i); the embeddings and the
MLM head carry over unchanged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from labse_model.config import ModelConfig
from labse_model.mlm import MaskedLanguageModel
from pipelines.io.config_options import UsageError

_LAYER_KEY = re.compile(r"^(bert\.encoder\.layer\.)(\d+)(\..*)$")


@dataclass(frozen=True)
class Stage:
    index: int
    num_layers: int
    begin: int  # first step of the stage (steps already done when it starts)
    end: int  # the stage's last step; steps (begin, end] belong to it


def default_stage_layers(num_layers: int) -> tuple[int, ...]:
    """LaBSE's L/4, L/2, L; a depth that does not divide by 4 must name its stages."""
    if num_layers % 4:
        raise UsageError(f"{num_layers} layers do not divide into LaBSE's L/4, L/2, L stages: "
                         "pass --stage-layers (e.g. 1,2 for 2 layers, or the full depth alone for no stacking)")
    return (num_layers // 4, num_layers // 2, num_layers)


def plan_stages(max_steps: int, stage_layers: tuple[int, ...], stage_fractions: tuple[float, ...],
                num_layers: int) -> list[Stage]:
    """The stages of a run of `max_steps`, validated against the encoder's depth."""
    if len(stage_layers) != len(stage_fractions):
        raise UsageError(f"--stage-layers has {len(stage_layers)} entries but --stage-fractions "
                         f"{len(stage_fractions)}: give one fraction per stage")
    if stage_layers[-1] != num_layers:
        raise UsageError(f"the last stage must train all {num_layers} layers of the config, "
                         f"--stage-layers ends at {stage_layers[-1]}")
    for shallow, deep in zip(stage_layers, stage_layers[1:]):
        if shallow < 1 or deep <= shallow or deep % shallow:
            raise UsageError(f"--stage-layers {','.join(map(str, stage_layers))}: each stage must be a multiple "
                             f"of the one before (stacking copies whole stacks), and {deep} is not of {shallow}")
    if any(f <= 0 for f in stage_fractions):
        raise UsageError("--stage-fractions must be positive")
    total = sum(stage_fractions)
    ends, cumulative = [], 0.0
    for fraction in stage_fractions:
        cumulative += fraction
        ends.append(int(round(max_steps * cumulative / total)))
    stages, begin = [], 0
    for index, (layers, end) in enumerate(zip(stage_layers, ends)):
        if end <= begin:
            raise UsageError(f"--max-steps {max_steps} leaves stage {index + 1} ({layers} layers) no step")
        stages.append(Stage(index=index, num_layers=layers, begin=begin, end=end))
        begin = end
    return stages


def build_model(config: ModelConfig, num_layers: int, seed: int) -> MaskedLanguageModel:
    """A fresh model of `num_layers`, initialised from `seed` without touching the global RNG stream.

    Leaving the global stream alone (dropout draws from it) keeps a run that grows its model at a
    boundary identical to one resumed at that boundary.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MaskedLanguageModel(replace(config, num_layers=num_layers))


def grow(model: MaskedLanguageModel, num_layers: int, seed: int) -> MaskedLanguageModel:
    """A `num_layers`-deep copy of `model` in which layer i is trained layer i mod k (k = its depth)."""
    trained = model.config.num_layers
    if num_layers % trained:
        raise ValueError(f"cannot stack {trained} layers into {num_layers}")
    deeper = build_model(model.config, num_layers, seed)
    source = model.state_dict()
    grown = {}
    for name in deeper.state_dict():
        match = _LAYER_KEY.match(name)
        origin = f"{match.group(1)}{int(match.group(2)) % trained}{match.group(3)}" if match else name
        grown[name] = source[origin].detach().clone()
    deeper.load_state_dict(grown, strict=True)
    return deeper.to(next(model.parameters()).device)
