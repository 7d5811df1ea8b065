"""Gradient caching on CPU: peak memory and speed of a big batch in chunks, against the small and the
big batch without it.

Runs of the real `labse-train` (mini encoder, max 64 tokens, dropout 0.1, mean pooling), each in a
fresh process, on the Multi30k shards that benchmarks/train.py builds:
  b32              global batch 32, uncached                 (the memory target: within 1.5x of this)
  b1024-chunk32    global batch 1024, --grad-cache-chunk 32
  b1024            global batch 1024, uncached               (the speed target: at least 0.6x of this)
  baseline         global batch 2, one step: the process without a big step's activations

Peak memory is the process's resident-set high-water mark (`ru_maxrss` from `os.wait4` on the
labse-train process): it includes the interpreter, torch, the model, AdamW's state and the loader.
"Step memory" subtracts the baseline run's peak, leaving what a step's batch adds. Speed is
`steps_per_second` from train_summary.json: the loop's own timing of forward, backward and optimizer
steps, without data loading. The configurations run interleaved (one run of each, then again), so a
change in the machine's load hits them alike, with one torch thread each (--threads: OpenMP threads
spin-wait for each other, which on cores shared with other jobs makes timings erratic).

    nice -n 10 .venv/bin/python benchmarks/grad_cache.py --data ../shared/data --work bench_out/grad_cache \\
        [--steps 2] [--repeats 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import build_inputs  # noqa: E402  benchmarks/train.py: labse-vocab + labse-tfrecords on Multi30k

REPO = Path(__file__).resolve().parents[1]
SEED, MAX_SEQ_LENGTH = 1, 64
RUNS = {
    "b32": dict(batch=32, chunk=0),
    "b1024-chunk32": dict(batch=1024, chunk=32),
    "b1024": dict(batch=1024, chunk=0),
}


def train_once(name: str, batch: int, chunk: int, steps: int, args, vocab: Path, shards: str, repeat: int) -> dict:
    """One labse-train process; its peak RSS (bytes) and the loop's steps/s."""
    run_dir = args.work / "runs" / f"{name}-{repeat}"
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "labse_model.train", "--data", shards, "--vocab", str(vocab),
            "--output", str(run_dir), "--config", "mini", "--pooling", "mean", "--dropout", "0.1",
            "--max-seq-length", str(MAX_SEQ_LENGTH), "--global-batch-size", str(batch), "--grad-cache-chunk", str(chunk),
            "--max-steps", str(steps), "--warmup-steps", "0", "--lr", "1e-4", "--log-every", "1",
            "--save-every", str(steps), "--eval-every", "0", "--seed", str(SEED), "--device", "cpu"]
    log = args.work / "logs" / f"{name}-{repeat}.log"
    # OpenMP threads spin-wait for each other: on cores shared with other jobs a descheduled thread
    # stalls the rest, so --threads 1 gives steadier timings there.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": str(args.threads)}
    with open(log, "w", encoding="utf-8") as handle:
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{name} failed ({process.returncode}), see {log}")
    summary = json.loads((run_dir / "train_summary.json").read_text())
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return {"peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports kilobytes
            "steps_per_second": summary["steps_per_second"], "final_loss": summary["final_loss"]}


def padded_lengths(shards: str, batch: int, steps: int) -> list[int]:
    """Tokens per sequence in the steps a run takes. The loader pads a batch to its longest sequence
    and the dual encoder pads both sides to the longer; chunks keep their batch's length, so a chunk
    of a 1024-pair batch is longer than a batch of 32."""
    from labse_model.data import build_train_loader

    loader = build_train_loader(shards, global_batch_size=batch, rank=0, world_size=1, seed=SEED,
                                num_steps=steps, max_seq_length=MAX_SEQ_LENGTH)
    return [max(b["src_input_ids"].shape[1], b["tgt_input_ids"].shape[1]) for b in loader]


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, default=Path("bench_out/grad_cache"))
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch (OpenMP) threads per run")
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args(argv)
    args.data, args.work = args.data.resolve(), args.work.resolve()
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    vocab, shards = build_inputs(args.data, args.work, args.vocab_size)

    results: dict[str, list[dict]] = {name: [] for name in [*RUNS, "baseline"]}
    for repeat in range(args.repeats):
        results["baseline"].append(train_once("baseline", 2, 0, 1, args, vocab, shards, repeat))
        for name, spec in RUNS.items():
            results[name].append(train_once(name, spec["batch"], spec["chunk"], args.steps, args, vocab, shards,
                                            repeat))
            print(f"{name} run {repeat + 1}: {results[name][-1]}", flush=True)
    (args.work / "results.json").write_text(json.dumps(results, indent=2))

    mib = 1024 ** 2
    baseline = statistics.median(r["peak_rss_bytes"] for r in results["baseline"])
    print(f"\nmini encoder, max 64 tokens, {args.steps} steps per run, {args.repeats} runs each, "
          f"{args.threads} thread(s); median (min-max)")
    print(f"baseline process (batch 2, one step): peak RSS {baseline / mib:.0f} MiB")
    print(f"padded tokens per sequence in the steps run: batch 32 {padded_lengths(shards, 32, args.steps)}, "
          f"batch 1024 {padded_lengths(shards, 1024, args.steps)}")
    print("| run | global batch | chunk | peak RSS MiB | step memory MiB (peak - baseline) | steps/s | pairs/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    medians = {}
    for name, spec in RUNS.items():
        rss = spread([r["peak_rss_bytes"] / mib for r in results[name]])
        step_memory = spread([(r["peak_rss_bytes"] - baseline) / mib for r in results[name]])
        speed = spread([r["steps_per_second"] for r in results[name]])
        medians[name] = {"rss": rss[0], "step_memory": step_memory[0], "speed": speed[0]}
        print(f"| {name} | {spec['batch']} | {spec['chunk'] or '-'} | {rss[0]:.0f} ({rss[1]:.0f}-{rss[2]:.0f}) | "
              f"{step_memory[0]:.0f} ({step_memory[1]:.0f}-{step_memory[2]:.0f}) | "
              f"{speed[0]:.3f} ({speed[1]:.3f}-{speed[2]:.3f}) | {speed[0] * spec['batch']:.0f} |")
    cached, small, big = medians["b1024-chunk32"], medians["b32"], medians["b1024"]
    print(f"\nmemory, chunk 32 / batch 32: peak RSS {cached['rss'] / small['rss']:.2f}x, step memory "
          f"{cached['step_memory'] / small['step_memory']:.2f}x (target <= 1.5x); batch 1024 uncached / batch 32: "
          f"peak RSS {big['rss'] / small['rss']:.2f}x, step memory {big['step_memory'] / small['step_memory']:.2f}x")
    print(f"speed, chunk 32 / batch 1024 uncached: {cached['speed'] / big['speed']:.2f}x (target >= 0.6x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
