"""labse-mine: mine translation pairs from two monolingual sentence sets (Beam).

    labse-mine --src DIR/sentences/lang=de --tgt DIR/sentences/lang=en --src-lang de --tgt-lang en \\
               --embedder usem3 --output PAIRS_DIR [--k 4] [--margin ratio] [--strategy max] \\
               [--same-site] [--overwrite] [Beam options]

Writes `PAIRS_DIR/part-SSSSS-of-NNNNN.parquet` (columns `src, tgt, src_lang, tgt_lang, cosine,
margin, src_url, src_doc_id, tgt_url, tgt_doc_id`) and `PAIRS_DIR/_stats.json` (the accounting
section of README contract 11, counts per step and the configuration; `_stats.json` so that
`pyarrow.dataset.dataset(PAIRS_DIR)` reads the shards),
then `PAIRS_DIR/_SUCCESS` (the completion marker labse-score requires). The steps are in
`pipelines/mine/transforms.py`.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
import time
from typing import Sequence

from pipelines.io.console import start_logging
from pipelines.io.config_options import UsageError, add_config_options, config_from_args
from pipelines.io.completion import read_output_stats, require_stage_output
from pipelines.stage_options import replace_help, stage_parser, usage_error
from pipelines.mine.cells import CellLayout, SideCount, count_sentences, matched_files, plan_cells
from pipelines.mine.config import MineConfig
from pipelines.embed.choice import resolve_embedder
from pipelines.embed.base import EmbedderError
from pipelines.embed.embedders import check_embedder_spec
from pipelines.mine.packed_mining import build_packed_pipeline, packed_mining
from pipelines.mine.transforms import build_pipeline
from pipelines.accounting import summary_text
from pipelines.stage import run_stage

logger = logging.getLogger(__name__)
LARGE_CELL_COUNT = 100  # 10 x 10 cells, a million sentences a side: past it the global layout pays


def check_inputs(src: str, tgt: str) -> None:
    """Before any work: a labse-clean input must be complete, and the two sides must not share a
    file (mining a set against itself pairs every sentence with itself). Raises UsageError."""
    for option, path in (("--src", src), ("--tgt", tgt)):
        require_stage_output(path, f"{option} {path}", plain_allowed=True)
    shared = sorted(_matched_files(src) & _matched_files(tgt))
    if shared or os.path.normpath(src) == os.path.normpath(tgt):
        shown = ", ".join(shared[:3]) or src
        raise UsageError(f"--src and --tgt read the same file(s) ({shown}): mining a sentence set against "
                         "itself pairs every sentence with itself; give two different sides")


def refuse_an_empty_side(src: str, tgt: str) -> dict[str, SideCount]:
    """Each side's sentence count (read from markers and footers, see pipelines.mine.cells), refusing
    a side with none before anything is embedded: no pair can come of it. Raises UsageError."""
    counts = {path: count_sentences(path) for path in (src, tgt)}
    for option, path in (("--src", src), ("--tgt", tgt)):
        if counts[path].sentences == 0 and "unreadable" not in counts[path].source:  # those the run reports
            raise UsageError(f"{option} {path} holds no sentences ({counts[path].source}): no pair can be mined, "
                             "so nothing is embedded; give a side with sentences (a labse-clean "
                             "`sentences/lang=XX` folder, Parquet or text files)")
    return counts


def _matched_files(path: str) -> set[str]:
    return {p if "://" in p else os.path.realpath(p) for p in matched_files(path)}


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser(
        "labse-mine",
        "Mine translation pairs between two monolingual sentence sets: embed both sides (in batches fixed by the "
        "sentences, so reruns give the same vectors), "
        "k-nearest neighbours in both directions over sharded cells (FAISS), margin scoring "
        "(Artetxe & Schwenk 2019) and a selection strategy.",
        output="PAIRS_DIR: Parquet shards and stats.json", overwrite=replace_help("PAIRS_DIR"))
    parser.add_argument("--src", required=True, help="source sentences: a labse-clean `sentences/lang=XX` "
                        "directory, Parquet/text files or a glob (text: one sentence per line)")
    parser.add_argument("--tgt", required=True, help="target sentences, same forms as --src")
    add_config_options(parser, MineConfig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = start_logging(argv, "%(asctime)s %(name)s %(message)s")
    args, beam_args = build_parser().parse_known_args(argv)
    try:
        check_inputs(args.src, args.tgt)
        counts = refuse_an_empty_side(args.src, args.tgt)
        cells = args.layout == "cells" or (args.layout == "auto" and not (args.src_index and args.tgt_index))
        # the global layout has no cells: nothing is planned for them
        layout = functools.cache(lambda: plan_cells(args.src, args.tgt, args.src_blocks, args.tgt_shards, counts)
                                 if cells else CellLayout(1, 1, "global layout: no cells"))
        config = config_from_args(MineConfig, args, derived={"src_blocks": lambda: layout().src_blocks,
                                                             "tgt_shards": lambda: layout().tgt_shards})
        try:
            # labse-mine mines one language pair per run, so `auto` is decided here, once, in the launcher
            choice = resolve_embedder(config.embedder, config.src_lang, config.tgt_lang)
            check_embedder_spec(choice.embedder)
        except EmbedderError as error:
            raise UsageError(f"--embedder: {error}") from error
        if config.cheap_embedder is not None:
            try:
                check_embedder_spec(config.cheap_embedder)
            except EmbedderError as error:
                raise UsageError(f"--cheap-embedder: {error}") from error
    except UsageError as error:
        return usage_error("labse-mine", str(error))
    if config.resolved_layout == "global":
        try:
            from pipelines.mine.index_search import load_manifest

            manifests = [load_manifest(config.src_index, "--src-index"), load_manifest(config.tgt_index, "--tgt-index")]
        except UsageError as error:
            return usage_error("labse-mine", str(error))
        logger.info("global layout: %s searched in %s (%s, %d sentences, %d shard(s)) and back in %s (%s, %d "
                    "sentences, %d shard(s))", config.src_lang, config.tgt_index, manifests[1].factory,
                    manifests[1].sentences, len(manifests[1].shards), config.src_index, manifests[0].factory,
                    manifests[0].sentences, len(manifests[0].shards))
        if config.backward_search == "candidates":
            logger.info("backward search limited to the candidates: the smaller side is searched in full (sources "
                        "for --strategy fwd, targets for bwd), the other only for its sentences among those lists "
                        "(--backward-search all: both in full)")
    else:
        logger.info("cells: %d source block(s) x %d target shard(s) (%s)", config.src_blocks, config.tgt_shards,
                    layout().reason)  # counts nothing when both are given
        if config.src_blocks * config.tgt_shards > LARGE_CELL_COUNT:
            logger.warning("%d cells: every vector is copied into each cell of its row or column, so this grows as "
                           "n^2; at this size build an index per language (labse-index) and give --src-index and "
                           "--tgt-index (docs/guides/mining-a-snapshot.md)", config.src_blocks * config.tgt_shards)
    if choice.reason != "given":
        logger.info("--embedder auto: %s (%s)", choice.embedder, choice.reason)
    config = dataclasses.replace(config, embedder=choice.embedder, embedder_reason=choice.reason)
    output = args.output.rstrip("/")
    if config.cascade_survivors:
        return cheap_pass(args, config, manifests, output, beam_args)
    logger.info("mining %s (%s) x %s (%s) with %s -> %s", args.src, config.src_lang, args.tgt, config.tgt_lang,
                config.embedder, output)
    if config.cheap_embedder is not None:
        logger.info("cascade: %s embeds every sentence and proposes %d candidates per sentence; %s embeds %s and "
                    "scores their candidates", config.cheap_embedder, config.cascade_candidates, config.embedder,
                    "every sentence" if config.loose_margin is None else
                    f"only those in a cheap pair at margin >= {config.loose_margin}")
    started = time.perf_counter()

    def summarise(stats: dict) -> str:
        lines = [f"{stats['pairs']:,} pairs mined with {config.embedder} in {time.perf_counter() - started:.0f} s; "
                 f"{stats['src']['embedded']:,}/{stats['src']['read']:,} source and "
                 f"{stats['tgt']['embedded']:,}/{stats['tgt']['read']:,} target sentences embedded"]
        cascade = stats.get("cascade")
        if cascade:
            lines.append(f"cascade: {cascade['cheap_embedder']} embedded {cascade['cheap_embedded']:,} sentences; "
                         f"{config.embedder} embedded {cascade['strong_embedded']:,} of {cascade['unique']:,} "
                         f"({cascade['strong_share']:.1%}), {cascade['spared']:,} spared "
                         + (f"below the loose margin {cascade['loose_margin']}" if cascade["loose_margin"] is not None
                            else "(--no-cascade-spare)"))
        return summary_text("labse-mine", stats, "candidate_pairs", lines)

    def wire(pipeline):
        refuse_local_store_on_dataflow(config.embedder, pipeline.options)
        return (build_packed_pipeline if packed_mining(config) else build_pipeline)(pipeline, args.src, args.tgt,
                                                                                     output, config)

    return run_stage("labse-mine", output, progress_unit="sentences", overwrite=args.overwrite, beam_args=beam_args,
                     inputs=[args.src, args.tgt, *(p for p in (config.src_index, config.tgt_index) if p),
                             *store_of(config.embedder)],
                     wire=wire, finish=lambda: read_output_stats(output), summarise=summarise)


def store_of(spec: str) -> list[str]:
    """The folder of a `vectors:DIR` embedder (an input the output must stay apart from), else none."""
    from pipelines.embed.saved_vectors import PREFIX, is_saved_vectors_spec

    return [spec[len(PREFIX):]] if is_saved_vectors_spec(spec) else []


def refuse_local_store_on_dataflow(spec: str, options) -> None:
    """`vectors:DIR` on local disk in a Dataflow job: UsageError, one line (`require_remote_on_dataflow`)."""
    from pipelines.stage import require_remote_on_dataflow

    for store in store_of(spec):
        require_remote_on_dataflow(options, "--embedder vectors:", store)


def cheap_pass(args, config: MineConfig, manifests: list, output: str, beam_args: Sequence[str]) -> int:
    """`--cascade-survivors`: the global cascade's cheap pass (`pipelines.mine.global_cascade`), its
    indexes first checked to hold --embedder's vectors."""
    from pipelines.embed.embedders import load_embedder
    from pipelines.mine.global_cascade import build_survivors_pipeline, check_index_matches, survivors_summary

    try:
        cheap = load_embedder(config.embedder)
        for option, index, manifest, lang in (("--src-index", config.src_index, manifests[0], config.src_lang),
                                              ("--tgt-index", config.tgt_index, manifests[1], config.tgt_lang)):
            check_index_matches(cheap, index, manifest, option, lang)
    except (UsageError, EmbedderError) as error:
        return usage_error("labse-mine", str(error))
    del cheap
    logger.info("cascade, cheap pass: %s x %s with %s; survivors (cheap ratio margin >= %s) -> %s/lang=%s and "
                "lang=%s", args.src, args.tgt, config.embedder, config.loose_margin, output, config.src_lang,
                config.tgt_lang)
    started = time.perf_counter()

    def wire(pipeline):
        refuse_local_store_on_dataflow(config.embedder, pipeline.options)
        return build_survivors_pipeline(pipeline, args.src, args.tgt, output, config)

    return run_stage("labse-mine", output, progress_unit="sentences", overwrite=args.overwrite, beam_args=beam_args,
                     inputs=[args.src, args.tgt, config.src_index, config.tgt_index, *store_of(config.embedder)],
                     wire=wire,
                     finish=lambda: read_output_stats(output),
                     summarise=lambda stats: summary_text("labse-mine", stats, "src_sentences",
                                                          survivors_summary(stats, time.perf_counter() - started)))


if __name__ == "__main__":
    sys.exit(main())
