"""labse-index: one compressed FAISS index per language from its saved vectors (Beam).

    labse-index --vectors DIR --lang de --output INDEX_DIR [--factory auto] [--shard-sentences N]
                [--train-sample N] [--nprobe 32] [--overwrite] [Beam options]

DIR holds saved vectors (`vectors:DIR`: NAME.npy rows = NAME.txt lines, local or gs://), written
once per sentence by the embedding step; labse-mine searches the index (`--tgt-index`), for every
language pair. Writes INDEX_DIR/trained.faiss, INDEX_DIR/shard-*.faiss + .txt + .f16.npy + .ids.npy, `_stats.json`
(accounting, the manifest: factory, shards, bytes a sentence) and `_SUCCESS` last.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Sequence


from pipelines.index.choice import (bytes_per_sentence, factory_for, fitted_factory, training_points_needed,
                                   training_sample_size)
from pipelines.index.config import IndexConfig
from pipelines.index.shards import plan_shards
from pipelines.index.transforms import BuildIndex
from pipelines.index.vector_files import list_matrix_files
from pipelines.io.console import start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.completion import read_output_stats, require_stage_output
from pipelines.embed.saved_vectors import SavedVectorsError, refuse_unfinished_output
from pipelines.stage import require_remote_on_dataflow, run_stage
from pipelines.stage_options import replace_help, stage_parser, usage_error

logger = logging.getLogger(__name__)


def build_parser():
    parser = stage_parser(
        "labse-index",
        "Build one compressed, sharded FAISS index of a language's saved vectors: train on a sample, add every "
        "vector in shards, choose the index type by size (or --factory).",
        output="INDEX_DIR: trained.faiss, shard-*.faiss, .txt, .f16.npy, .ids.npy and _stats.json",
        overwrite=replace_help("INDEX_DIR"))
    parser.add_argument("--vectors", required=True, help="saved vectors DIR (NAME.npy + NAME.txt pairs), local or gs://"
                        " (a `vectors:` prefix is accepted)")
    add_config_options(parser, IndexConfig)
    return parser


def plan(vectors: str, config: IndexConfig):
    """(files, shard plans, factory, training sample size) for `vectors`; UsageError when unusable."""
    try:
        files = list_matrix_files(vectors.removeprefix("vectors:"))
    except SavedVectorsError as error:
        raise UsageError(f"--vectors: {error}") from None
    sentences = sum(f.rows for f in files)
    if sentences == 0:
        raise UsageError(f"--vectors {vectors}: its .npy files hold no rows: nothing to index")
    factory = factory_for(sentences) if config.factory == "auto" else config.factory
    sample = training_sample_size(sentences, factory, config.train_sample)
    if config.factory == "auto":
        factory = fitted_factory(factory, sample)
    try:
        import faiss

        index = faiss.index_factory(files[0].dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as error:
        raise UsageError(f"--factory {factory!r} is not a FAISS factory string for {files[0].dim} dimensions: "
                         f"{str(error).strip().splitlines()[-1][:200]}") from None
    needed, what = training_points_needed(index)
    if not index.is_trained and sample < needed:
        raise UsageError(f"--factory {factory!r} trains on at least {needed:,} vectors ({what}) but the training "
                         f"sample holds {sample:,}: choose a smaller index (or --factory auto)")
    return files, plan_shards(files, config.shard_sentences), factory, sample


def check_vectors(vectors: str) -> None:
    """--vectors is complete when it lies in a stage output (`require_stage_output`) and is no
    labse-embed output its run left unfinished (`refuse_unfinished_output`); UsageError, one line."""
    require_stage_output(vectors, "--vectors", plain_allowed=True)
    try:
        refuse_unfinished_output(vectors)
    except SavedVectorsError as error:
        raise UsageError(f"--vectors: {error}") from None


def wire(pipeline, vectors: str, files, plans, factory: str, sample: int, config: IndexConfig, output: str):
    require_remote_on_dataflow(pipeline.options, "--vectors", vectors)
    return pipeline | "Index" >> BuildIndex(files, plans, factory, sample, config, output)


def main(argv: Sequence[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(message)s")
    args, beam_args = build_parser().parse_known_args(argv)
    try:
        config = config_from_args(IndexConfig, args)
        files, plans, factory, sample = plan(args.vectors, config)
    except UsageError as error:
        return usage_error("labse-index", str(error))
    sentences = sum(f.rows for f in files)
    logger.info("%s: %d vectors of %d dimensions in %d file(s) -> %s, %d shard(s), trained on %d; about %d "
                "bytes a sentence", config.lang, sentences, files[0].dim, len(files), factory, len(plans), sample,
                bytes_per_sentence(factory, files[0].dim))
    output = args.output.rstrip("/")

    started = time.perf_counter()

    def stats_and_log() -> dict:
        stats = read_output_stats(output)
        logger.info("indexed %d of %d vectors in %.0f s: %.1f bytes a sentence", stats["accounting"]["vectors"]["kept"],
                    stats["accounting"]["vectors"]["read"], time.perf_counter() - started,
                    stats["index"]["bytes_per_sentence"])
        return stats

    return run_stage("labse-index", output, overwrite=args.overwrite, beam_args=beam_args,
                     inputs=[args.vectors.removeprefix("vectors:")],
                     # a labse-embed output is read only once complete (plain folders of vectors are welcome)
                     check_inputs=lambda: check_vectors(args.vectors.removeprefix("vectors:")),
                     wire=lambda pipeline: wire(pipeline, args.vectors.removeprefix("vectors:"), files, plans, factory,
                                                sample, config, output),
                     finish=stats_and_log)

if __name__ == "__main__":
    sys.exit(main())
