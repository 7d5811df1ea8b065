"""labse-tfrecords: translation pairs -> globally shuffled `tf.train.Example` shards (contract 8).

    labse-tfrecords --pairs SCORED_DIR --vocab vocab.txt --output SHARDS_DIR \\
        [--parallel-text de:train.de.gz,en:train.en.gz ...] [--max-seq-length 64] [--num-shards 16] \\
        [--min-score S] [--include-text] [--seed 0] [--overwrite] [Beam options]

Inputs: scored pairs Parquet (`src, tgt, src_lang, tgt_lang, score, ...`; any Parquet with `src`
and `tgt` columns is accepted, missing languages become "und" and a missing score NaN) and/or
line-aligned plain-text files (a human-translated corpus such as Multi30k; score 1.0).

Each pair is tokenised with `pipelines.text.wordpiece.TFTextTokenizer` (loaded once per worker), wrapped as
`[CLS] ... [SEP]`, truncated to `--max-seq-length` (keeping `[SEP]`), and assigned a 64-bit key
hashed from (seed, languages, texts).  The key picks the shard and orders records inside it, so the
shuffle is global across shards, reproducible for a seed, and independent of the runner's bundling.
Identical pairs get the same key and are written once (duplicates are in-batch false negatives for
the ranking loss).  Every dropped pair is counted by reason in `stats.json` and Beam counters.

Outputs in SHARDS_DIR: `pairs-SSSSS-of-NNNNN.tfrecord` (uncompressed, written atomically),
`schema.json` (features, dtypes, version, vocabulary checksum, max_seq_length, shard list),
`stats.json` and last `_SUCCESS` (`pipelines.io.completion`).  The trainer reads them without
TensorFlow (`labse_model.data`).  `--pairs` Parquet must lie in complete stage outputs (`_SUCCESS`);
the output is locked while the stage runs and refused if it holds anything, unless `--overwrite`.

The stage in three modules, one concern each:

    encode.py      plain functions, no Beam: pair normalisation, word-piece ids, shuffle key,
                   the Example bytes, the schema and what schema.json / stats.json hold
    transforms.py  the Beam transforms: ReadParquetPairs, ReadParallelText, PairsToTFRecords,
                   BuildTFRecords (the whole stage)
    cli.py         the `labse-tfrecords` command: options, input checks, output lock, main()

The TFRecord framing itself is `pipelines.io.tfrecord`, shared with the trainer. Importing this
package imports none of them: `main` loads the CLI when called.
"""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`labse-tfrecords` (see `pipelines.tfrecords.cli.main`); the console script's entry point."""
    from pipelines.tfrecords.cli import main as _main

    return _main(argv)


__all__ = ["main"]
