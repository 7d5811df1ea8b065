"""Model and training configuration as dataclasses; every run writes both to `RUN_DIR/config.json`.

Defaults follow the paper (Feng et al., 2022) where it states them: additive margin 0.3, global batch
4096, a BERT-base encoder (12 layers, 768 wide, 12 heads). The logit scale is not given in the paper's
text; TF Model Garden's LaBSE config uses 100; `TrainConfig.scale` explains why the default here is 20.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipelines.io.config_options import UsageError, not_an_option, option

# Preset encoders. "base" is the paper's (BERT-base); "tiny" is for tests, "mini" for CPU
# benchmarks and the demo (minutes on 2 cores), "small" for longer CPU or single-GPU experiments.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=256, max_position_embeddings=128),
    "mini": dict(num_layers=4, hidden_size=128, num_heads=2, intermediate_size=512, max_position_embeddings=128),
    "small": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024, max_position_embeddings=256),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, max_position_embeddings=512),
}


# The largest model a config may ask for: 20x LaBSE (4.7e8), 40 GB of float32 weights. A bound
# checked before anything is allocated (ModelConfig), so an absurd config file is one line.
MAX_PARAMETERS = 10**10

# Token pooling before the head: Sentence-BERT's three (sentence-transformers' Pooling modes of the same names).
POOLING_MODES = ("cls", "mean", "max")


def count_vocab(vocab_path: str | Path) -> int:
    """Number of entries in a WordPiece `vocab.txt` (one token per line, ids are line numbers)."""
    with open(vocab_path, encoding="utf-8") as handle:
        return sum(1 for _ in handle)


# ----------------------------------------------------------------------------------------------
# Validation. Every setting is checked where its dataclass is built, so the same rules hold for
# command-line options and for a configuration read back from a run directory's JSON. A setting's
# message names the field and, where it differs from `--field-name`, the option that sets it.
# Comparisons alone would let NaN through some checks (NaN >= 0 is False, but so is NaN < 0) and
# infinity through others, so every real number is first required to be finite.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def int_at_least(name: str, value: Any, low: int, meaning: str = "") -> str | None:
    """None when `value` is an integer >= `low`, else the message saying so."""
    if _is_int(value) and value >= low:
        return None
    return f"{name} must be an integer >= {low}{meaning}, got {value!r}"


def finite_in(name: str, value: Any, low: float, high: float = math.inf, *, low_open: bool = False,
              high_open: bool = True) -> str | None:
    """None when `value` is a finite number in the interval, else the message naming the interval."""
    if _is_finite(value) and (low < value if low_open else low <= value) and \
            (value < high if high_open else value <= high):
        return None
    left, right = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
    upper = "inf" if high == math.inf else f"{high:g}"
    return f"{name} must be a finite number in {left}{low:g}, {upper}{right}, got {value!r}"


def check_dropout(value: Any, name: str = "--dropout") -> None:
    """Dropout is a probability of zeroing a unit: [0, 1) (1 would zero every activation)."""
    problem = finite_in(name, value, 0.0, 1.0)
    if problem:
        raise UsageError(problem)


def refuse_problems(problems: list[str | None]) -> None:
    """ValueError with every problem found, on one line (a user fixes them all in one go)."""
    found = [problem for problem in problems if problem]
    if found:
        raise UsageError("; ".join(found))


# Seeds feed torch.manual_seed (at most 2**64 - 1, shifted by rank and step) and numpy's
# SeedSequence (non-negative only).
SEED_LIMIT = 2**63


def _seed_problem(value: Any) -> str | None:
    if _is_int(value) and 0 <= value < SEED_LIMIT:
        return None
    return f"seed must be an integer in [0, 2**63), got {value!r}"


# ----------------------------------------------------------------------------------------------
# Command-line metadata. Every field of the settings that a command builds from its options
# (TrainConfig for labse-train, PretrainConfig for labse-pretrain) says how it is set with
# `option(...)` or `not_an_option(...)` (pipelines.io.config_options, shared with labse-clean):
# its option, help text and choices sit beside its type and default, and the command builds the
# options and the dataclass back from this, so a setting is declared once.


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
            raise UsageError(f"unknown model config {name!r}; choose one of {sorted(PRESETS)}")
        return cls(vocab_size=vocab_size, preset=name, **{**PRESETS[name], **overrides})

    def __post_init__(self) -> None:
        refuse_problems([
            int_at_least("vocab_size", self.vocab_size, 5, " (the 5 special tokens alone need 5)"),
            *(int_at_least(name, getattr(self, name), 1)
              for name in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings")),
            finite_in("hidden_dropout (--dropout)", self.hidden_dropout, 0.0, 1.0),
            finite_in("attention_dropout (--dropout)", self.attention_dropout, 0.0, 1.0),
            None if self.pooling in POOLING_MODES else
            f"unknown pooling {self.pooling!r}; choose one of {list(POOLING_MODES)}",
        ])
        if self.hidden_size % self.num_heads:
            raise UsageError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.parameter_count() > MAX_PARAMETERS:
            # Checked here, before any tensor exists: a config file asking for 10^6 layers or a
            # hidden size of 10^6 would otherwise be found out by an allocation of ~100 GB.
            raise UsageError(f"the model would have {self.parameter_count():.3g} parameters (vocab_size "
                             f"{self.vocab_size}, num_layers {self.num_layers}, hidden_size {self.hidden_size}, "
                             f"intermediate_size {self.intermediate_size}, max_position_embeddings "
                             f"{self.max_position_embeddings}), over this trainer's limit of {MAX_PARAMETERS:.0e} "
                             "(LaBSE: 4.7e+08)")
        if not (_is_int(self.pad_token_id) and 0 <= self.pad_token_id < self.vocab_size):
            raise UsageError(f"pad_token_id must be an id of the vocabulary, got {self.pad_token_id!r}")

    def parameter_count(self) -> int:
        """Parameters of the encoder and head this config builds (BERT's embeddings, layers, head)."""
        hidden, inner = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + 2) * hidden + 2 * hidden
        layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * inner + inner + hidden + 4 * hidden
        return embeddings + self.num_layers * layer + hidden * hidden + hidden

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
            # torch's fused scaled_dot_product_attention (flash / memory-efficient kernels on GPU), named
            # rather than left to the transformers version's default.
            attn_implementation="sdpa",
        )


@dataclass
class TrainerSettings:
    """What `labse-train` (TrainConfig) and `labse-pretrain` (PretrainConfig) share: AdamW with
    BERT's decay groups (labse_model.optim), gradient clipping, and the cadence of logs,
    evaluations and checkpoints that the one training loop (labse_model.loop) follows.

    Each trainer's config extends it; `config.json` stays flat, so run directories written before
    this class existed resume unchanged.
    """

    learning_rate: float = option(1e-4, "peak AdamW learning rate", flag="--lr")
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and LayerNorm)")
    adam_betas: tuple[float, float] = not_an_option((0.9, 0.999))
    adam_eps: float = not_an_option(1e-6)
    max_grad_norm: float = option(1.0, "gradient clipping (0: off)")
    # The fields marked resumable may change on --resume (pipelines.io.config_options.resumable_fields).
    eval_every: int = option(1000, "steps between evaluations (labse-train: dev retrieval; labse-pretrain: "
                             "held-out masked tokens)", resumable=True, group="run")
    save_every: int = option(1000, "steps between checkpoints", resumable=True, group="run")
    log_every: int = option(10, "steps between loss logs", resumable=True, group="run")
    keep_checkpoints: int = option(3, "newest checkpoints to keep, 0 = all", resumable=True, group="run")
    bf16: bool = option(True, "bf16 autocast on GPU (ignored on CPU)")
    # Off by default: compiling takes minutes before the first step, worth it on long GPU runs only.
    compile: bool = option(False, "torch.compile the trained model (GPU runs; minutes of compiling before the "
                           "first step)", group="run")

    # Whether learning rate 0 is valid (TrainConfig says why it allows it).
    zero_learning_rate_allowed: ClassVar[bool] = False

    def trainer_problems(self) -> list[str | None]:
        """The problems of the shared fields (refuse_problems reports them with the trainer's own)."""
        self.adam_betas = tuple(self.adam_betas)  # JSON round trip gives a list
        betas_ok = len(self.adam_betas) == 2 and all(finite_in("beta", b, 0.0, 1.0) is None for b in self.adam_betas)
        return [
            finite_in("learning_rate (--lr)", self.learning_rate, 0.0, low_open=not self.zero_learning_rate_allowed),
            finite_in("weight_decay", self.weight_decay, 0.0),
            None if betas_ok else f"adam_betas must be two finite numbers in [0, 1), got {list(self.adam_betas)!r}",
            finite_in("adam_eps", self.adam_eps, 0.0, low_open=True),
            finite_in("max_grad_norm", self.max_grad_norm, 0.0),  # 0 turns clipping off
            int_at_least("eval_every", self.eval_every, 0, " (0: only at the end of the run or stage)"),
            int_at_least("save_every", self.save_every, 0, " (0: only at the end)"),
            int_at_least("log_every", self.log_every, 1),
            int_at_least("keep_checkpoints", self.keep_checkpoints, 0, " (0 keeps all)"),
        ]


@dataclass
class TrainConfig(TrainerSettings):
    """Optimisation and loss settings of one `labse-train` run."""

    # A run at learning rate 0 keeps its starting point's weights: it checks --init-from and
    # labse-export end to end (docs/reference/labse-train.md, starting from a published model).
    zero_learning_rate_allowed: ClassVar[bool] = True

    # The paper's batch; split evenly over ranks.
    global_batch_size: int = option(4096, "pairs per step over all processes (must divide by the process count)")
    # Additive margin m, subtracted from the positive cosine only (paper); not labse-mine's margin kind.
    additive_margin: float = option(0.3, "additive margin on the positive", flag="--margin")
    # Logit scale s multiplies cosines in [-1, 1]. TF Model Garden's LaBSE uses 100 with a
    # pre-trained BERT; from random weights (every [CLS] embedding nearly the same vector) 100 sat at
    # the collapsed loss while 20 learned (BENCHMARKS.md, "Trainer": the scale rows). A high scale
    # puts the softmax weight on the few currently-closest negatives, which at initialisation are
    # noise; CLIP likewise starts its learned scale at 1/0.07 ~ 14 and caps it at 100. Use
    # --scale 100 with --init-from a pre-trained encoder to follow Model Garden.
    scale: float = option(20.0, "logit scale on cosines")
    # Score local rows against the global batch (cross-device negatives).
    gather_negatives: bool = option(True, "score local pairs against every process's pairs (the global batch)")
    max_steps: int = option(50_000, "total optimizer steps", resumable=True)
    warmup_steps: int = option(1000, "linear warm-up, then linear decay to 0")
    seed: int = option(42, "seed of the initial weights, the data order and dropout")
    # The paper's; sequences in the shards are already truncated to this.
    max_seq_length: int = option(64, "truncate longer sequences")
    # The loader's memory is these shards' offset indexes, 8 bytes a record (labse_model.data).
    shuffle_window: int = option(8, "shards whose records are shuffled together; each reading process holds "
                                 "their offset indexes (8 bytes a record)", metavar="SHARDS")
    num_workers: int = option(0, "DataLoader workers per process", resumable=True, group="run")
    # Gradient caching (labse_model.grad_cache): encode each rank's batch C pairs at a time, so the
    # softmax spans the global batch while activation memory is that of C pairs. 0 = off.
    grad_cache_chunk: int = option(
        0, "gradient caching: encode each process's batch C pairs at a time (activation memory of C pairs, "
        "negatives of the whole global batch, one extra forward); 0 = off", metavar="C")

    def __post_init__(self) -> None:
        refuse_problems([
            int_at_least("global_batch_size", self.global_batch_size, 2,
                         " (in-batch negatives need at least one negative)"),
            # The margin is subtracted from the positive's cosine; a negative one would favour it.
            finite_in("additive_margin", self.additive_margin, 0.0),
            finite_in("scale", self.scale, 0.0, low_open=True),
            int_at_least("max_steps", self.max_steps, 1),
            *self.trainer_problems(),
            int_at_least("warmup_steps", self.warmup_steps, 0),
            _seed_problem(self.seed),
            int_at_least("max_seq_length", self.max_seq_length, 2, " ([CLS] and [SEP])"),
            int_at_least("shuffle_window", self.shuffle_window, 1),
            int_at_least("num_workers", self.num_workers, 0),
            int_at_least("grad_cache_chunk", self.grad_cache_chunk, 0, " (0 turns gradient caching off)"),
        ])


class JsonConfigFile:
    """A run's JSON config file (`RUN_DIR/config.json`, `PT_DIR/pretrain_config.json`): written
    atomically, read back through the dataclass's own `from_dict`, whose checks refuse an edited or
    damaged file as clearly as a bad command-line option (ValueError naming the file)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        from pipelines.io.atomic import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path):
        try:
            with open(path, encoding="utf-8") as handle:
                return cls.from_dict(json.load(handle))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UsageError(f"{path} is not a valid {cls.__name__} file: {exc}") from None


@dataclass
class RunConfig(JsonConfigFile):
    """Everything `RUN_DIR/config.json` records: model, training, and the data it saw."""

    model: ModelConfig
    train: TrainConfig
    data: str = ""
    dev_data: str | None = None
    vocab: str = "vocab.txt"  # relative to the run directory
    world_size: int = 1
    init_from: str | None = None  # the --init-from starting point; its vocabulary is the run's
    extra: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] | None = None  # the shards read (labse_model.run_inputs); --resume compares

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        if "shuffle_buffer" in data.get("train", {}):
            raise UsageError("the run was made by the loader before offset indexes (shuffle_buffer), whose data order "
                             "this one cannot continue: start a new run with --init-from the old run directory")
        train = dict(data["train"])
        if "margin" in train:  # a run written before the field was named additive_margin
            train["additive_margin"] = train.pop("margin")
        return cls(
            model=ModelConfig(**data["model"]),
            train=TrainConfig(**train),
            **{k: v for k, v in data.items() if k not in ("model", "train")},
        )


@dataclass
class PretrainConfig(TrainerSettings):
    """Settings of one `labse-pretrain` run (MLM + TLM with progressive stacking).

    Masking follows LaBSE (20% of the tokens, at most 80 a sequence) and BERT's 80/10/10 rule;
    languages are sampled with exponent 0.3 as for LaBSE's vocabulary; the stage split 2:4:9 with
    L/4, L/2, L layers is LaBSE's progressive stacking. Optimiser settings are BERT's.
    """

    # Options marked `derived` take their default from the model (labse_model.pretrain.pretrain_settings).
    global_batch_size: int = option(256, "sequences per step over all processes, MLM and TLM together")
    max_steps: int = option(1_000_000, "steps over all stages")
    # () = LaBSE's L/4, L/2, L of the model's depth.
    stage_layers: tuple[int, ...] = option(
        (), "layers per stage, each a multiple of the last; the full depth alone trains without stacking",
        derived="L/4,L/2,L of the config's depth; mini: 1,2,4", group="model")
    stage_fractions: tuple[float, ...] = option((2.0, 4.0, 9.0), "relative length of each stage (LaBSE: 2,4,9)",
                                                group="model")
    max_seq_length: int = option(512, "tokens per sequence", derived="{default}, or the config's positions if fewer")
    mask_prob: float = option(0.2, "share of tokens to predict")
    max_predictions: int = option(80, "masked tokens per sequence at most")
    # Share of each batch that is translation pairs.
    tlm_fraction: float = option(0.0, "share of each batch that is TLM pairs", derived="0.5 with --pairs, else 0")
    lang_alpha: float = option(0.3, "language sampling exponent: p ~ sentences ** alpha")
    # Per stage: every stage starts a fresh optimizer (see labse_model.pretrain).
    warmup_steps: int = option(10_000, "linear warm-up of each stage")
    seed: int = option(42, "seed of the initial weights, sampling, masking and dropout")
    # Share of packed sequences never trained on.
    heldout_rate: float = option(0.01, "share of packed monolingual sequences held out for evaluation")
    heldout_per_language: int = option(64, "held-out sequences scored per language")
    tlm_shuffle_window: int = not_an_option(8)  # shards of the TLM pair reader shuffled together
    mlm_shuffle_window: int = option(1000, "packed monolingual sequences of a file shuffled together (1: file order)")

    def __post_init__(self) -> None:
        self.stage_layers = tuple(self.stage_layers)
        self.stage_fractions = tuple(self.stage_fractions)
        refuse_problems([
            int_at_least("global_batch_size", self.global_batch_size, 1),
            int_at_least("max_steps", self.max_steps, 1),
            *(int_at_least("stage_layers entry", n, 1) for n in self.stage_layers),
            *(finite_in("stage_fractions entry", f, 0.0, low_open=True) for f in self.stage_fractions),
            int_at_least("max_seq_length", self.max_seq_length, 5),
            # labse_model.masking's rule: at least one token and never all of them.
            finite_in("mask_prob", self.mask_prob, 0.0, 1.0, low_open=True),
            int_at_least("max_predictions", self.max_predictions, 1),
            finite_in("tlm_fraction", self.tlm_fraction, 0.0, 1.0, high_open=False),
            finite_in("lang_alpha", self.lang_alpha, 0.0),
            *self.trainer_problems(),
            int_at_least("warmup_steps", self.warmup_steps, 0),
            _seed_problem(self.seed),
            finite_in("heldout_rate", self.heldout_rate, 0.0, 1.0),
            int_at_least("heldout_per_language", self.heldout_per_language, 1, " (--heldout-rate 0 turns it off)"),
            int_at_least("tlm_shuffle_window", self.tlm_shuffle_window, 1),
            int_at_least("mlm_shuffle_window", self.mlm_shuffle_window, 1),
        ])
        self.stage_fractions = tuple(float(f) for f in self.stage_fractions)


@dataclass
class PretrainRunConfig(JsonConfigFile):
    """Everything `PT_DIR/pretrain_config.json` records; `labse-train --init-from PT_DIR` reads it."""

    model: ModelConfig
    pretrain: PretrainConfig
    vocab_sha256: str
    mono: list[str] = field(default_factory=list)
    pairs: str | None = None
    world_size: int = 1
    inputs: dict[str, Any] | None = None  # the files read (labse_model.run_inputs); --resume compares

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PretrainRunConfig":
        # Written before the offset-index loader: --init-from such a directory reads its model settings
        # alone (a --resume of it continues its TLM pairs in the new order).
        pretrain = {k: v for k, v in data["pretrain"].items() if k != "shuffle_buffer"}
        return cls(model=ModelConfig(**data["model"]), pretrain=PretrainConfig(**pretrain),
                   **{k: v for k, v in data.items() if k not in ("model", "pretrain")})


def file_sha256(path: str | Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
