"""Trainer benchmark on CPU: additive margin, gathered negatives, and the logit scale.

Pipeline, all with the project's own commands:
  labse-vocab (Multi30k train en/de/fr/cs) -> labse-tfrecords (de/fr/cs-en Multi30k train pairs)
  -> labse-train runs -> labse-export -> evaluation on Multi30k test_2016 (de/fr/cs-en caption
  retrieval) and Tatoeba deu/fra/ces (labse_model.evaluate, 6A).

Runs (same data order, same initialisation, same number of steps, margin 0.3 and --scale unless named):
  2x32-gather      2 gloo processes x 32, gathered negatives (softmax over 64): the product's default
  2x32-gather-sS   the same with --alt-scale (100: TF Model Garden's value)     -> the scale default
  2x32-local       2 processes x 32, local negatives only (softmax over 32)     -> (b)
  1x64             1 process x 64 (the big batch gathering should equal)        -> (b)
  2x32-gather-m0   margin 0                                                     -> (a) does the margin help?

Usage (BENCHMARKS.md, section model, has the exact commands and results):
  nice -n 10 .venv/bin/python benchmarks/train.py --data ../shared/data --work bench_out/train_mean
The runs use mean pooling before LaBSE's dense+tanh head and no dropout (--pooling, --dropout): from
random weights the [CLS] vector only learns sentence length at this compute and every run stays at
chance, which hides the comparisons (BENCHMARKS.md, model).
`--pooling mean,max --seeds 1,2,3` repeats every run for each pooling and seed (the seed sets the
initial weights and the data order), e.g. to compare mean and max pooling with their seed spread.
Finished runs are skipped when the script is re-run (delete --work to start over).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

def make_runs(scale: float, alt_scale: float) -> dict[str, dict]:
    """The comparison runs; all use `scale` except the one that tests `alt_scale`."""
    return {
        "2x32-gather": dict(nproc=2, gather=True, margin=0.3, scale=scale),
        f"2x32-gather-s{alt_scale:g}": dict(nproc=2, gather=True, margin=0.3, scale=alt_scale),
        "2x32-local": dict(nproc=2, gather=False, margin=0.3, scale=scale),
        "1x64": dict(nproc=1, gather=True, margin=0.3, scale=scale),
        "2x32-gather-m0": dict(nproc=2, gather=True, margin=0.0, scale=scale),
    }


def run(command: list[str], log: Path) -> float:
    started = time.perf_counter()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    if code != 0:
        raise SystemExit(f"failed ({code}): {' '.join(command)}\nsee {log}")
    return time.perf_counter() - started


def build_inputs(data: Path, work: Path, vocab_size: int) -> tuple[Path, str]:
    vocab = work / "vocab" / "vocab.txt"
    if not vocab.is_file():
        argv = [PY, "-m", "vocab.cli", "--output", str(vocab), "--vocab-size", str(vocab_size), "--overwrite"]
        for lang in ("en", "de", "fr", "cs"):
            argv += ["--input-text", f"{lang}={data / 'multi30k' / f'train.{lang}.gz'}"]
        vocab.parent.mkdir(parents=True, exist_ok=True)
        print(f"labse-vocab: {run(argv + ['--direct_num_workers', '1'], work / 'vocab.log'):.0f} s", flush=True)
    shards = work / "shards"
    if not (shards / "schema.json").is_file():
        argv = [PY, "-m", "pipelines.tfrecords", "--vocab", str(vocab), "--output", str(shards),
                "--num-shards", "4", "--max-seq-length", "64", "--overwrite"]
        for lang in ("de", "fr", "cs"):
            argv += ["--parallel-text", f"{lang}:{data / 'multi30k' / f'train.{lang}.gz'},"
                                        f"en:{data / 'multi30k' / 'train.en.gz'}"]
        print(f"labse-tfrecords: {run(argv, work / 'tfrecords.log'):.0f} s", flush=True)
    return vocab, str(shards / "*.tfrecord*")


def train_and_evaluate(name: str, spec: dict, pooling: str, seed: int, args, vocab: Path, shards: str) -> dict:
    tag = f"{name}-{pooling}-seed{seed}"
    run_dir = args.work / "runs" / tag
    result_path = args.work / "results" / f"{tag}.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    global_batch = args.batch
    argv = [PY, "-m", "labse_model.train", "--data", shards, "--vocab", str(vocab), "--output", str(run_dir),
            "--config", args.config, "--global-batch-size", str(global_batch), "--max-steps", str(args.steps),
            "--lr", str(args.lr), "--warmup-steps", str(args.warmup), "--margin", str(spec["margin"]),
            "--nproc-per-node", str(spec["nproc"]), "--save-every", str(args.steps), "--eval-every", "0",
            "--log-every", "10", "--seed", str(seed), "--max-seq-length", str(args.max_seq_length),
            "--pooling", pooling, "--dropout", str(args.dropout)]
    argv += ["--gather-negatives" if spec["gather"] else "--no-gather-negatives"]
    argv += ["--scale", str(spec["scale"])]
    wall = run(argv, args.work / "logs" / f"{tag}.train.log")
    summary = json.loads((run_dir / "train_summary.json").read_text())
    model_dir = args.work / "models" / tag
    run([PY, "-m", "labse_model.export", "--run", str(run_dir), "--output", str(model_dir), "--overwrite"],
        args.work / "logs" / f"{tag}.export.log")

    from labse_model.evaluate import load_encoder, multi30k_retrieval_accuracies, tatoeba_accuracy

    encode = load_encoder(str(model_dir), device="cpu", batch_size=128)
    accuracies = multi30k_retrieval_accuracies(encode, args.data, [(lang, "en") for lang in ("de", "fr", "cs")])
    multi30k = {lang: accuracies[f"{lang}-en"]["mean"] for lang in ("de", "fr", "cs")}
    tatoeba = tatoeba_accuracy(encode, args.data / "tatoeba", ["deu", "fra", "ces"])
    result = {
        "run": name, **spec, "pooling": pooling, "seed": seed, "global_batch": global_batch, "steps": summary["step"],
        "train_wall_s": wall, "steps_per_s": summary["steps_per_second"],
        "gather_forward_share": summary["gather_forward_share"], "final_loss": summary["final_loss"],
        "multi30k": multi30k, "multi30k_mean": sum(multi30k.values()) / 3,
        "tatoeba": {k: v["mean"] for k, v in tatoeba["languages"].items()}, "tatoeba_mean": tatoeba["mean"],
    }
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, default=Path("bench_out/train"))
    parser.add_argument("--config", default="mini")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--max-seq-length", type=int, default=32, help="Multi30k captions rarely need more")
    parser.add_argument("--batch", type=int, default=64, help="global batch (pairs per step)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--pooling", default="mean",
                        help="comma-separated token poolings (cls, mean, max) before the dense+tanh head, each run "
                        "for every one: from random weights [CLS] only learns sentence length at this compute "
                        "(BENCHMARKS.md, model), so the comparisons use mean")
    parser.add_argument("--seeds", default="1", help="comma-separated seeds (initial weights, data order), each run for every one")
    parser.add_argument("--dropout", type=float, default=0.0, help="no dropout: 300 steps never revisit a pair")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--scale", type=float, default=20.0, help="logit scale of the comparison runs")
    parser.add_argument("--alt-scale", type=float, default=100.0, help="the other scale tried with 2x32-gather")
    parser.add_argument("--runs", default=None, help="comma-separated subset of the run names (default: all)")
    args = parser.parse_args(argv)
    poolings = args.pooling.split(",")
    if set(poolings) - {"cls", "mean", "max"}:
        parser.error(f"--pooling {args.pooling!r}: choose among cls, mean, max")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.data = args.data.resolve()
    args.work = args.work.resolve()
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    vocab, shards = build_inputs(args.data, args.work, args.vocab_size)

    runs = make_runs(args.scale, args.alt_scale)
    results = []
    for name in (args.runs.split(",") if args.runs else runs):
        for seed in seeds:  # seed outermost: each finished seed is a complete comparison of the poolings
            for pooling in poolings:
                started = time.perf_counter()
                results.append(train_and_evaluate(name, runs[name], pooling, seed, args, vocab, shards))
                print(f"{name} {pooling} seed {seed}: done in {time.perf_counter() - started:.0f} s", flush=True)

    print(f"\n{args.config} encoder, dropout {args.dropout:g}, {args.steps} steps x "
          f"{args.batch} pairs, lr {args.lr}; accuracies are the "
          "mean of both retrieval directions")
    print("| run | pooling | seed | processes x batch | negatives per row | margin | scale | steps/s | "
          "gather share (fwd) | final loss | Multi30k test de/fr/cs-en | Tatoeba deu/fra/ces |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        per_rank = r["global_batch"] // r["nproc"]
        negatives = r["global_batch"] if (r["gather"] or r["nproc"] == 1) else per_rank
        m30 = "/".join(f"{v * 100:.1f}" for v in r["multi30k"].values())
        tat = "/".join(f"{v * 100:.1f}" for v in r["tatoeba"].values())
        print(f"| {r['run']} | {r['pooling']} | {r['seed']} | {r['nproc']} x {per_rank} | {negatives} | {r['margin']} | "
              f"{r['scale']:g} | {r['steps_per_s']:.2f} | {r['gather_forward_share'] * 100:.1f}% | "
              f"{r['final_loss']:.3f} | {m30} (mean {r['multi30k_mean'] * 100:.1f}) | {tat} "
              f"(mean {r['tatoeba_mean'] * 100:.1f}) |")
    if len(seeds) > 1:
        print("\nOver the seeds (Multi30k / Tatoeba mean %: mean, min-max):")
        for name in dict.fromkeys(r["run"] for r in results):
            for pooling in poolings:
                group = [r for r in results if r["run"] == name and r["pooling"] == pooling]
                summary = [f"{key} {statistics.mean(vals):.1f}, {min(vals):.1f}-{max(vals):.1f}"
                           for key in ("multi30k_mean", "tatoeba_mean")
                           for vals in [[r[key] * 100 for r in group]]]
                print(f"- {name} {pooling}, {len(group)} seeds: " + "; ".join(summary))
    # The ratios compare runs of the first pooling and seed.
    by_name = {r["run"]: r for r in results if r["pooling"] == poolings[0] and r["seed"] == seeds[0]}
    if {"2x32-gather", "2x32-gather-m0"} <= set(by_name):
        print(f"\n(a) margin 0.3 / margin 0, Multi30k mean accuracy ratio: "
              f"{by_name['2x32-gather']['multi30k_mean'] / max(by_name['2x32-gather-m0']['multi30k_mean'], 1e-9):.2f}")
    if {"2x32-gather", "2x32-local", "1x64"} <= set(by_name):
        g, l, b = (by_name[k]["multi30k_mean"] for k in ("2x32-gather", "2x32-local", "1x64"))
        print(f"(b) Multi30k mean accuracy: gathered / local-only {g / max(l, 1e-9):.2f}, gathered / 1x64 "
              f"{g / max(b, 1e-9):.2f}; steps/s 2 processes gathered / 1 process: "
              f"{by_name['2x32-gather']['steps_per_s'] / by_name['1x64']['steps_per_s']:.2f}")
    (args.work / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
