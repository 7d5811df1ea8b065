"""Pre-training benchmark on CPU: LaBSE's pre-training ablation at toy scale, with the project's commands.

Inputs, as benchmarks/train.py builds them (same vocabulary and fine-tuning shards):
  labse-vocab (Multi30k train en/de/fr/cs, 8,000 tokens) -> labse-tfrecords (de/fr/cs-en train pairs)
  plus a fifth of the pairs (the first 1/5 of each train file) as a second set of shards.

Pre-training (labse-pretrain, mini encoder): MLM on the Multi30k train text of en/de/fr/cs (each
language as monolingual text) and TLM on the FIFTH of the pairs only, so that the data-saving
comparison below never shows the pre-trained model a pair the 1/5 fine-tuning does not see.
  stacked   --stage-layers 1,2,4 --stage-fractions 2,4,9 (LaBSE's L/4, L/2, L)
  flat      --stage-layers 4 --stage-fractions 1 (no stacking), the same steps

Fine-tuning (labse-train, as benchmarks/train.py: 1 process x 64 pairs, 300 steps, lr 1e-3 (--lr), margin
0.3, scale 20, dropout 0, 32 tokens), each for every --seeds:
  cls-random / cls-pretrained          [CLS] pooling from random weights vs from `stacked`
  mean-random / mean-pretrained        mean pooling, the same
  mean-pretrained-fifth                mean pooling from `stacked`, fine-tuned on the fifth only
  cls-pretrained-fifth                 the same with [CLS]
  cls-flat                             [CLS] from the flat pre-training (does stacking cost quality?)
then labse-export and Multi30k test_2016 de/fr/cs-en and Tatoeba deu/fra/ces retrieval.

Usage (BENCHMARKS.md, section pre-training, has the commands and results):
  nice -n 5 .venv/bin/python benchmarks/pretrain.py --data ../shared/data --work bench_out/pretrain
Finished steps are skipped when the script is re-run (delete --work to start over). A fine-tuning lr
other than the default (--lr) is part of every name (results/RUN-lrX-seedN.json, runs/, models/, logs/,
results-lrX.json), so a sweep over --lr keeps each lr's results apart.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import PY, build_inputs, run  # noqa: E402  (benchmarks/train.py: the same inputs and runner)

LANGS = ("de", "fr", "cs")
FINE_TUNES = {
    "cls-random": dict(pooling="cls", init=None, pairs="all"),
    "cls-pretrained": dict(pooling="cls", init="stacked", pairs="all"),
    "mean-random": dict(pooling="mean", init=None, pairs="all"),
    "mean-pretrained": dict(pooling="mean", init="stacked", pairs="all"),
    "mean-pretrained-fifth": dict(pooling="mean", init="stacked", pairs="fifth"),
    "cls-pretrained-fifth": dict(pooling="cls", init="stacked", pairs="fifth"),
    "cls-flat": dict(pooling="cls", init="flat", pairs="all"),
}
PRETRAININGS = {"stacked": ("1,2,4", "2,4,9"), "flat": ("4", "1")}
DEFAULT_FINE_TUNE_LR = 1e-3  # benchmarks/train.py's


def fifth_shards(data: Path, work: Path, vocab: Path) -> str:
    """Shards of the first fifth of each Multi30k train file (the 'less parallel data' set)."""
    shards = work / "shards_fifth"
    if (shards / "schema.json").is_file():
        return str(shards / "*.tfrecord*")
    texts = work / "fifth_text"
    texts.mkdir(parents=True, exist_ok=True)
    for lang in (*LANGS, "en"):
        with gzip.open(data / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        with gzip.open(texts / f"train.{lang}.gz", "wt", encoding="utf-8") as out:
            out.write("\n".join(lines[: len(lines) // 5]) + "\n")
    argv = [PY, "-m", "pipelines.tfrecords", "--vocab", str(vocab), "--output", str(shards),
            "--num-shards", "2", "--max-seq-length", "64", "--overwrite"]
    for lang in LANGS:
        argv += ["--parallel-text", f"{lang}:{texts / f'train.{lang}.gz'},en:{texts / 'train.en.gz'}"]
    print(f"labse-tfrecords (fifth): {run(argv, work / 'tfrecords_fifth.log'):.0f} s", flush=True)
    return str(shards / "*.tfrecord*")


def pretrain(name: str, args, vocab: Path, pairs: str) -> dict:
    out = args.work / "pretrained" / name
    if (out / "encoder.safetensors").is_file():
        return json.loads((out / "pretrain_summary.json").read_text())
    layers, fractions = PRETRAININGS[name]
    argv = [PY, "-m", "labse_model.pretrain", "--pairs", pairs, "--vocab", str(vocab), "--output", str(out),
            "--config", "mini", "--stage-layers", layers, "--stage-fractions", fractions,
            "--max-steps", str(args.pretrain_steps), "--global-batch-size", str(args.pretrain_batch),
            "--max-seq-length", str(args.pretrain_seq_length), "--tlm-fraction", "0.5", "--lr", str(args.pretrain_lr),
            "--warmup-steps", str(args.pretrain_warmup), "--dropout", "0.1", "--log-every", "10",
            "--eval-every", "0", "--save-every", "250", "--heldout-rate", "0.01", "--seed", "1",
            "--mlm-shuffle-window", str(args.mlm_shuffle_window)]
    for lang in (*LANGS, "en"):
        argv += ["--mono", f"{lang}:{args.data / 'multi30k' / f'train.{lang}.gz'}"]
    if any((out / "checkpoints").glob("step-*[0-9]")):
        argv.append("--resume")  # an interrupted benchmark continues where it stopped
    elif out.exists():
        # killed before its first checkpoint: nothing to resume from, and labse-pretrain refuses a used dir
        print(f"pretrain {name}: no checkpoint in {out}, starting it over", flush=True)
        shutil.rmtree(out)
    wall = run(argv, args.work / "logs" / f"pretrain-{name}.log")
    summary = json.loads((out / "pretrain_summary.json").read_text())
    summary["wall_s"] = wall
    (out / "pretrain_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def lr_tag(lr: float) -> str:
    """'-lrX' for a fine-tuning lr other than the default, '' for the default, so that a sweep's
    results, runs, models, logs and summary never overwrite another lr's (earlier default-lr
    results keep their names)."""
    return "" if lr == DEFAULT_FINE_TUNE_LR else f"-lr{lr:g}"


def fine_tune(name: str, seed: int, args, vocab: Path, shards: dict[str, str]) -> dict:
    spec = FINE_TUNES[name]
    tag = f"{name}{lr_tag(args.lr)}-seed{seed}"
    result_path = args.work / "results" / f"{tag}.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    run_dir, model_dir = args.work / "runs" / tag, args.work / "models" / tag
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    argv = [PY, "-m", "labse_model.train", "--data", shards[spec["pairs"]], "--vocab", str(vocab),
            "--output", str(run_dir), "--global-batch-size", "64", "--max-steps", str(args.steps),
            "--lr", str(args.lr), "--warmup-steps", str(args.steps // 10), "--margin", "0.3", "--scale", "20",
            "--save-every", str(args.steps), "--eval-every", "0", "--log-every", "10", "--seed", str(seed),
            "--max-seq-length", "32", "--pooling", spec["pooling"], "--dropout", "0"]
    if spec["init"]:
        argv += ["--init-from", str(args.work / "pretrained" / spec["init"])]
    else:
        argv += ["--config", "mini"]
    wall = run(argv, args.work / "logs" / f"{tag}.train.log")
    run([PY, "-m", "labse_model.export", "--run", str(run_dir), "--output", str(model_dir), "--overwrite"],
        args.work / "logs" / f"{tag}.export.log")

    from labse_model.evaluate import load_encoder, multi30k_retrieval_accuracies, tatoeba_accuracy

    encode = load_encoder(str(model_dir), device="cpu", batch_size=128)
    accuracies = multi30k_retrieval_accuracies(encode, args.data, [(lang, "en") for lang in LANGS])
    multi30k = {lang: accuracies[f"{lang}-en"]["mean"] for lang in LANGS}
    tatoeba = tatoeba_accuracy(encode, args.data / "tatoeba", ["deu", "fra", "ces"])
    result = {"run": name, "seed": seed, "lr": args.lr, **spec, "train_wall_s": wall, "multi30k": multi30k,
              "multi30k_mean": sum(multi30k.values()) / len(LANGS),
              "tatoeba": {k: v["mean"] for k, v in tatoeba["languages"].items()}, "tatoeba_mean": tatoeba["mean"]}
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=2))
    return result


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values) * 100
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} (min {min(values) * 100:.1f}, max {max(values) * 100:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("LABSE_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, default=Path("bench_out/pretrain"))
    parser.add_argument("--pretrain-steps", type=int, default=2000)
    parser.add_argument("--pretrain-batch", type=int, default=64)
    parser.add_argument("--pretrain-seq-length", type=int, default=64)
    parser.add_argument("--pretrain-lr", type=float, default=1e-3)
    parser.add_argument("--mlm-shuffle-window", type=int, default=1000,
                        help="labse-pretrain's window of shuffled MLM sequences (1: file order)")
    parser.add_argument("--pretrain-warmup", type=int, default=20, help="steps of warm-up in every stage")
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps (x 64 pairs)")
    parser.add_argument("--lr", type=float, default=DEFAULT_FINE_TUNE_LR,
                        help="fine-tuning peak learning rate (a sweep: run again with another value)")
    parser.add_argument("--seeds", default="1,2,3", help="fine-tuning seeds")
    parser.add_argument("--runs", default=",".join(FINE_TUNES), help="fine-tuning runs to make")
    parser.add_argument("--pretrainings", default="stacked,flat")
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args(argv)
    args.data, args.work = args.data.resolve(), args.work.resolve()
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "2")

    # The same vocabulary and full shards as benchmarks/train.py (its --work layout: vocab/, shards/).
    vocab, all_shards = build_inputs(args.data, args.work, args.vocab_size)
    shards = {"all": all_shards, "fifth": fifth_shards(args.data, args.work, vocab)}
    pretrained = {}
    for name in args.pretrainings.split(","):
        started = time.perf_counter()
        pretrained[name] = pretrain(name, args, vocab, shards["fifth"])
        print(f"pretrain {name}: {time.perf_counter() - started:.0f} s", flush=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict]] = {}
    for seed in seeds:  # seed-major: an interrupted benchmark has every run at least once
        for name in args.runs.split(","):
            started = time.perf_counter()
            results.setdefault(name, []).append(fine_tune(name, seed, args, vocab, shards))
            print(f"{name} seed {seed}: {time.perf_counter() - started:.0f} s", flush=True)

    print(f"\nPre-training (mini, {args.pretrain_steps} steps x {args.pretrain_batch} sequences of "
          f"{args.pretrain_seq_length} tokens, half TLM):")
    print("| pre-training | stages | wall s | tokens/s per stage | held-out MLM loss / accuracy at the end | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, summary in pretrained.items():
        stages = list(summary["stages"].values())
        last = stages[-1]
        print(f"| {name} | {'/'.join(str(s['layers']) for s in stages)} layers | {summary.get('wall_s', float('nan')):.0f} | "
              f"{' / '.join(format(s['tokens_per_second'], '.0f') for s in stages)} | "
              f"{last.get('heldout_mlm_loss', float('nan')):.3f} / {last.get('heldout_mlm_accuracy', float('nan')) * 100:.1f}% | "
              f"{summary['peak_memory_bytes'] / 2**20:.0f} |")
    print(f"\nFine-tuning ({args.steps} steps x 64 pairs, lr {args.lr:g}; mean over seeds {seeds}, min and max in brackets):")
    print("| run | pooling | init | pairs | Multi30k de/fr/cs-en mean % | Tatoeba deu/fra/ces mean % |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        spec = FINE_TUNES[name]
        print(f"| {name} | {spec['pooling']} | {spec['init'] or 'random'} | {spec['pairs']} | "
              f"{_spread([r['multi30k_mean'] for r in rows])} | {_spread([r['tatoeba_mean'] for r in rows])} |")

    def mean_of(name: str) -> float:
        return statistics.fmean(r["multi30k_mean"] for r in results[name]) if name in results else float("nan")

    print(f"\n[CLS]: pre-trained / random, Multi30k: {mean_of('cls-pretrained') / max(mean_of('cls-random'), 1e-9):.1f}x")
    print(f"mean: pre-trained / random: {mean_of('mean-pretrained') / max(mean_of('mean-random'), 1e-9):.2f}x")
    print(f"data saving: mean pooling, pre-trained on 1/5 of the pairs / random on all: "
          f"{mean_of('mean-pretrained-fifth') / max(mean_of('mean-random'), 1e-9):.2f}x")
    if {"stacked", "flat"} <= set(pretrained):
        s, f = pretrained["stacked"], pretrained["flat"]
        print(f"stacking: wall-clock stacked / flat {s.get('wall_s', 0) / max(f.get('wall_s', 1e-9), 1e-9):.2f}; "
              f"[CLS] fine-tuned from stacked / flat: {mean_of('cls-pretrained') / max(mean_of('cls-flat'), 1e-9):.2f}x")
    (args.work / f"results{lr_tag(args.lr)}.json").write_text(json.dumps({"pretrained": pretrained, "fine_tuned": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
