"""Model and training configuration as dataclasses; every run writes both to `RUN_DIR/config.json`.

Defaults follow the paper (Feng et al., 2022) where it states them: additive margin 0.3, global batch
4096, a BERT-base encoder (12 layers, 768 wide, 12 heads). The logit scale is not given in the paper's
text; TF Model Garden's LaBSE config uses 100; `TrainConfig.scale` explains why the default here is 20.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Preset encoders. "base" is the paper's (BERT-base); "tiny" is for tests, "mini" for CPU
# benchmarks and the demo (minutes on 2 cores), "small" for longer CPU or single-GPU experiments.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=256, max_position_embeddings=128),
    "mini": dict(num_layers=4, hidden_size=128, num_heads=2, intermediate_size=512, max_position_embeddings=128),
    "small": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024, max_position_embeddings=256),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, max_position_embeddings=512),
}


# Token pooling before the head: Sentence-BERT's three (sentence-transformers' Pooling modes of the same names).
POOLING_MODES = ("cls", "mean", "max")


def count_vocab(vocab_path: str | Path) -> int:
    """Number of entries in a WordPiece `vocab.txt` (one token per line, ids are line numbers)."""
    with open(vocab_path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


@dataclass
class ModelConfig:
    """A BERT encoder shared by both sides of the dual encoder, token pooling, LaBSE's dense+tanh head."""

    vocab_size: int
    num_layers: int = 12
    hidden_size: int = 768
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    pad_token_id: int = 0
    preset: str = "base"
    # Token pooling before the dense+tanh head. "cls" is the released LaBSE's head and the default:
    # the paper starts from a pre-trained (MLM/TLM) encoder whose [CLS] already carries the sentence.
    # From RANDOM weights, measured (BENCHMARKS.md, model): the [CLS] vector of a post-LN BERT starts
    # the same for every sentence (dev cosine 0.9997) and the only signal it picks up in hundreds of
    # steps is sentence length (top principal component, r = 0.87 with length; dev retrieval stays
    # at ~1%), while "mean" (masked mean of the last layer) reached 41% after 100 steps in the
    # same run. Use "mean" to train from scratch without a pre-training stage. "max" is the
    # element-wise max over real tokens, Sentence-BERT's third option.
    pooling: str = "cls"
    # LaBSE's dense+tanh layer after pooling. False: the pooled vector goes straight to the L2
    # normalisation, as in sentence-transformers models without a Dense module (kept so that such a
    # model, given to --init-from, trains and exports as it was published).
    dense_head: bool = True

    @classmethod
    def from_preset(cls, name: str, vocab_size: int, **overrides: Any) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model config {name!r}; choose one of {sorted(PRESETS)}")
        return cls(vocab_size=vocab_size, preset=name, **{**PRESETS[name], **overrides})

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.vocab_size < 5:
            raise ValueError(f"vocab_size {self.vocab_size} is too small (the 5 special tokens alone need 5)")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {list(POOLING_MODES)}")

    def to_bert_config(self):
        from transformers import BertConfig

        return BertConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            hidden_dropout_prob=self.hidden_dropout,
            attention_probs_dropout_prob=self.attention_dropout,
            pad_token_id=self.pad_token_id,
            type_vocab_size=2,
        )


@dataclass
class TrainConfig:
    """Optimisation and loss settings of one `labse-train` run."""

    global_batch_size: int = 4096  # the paper's batch; split evenly over ranks
    margin: float = 0.3  # additive margin m, subtracted from the positive cosine only (paper)
    # Logit scale s multiplies cosines in [-1, 1]. TF Model Garden's LaBSE uses 100 with a
    # pre-trained BERT. This toolkit learns its own vocabulary, so its encoders start from random
    # weights, where every [CLS] embedding is nearly the same vector. Measured (BENCHMARKS.md,
    # model): from that start, scale 100 with margin 0.3 sat at the collapsed loss
    # 2*ln(1 + (B-1)*e^(0.3*100)) with chance-level retrieval after 150 steps, while 20 had started to
    # learn; after 300 steps both had moved and 20 was still (within noise) ahead. With mean pooling
    # (which does learn from scratch), 300 steps: scale 20 73.4% vs 100 70.8% Multi30k. A high scale
    # puts the softmax weight on the few currently-closest negatives, which at initialisation are
    # noise; CLIP likewise starts its learned scale at 1/0.07 ~ 14 and caps it at 100. Use
    # --scale 100 with --init-from a pre-trained encoder to follow Model Garden.
    scale: float = 20.0
    gather_negatives: bool = True  # score local rows against the global batch (cross-device negatives)
    max_steps: int = 50_000
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-6
    warmup_steps: int = 1000
    max_grad_norm: float = 1.0
    seed: int = 42
    max_seq_length: int = 64  # the paper's; sequences in the shards are already truncated to this
    eval_every: int = 1000
    save_every: int = 1000
    log_every: int = 10
    shuffle_buffer: int = 10_000
    num_workers: int = 0
    keep_checkpoints: int = 3  # newest checkpoints kept; 0 keeps all
    bf16: bool = True  # bf16 autocast on CUDA; ignored on CPU
    # Gradient caching (labse_model.grad_cache): encode each rank's batch C pairs at a time, so the
    # softmax spans the global batch while activation memory is that of C pairs. 0 = off.
    grad_cache_chunk: int = 0

    def __post_init__(self) -> None:
        if self.global_batch_size < 2:
            raise ValueError("global_batch_size must be >= 2 (in-batch negatives need at least one negative)")
        if self.scale <= 0:
            raise ValueError("scale must be > 0")
        if self.grad_cache_chunk < 0:
            raise ValueError("grad_cache_chunk must be >= 0 (0 turns gradient caching off)")
        self.adam_betas = tuple(self.adam_betas)  # JSON round trip gives a list


@dataclass
class RunConfig:
    """Everything `RUN_DIR/config.json` records: model, training, and the data it saw."""

    model: ModelConfig
    train: TrainConfig
    data: str = ""
    dev_data: str | None = None
    vocab: str = "vocab.txt"  # relative to the run directory
    world_size: int = 1
    init_from: str | None = None  # the --init-from starting point; its vocabulary is the run's
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return cls(
            model=ModelConfig(**data["model"]),
            train=TrainConfig(**data["train"]),
            **{k: v for k, v in data.items() if k not in ("model", "train")},
        )

    def save(self, path: str | Path) -> None:
        from pipelines.io.atomic import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))


@dataclass
class PretrainConfig:
    """Settings of one `labse-pretrain` run (MLM + TLM with progressive stacking).

    Masking follows LaBSE (20% of the tokens, at most 80 a sequence) and BERT's 80/10/10 rule;
    languages are sampled with exponent 0.3 as for LaBSE's vocabulary; the stage split 2:4:9 with
    L/4, L/2, L layers is LaBSE's progressive stacking. Optimiser settings are BERT's.
    """

    global_batch_size: int = 256  # sequences per step over all processes, MLM and TLM together
    max_steps: int = 1_000_000
    stage_layers: tuple[int, ...] = ()  # () = LaBSE's L/4, L/2, L of the model's depth
    stage_fractions: tuple[float, ...] = (2.0, 4.0, 9.0)
    max_seq_length: int = 512
    mask_prob: float = 0.2
    max_predictions: int = 80
    tlm_fraction: float = 0.0  # share of each batch that is translation pairs
    lang_alpha: float = 0.3
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-6
    warmup_steps: int = 10_000  # per stage: every stage starts a fresh optimizer (see labse_model.pretrain)
    max_grad_norm: float = 1.0
    seed: int = 42
    heldout_rate: float = 0.01  # share of packed sequences never trained on
    heldout_per_language: int = 64
    eval_every: int = 1000
    save_every: int = 1000
    log_every: int = 10
    keep_checkpoints: int = 3
    shuffle_buffer: int = 10_000  # of the TLM pair reader
    bf16: bool = True

    def __post_init__(self) -> None:
        self.stage_layers = tuple(int(n) for n in self.stage_layers)
        self.stage_fractions = tuple(float(f) for f in self.stage_fractions)
        self.adam_betas = tuple(self.adam_betas)
        checks = [
            (self.global_batch_size >= 1, "global_batch_size must be >= 1"),
            (self.max_steps >= 1, "max_steps must be >= 1"),
            (0 < self.mask_prob < 1, "mask_prob must be in (0, 1)"),
            (self.max_predictions >= 1, "max_predictions must be >= 1"),
            (0 <= self.tlm_fraction <= 1, "tlm_fraction must be in [0, 1]"),
            (self.lang_alpha >= 0, "lang_alpha must be >= 0"),
            (self.learning_rate > 0, "learning_rate must be > 0"),
            (self.warmup_steps >= 0, "warmup_steps must be >= 0"),
            (0 <= self.heldout_rate < 1, "heldout_rate must be in [0, 1)"),
            (self.max_seq_length >= 5, "max_seq_length must be >= 5"),
            (self.log_every >= 1, "log_every must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass
class PretrainRunConfig:
    """Everything `PT_DIR/pretrain_config.json` records; `labse-train --init-from PT_DIR` reads it."""

    model: ModelConfig
    pretrain: PretrainConfig
    vocab_sha256: str
    mono: list[str] = field(default_factory=list)
    pairs: str | None = None
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PretrainRunConfig":
        return cls(model=ModelConfig(**data["model"]), pretrain=PretrainConfig(**data["pretrain"]),
                   **{k: v for k, v in data.items() if k not in ("model", "pretrain")})

    def save(self, path: str | Path) -> None:
        from pipelines.io.atomic import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "PretrainRunConfig":
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))


def file_sha256(path: str | Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
