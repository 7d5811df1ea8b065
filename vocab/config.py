"""labse-vocab's configuration: checked when built; each field is also labse-vocab's option of the
same name (`pipelines.io.config_options`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipelines.io.config_options import option
from vocab.learn import MAX_TOKEN_LENGTH, LearnerConfig
from vocab.prune import DEFAULT_MAX_WORDS


@dataclass
class VocabConfig:
    vocab_size: int = option(500_000, "exact number of tokens")  # LaBSE: 501,153
    smoothing: float = option(0.3, "exponent alpha of the language weights p_l ∝ n_l^alpha (1 = raw counts, "
                              "0 = uniform)")  # LaBSE's exponent
    num_unused: int = option(0, "[unusedN] slots after the reserved tokens")
    char_min_count: float = option(5.0, "a character with at least this weighted count is a token alone and as ##c")
    holdout_rate: float = option(0.01, "share of sentences held out of counting, for the report")
    heldout_per_language: int = option(2000, "held-out sentences per language kept for the report")
    max_token_length: int = option(50, "words longer than this (in characters) are not learned from")
    # Split over languages by smoothed share (vocab.prune): the learner's memory is about 1 KB a
    # word (docs/guides/vocabulary-at-scale.md).
    max_words: int = option(DEFAULT_MAX_WORDS, "distinct words the learner gets at most (each language's most "
                            "frequent, split by smoothed share; the learner needs about 1 KB a word); 0 = all")

    def __post_init__(self) -> None:
        found = []
        if not 0.0 <= self.holdout_rate < 1.0:
            found.append(f"--holdout-rate must be in [0, 1), got {self.holdout_rate}")
        if not (math.isfinite(self.smoothing) and self.smoothing >= 0.0):
            found.append(f"--smoothing must be a finite number >= 0, got {self.smoothing}")
        if not (math.isfinite(self.char_min_count) and self.char_min_count > 0.0):
            found.append(f"--char-min-count must be a finite number > 0, got {self.char_min_count}")
        for name in ("vocab_size", "max_token_length"):
            if getattr(self, name) < 1:
                found.append(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_token_length > MAX_TOKEN_LENGTH:
            found.append(f"--max-token-length must be at most {MAX_TOKEN_LENGTH} (the learner's limit), "
                         f"got {self.max_token_length}")
        for name in ("num_unused", "heldout_per_language", "max_words"):
            if getattr(self, name) < 0:
                found.append(f"--{name.replace('_', '-')} must be at least 0, got {getattr(self, name)}")
        if found:
            raise ValueError("; ".join(found))

    def learner(self) -> LearnerConfig:
        return LearnerConfig(
            vocab_size=self.vocab_size,
            num_unused=self.num_unused,
            char_min_count=self.char_min_count,
            max_token_length=self.max_token_length,
        )
