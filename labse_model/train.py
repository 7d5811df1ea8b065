"""labse-train: train a LaBSE dual encoder on TFRecord shards, on one CPU or many GPUs.

    labse-train --data 'shards/*.tfrecord*' --vocab vocab.txt --output runs/labse \\
                --config base --nproc-per-node 8 --global-batch-size 4096

With `--nproc-per-node N` the command re-launches itself through torchrun (`torch.distributed.run
--standalone`), so one command starts N processes: NCCL on GPUs, gloo on CPU. Every rank scores its
local pairs against the pairs of all ranks (gathered negatives), so the softmax sees the whole
global batch, and the gradients equal those of one process with the global batch (labse_model.loss).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from pipelines.io.atomic import atomic_path
from labse_model import checkpoint as ckpt
from pipelines.io import storage
from labse_model.cli import add_run_arguments, check_resumable, command_main, new_parser, run_in_run_dir
from labse_model.config import (
    POOLING_MODES,
    PRESETS,
    ModelConfig,
    RunConfig,
    TrainConfig,
    check_dropout,
    count_vocab,
    file_sha256,
)
from labse_model.distributed import DistributedContext, barrier
from labse_model.encoder import DualEncoder
from labse_model.grad_cache import grad_cached_step
from labse_model.loop import (
    BackpropagatedStep,
    LoopParts,
    autocast_context,
    resume_point,
    run_loop,
    set_aside_later_checkpoints,
)
from labse_model.loss import BidirectionalAMSLoss
from labse_model.optim import build_optimizer, build_scheduler
from labse_model.run_log import RunLog
from labse_model.run_store import checkpoint_publisher
from labse_model.starting_point import StartingPoint, check_run_vocab, load_starting_point, model_config_for_run
from pipelines.accounting import closing_lines
from pipelines.io.atomic import write_text_atomic
from labse_model.run_inputs import check_same_inputs, file_key, fingerprint
from pipelines.io.config_options import (
    UsageError,
    add_config_options,
    config_from_args,
    config_options,
    option_flag,
    resumable_fields,
)

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser, data = new_parser(
        "labse-train",
        "Train a LaBSE-style dual encoder (shared BERT, [CLS] -> dense+tanh -> L2) with a "
        "bidirectional additive-margin softmax and negatives gathered across processes.",
    )
    data.add_argument("--data", required=True, help="glob of TFRecord shards written by labse-tfrecords (quote it); "
                      "gs://... is streamed")
    data.add_argument("--vocab", required=True, help="the vocab.txt the shards were tokenised with")
    data.add_argument("--output", required=True, type=storage.path_argument,
                      help="run directory (config, checkpoints, logs); gs://... is mirrored locally and uploaded "
                      "after every checkpoint (docs/guides/training-on-object-storage.md)")
    data.add_argument(
        "--dev-data",
        default=None,
        metavar="SRC_LANG:PATH,TGT_LANG:PATH|GLOB",
        help="held-out pairs for periodic retrieval accuracy: two line-aligned text files (.gz allowed) as for "
        "labse-tfrecords --parallel-text, e.g. Multi30k de:val.de.gz,en:val.en.gz, or a TFRecord glob (quote it). "
        "The older SRC_FILE:TGT_FILE form is still read in this release, with a deprecation warning",
    )
    data.add_argument("--dev-max-pairs", type=int, default=1000, help="pairs of --dev-data to use")
    data.add_argument("--resume", action="store_true", help="continue the run in --output from its latest checkpoint")
    data.add_argument("--init-from", default=None,
                      help="start from this model: a labse-train run directory, checkpoint folder or "
                      "model.safetensors; a labse-pretrain output; a Hugging Face BERT directory; or a "
                      "sentence-transformers directory (e.g. LaBSE). Its architecture, pooling, head and "
                      "vocab.txt (which --vocab must be) are taken; optimizer and schedule start fresh")
    model = parser.add_argument_group("model")
    model.add_argument("--config", choices=sorted(PRESETS), default=None,
                       help="encoder size preset (default base; with --init-from, the starting point's)")
    model.add_argument("--pooling", choices=POOLING_MODES, default=None,
                       help="[CLS] (LaBSE's head; needs a pre-trained encoder, see --init-from), or the mean or "
                       "max over the tokens (learn from random weights; BENCHMARKS.md, model), then dense+tanh+L2 "
                       "(default cls; with --init-from, the starting point's where it has one)")
    model.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (0 disables)")
    train = parser.add_argument_group("training (defaults: the paper's where it gives them)")
    add_config_options(train, TrainConfig, groups={"run": add_run_arguments(parser)})  # one option per field
    return parser


def main(argv: list[str] | None = None) -> int:
    return command_main("labse_model.train", build_parser(), argv, train, check=check_arguments)


def check_arguments(args: argparse.Namespace) -> None:
    """Every numeric option, checked before any work starts (TrainConfig's and ModelConfig's rules),
    also with --resume, where most of them are then taken from the run instead."""
    config_from_args(TrainConfig, args)
    check_dropout(args.dropout)
    if args.dev_max_pairs < 1:
        raise UsageError(f"--dev-max-pairs must be an integer >= 1, got {args.dev_max_pairs}")
    if args.dev_data is not None:
        from labse_model.dev_eval import dev_text_files

        dev_text_files(args.dev_data)  # a malformed SRC_LANG:PATH,TGT_LANG:PATH; its files are read later


# ----------------------------------------------------------------------------------------------
# Run configuration


def make_run_config(args: argparse.Namespace, world_size: int, start: StartingPoint | None = None) -> RunConfig:
    vocab_size = count_vocab(args.vocab)
    if start is None:
        model = ModelConfig.from_preset(args.config or "base", vocab_size, hidden_dropout=args.dropout,
                                        attention_dropout=args.dropout, pooling=args.pooling or "cls")
    else:
        check_run_vocab(start, args.vocab)
        model = model_config_for_run(start, args.config, args.pooling, args.dropout, vocab_size)
        start.check_matches(model)  # before the run directory is written
    train_config = config_from_args(TrainConfig, args)
    if train_config.max_seq_length > model.max_position_embeddings:
        raise UsageError(
            f"--max-seq-length {train_config.max_seq_length} exceeds the model's "
            f"{model.max_position_embeddings} positions"
        )
    return RunConfig(model=model, train=train_config, data=args.data, dev_data=args.dev_data, world_size=world_size,
                     init_from=args.init_from)


def resumed_run_config(args: argparse.Namespace, run_dir: Path, world_size: int) -> RunConfig:
    """The run's saved configuration with the resumable options given now; UsageError (one line)
    when --data is not the run's shards or an option given now would change what cannot change."""
    config = RunConfig.load(run_dir / "config.json")
    inputs = shard_inputs(args.data)
    check_same_inputs("--data", config.inputs, inputs, run_dir)
    changed = changed_settings(args, config, run_dir)
    if changed:
        raise UsageError(f"--resume: {run_dir} was trained with other settings, which a resume cannot change: "
                         + "; ".join(changed) + ". Leave them out (the run's are used), or start a new --output")
    # Only the fields TrainConfig marks resumable may change; their options default to None, so one
    # not given keeps the run's value.
    overrides = {name: getattr(args, name) for name in resumable_fields(TrainConfig)
                 if getattr(args, name, None) is not None}
    config.train = dataclasses.replace(config.train, **overrides)  # checked again, as any TrainConfig
    config.data, config.inputs = args.data, inputs
    if args.dev_data is not None:
        config.dev_data = args.dev_data
    config.world_size = world_size
    return config


def shard_inputs(pattern: str) -> dict[str, Any]:
    from labse_model.data import resolve_shards

    return fingerprint((file_key(path), path) for path in resolve_shards(pattern))


def changed_settings(args: argparse.Namespace, config: RunConfig, run_dir: Path) -> list[str]:
    """The options given with --resume (explicitly, see `cli.given_options`) whose values differ
    from the run's and may not change: every TrainConfig field not marked resumable, the model's,
    --init-from and --vocab. Without this they were ignored without a word."""
    given = getattr(args, "given_options", frozenset())
    asked = config_from_args(TrainConfig, args)
    resumable = resumable_fields(TrainConfig)
    changed = [f"{option_flag(f, spec)} {getattr(asked, f.name)} (run: {getattr(config.train, f.name)})"
               for f, spec in config_options(TrainConfig)
               if spec is not None and f.name in given and f.name not in resumable
               and getattr(asked, f.name) != getattr(config.train, f.name)]
    model = {"config": config.model.preset, "pooling": config.model.pooling, "dropout": config.model.hidden_dropout,
             "init_from": config.init_from}
    changed += [f"--{name.replace('_', '-')} {getattr(args, name)} (run: {value})" for name, value in model.items()
                if name in given and getattr(args, name) != value]
    if "vocab" in given and file_sha256(args.vocab) != file_sha256(run_dir / config.vocab):
        changed.append(f"--vocab {args.vocab} (not the run's {config.vocab}: other contents)")
    return changed


# ----------------------------------------------------------------------------------------------
# Training


def prepare_run_dir(args: argparse.Namespace, ctx: DistributedContext, start: StartingPoint | None) -> RunConfig:
    run_dir: Path = args.output
    if args.resume:
        check_resumable(run_dir, "config.json", args.resume_step)
        config = resumed_run_config(args, run_dir, ctx.world_size)
        if ctx.is_main:
            config.save(run_dir / "config.json")  # records overrides such as a longer --max-steps
        return config
    if ckpt.list_checkpoints(run_dir):
        raise UsageError(f"{run_dir} already holds checkpoints: pass --resume to continue it, or choose a new --output")
    config = make_run_config(args, ctx.world_size, start)
    config.inputs = shard_inputs(args.data)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(run_dir / "vocab.txt") as tmp:
            shutil.copyfile(args.vocab, tmp)  # the starting point's vocab.txt (same sha256)
        config.save(run_dir / "config.json")
    return config


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume) training in this process; collective when launched by torchrun."""
    if not storage.glob(args.data):
        raise FileNotFoundError(f"--data {args.data!r} matches no files")
    if not Path(args.vocab).is_file():
        raise FileNotFoundError(f"--vocab {args.vocab} not found")
    return run_in_run_dir(args, _train)


def _train(args: argparse.Namespace, ctx: DistributedContext) -> dict[str, Any]:
    from labse_model.data import build_train_loader, check_schema_vocab
    from labse_model.dev_eval import encode_ids, load_dev_pairs, pair_retrieval_accuracy

    run_dir: Path = args.output
    start = load_starting_point(args.init_from) if args.init_from and not args.resume else None
    config = prepare_run_dir(args, ctx, start)
    barrier()
    tc, mc = config.train, config.model
    if tc.global_batch_size % ctx.world_size:
        raise UsageError(f"--global-batch-size {tc.global_batch_size} does not divide over {ctx.world_size} processes")
    local_batch = tc.global_batch_size // ctx.world_size
    if tc.grad_cache_chunk >= local_batch and ctx.is_main:
        logger.warning("--grad-cache-chunk %d is not smaller than the %d pairs per process: one chunk, so "
                       "gradient caching saves no memory and only adds a forward", tc.grad_cache_chunk, local_batch)

    if tc.warmup_steps >= tc.max_steps and ctx.is_main:
        logger.warning("%s", warmup_problem(tc.warmup_steps, tc.max_steps))
    torch.manual_seed(tc.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = DualEncoder(mc).to(ctx.device)
    optimizer = build_optimizer(model, tc)
    scheduler = build_scheduler(optimizer, tc.warmup_steps, tc.max_steps)

    start_step, resumed = 0, None
    if args.resume:
        resumed = resume_point(run_dir, ctx, args.resume_step)
        resumed.restore_model(model.encoder)
        optimizer.load_state_dict(resumed.state["optimizer"])
        scheduler.load_state_dict(resumed.state["scheduler"])
        start_step = resumed.step
        resumed.restore_rng(ctx.rank, ctx.world_size, tc.seed)
        if ctx.is_main:
            logger.info("resumed %s at step %d", resumed.path, start_step)
    else:
        if start is not None:
            start.load_into(model.encoder)  # after the fresh init, so parts the source lacks stay fresh
            start = None  # the source's tensors are copied; free them
        elif config.model.pooling == "cls" and ctx.is_main:
            # Measured (BENCHMARKS.md, model): from random weights the [CLS] vector learns only sentence
            # length and retrieval stays near chance, while mean pooling learns within a few hundred steps.
            logger.warning("training [CLS] pooling from random weights: it learns little more than sentence "
                           "length (BENCHMARKS.md); pass --init-from a pre-trained encoder, or --pooling mean")
        # Different dropout masks per rank, reproducible from the seed.
        torch.manual_seed(tc.seed + ctx.rank)

    loader = build_train_loader(
        args.data,
        global_batch_size=tc.global_batch_size,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=tc.seed,
        pad_id=mc.pad_token_id,
        shuffle_window=tc.shuffle_window,
        num_workers=tc.num_workers,
        start_step=start_step,
        max_seq_length=tc.max_seq_length,
        vocab_size=mc.vocab_size,
    )
    check_schema_vocab(loader.schema, run_dir / "vocab.txt", config.init_from)  # ids from another vocabulary are garbage
    if resumed is not None:
        loader.check_resume(resumed.state.get("loader"), start_step)

    dev = None
    if config.dev_data and ctx.is_main:
        dev = load_dev_pairs(config.dev_data, str(run_dir / "vocab.txt"), args.dev_max_pairs, tc.max_seq_length)
        logger.info("dev set: %d pairs from %s", len(dev[0]), config.dev_data)

    if resumed is not None:
        set_aside_later_checkpoints(run_dir, ctx, resumed)
    log = RunLog(run_dir, enabled=ctx.is_main, resumed_at_step=start_step if args.resume else None)
    parts = LoopParts(
        ctx=ctx, run_dir=run_dir, model=model.encoder, trained=model, optimizer=optimizer,
        scheduler=scheduler, log=log,
        settings=tc, after_checkpoint=checkpoint_publisher(args, ctx, tc.keep_checkpoints),
    )
    loss_fn = BidirectionalAMSLoss(additive_margin=tc.additive_margin, scale=tc.scale, gather_negatives=tc.gather_negatives)

    def check_batch(batch: dict[str, torch.Tensor]) -> None:
        # Token ids are checked against the vocabulary where records are decoded (the loader's vocab_size).
        if batch["src_input_ids"].shape[0] != local_batch:
            raise ValueError(f"data loader gave {batch['src_input_ids'].shape[0]} rows, expected {local_batch}")

    def compute_loss(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        check_batch(batch)
        return loss_fn(*parts.trained(**batch)), {}

    def grad_cached_loss(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        check_batch(batch)
        return grad_cached_step(parts.trained, batch, tc.grad_cache_chunk, loss_fn,
                                autocast=autocast_context(ctx.device, tc.bf16)), {}

    train_step = BackpropagatedStep(grad_cached_loss) if tc.grad_cache_chunk else compute_loss

    def evaluate(at_step: int) -> dict[str, float] | None:
        if dev is None:
            return None
        result = pair_retrieval_accuracy(encode_ids(model.encoder, dev[0], ctx.device),
                                         encode_ids(model.encoder, dev[1], ctx.device))
        log.record(at_step, {f"dev_{k}": v for k, v in result.items()}, "dev")
        return result

    stop_at = tc.max_steps if args.stop_after_steps is None else min(tc.max_steps, start_step + args.stop_after_steps)
    result = run_loop(parts, loader, train_step, start_step=start_step, stop_at=stop_at,
                      total_steps=tc.max_steps, evaluate=evaluate,
                      checkpoint_state=lambda at_step: {"loader": loader.state(at_step)})
    step = result.step
    finished_before = _finished_summary(run_dir) if args.resume and step == start_step else None
    if finished_before is not None:  # nothing trained now: the finished run's summary (its loss, timing) stands
        log.close()
        logger.info("--resume: %s had already finished at step %d; its train_summary.json is kept", run_dir, step)
        barrier()
        return finished_before
    dev_result = result.last_eval
    if ctx.is_main and dev is not None and result.last_eval_step != step:
        dev_result = evaluate(step)
    summary = {
        "step": step,
        "world_size": ctx.world_size,
        "local_batch_size": local_batch,
        "global_batch_size": tc.global_batch_size,
        "gather_negatives": tc.gather_negatives and ctx.world_size > 1,
        "grad_cache_chunk": tc.grad_cache_chunk,
        "final_loss": result.last_loss,
        "steps_timed": result.steps_timed,
        "seconds_per_step": result.seconds / max(1, result.steps_timed),
        "steps_per_second": result.steps_per_second,
        "gather_forward_share": loss_fn.gather_seconds / max(result.seconds, 1e-9),
        "dev_accuracy": dev_result,
        "finished": step >= tc.max_steps,
        "stopped_by": result.stopped_by,
    }
    if ctx.is_main:
        log.close()
        write_text_atomic(run_dir / "train_summary.json", json.dumps(summary, indent=2) + "\n")
        logger.info("done at step %d: %s", step, json.dumps(summary))
        print(closing_summary(summary, tc.max_steps, tc.warmup_steps, run_dir), flush=True)
    barrier()
    return summary


def warmup_problem(warmup_steps: int, max_steps: int) -> str:
    """The one wording of a warm-up as long as the run, warned at start-up and again in the closing lines."""
    return (f"--warmup-steps {warmup_steps:,} is not shorter than --max-steps {max_steps:,}: the learning rate never "
            f"reaches --lr (give --warmup-steps <= {max_steps - 1:,}; a tenth of the run, {max(max_steps // 10, 1):,}, "
            "is usual)")


def closing_summary(summary: dict, max_steps: int, warmup_steps: int, run_dir) -> str:
    """labse-train's closing lines (accounting.closing_lines): the steps trained of the run's, the final
    loss, speed and batch, the dev retrieval; a WARNING for a loss that is not a number, a run that
    stopped early, or a warm-up that never let the learning rate reach --lr."""
    loss = summary["final_loss"]
    state = "finished" if summary["finished"] else f"stopped by {summary['stopped_by'] or 'request'}"
    decisions = [f"final loss {'-' if loss is None else f'{loss:.4f}'}, {summary['steps_per_second'] or 0:.2f} steps/s, global batch "
                 f"{summary['global_batch_size']:,} over {summary['world_size']} process(es)"
                 + (", negatives gathered" if summary["gather_negatives"] else "") + f"; run in {run_dir}"]
    if summary.get("dev_accuracy"):
        decisions.append("dev retrieval: " + ", ".join(f"{name} {value:.1%}" for name, value in summary["dev_accuracy"].items()))
    warnings = []
    if loss is None or not math.isfinite(loss):
        warnings.append(f"the final loss is {loss}: the run diverged or trained nothing")
    if not summary["finished"]:
        warnings.append(f"stopped at step {summary['step']:,} of {max_steps:,}: run the same command with --resume to finish")
    if warmup_steps >= max_steps:
        warnings.append(warmup_problem(warmup_steps, max_steps))
    return closing_lines(f"labse-train: {summary['step']:,} of {max_steps:,} steps ({state})", decisions, warnings)


def _finished_summary(run_dir: Path) -> dict | None:
    """The train_summary.json of a run that reached its last step, or None (absent, unfinished, unreadable)."""
    try:
        summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("finished") else None


if __name__ == "__main__":
    sys.exit(main())
