"""`make demo` (`python -m recipes.demo`): every stage on the sample data with DirectRunner, then one summary.

The demo sits at the top of the dependency order (recipes -> labse_model, vocab, pipelines), so this
module orders the steps and imports each directly. Each step is `step(data, out, artifacts) ->
list[str]` (the text steps in recipes/demo_text.py, mining and scoring in recipes/demo_mining.py); a
step records the paths it wrote in `artifacts` (for example `artifacts["clean_output"]`) for the
steps after it. The last step, defined here, is the model's: TFRecords -> pre-training -> 2-process
training -> export -> evaluation.

The model step runs the real commands: `labse-tfrecords` on Multi30k train (de/fr/cs-en) plus the
mining stage's scored pairs, `labse-pretrain` (MLM on the cleaning stage's sentences and Multi30k
train text, TLM on the shards, progressive stacking 1 -> 2 -> 4 layers), `labse-train
--nproc-per-node 2 --init-from` it (torchrun, gloo, gathered negatives) on the demo's vocabulary,
`labse-export` to `out/model`, then Tatoeba deu/fra/ces and Multi30k test_2016 de-en retrieval of
the exported model. A few minutes on 2 CPU cores: the numbers show the plumbing works and training
moves accuracy off chance, not LaBSE's quality.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

from pipelines.io.atomic import write_json_atomic
from pipelines.report.cli import write_report
from pipelines.report.config import ReportConfig

from pipelines.distill.demo import run_demo as distill_step
from recipes.demo_mining import mining_step
from recipes.demo_text import clean_step, main_content_step, vocab_step

# Sized to train in minutes on 2 shared CPU cores (what this size gives: BENCHMARKS.md, section model,
# "Demo sizing").
DEMO_CONFIG = "mini"
DEMO_STEPS = 300
DEMO_BATCH = 64
DEMO_LR = 1e-3
# From random weights the [CLS] vector learns only sentence length in a few hundred steps, while
# mean pooling learns the task (BENCHMARKS.md, section model, "Why the earlier runs stayed at
# chance"), so the demo trains with mean pooling and, as nothing is seen twice in 300 steps,
# without dropout. The LaBSE head (dense+tanh+L2) is kept.
DEMO_POOLING = "mean"
# A short pre-training (BENCHMARKS.md, pre-training, has what longer ones give).
DEMO_PRETRAIN_STEPS = 150
DEMO_PRETRAIN_BATCH = 32
DEMO_PRETRAIN_LR = 5e-4
DEMO_DROPOUT = 0.0


def train_argv(shards, vocab, run_dir: Path, *, init_from=None, steps: int = DEMO_STEPS,
               batch: int = DEMO_BATCH, nproc: int = 2, dev_data: str | None = None) -> list[str]:
    """labse-train's arguments with the demo's small settings (mean pooling, no dropout, gathered
    negatives over `nproc` gloo processes); also what `recipes.remine` trains with."""
    argv = ["--data", str(shards), "--vocab", str(vocab), "--output", str(run_dir),
            "--pooling", DEMO_POOLING, "--dropout", str(DEMO_DROPOUT), "--nproc-per-node", str(nproc),
            "--global-batch-size", str(batch), "--max-steps", str(steps), "--lr", str(DEMO_LR),
            "--warmup-steps", str(max(steps // 10, 1)), "--log-every", "10", "--save-every", str(steps),
            "--eval-every", "0"]
    if nproc > 1:
        argv.append("--gather-negatives")
    # the architecture comes from a starting point; without one, the demo's size
    argv += ["--init-from", str(init_from)] if init_from is not None else ["--config", DEMO_CONFIG]
    if dev_data:
        argv += ["--dev-data", dev_data, "--dev-max-pairs", "500"]
    return argv


def model_step(data: Path, out: Path, artifacts: dict) -> list[str]:
    """The model step: TFRecords, pre-training, training, export and retrieval scores."""
    from labse_model.evaluate import load_encoder, multi30k_retrieval_accuracy, tatoeba_accuracy
    from labse_model.export import main as export_main
    from labse_model.pretrain import main as pretrain_main
    from labse_model.train import main as train_main
    from pipelines.tfrecords import main as tfrecords_main

    vocab = artifacts.get("vocab")
    if not vocab or not Path(vocab).is_file():
        raise RuntimeError(
            "the model step needs the vocabulary step's artifacts['vocab'] (vocab.txt); run the demo "
            "with the vocabulary step first, e.g. --only vocab,model"
        )
    lines: list[str] = []

    # 1. TFRecords: Multi30k train pairs + the demo's scored pairs.
    shards = out / "tfrecords"
    argv = ["--vocab", vocab, "--output", str(shards), "--num-shards", "4", "--max-seq-length", "64",
            "--overwrite", "--direct_num_workers", "1"]
    for lang in ("de", "fr", "cs"):
        argv += ["--parallel-text", f"{lang}:{data / 'multi30k' / f'train.{lang}.gz'},en:{data / 'multi30k' / 'train.en.gz'}"]
    scored = artifacts.get("scored_pairs")
    if scored and Path(scored).exists():
        argv += ["--pairs", str(scored)]
    started = time.perf_counter()
    if tfrecords_main(argv) != 0:
        raise RuntimeError("labse-tfrecords failed")
    stats = json.loads((shards / "stats.json").read_text(encoding="utf-8"))
    lines.append(
        f"TFRecords: {stats['written_pairs']:,} pairs (Multi30k train de/fr/cs-en"
        + (f" + scored pairs from {scored}" if scored and Path(scored).exists() else "; no scored pairs from mining")
        + f"), dropped {stats.get('dropped') or 'none'}, {time.perf_counter() - started:.0f} s"
    )

    # 2. Pre-training: MLM on the demo's cleaned text and Multi30k train text, TLM on the shards,
    # stacked 1 -> 2 -> 4 layers; the dual encoder then starts from it.
    pretrained = out / "pretrain"
    if pretrained.exists():
        import shutil

        shutil.rmtree(pretrained)
    argv = ["--pairs", str(shards / "*.tfrecord*"), "--vocab", vocab, "--output", str(pretrained),
            "--config", DEMO_CONFIG, "--stage-layers", "1,2,4", "--stage-fractions", "2,4,9",
            "--max-steps", str(DEMO_PRETRAIN_STEPS), "--global-batch-size", str(DEMO_PRETRAIN_BATCH),
            "--max-seq-length", "64", "--tlm-fraction", "0.5", "--lr", str(DEMO_PRETRAIN_LR),
            "--warmup-steps", "10", "--log-every", "10", "--eval-every", "0", "--save-every", str(DEMO_PRETRAIN_STEPS),
            "--heldout-rate", "0.01"]
    clean = artifacts.get("clean_output")
    if clean and (Path(clean) / "sentences").is_dir() and any((Path(clean) / "sentences").glob("lang=*")):
        argv += ["--mono", str(Path(clean) / "sentences")]
    for lang in ("de", "fr", "cs", "en"):
        argv += ["--mono", f"{lang}:{data / 'multi30k' / f'train.{lang}.gz'}"]
    started = time.perf_counter()
    if pretrain_main(argv) != 0:
        raise RuntimeError("labse-pretrain failed")
    pt_summary = json.loads((pretrained / "pretrain_summary.json").read_text(encoding="utf-8"))
    stages = list(pt_summary["stages"].values())
    lines.append(
        f"labse-pretrain: {DEMO_CONFIG} encoder, MLM on {len(pt_summary['languages'])} languages "
        f"({'cleaned text + ' if clean else ''}Multi30k train) + TLM on the shards, "
        f"{' -> '.join(str(s['layers']) for s in stages)} layers, {pt_summary['step']} steps x {DEMO_PRETRAIN_BATCH} "
        f"sequences in {time.perf_counter() - started:.0f} s; held-out masked-token accuracy per stage "
        + " / ".join(f"{s.get('heldout_mlm_accuracy', float('nan')) * 100:.1f}%" for s in stages)
    )

    # 3. Training: 2 gloo processes, gathered negatives, from the pre-trained encoder.
    run_dir = out / "train"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    started = time.perf_counter()
    code = train_main(train_argv(
        shards / "*.tfrecord*", vocab, run_dir, init_from=pretrained,
        dev_data=f"de:{data / 'multi30k' / 'val.de.gz'},en:{data / 'multi30k' / 'val.en.gz'}"))
    if code != 0:
        raise RuntimeError(f"labse-train failed with exit code {code}")
    summary = json.loads((run_dir / "train_summary.json").read_text(encoding="utf-8"))
    lines.append(
        f"labse-train: the pre-trained {DEMO_CONFIG} encoder ({DEMO_POOLING} pooling -> dense+tanh -> L2), 2 processes x {DEMO_BATCH // 2} pairs, gathered negatives "
        f"(softmax over {DEMO_BATCH}), {summary['step']} steps in {time.perf_counter() - started:.0f} s "
        f"({summary['steps_per_second']:.2f} steps/s, forward gather {summary['gather_forward_share'] * 100:.1f}% "
        f"of step time); final loss {summary['final_loss']:.3f}"
    )
    if summary.get("dev_accuracy"):
        lines.append(f"dev (Multi30k val de-en, 500 pairs): retrieval accuracy {summary['dev_accuracy']['mean'] * 100:.1f}%")

    # 4. Export and evaluation of the exported directory.
    model_dir = out / "model"
    if export_main(["--run", str(run_dir), "--output", str(model_dir), "--overwrite"]) != 0:
        raise RuntimeError("labse-export failed")
    artifacts["model_dir"] = str(model_dir)
    encode = load_encoder(str(model_dir), device="cpu", batch_size=128)
    multi30k = multi30k_retrieval_accuracy(encode, data, pair=("de", "en"))
    tatoeba = tatoeba_accuracy(encode, data / "tatoeba", ["deu", "fra", "ces"])
    # in labse-eval --output's format, so labse-report finds them beside the other outputs
    write_json_atomic(out / "eval" / "multi30k.json", {
        "task": "multi30k", "model": str(model_dir), "split": "test_2016_flickr", "pairs": {"de-en": multi30k},
        "mean": multi30k["mean"]})
    write_json_atomic(out / "eval" / "tatoeba.json", {"task": "tatoeba", "model": str(model_dir), **tatoeba})
    lines.append(f"exported a sentence-transformers model to {model_dir}")
    lines.append(
        f"Multi30k test_2016 de-en retrieval ({multi30k['pairs']} captions): {multi30k['mean'] * 100:.1f}% "
        f"(de->en {multi30k['src->tgt'] * 100:.1f}%, en->de {multi30k['tgt->src'] * 100:.1f}%; chance 0.1%)"
    )
    per_lang = ", ".join(
        f"{lang} {row['mean'] * 100:.1f}%" for lang, row in tatoeba["languages"].items()
    )
    lines.append(f"Tatoeba (mean of both directions): {per_lang}; mean {tatoeba['mean'] * 100:.1f}% "
                 "(LaBSE: 83.7% over 112 languages; a few CPU minutes on captions do not transfer to Tatoeba)")
    return lines


DemoStep = Callable[[Path, Path, dict], list[str]]
# (name for --only, title, step), in data-flow order.
STEPS: list[tuple[str, str, DemoStep]] = [
    ("main_content", "main-content classifier", main_content_step),
    ("clean", "cleaning", clean_step),
    ("vocab", "vocabulary", vocab_step),
    ("mine", "mining and scoring", mining_step),
    ("distill", "static miner (labse-distill) and the mining cascade", distill_step),
    ("model", "TFRecords, pre-training, training, export, Tatoeba", model_step),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared sample data folder")
    parser.add_argument("--output", type=Path, default=Path("demo_out"))
    parser.add_argument("--only", default=None,
                        help=f"comma-separated steps to run (debugging): {','.join(name for name, _, _ in STEPS)}")
    args = parser.parse_args(argv)

    if not (args.data / "README.md").is_file():
        print(f"error: sample data not found at {args.data} (set LABSE_DATA)", file=sys.stderr)
        return 2
    selected = set(args.only.split(",")) if args.only else {name for name, _, _ in STEPS}
    unknown = selected - {name for name, _, _ in STEPS}
    if unknown:
        print(f"error: --only names unknown steps {sorted(unknown)}; the steps are "
              f"{','.join(name for name, _, _ in STEPS)}", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    artifacts: dict[str, str] = {}
    report: list[tuple[str, float, list[str]]] = []
    for name, title, step in STEPS:
        if name not in selected:
            continue
        print(f"\n=== {title} ({name}) ===", flush=True)
        started = time.perf_counter()
        lines = step(args.data.resolve(), args.output.resolve(), artifacts)
        seconds = time.perf_counter() - started
        report.append((title, seconds, lines))
        print(f"--- {title}: {seconds:.0f} s", flush=True)

    print("\n================ demo summary ================")
    total = 0.0
    for title, seconds, lines in report:
        total += seconds
        print(f"\n## {title} ({seconds:.0f} s)")
        for line in lines:
            print(line)
    print(f"\nall stages: {total:.0f} s; outputs under {args.output}/")
    output, sections, flags = write_report(str(args.output.resolve()), ReportConfig())
    print(f"run report ({sections} sections, {flags} flagged): {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
