"""labse-embed: embed each language's unique sentences once, into saved vectors (Beam).

    labse-embed --input de=DIR/sentences/lang=de --input en=DIR/sentences/lang=en --embedder usem3 \\
                --output VECTORS [--dtype float32] [--shard-sentences 500000] [--overwrite] [Beam options]

Writes VECTORS/LANG/LANG-SSSSS-of-NNNNN.{npy,txt,keys.npy} (one `vectors:DIR` folder per language:
labse-index's --vectors, labse-mine's --embedder vectors:DIR), VECTORS/stats.json and
VECTORS/_SUCCESS last. The steps are in `pipelines/vectors/transforms.py`, the layout in
`pipelines/vectors/shards.py`.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Sequence

from pipelines.accounting import summary_text
from pipelines.embed.base import EmbedderError
from pipelines.embed.choice import COVERAGE, covers
from pipelines.embed.embedders import check_embedder_spec
from pipelines.io.completion import read_output_stats, require_stage_output
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.console import start_logging
from pipelines.mine.cells import matched_files
from pipelines.stage import run_stage
from pipelines.stage_options import replace_help, stage_parser, usage_error
from pipelines.vectors.config import EmbedConfig
from pipelines.vectors.shards import parse_input
from pipelines.vectors.transforms import STAGE, build_pipeline

logger = logging.getLogger(__name__)


def build_parser():
    parser = stage_parser(
        STAGE,
        "Embed every language's unique sentences once and save their vectors (vectors:DIR, one folder per "
        "language, in shards), for labse-index and labse-mine's --embedder vectors:DIR.",
        output="VECTORS: VECTORS/LANG/LANG-*.npy + .txt + .keys.npy per language, stats.json, _SUCCESS (local or "
               "gs://)", overwrite=replace_help("VECTORS"))
    parser.add_argument("--input", action="append", required=True, metavar="LANG=PATH",
                        help="one language's sentences, as labse-mine's --src reads them: a labse-clean "
                             "`sentences/lang=XX` folder, Parquet or text files (one sentence a line) or a glob, "
                             "local or gs://; repeatable, also for one language (its inputs are one set)")
    add_config_options(parser, EmbedConfig)
    return parser


def check_inputs(inputs: Sequence[tuple[str, str]]) -> None:
    """Before any work: each input holds files and, inside a stage's output, that output is
    complete (`_SUCCESS`). Raises UsageError."""
    for lang, path in inputs:
        require_stage_output(path, f"--input {lang}={path}", plain_allowed=True)
        if not matched_files(path):
            raise UsageError(f"--input {lang}={path} matches no sentence files: give a `sentences/lang=XX` folder, "
                             "Parquet or text files, or a glob")


def main(argv: Sequence[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(message)s")
    args, beam_args = build_parser().parse_known_args(argv)
    try:
        config = config_from_args(EmbedConfig, args)
        inputs = [parse_input(value) for value in args.input]
        check_inputs(inputs)
        try:
            check_embedder_spec(config.embedder)
        except EmbedderError as error:
            raise UsageError(f"--embedder: {error}") from error
    except UsageError as error:
        return usage_error(STAGE, str(error))
    langs = sorted({lang for lang, _ in inputs})
    known = COVERAGE.get(config.embedder.lower())
    for lang in langs:
        if known is not None and not covers(config.embedder.lower(), lang):
            logger.warning("%s was not trained on %s: its vectors of it may mine poorly (pipelines/embed/choice.py)",
                           config.embedder, lang)
    output = args.output.rstrip("/")
    logger.info("embedding the unique sentences of %s with %s (%s, %d a shard) -> %s/LANG", ", ".join(langs),
                config.embedder, config.dtype, config.shard_sentences, output)
    started = time.perf_counter()

    def summarise(stats: dict) -> str:
        seconds = time.perf_counter() - started
        lines = [f"{lang}: {books['sentences']:,} unique sentences in {books['shards']} shard(s), "
                 f"{books['bytes'] / 1e6:,.1f} MB -> {books['folder']}" for lang, books in stats["languages"].items()]
        lines.append(f"{stats['accounting']['sentences']['kept']:,} sentences embedded with {config.embedder} in "
                     f"{seconds:.0f} s")
        warnings = [f"{lang}: {books['non_finite_rows']:,} rows hold NaN or inf (labse-index and labse-mine drop them)"
                    for lang, books in stats["languages"].items() if books["non_finite_rows"]]
        return summary_text(STAGE, stats, "sentences", lines, warnings)

    return run_stage(STAGE, output, progress_unit="sentences", overwrite=args.overwrite, beam_args=beam_args,
                     inputs=[path for _, path in inputs],
                     wire=lambda pipeline: build_pipeline(pipeline, inputs, output, config),
                     finish=lambda: read_output_stats(output), summarise=summarise)


if __name__ == "__main__":
    sys.exit(main())
