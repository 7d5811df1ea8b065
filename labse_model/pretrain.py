"""labse-pretrain: MLM + TLM pre-training with progressive stacking, the first half of LaBSE's training.

    labse-pretrain --mono clean_out/sentences --mono de:multi30k/train.de.gz \\
                   --pairs 'shards/*.tfrecord*' --vocab vocab.txt --output runs/pt \\
                   --config base --nproc-per-node 8
    labse-train ... --init-from runs/pt --pooling cls

The encoder is grown L/4 -> L/2 -> L layers (`labse_model.stacking`); every stage starts a fresh
AdamW with its own warm-up, as TF Model Garden's progressive trainer builds a new optimizer per
stage: the Adam moments of a layer say nothing about its copy stacked above it, and the copies
start as exact duplicates whose first updates need the small steps of a warm-up. After the
warm-up the learning rate follows one linear decay over the whole run, so the stages add up to
BERT's schedule rather than each decaying to zero.

The shared loop (`labse_model.loop`) does the rest as for `labse-train`: torchrun (gloo or NCCL),
DDP, bf16 autocast on GPU, clipping, TensorBoard and `metrics.jsonl`, a progress bar, atomic
checkpoints, and `--resume` that continues bit-exactly, also from a checkpoint at a stage boundary.
Held-out masked-token loss and accuracy are logged every `--eval-every` steps and at the end of
each stage.

Output (`PT_DIR`):
    encoder.safetensors      the BERT weights under SentenceEncoder's names (bert.*), nothing else
    pretrain_config.json     model + pre-training settings, the vocab.txt sha256 (PretrainRunConfig)
    vocab.txt                the vocabulary every later stage must tokenise with
    pretrain_summary.json    per stage: layers, steps, held-out loss and accuracy, tokens/s
    checkpoints/ metrics.jsonl tensorboard/   as for labse-train
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from labse_model import checkpoint as ckpt
from pipelines.accounting import closing_lines
from pipelines.io import storage
from labse_model.cli import add_run_arguments, check_resumable, command_main, new_parser, run_in_run_dir
from labse_model.config import (
    PRESETS,
    ModelConfig,
    PretrainConfig,
    PretrainRunConfig,
    check_dropout,
    count_vocab,
    file_sha256,
)
from labse_model.distributed import DistributedContext, all_reduce_mean, barrier
from labse_model.loop import (
    LoopParts,
    autocast_context,
    resume_point,
    run_loop,
    set_aside_later_checkpoints,
)
from labse_model.masking import MaskingSpec
from labse_model.mlm import MaskedLanguageModel
from labse_model.optim import build_optimizer
from labse_model.run_inputs import check_same_inputs, file_key, fingerprint
from labse_model.run_log import RunLog
from labse_model.run_store import checkpoint_publisher
from labse_model.stacking import Stage, build_model, default_stage_layers, grow, plan_stages
from pipelines.io.atomic import atomic_path, write_text_atomic
from pipelines.io.config_options import UsageError, add_config_options, config_from_args, resumable_fields

logger = logging.getLogger(__name__)

CONFIG_FILE = "pretrain_config.json"
ENCODER_FILE = "encoder.safetensors"
SUMMARY_FILE = "pretrain_summary.json"


# ----------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser, data = new_parser(
        "labse-pretrain",
        "Pre-train a BERT encoder with masked (MLM) and translation (TLM) language modelling and "
        "progressive stacking, for `labse-train --init-from`.",
    )
    data.add_argument("--mono", action="append", required=True,
                      help="monolingual text: labse-clean's sentences/ directory (lang=XX partitions), or "
                      "LANG:GLOB of text files (one sentence a line, blank line between documents); repeatable")
    data.add_argument("--pairs", default=None, help="glob of labse-tfrecords pair shards for TLM (quote it)")
    data.add_argument("--vocab", required=True, help="the vocab.txt (the one labse-tfrecords used for --pairs)")
    data.add_argument("--output", required=True, type=storage.path_argument,
                      help="PT_DIR: encoder, config, checkpoints, logs; gs://... is mirrored locally and uploaded "
                      "after every checkpoint (docs/guides/training-on-object-storage.md)")
    data.add_argument("--resume", action="store_true", help="continue the run in --output from its latest checkpoint")
    model = parser.add_argument_group("model")
    model.add_argument("--config", choices=sorted(PRESETS), default="base", help="encoder size preset")
    model.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout")
    train = parser.add_argument_group("pre-training")
    # One option per PretrainConfig field (--stage-layers and --stage-fractions in the model group).
    add_config_options(train, PretrainConfig, groups={"model": model, "run": add_run_arguments(parser)})
    return parser


def main(argv: list[str] | None = None) -> int:
    return command_main("labse_model.pretrain", build_parser(), argv, pretrain, check=check_arguments)


def check_arguments(args: argparse.Namespace) -> None:
    """Every numeric option, checked before any work starts (PretrainConfig's rules; the preset
    gives the depth and positions that some defaults derive from)."""
    preset = PRESETS[args.config]
    settings = pretrain_settings(args, preset["num_layers"], preset["max_position_embeddings"])
    if not args.resume:  # a resume takes its stages from the run, checked when it is read
        check_warmup_fits(settings, preset["num_layers"])
    check_dropout(args.dropout)


# ----------------------------------------------------------------------------------------------
# Run configuration


def make_run_config(args: argparse.Namespace, world_size: int) -> PretrainRunConfig:
    model = ModelConfig.from_preset(args.config, count_vocab(args.vocab), hidden_dropout=args.dropout,
                                    attention_dropout=args.dropout)
    settings = pretrain_settings(args, model.num_layers, model.max_position_embeddings)
    return PretrainRunConfig(model=model, pretrain=settings, vocab_sha256=file_sha256(args.vocab),
                             mono=list(args.mono), pairs=args.pairs, world_size=world_size)


def pretrain_settings(args: argparse.Namespace, num_layers: int, max_positions: int) -> PretrainConfig:
    """The PretrainConfig the options ask for, for a model of `num_layers` and `max_positions`;
    UsageError naming any setting out of range. The options not given that PretrainConfig marks
    `derived` are derived here from the model and --pairs."""
    return config_from_args(PretrainConfig, args, derived={
        "stage_layers": lambda: default_stage_layers(num_layers),
        "max_seq_length": lambda: min(PretrainConfig.max_seq_length, max_positions),
        "tlm_fraction": lambda: 0.5 if args.pairs else 0.0,
    })


def check_run_config(config: PretrainRunConfig, world_size: int) -> list[Stage]:
    """Everything that can be wrong with the settings, found before any data is read."""
    model, settings = config.model, config.pretrain
    if settings.max_seq_length > model.max_position_embeddings:
        raise UsageError(f"--max-seq-length {settings.max_seq_length} exceeds the {model.preset} config's "
                         f"{model.max_position_embeddings} positions")
    if settings.global_batch_size % world_size:
        raise UsageError(f"--global-batch-size {settings.global_batch_size} does not divide over {world_size} processes")
    if settings.tlm_fraction > 0 and not config.pairs:
        raise UsageError("--tlm-fraction > 0 needs pair shards: give --pairs")
    tlm_rows = round(settings.global_batch_size * settings.tlm_fraction)
    if tlm_rows % world_size:
        raise UsageError(f"{tlm_rows} TLM rows per step (--tlm-fraction {settings.tlm_fraction} of "
                         f"{settings.global_batch_size}) do not divide over {world_size} processes")
    if tlm_rows == settings.global_batch_size:
        raise UsageError("--tlm-fraction 1 leaves no monolingual row: MLM needs at least one")
    return check_warmup_fits(settings, model.num_layers)


def check_warmup_fits(settings: PretrainConfig, num_layers: int) -> list[Stage]:
    """The stages, refusing a warm-up that is not shorter than the shortest stage (each stage warms
    up anew) with the value that would fit."""
    stages = plan_stages(settings.max_steps, settings.stage_layers, settings.stage_fractions, num_layers)
    shortest = min(stages, key=lambda stage: stage.end - stage.begin)
    length = shortest.end - shortest.begin
    if settings.warmup_steps >= length:
        raise UsageError(f"--warmup-steps {settings.warmup_steps} is not shorter than stage {shortest.index + 1} "
                         f"({length} steps): every stage warms up anew; give --warmup-steps <= {length - 1} "
                         f"(a tenth of the stage, {max(length // 10, 1)}, is usual) or a larger --max-steps")
    return stages


def resumed_run_config(args: argparse.Namespace, run_dir: Path, world_size: int) -> PretrainRunConfig:
    """The saved configuration, refusing a resume whose options would change the run's shape."""
    saved = PretrainRunConfig.load(run_dir / CONFIG_FILE)
    asked = make_run_config(args, world_size)
    differences = [
        f"{name}: run has {getattr(saved.pretrain, name)!r}, asked {getattr(asked.pretrain, name)!r}"
        for name in (f.name for f in dataclasses.fields(PretrainConfig))
        if name not in resumable_fields(PretrainConfig) and getattr(saved.pretrain, name) != getattr(asked.pretrain, name)
    ]
    if saved.model != asked.model:
        differences.insert(0, f"model: run has {saved.model.preset} ({saved.model.num_layers} layers, vocabulary "
                           f"{saved.model.vocab_size}), asked {asked.model.preset} ({asked.model.num_layers} layers, "
                           f"vocabulary {asked.model.vocab_size})")
    if saved.vocab_sha256 != asked.vocab_sha256:
        differences.insert(0, "vocab.txt differs from the run's")
    if differences:
        raise UsageError(f"--resume: {run_dir} is a run with other settings; " + "; ".join(differences))
    saved.pretrain = dataclasses.replace(saved.pretrain,
                                         **{name: getattr(asked.pretrain, name) for name in resumable_fields(PretrainConfig)})
    saved.mono, saved.pairs, saved.world_size = asked.mono, asked.pairs, world_size
    return saved


def resolve_run_config(args: argparse.Namespace, ctx: DistributedContext) -> PretrainRunConfig:
    """The run's configuration, new or resumed, checked; nothing is written yet."""
    run_dir: Path = args.output
    if args.resume:
        check_resumable(run_dir, CONFIG_FILE, args.resume_step)
        config = resumed_run_config(args, run_dir, ctx.world_size)
    else:
        if run_dir.exists() and any(run_dir.iterdir()):
            raise UsageError(f"{run_dir} is not empty: pass --resume to continue it, or choose a new --output")
        config = make_run_config(args, ctx.world_size)
    check_run_config(config, ctx.world_size)
    return config


def pretrain_inputs(corpora: list, pairs: str | None) -> dict[str, Any]:
    """The fingerprint (labse_model.run_inputs) of every monolingual file and pair shard read."""
    from labse_model.data import resolve_shards

    files = [(file_key(path, f"{corpus.lang}/"), path) for corpus in corpora for path, _ in corpus.files]
    files += [(file_key(path, "pairs/"), path) for path in (resolve_shards(pairs) if pairs else [])]
    return fingerprint(files)


def check_same_processes(resumed: ckpt.ResumePoint, world_size: int) -> None:
    """A pre-training run resumes only on the number of processes that wrote its checkpoint.

    Each process reads its own share of every language's monolingual stream (its files, or every
    world-size-th packed sequence) and its checkpoint holds that share's position; with another
    number of processes the shares are dealt anew and no saved position says where each one stands,
    so text would be repeated or skipped. (labse-train has no such limit: its batches are computed
    from the step for any number of processes.)"""
    saved = int(resumed.state["world_size"])
    if saved != world_size:
        raise UsageError(f"--resume: {resumed.path} was written by {saved} processes and this run has {world_size}: "
                         f"labse-pretrain's monolingual text is split per process, so it resumes only on {saved} "
                         f"(--nproc-per-node {saved}, or nodes x processes per node = {saved} under torchrun)")


def write_run_dir(args: argparse.Namespace, config: PretrainRunConfig, ctx: DistributedContext) -> None:
    barrier()  # every rank checked the settings and opened its data before rank 0 writes anything
    if ctx.is_main:
        run_dir: Path = args.output
        run_dir.mkdir(parents=True, exist_ok=True)
        if not args.resume:
            with atomic_path(run_dir / "vocab.txt") as tmp:
                shutil.copyfile(args.vocab, tmp)
        config.save(run_dir / CONFIG_FILE)
    barrier()


# ----------------------------------------------------------------------------------------------
# Pre-training


def pretrain(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume) pre-training in this process; collective when launched by torchrun."""
    if not Path(args.vocab).is_file():
        raise FileNotFoundError(f"--vocab {args.vocab} not found")
    if args.pairs and not storage.glob(args.pairs):
        raise FileNotFoundError(f"--pairs {args.pairs!r} matches no files")
    return run_in_run_dir(args, _pretrain)


def stage_schedule(optimizer: torch.optim.Optimizer, stage: Stage, warmup_steps: int, max_steps: int):
    """A fresh warm-up at the stage's start, then the run-wide linear decay to 0 at `max_steps`."""

    def factor(local_step: int) -> float:
        warmup = min(1.0, (local_step + 1) / warmup_steps) if warmup_steps else 1.0
        return warmup * max(0.0, (max_steps - stage.begin - local_step) / max_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@torch.no_grad()
def heldout_scores(model: MaskedLanguageModel, batches: list[dict[str, torch.Tensor]], device: torch.device,
                   bf16: bool) -> dict[str, float]:
    """Masked-token cross-entropy and accuracy over the held-out set (eval mode, fixed masks)."""
    from labse_model.loop import move_batch

    was_training = model.training
    model.eval()
    autocast = autocast_context(device, bf16)
    total_loss, correct, targets = 0.0, 0, 0
    for batch in batches:
        batch = move_batch(batch, device)
        with autocast():
            loss, right = model(**batch)
        count = int(batch["mlm_labels"].numel())
        total_loss += float(loss) * count
        correct += int(right)
        targets += count
    model.train(was_training)
    return {"heldout_mlm_loss": total_loss / max(1, targets), "heldout_mlm_accuracy": correct / max(1, targets)}


def _pretrain(args: argparse.Namespace, ctx: DistributedContext) -> dict[str, Any]:
    from labse_model.pretrain_data import (
        Packer,
        PretrainBatches,
        TLMSource,
        find_mono_corpora,
        heldout_batches,
        heldout_sequences,
    )
    from pipelines.text.wordpiece import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, hf_tokenizer

    run_dir: Path = args.output
    config = resolve_run_config(args, ctx)
    settings, model_config = config.pretrain, config.model
    corpora = find_mono_corpora(config.mono)
    inputs = pretrain_inputs(corpora, config.pairs)
    if args.resume:  # config.inputs is still what the run recorded
        check_same_inputs("--mono/--pairs", config.inputs, inputs, run_dir)
    config.inputs = inputs
    stages = plan_stages(settings.max_steps, settings.stage_layers, settings.stage_fractions, model_config.num_layers)
    local_rows = settings.global_batch_size // ctx.world_size
    tlm_local = round(settings.global_batch_size * settings.tlm_fraction) // ctx.world_size
    if ctx.is_main:
        shares = ", ".join(f"{c.lang} {c.sentences:,}" for c in corpora)
        logger.info("monolingual sentences: %s; stages %s", shares,
                    ", ".join(f"{s.num_layers} layers to step {s.end}" for s in stages))

    start_step, position, resumed = 0, None, None
    layers = stages[0].num_layers
    if args.resume:
        resumed = resume_point(run_dir, ctx, args.resume_step, required_state=("num_layers",))
        check_same_processes(resumed, ctx.world_size)
        start_step, layers = resumed.step, int(resumed.state["num_layers"])
    model = build_model(model_config, layers, settings.seed)
    if resumed is not None:
        resumed.restore_model(model)
        position = resumed.restore_rng(ctx.rank, ctx.world_size, settings.seed)
        if ctx.is_main:
            logger.info("resumed %s at step %d (%d layers)", resumed.path, start_step, layers)
    else:
        torch.manual_seed(settings.seed + ctx.rank)  # different dropout masks per rank, from the seed
    model.to(ctx.device)

    tokenizer = hf_tokenizer(args.vocab)
    packer = Packer(tokenizer, settings.max_seq_length, CLS_ID, SEP_ID)
    spec = MaskingSpec(mask_prob=settings.mask_prob, max_predictions=settings.max_predictions, mask_id=MASK_ID,
                       vocab_size=model_config.vocab_size, special_ids=tuple(range(len(SPECIAL_TOKENS))))
    tlm = None
    if tlm_local:
        tlm = TLMSource.open(config.pairs, vocab_path=args.vocab,
                             global_rows=tlm_local * ctx.world_size, rank=ctx.rank, world_size=ctx.world_size,
                             seed=settings.seed, shuffle_window=settings.tlm_shuffle_window,
                             vocab_size=model_config.vocab_size)
    batches = PretrainBatches(corpora, packer, spec=spec, local_rows=local_rows, tlm_rows=tlm_local, tlm=tlm,
                              lang_alpha=settings.lang_alpha, rank=ctx.rank, world_size=ctx.world_size,
                              seed=settings.seed, heldout_rate=settings.heldout_rate,
                              max_seq_length=settings.max_seq_length, pad_id=PAD_ID,
                              shuffle_window=settings.mlm_shuffle_window, start_step=start_step, position=position)
    write_run_dir(args, config, ctx)  # only now: bad input above has written nothing
    if resumed is not None:
        set_aside_later_checkpoints(run_dir, ctx, resumed)

    heldout = []
    if ctx.is_main and settings.heldout_rate > 0:
        sequences = heldout_sequences(corpora, Packer(tokenizer, settings.max_seq_length, CLS_ID, SEP_ID),
                                      settings.heldout_rate, settings.heldout_per_language)
        heldout = heldout_batches(sequences, spec, settings.seed, batch_rows=64, pad_id=PAD_ID)
        logger.info("held-out set: %d sequences", len(sequences))

    log = RunLog(run_dir, enabled=ctx.is_main, resumed_at_step=start_step if args.resume else None)
    stop_at = settings.max_steps if args.stop_after_steps is None else min(settings.max_steps,
                                                                            start_step + args.stop_after_steps)
    stage_results = _timing_carried_over(_read_summary(run_dir), start_step, stages) if args.resume else {}
    tokens = torch.zeros((), dtype=torch.float64)
    step, stopped_by = start_step, None

    def summary_of(at_step: int, stopped: str | None) -> dict[str, Any]:
        return {
            "step": at_step,
            "finished": at_step >= settings.max_steps,
            "stopped_by": stopped,
            "world_size": ctx.world_size,
            "global_batch_size": settings.global_batch_size,
            "tlm_rows_per_step": tlm_local * ctx.world_size,
            "languages": {c.lang: c.sentences for c in corpora},
            "sentences_cut": packer.sentences_cut,
            "rows_skipped": packer.rows_skipped,
            "peak_memory_bytes": _peak_memory(ctx.device),
            "stages": {str(k): v for k, v in sorted(stage_results.items())},
        }
    for stage in stages:
        if step >= stage.end or step >= stop_at:
            continue
        if model.config.num_layers != stage.num_layers:
            model = grow(model, stage.num_layers, settings.seed + stage.index)
            if ctx.is_main:
                logger.info("stage %d: stacked %d -> %d layers", stage.index + 1, layers, stage.num_layers)
        layers = stage.num_layers
        optimizer = build_optimizer(model, settings)
        scheduler = stage_schedule(optimizer, stage, settings.warmup_steps, settings.max_steps)
        if resumed is not None and stage.begin < step:  # resumed inside this stage
            optimizer.load_state_dict(resumed.state["optimizer"])
            scheduler.load_state_dict(resumed.state["scheduler"])
        parts = LoopParts(ctx=ctx, run_dir=run_dir, model=model, trained=model, optimizer=optimizer,
                          scheduler=scheduler, settings=settings, log=log,
                          after_checkpoint=checkpoint_publisher(args, ctx, settings.keep_checkpoints))

        def compute_loss(batch, parts=parts, tokens=tokens):
            tokens.add_(batch["attention_mask"].sum().item())
            loss, correct = parts.trained(**batch)
            return loss, {"mlm_accuracy": correct.float() / batch["mlm_labels"].numel()}

        def evaluate(at_step: int, stage=stage) -> dict[str, float] | None:
            if not heldout:
                return None
            scores = heldout_scores(model, heldout, ctx.device, settings.bf16)
            log.record(at_step, {**scores, "stage": stage.index + 1}, "heldout")
            return scores

        stage_tokens_before = float(tokens)
        result = run_loop(
            parts, batches, compute_loss, start_step=step, stop_at=min(stage.end, stop_at),
            total_steps=settings.max_steps, evaluate=evaluate,
            checkpoint_state=lambda s, stage=stage: {"stage": stage.index, "num_layers": stage.num_layers},
            rank_state=batches.position, log_values=lambda s, stage=stage: {"stage": stage.index + 1},
            description=f"stage {stage.index + 1}/{len(stages)} ({stage.num_layers} layers)",
        )
        step = result.step
        stage_tokens = all_reduce_mean(torch.tensor(float(tokens) - stage_tokens_before)).item() * ctx.world_size
        record = stage_results.setdefault(stage.index, {"stage": stage.index + 1, "layers": stage.num_layers,
                                                        "first_step": stage.begin + 1, "last_step": stage.end,
                                                        "seconds": 0.0, "tokens": 0.0, "steps_timed": 0})
        record["seconds"] += result.seconds
        record["tokens"] += stage_tokens
        record["steps_timed"] += result.steps_timed
        record["tokens_per_second"] = record["tokens"] / max(record["seconds"], 1e-9)
        record["final_loss"] = result.last_loss
        if ctx.is_main and step == stage.end:
            scores = result.last_eval if result.last_eval_step == step else evaluate(step)
            if scores:
                record.update(scores)
                logger.info("stage %d (%d layers) done at step %d: held-out MLM loss %.4f, accuracy %.4f",
                            stage.index + 1, stage.num_layers, step, scores["heldout_mlm_loss"],
                            scores["heldout_mlm_accuracy"])
        resumed = None  # only the first stage of this invocation resumes an optimizer
        stopped_by = result.stopped_by
        if stopped_by is not None:
            break
        if ctx.is_main and step < settings.max_steps:
            # Written at each stage's end too: a crash in a later stage, then --resume, keeps this stage's record.
            write_text_atomic(run_dir / SUMMARY_FILE, json.dumps(summary_of(step, None), indent=2) + "\n")

    finished = step >= settings.max_steps
    summary = summary_of(step, stopped_by)
    if ctx.is_main:
        log.close()
        if finished:
            ckpt.save_weights(model.encoder_state_dict(), run_dir / ENCODER_FILE)
        write_text_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
        logger.info("done at step %d%s", step, f": encoder written to {run_dir / ENCODER_FILE}" if finished else "")
        print(closing_summary(summary, settings.max_steps, run_dir), flush=True)
    barrier()
    return summary


def closing_summary(summary: dict[str, Any], max_steps: int, run_dir) -> str:
    """labse-pretrain's closing lines (accounting.closing_lines): the steps of the run, each stage's
    layers, loss and held-out MLM accuracy, the text read per language and what packing cut or
    skipped; a WARNING for a loss that is not a number or a run that stopped early."""
    state = "finished" if summary["finished"] else f"stopped by {summary['stopped_by'] or 'request'}"
    decisions = []
    for stage in summary["stages"].values():
        held_out = (f", held-out MLM accuracy {stage['heldout_mlm_accuracy']:.1%}"
                    if "heldout_mlm_accuracy" in stage else "")
        loss = stage.get("final_loss")
        decisions.append(f"stage {stage['stage']} ({stage['layers']} layers, steps {stage['first_step']:,}-"
                         f"{stage['last_step']:,}): final loss {'-' if loss is None else f'{loss:.4f}'}{held_out}, "
                         f"{stage.get('tokens_per_second', 0):,.0f} tokens/s")
    languages = sorted(summary["languages"].items(), key=lambda item: -(item[1] or 0))
    decisions.append("monolingual sentences: " + ", ".join(f"{lang} {n or 0:,}" for lang, n in languages[:8])
                     + (f", ... ({len(languages)} languages)" if len(languages) > 8 else ""))
    decisions.append(f"packing: {summary['sentences_cut']:,} sentences cut to the sequence length, "
                     f"{summary['rows_skipped']:,} rows skipped; run in {run_dir}")
    warnings = [f"stage {stage['stage']}'s final loss is {stage['final_loss']}: the run diverged"
                for stage in summary["stages"].values()
                if stage.get("final_loss") is not None and not math.isfinite(stage["final_loss"])]
    if not summary["finished"]:
        warnings.append(f"stopped at step {summary['step']:,} of {max_steps:,}: run the same command with --resume to finish")
    return closing_lines(f"labse-pretrain: {summary['step']:,} of {max_steps:,} steps ({state})", decisions, warnings)


def _timing_carried_over(previous: dict[str, Any], start_step: int, stages: list[Stage]) -> dict[int, dict[str, Any]]:
    """The per-stage records of earlier invocations that a resume at `start_step` keeps.

    A record holds the time and tokens of the steps its invocations ran. When the summary reaches
    past `start_step` (the newest checkpoint did not load, or --resume-step picked an older one),
    the steps after `start_step` run again now: the records of the stages that were not over by
    `start_step` are dropped rather than counted twice (their `steps_timed` then says how many
    steps their time covers)."""
    records = {int(k): v for k, v in previous.get("stages", {}).items()}
    if int(previous.get("step", 0)) > start_step:
        records = {index: record for index, record in records.items() if stages[index].end <= start_step}
    for stage in stages:
        # A stage over by `start_step` whose record never reached the summary (the process was killed
        # between the stage's last checkpoint and the summary written at its end) is still listed.
        if stage.end <= start_step and stage.index not in records:
            records[stage.index] = {"stage": stage.index + 1, "layers": stage.num_layers,
                                    "first_step": stage.begin + 1, "last_step": stage.end, "seconds": 0.0,
                                    "tokens": 0.0, "steps_timed": 0, "timing_lost": True}
    return records


def _read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / SUMMARY_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _peak_memory(device: torch.device) -> int:
    """Peak GPU memory allocated by torch, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


if __name__ == "__main__":
    sys.exit(main())
