"""Training-step profile (issue 32 item 6): model FLOP utilisation (MFU) and the share of the step spent
gathering negatives, for the dual encoder as labse-train runs it, on CPU or GPU.

    nice -n 10 .venv/bin/python benchmarks/step_profile.py --config tiny --local-batch 32 --nproc 2
    python benchmarks/step_profile.py --config base --local-batch 512 --nproc 8 --device cuda --compile

Each of `--nproc` processes (gloo on CPU, NCCL on CUDA: the backend labse_model.distributed picks)
runs the trainer's pieces — DualEncoder (fused SDPA attention), DDP (labse_model.loop.wrap_ddp),
optionally torch.compile, bf16 autocast on CUDA, BidirectionalAMSLoss with gathered negatives,
AdamW — on random ids of `--seq-len` tokens, `--warmup` untimed steps then `--steps` timed ones.

Printed per run: seconds a step, tokens a second over all processes, the model's FLOP/s, MFU, and
the gather share = time in the forward all-gathers of the embeddings / step time (the loss's own
`gather_seconds`, device-synchronised; the backward's reduce-scatter and DDP's gradient all-reduce
are inside the backward and not split out).

FLOPs a step and process: 6 x (non-embedding parameters) x tokens + 12 x layers x hidden x seq x
tokens (attention scores and values, forward and backward), tokens = 2 x local batch x seq (source
and target). MFU divides the achieved FLOP/s by the peak: `--peak-tflops` if given; on CUDA the
dense bf16 peak of a known GPU (H100/H200 989, A100 312, L4 121); on CPU the measured float32 matmul
throughput of one process (a 2048 x 2048 matmul loop), so CPU MFU reads "share of what this CPU's
matmul reaches", not of a datasheet peak.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPU_BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0}


def step_flops(config, local_batch: int, seq_len: int) -> float:
    """Model FLOPs of one training step on one process (forward + backward)."""
    layer = 12 * config.hidden_size ** 2 + 2 * config.hidden_size * config.intermediate_size  # weights
    non_embedding = config.num_layers * layer + config.hidden_size ** 2  # + the dense head
    tokens = 2 * local_batch * seq_len
    return 6 * non_embedding * tokens + 12 * config.num_layers * config.hidden_size * seq_len * tokens


def cpu_matmul_tflops(seconds: float = 2.0) -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
    return 2 * 2048 ** 3 * count / (time.perf_counter() - started) / 1e12


def peak_tflops(device: torch.device, given: float | None) -> tuple[float, str]:
    if given:
        return given, "given"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_BF16_PEAK_TFLOPS.items():
            if key in name:
                return value, f"{name} dense bf16 datasheet"
        raise SystemExit(f"unknown GPU {name!r}: pass --peak-tflops")
    return cpu_matmul_tflops(), "measured float32 matmul, one process"


def _worker(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.nproc),
                      LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TORCHELASTIC_RUN_ID="step-profile")
    from labse_model.config import ModelConfig
    from labse_model.distributed import init_distributed, shutdown_distributed, synchronize
    from labse_model.encoder import DualEncoder
    from labse_model.loop import autocast_context, wrap_ddp
    from labse_model.loss import BidirectionalAMSLoss

    ctx = init_distributed(args.device)
    if ctx.device.type == "cpu":  # the processes share the cores, as torchrun's OMP_NUM_THREADS would
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.nproc))
    torch.manual_seed(0)
    config = ModelConfig.from_preset(args.config, args.vocab_size, hidden_dropout=0.0, attention_dropout=0.0)
    model = wrap_ddp(DualEncoder(config).to(ctx.device), ctx)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = BidirectionalAMSLoss(margin=0.3, scale=20.0, gather_negatives=True)
    autocast = autocast_context(ctx.device, bf16=True)
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, args.vocab_size, (2, args.local_batch, args.seq_len), generator=generator).to(ctx.device)
    mask = torch.ones_like(ids[0])
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            loss_fn.gather_seconds = 0.0
        synchronize(ctx.device)
        started = time.perf_counter()
        with autocast():
            src, tgt = model(ids[0], mask, ids[1], mask)
            loss = loss_fn(src.float(), tgt.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(ctx.device)
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    if rank == 0:
        peak, source = peak_tflops(ctx.device, args.peak_tflops)
        step_s = statistics.median(times)
        flops = step_flops(config, args.local_batch, args.seq_len)
        result = {
            "device": str(ctx.device) if ctx.device.type == "cpu" else torch.cuda.get_device_name(ctx.device),
            "processes": args.nproc, "config": args.config, "local_batch": args.local_batch, "seq_len": args.seq_len,
            "compile": args.compile, "bf16": ctx.device.type == "cuda", "attention": config.to_bert_config()._attn_implementation,
            "step_s_median": step_s, "step_s_spread": [min(times), max(times)], "steps": len(times),
            "tokens_per_s": args.nproc * 2 * args.local_batch * args.seq_len / step_s,
            "model_tflops_per_process": flops / step_s / 1e12, "peak_tflops": peak, "peak_source": source,
            "mfu": flops / step_s / 1e12 / peak,
            "gather_share": loss_fn.gather_seconds / sum(times),
        }
        Path(out).write_text(json.dumps(result), encoding="utf-8")
    shutdown_distributed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", help="model preset (tiny, mini, small, base)")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--local-batch", type=int, default=32, help="pairs a process")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (one GPU a process)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (as --compile in labse-train)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"step-profile-{os.getpid()}.json"
    mp.spawn(_worker, args=(args, _free_port(), str(out)), nprocs=args.nproc)
    result = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    print(f"{result['device']} x {result['processes']}, {args.config}, {args.local_batch} pairs x {args.seq_len} tokens a "
          f"process, attention {result['attention']}, bf16 {result['bf16']}, compile {result['compile']}")
    print(f"step {result['step_s_median'] * 1e3:.1f} ms (median of {result['steps']}; "
          f"{result['step_s_spread'][0] * 1e3:.1f}-{result['step_s_spread'][1] * 1e3:.1f}), "
          f"{result['tokens_per_s']:,.0f} tokens/s")
    print(f"MFU {100 * result['mfu']:.1f}% ({result['model_tflops_per_process']:.3f} of {result['peak_tflops']:.2f} TFLOP/s "
          f"a process, peak: {result['peak_source']})")
    print(f"gather share {100 * result['gather_share']:.1f}% of step time (forward all-gathers of the embeddings)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
