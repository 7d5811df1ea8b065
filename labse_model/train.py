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
import glob
import gzip
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from labse_model import checkpoint as ckpt
from labse_model.config import POOLING_MODES, PRESETS, ModelConfig, RunConfig, TrainConfig, count_vocab
from labse_model.distributed import (
    DistributedContext,
    all_gather_with_grad,
    all_reduce_mean,
    barrier,
    init_distributed,
    launched_by_torchrun,
    shutdown_distributed,
)
from labse_model.encoder import DualEncoder, SentenceEncoder
from labse_model.loss import BidirectionalAMSLoss
from pipelines.io.atomic import write_text_atomic

logger = logging.getLogger("labse_model.train")

# TrainConfig fields a user may change when resuming (the rest must match the run being resumed).
RESUMABLE_OVERRIDES = ("max_steps", "eval_every", "save_every", "log_every", "num_workers", "keep_checkpoints")


# ----------------------------------------------------------------------------------------------
# Command line


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the empty ones (None, False) that say nothing."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labse-train",
        description="Train a LaBSE-style dual encoder (shared BERT, [CLS] -> dense+tanh -> L2) with a "
        "bidirectional additive-margin softmax and negatives gathered across processes.",
        formatter_class=HelpFormatter,
    )
    data = parser.add_argument_group("data and run")
    data.add_argument("--data", required=True, help="glob of TFRecord shards written by labse-tfrecords (quote it)")
    data.add_argument("--vocab", required=True, help="the vocab.txt the shards were tokenised with")
    data.add_argument("--output", required=True, type=Path, help="run directory (config, checkpoints, logs)")
    data.add_argument(
        "--dev-data",
        default=None,
        help="held-out pairs for periodic retrieval accuracy: a TFRecord glob, or two line-aligned "
        "text files 'SRC_FILE:TGT_FILE' (.gz allowed), e.g. Multi30k val.de.gz:val.en.gz",
    )
    data.add_argument("--dev-max-pairs", type=int, default=1000, help="pairs of --dev-data to use")
    data.add_argument("--resume", action="store_true", help="continue the run in --output from its latest checkpoint")
    data.add_argument("--init-from", default=None,
                      help="start from these encoder weights (a run directory, a checkpoint folder or a "
                      "model.safetensors), e.g. a pre-trained encoder; optimizer and schedule start fresh")
    model = parser.add_argument_group("model")
    model.add_argument("--config", choices=sorted(PRESETS), default="base", help="encoder size preset")
    model.add_argument("--pooling", choices=POOLING_MODES, default="cls",
                       help="[CLS] (LaBSE's head; needs a pre-trained encoder, see --init-from) or mean of the "
                       "tokens (learns from random weights; BENCHMARKS.md, model), then dense+tanh+L2")
    model.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (0 disables)")
    train = parser.add_argument_group("training (defaults: the paper's where it gives them)")
    defaults = TrainConfig()
    train.add_argument("--global-batch-size", type=int, default=defaults.global_batch_size,
                       help="pairs per step over all processes (must divide by the process count)")
    train.add_argument("--margin", type=float, default=defaults.margin, help="additive margin on the positive")
    train.add_argument("--scale", type=float, default=defaults.scale, help="logit scale on cosines")
    train.add_argument("--gather-negatives", action=argparse.BooleanOptionalAction, default=defaults.gather_negatives,
                       help="score local pairs against every process's pairs (the global batch)")
    train.add_argument("--max-steps", type=int, default=None, help=f"total optimizer steps (default {defaults.max_steps})")
    train.add_argument("--lr", type=float, default=defaults.learning_rate, help="peak AdamW learning rate")
    train.add_argument("--weight-decay", type=float, default=defaults.weight_decay)
    train.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps, help="linear warm-up, then linear decay to 0")
    train.add_argument("--max-grad-norm", type=float, default=defaults.max_grad_norm, help="gradient clipping (0: off)")
    train.add_argument("--max-seq-length", type=int, default=defaults.max_seq_length, help="truncate longer sequences")
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--shuffle-buffer", type=int, default=defaults.shuffle_buffer)
    train.add_argument("--no-bf16", dest="bf16", action="store_false", help="disable bf16 autocast on GPU")
    run = parser.add_argument_group("launch, logging and checkpoints")
    run.add_argument("--nproc-per-node", type=int, default=1,
                     help="processes on this host (GPUs, or CPU processes with gloo); >1 relaunches via torchrun")
    run.add_argument("--num-workers", type=int, default=None, help="DataLoader workers per process (default 0)")
    run.add_argument("--eval-every", type=int, default=None, help=f"steps between dev evaluations (default {defaults.eval_every})")
    run.add_argument("--save-every", type=int, default=None, help=f"steps between checkpoints (default {defaults.save_every})")
    run.add_argument("--log-every", type=int, default=None, help=f"steps between loss logs (default {defaults.log_every})")
    run.add_argument("--keep-checkpoints", type=int, default=None,
                     help=f"newest checkpoints to keep, 0 = all (default {defaults.keep_checkpoints})")
    run.add_argument("--stop-after-steps", type=int, default=None,
                     help="stop this invocation after N steps (checkpointing first), e.g. to fit a job time "
                     "limit; continue later with --resume. The schedule still follows --max-steps")
    run.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    return parser


def relaunch_with_torchrun(argv: list[str], nproc: int) -> int:
    """Run this same command under torchrun with `nproc` processes on this host; its exit code."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "labse_model.train", *argv,
    ]
    logger.info("launching %d processes: %s", nproc, " ".join(command))
    return subprocess.call(command)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.nproc_per_node > 1 and not launched_by_torchrun():
        return relaunch_with_torchrun(argv, args.nproc_per_node)
    try:
        train(args)
    except (ValueError, FileNotFoundError) as exc:
        logger.error("%s", exc)
        return 2
    return 0


# ----------------------------------------------------------------------------------------------
# Run configuration


def make_run_config(args: argparse.Namespace, world_size: int) -> RunConfig:
    vocab_size = count_vocab(args.vocab)
    model = ModelConfig.from_preset(
        args.config, vocab_size, hidden_dropout=args.dropout, attention_dropout=args.dropout, pooling=args.pooling
    )
    defaults = TrainConfig()
    train_config = TrainConfig(
        global_batch_size=args.global_batch_size,
        margin=args.margin,
        scale=args.scale,
        gather_negatives=args.gather_negatives,
        max_steps=args.max_steps if args.max_steps is not None else defaults.max_steps,
        learning_rate=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        max_seq_length=args.max_seq_length,
        eval_every=_or(args.eval_every, defaults.eval_every),
        save_every=_or(args.save_every, defaults.save_every),
        log_every=_or(args.log_every, defaults.log_every),
        shuffle_buffer=args.shuffle_buffer,
        num_workers=_or(args.num_workers, defaults.num_workers),
        keep_checkpoints=_or(args.keep_checkpoints, defaults.keep_checkpoints),
        bf16=args.bf16,
    )
    if train_config.max_seq_length > model.max_position_embeddings:
        raise ValueError(
            f"--max-seq-length {train_config.max_seq_length} exceeds the {args.config} config's "
            f"{model.max_position_embeddings} positions"
        )
    return RunConfig(model=model, train=train_config, data=args.data, dev_data=args.dev_data, world_size=world_size)


def _or(value, default):
    return default if value is None else value


def resumed_run_config(args: argparse.Namespace, run_dir: Path, world_size: int) -> RunConfig:
    config = RunConfig.load(run_dir / "config.json")
    for name in RESUMABLE_OVERRIDES:
        value = getattr(args, name, None)
        if value is not None:
            setattr(config.train, name, value)
    config.data = args.data
    if args.dev_data is not None:
        config.dev_data = args.dev_data
    config.world_size = world_size
    return config


def resolve_weights(path: str) -> Path:
    """model.safetensors from a file, a checkpoint folder, or a run directory (its latest checkpoint)."""
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    if (candidate / ckpt.MODEL_FILE).is_file():
        return candidate / ckpt.MODEL_FILE
    return ckpt.find_checkpoint(candidate) / ckpt.MODEL_FILE


def lr_lambda(warmup_steps: int, max_steps: int):
    """Linear warm-up to the peak over `warmup_steps` (the first step already moves), then linear decay to 0."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


def build_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    # No weight decay on biases and LayerNorm weights (the BERT convention).
    decay, no_decay = [], []
    for parameter in model.parameters():
        (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate,
        betas=config.adam_betas,
        eps=config.adam_eps,
    )


# ----------------------------------------------------------------------------------------------
# Dev evaluation


def _read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def load_dev_pairs(spec: str, vocab_path: str, max_pairs: int, max_seq_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of held-out pairs: a TFRecord glob, or 'SRC_FILE:TGT_FILE' line-aligned text."""
    if ":" in spec and not glob.glob(spec):
        src_path, tgt_path = spec.split(":", 1)
        for path in (src_path, tgt_path):
            if not Path(path).is_file():
                raise FileNotFoundError(f"--dev-data file not found: {path}")
        sources, targets = _read_lines(src_path), _read_lines(tgt_path)
        if len(sources) != len(targets):
            raise ValueError(f"--dev-data files are not line-aligned: {len(sources)} vs {len(targets)} lines")
        keep = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()][:max_pairs]
        from vocab.tokenizer import hf_tokenizer

        tokenizer = hf_tokenizer(vocab_path)
        encode = lambda texts: tokenizer(texts, truncation=True, max_length=max_seq_length)["input_ids"]  # noqa: E731
        return encode([s for s, _ in keep]), encode([t for _, t in keep])
    from labse_model.data import iter_pairs

    src_ids, tgt_ids = [], []
    for pair in iter_pairs(spec):
        src_ids.append(pair.src_ids[:max_seq_length])
        tgt_ids.append(pair.tgt_ids[:max_seq_length])
        if len(src_ids) >= max_pairs:
            break
    if not src_ids:
        raise ValueError(f"--dev-data {spec!r} holds no pairs")
    return src_ids, tgt_ids


@torch.no_grad()
def encode_ids(encoder: SentenceEncoder, sequences: list[list[int]], device: torch.device, batch_size: int = 128,
               pad_id: int = 0) -> torch.Tensor:
    from labse_model.data import pad_batch

    was_training = encoder.training
    encoder.eval()
    out = []
    for start in range(0, len(sequences), batch_size):
        ids, mask = pad_batch(sequences[start : start + batch_size], pad_id)
        out.append(encoder(ids.to(device), mask.to(device)).float().cpu())
    encoder.train(was_training)
    return torch.cat(out)


def retrieval_accuracy(src: torch.Tensor, tgt: torch.Tensor) -> dict[str, float]:
    """Top-1 retrieval accuracy of each source among all targets and back (pairs are row-aligned)."""
    similarity = src @ tgt.T
    gold = torch.arange(len(src))
    s2t = (similarity.argmax(dim=1) == gold).float().mean().item()
    t2s = (similarity.argmax(dim=0) == gold).float().mean().item()
    return {"src2tgt": s2t, "tgt2src": t2s, "mean": (s2t + t2s) / 2}


# ----------------------------------------------------------------------------------------------
# Training


def _move(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepare_run_dir(args: argparse.Namespace, ctx: DistributedContext) -> RunConfig:
    run_dir: Path = args.output
    if args.resume:
        if not (run_dir / "config.json").is_file():
            raise FileNotFoundError(f"--resume: {run_dir / 'config.json'} not found (nothing to resume)")
        ckpt.find_checkpoint(run_dir)  # fail early and clearly when there is none
        config = resumed_run_config(args, run_dir, ctx.world_size)
        if ctx.is_main:
            config.save(run_dir / "config.json")  # records overrides such as a longer --max-steps
        return config
    if ckpt.list_checkpoints(run_dir):
        raise ValueError(f"{run_dir} already holds checkpoints: pass --resume to continue it, or choose a new --output")
    config = make_run_config(args, ctx.world_size)
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.vocab, run_dir / ".vocab.txt.tmp")
        os.replace(run_dir / ".vocab.txt.tmp", run_dir / "vocab.txt")
        config.save(run_dir / "config.json")
    return config


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run (or resume) training in this process; collective when launched by torchrun."""
    if not glob.glob(args.data):
        raise FileNotFoundError(f"--data {args.data!r} matches no files")
    if not Path(args.vocab).is_file():
        raise FileNotFoundError(f"--vocab {args.vocab} not found")
    ctx = init_distributed(args.device)
    try:
        return _train(args, ctx)
    finally:
        shutdown_distributed()


def _train(args: argparse.Namespace, ctx: DistributedContext) -> dict[str, Any]:
    from labse_model.data import build_train_loader, check_schema_vocab

    run_dir: Path = args.output
    config = prepare_run_dir(args, ctx)
    barrier()
    tc, mc = config.train, config.model
    if tc.global_batch_size % ctx.world_size:
        raise ValueError(f"--global-batch-size {tc.global_batch_size} does not divide over {ctx.world_size} processes")
    local_batch = tc.global_batch_size // ctx.world_size

    torch.manual_seed(tc.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = DualEncoder(mc).to(ctx.device)
    optimizer = build_optimizer(model, tc)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tc.warmup_steps, tc.max_steps))

    start_step = 0
    if args.resume:
        checkpoint = ckpt.find_checkpoint(run_dir)
        ckpt.load_model_weights(model.encoder, checkpoint / ckpt.MODEL_FILE)
        state = ckpt.load_training_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_step = int(state["step"])
        rng = ckpt.load_rng_state(checkpoint, ctx.rank) if state.get("world_size") == ctx.world_size else None
        if rng is None:
            logger.warning("checkpoint was written by %s processes, now %d: RNG streams are re-seeded",
                           state.get("world_size"), ctx.world_size)
            torch.manual_seed(tc.seed + 1_000_003 * start_step + ctx.rank)
        else:
            ckpt.set_rng_state(rng)
        if ctx.is_main:
            logger.info("resumed %s at step %d", checkpoint, start_step)
    else:
        if args.init_from:
            weights = resolve_weights(args.init_from)
            ckpt.load_model_weights(model.encoder, weights)
            if ctx.is_main:
                logger.info("initialised the encoder from %s", weights)
        elif config.model.pooling == "cls" and ctx.is_main:
            # Measured (BENCHMARKS.md, model): from random weights the [CLS] vector learns only sentence
            # length and retrieval stays near chance, while mean pooling learns within a few hundred steps.
            logger.warning("training [CLS] pooling from random weights: it learns little more than sentence "
                           "length (BENCHMARKS.md); pass --init-from a pre-trained encoder, or --pooling mean")
        # Different dropout masks per rank, reproducible from the seed.
        torch.manual_seed(tc.seed + ctx.rank)

    ddp_model: torch.nn.Module = model
    if ctx.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        import inspect

        # BERT's buffers (position ids) are constants: no need to sync them on every forward. The
        # option was renamed in torch 2.13 (older torch on GPU hosts only knows broadcast_buffers).
        no_buffer_sync = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                          else {"broadcast_buffers": False})
        ddp_model = DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None, **no_buffer_sync
        )

    loss_fn = BidirectionalAMSLoss(margin=tc.margin, scale=tc.scale)
    loader = build_train_loader(
        args.data,
        global_batch_size=tc.global_batch_size,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=tc.seed,
        pad_id=mc.pad_token_id,
        shuffle_buffer=tc.shuffle_buffer,
        num_workers=tc.num_workers,
        start_step=start_step,
        max_seq_length=tc.max_seq_length,
    )
    check_schema_vocab(loader.schema, run_dir / "vocab.txt")  # ids from another vocabulary are garbage

    dev = None
    if config.dev_data and ctx.is_main:
        dev = load_dev_pairs(config.dev_data, str(run_dir / "vocab.txt"), args.dev_max_pairs, tc.max_seq_length)
        logger.info("dev set: %d pairs from %s", len(dev[0]), config.dev_data)

    writer = None
    metrics_path = run_dir / "metrics.jsonl"
    if ctx.is_main:
        writer = summary_writer(run_dir / "tensorboard", purge_step=start_step if args.resume else None)
        _truncate_metrics(metrics_path, start_step)

    use_autocast = ctx.device.type == "cuda" and tc.bf16
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_autocast else nullcontext
    gather = tc.gather_negatives and ctx.world_size > 1
    stop_at = tc.max_steps if args.stop_after_steps is None else min(tc.max_steps, start_step + args.stop_after_steps)

    from tqdm.auto import tqdm

    progress = tqdm(total=tc.max_steps, initial=start_step, disable=not ctx.is_main, desc="train", unit="step",
                    dynamic_ncols=True)
    model.train()
    step = start_step
    timings = {"step": 0.0, "gather": 0.0, "steps": 0}
    last_loss = float("nan")
    dev_result: dict[str, float] | None = None
    checked_ids = False

    def save(at_step: int) -> None:
        ckpt.save_checkpoint(
            run_dir, at_step, model=model.encoder,
            training_state={"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                            "data_position": at_step},
            rank=ctx.rank, world_size=ctx.world_size, barrier=barrier,
            keep_last=tc.keep_checkpoints or None,
        )

    def evaluate(at_step: int) -> dict[str, float] | None:
        if dev is None:
            return None
        result = retrieval_accuracy(encode_ids(model.encoder, dev[0], ctx.device),
                                    encode_ids(model.encoder, dev[1], ctx.device))
        for name, value in result.items():
            writer.add_scalar(f"dev/accuracy_{name}", value, at_step)
        _append_metrics(metrics_path, {"step": at_step, **{f"dev_{k}": v for k, v in result.items()}})
        progress.write(f"step {at_step}: dev retrieval accuracy {result['mean']:.4f} "
                       f"(src->tgt {result['src2tgt']:.4f}, tgt->src {result['tgt2src']:.4f})")
        return result

    while step < stop_at:
        batch = _move(next(loader), ctx.device)
        if batch["src_input_ids"].shape[0] != local_batch:
            raise ValueError(f"data loader gave {batch['src_input_ids'].shape[0]} rows, expected {local_batch}")
        if not checked_ids:
            top = max(int(batch["src_input_ids"].max()), int(batch["tgt_input_ids"].max()))
            if top >= mc.vocab_size:
                raise ValueError(f"token id {top} >= vocabulary size {mc.vocab_size}: were the shards "
                                 f"tokenised with {args.vocab}?")
            checked_ids = True
        _sync(ctx.device)
        started = time.perf_counter()
        with autocast():
            src, tgt = ddp_model(**batch)
        if gather:
            _sync(ctx.device)
            gather_started = time.perf_counter()
            all_src, all_tgt = all_gather_with_grad(src), all_gather_with_grad(tgt)
            _sync(ctx.device)
            timings["gather"] += time.perf_counter() - gather_started
            loss = loss_fn(src, tgt, all_src, all_tgt, label_offset=ctx.rank * local_batch)
        else:
            loss = loss_fn(src, tgt)
        loss.backward()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
            if tc.max_grad_norm > 0 else torch.tensor(float("nan"))
        )
        lr = scheduler.get_last_lr()[0]  # the rate this step used
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(ctx.device)
        timings["step"] += time.perf_counter() - started
        timings["steps"] += 1
        step += 1

        if step % tc.log_every == 0 or step == stop_at:
            # The mean of the ranks' losses is the global-batch loss (each is a mean over its rows).
            last_loss = all_reduce_mean(loss.detach()).item()
            if ctx.is_main:
                writer.add_scalar("train/loss", last_loss, step)
                writer.add_scalar("train/lr", lr, step)
                writer.add_scalar("train/grad_norm", float(grad_norm), step)
                writer.add_scalar("train/steps_per_second", timings["steps"] / max(timings["step"], 1e-9), step)
                _append_metrics(metrics_path, {"step": step, "loss": last_loss, "lr": lr, "grad_norm": float(grad_norm)})
                progress.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}")
        progress.update(1)
        if ctx.is_main and tc.eval_every and step % tc.eval_every == 0:
            dev_result = evaluate(step)
        if (tc.save_every and step % tc.save_every == 0) or step == stop_at:
            save(step)
    progress.close()

    if ctx.is_main and dev is not None and (dev_result is None or not tc.eval_every or step % tc.eval_every):
        dev_result = evaluate(step)
    summary = {
        "step": step,
        "world_size": ctx.world_size,
        "local_batch_size": local_batch,
        "global_batch_size": tc.global_batch_size,
        "gather_negatives": gather,
        "final_loss": last_loss,
        "steps_timed": timings["steps"],
        "seconds_per_step": timings["step"] / max(1, timings["steps"]),
        "steps_per_second": timings["steps"] / max(timings["step"], 1e-9),
        "gather_forward_share": timings["gather"] / max(timings["step"], 1e-9),
        "dev_accuracy": dev_result,
        "finished": step >= tc.max_steps,
    }
    if ctx.is_main:
        writer.close()
        write_text_atomic(run_dir / "train_summary.json", json.dumps(summary, indent=2) + "\n")
        logger.info("done at step %d: %s", step, json.dumps(summary))
    barrier()
    return summary


def summary_writer(log_dir: Path, purge_step: int | None):
    """A TensorBoard writer that does not import TensorFlow.

    TensorBoard's file I/O uses real TensorFlow whenever it is importable (8 s and ~1 GB per rank
    here) unless the module `tensorboard.compat.notf` exists; registering that empty marker module
    selects TensorBoard's own pure-Python stub, which writes the same event files.
    """
    import types

    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), purge_step=purge_step)


def _append_metrics(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _truncate_metrics(path: Path, keep_through_step: int) -> None:
    """Drop log lines past the resumed step (written by the interrupted run after its checkpoint)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["step"] <= keep_through_step]
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
