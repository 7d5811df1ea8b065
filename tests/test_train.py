"""labse-train on real Multi30k shards: the run directory, checkpoints, and an exact --resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from labse_model import checkpoint as ckpt
from labse_model.optim import lr_lambda
from labse_model.run_log import read_metrics
from labse_model.train import main as train_main



def _args(vocab: Path, shards: str, output: Path, *extra: str) -> list[str]:
    # Dropout stays on: resuming must restore the RNG streams, not only weights and optimizer.
    return ["--data", shards, "--vocab", str(vocab), "--output", str(output), "--config", "tiny",
            "--global-batch-size", "8", "--max-steps", "6", "--lr", "2e-3", "--warmup-steps", "2",
            "--log-every", "1", "--save-every", "3", "--scale", "20", *extra]


# Gradient caching in chunks of 3 (3 + 3 + a ragged 2 per batch of 8) re-encodes each chunk from a
# saved RNG state: a resume must still be bit-exact, and the run must record the setting.
@pytest.mark.parametrize("grad_cache_chunk", [0, 3], ids=["uncached", "grad-cache"])
def test_resume_continues_exactly(pair_inputs, labse_data, tmp_path, grad_cache_chunk):
    vocab, shards = pair_inputs
    dev = f"de:{labse_data}/multi30k/val.de.gz,en:{labse_data}/multi30k/val.en.gz"
    interrupted, straight = tmp_path / "interrupted", tmp_path / "straight"
    chunking = ("--grad-cache-chunk", str(grad_cache_chunk))

    assert train_main(_args(vocab, shards, interrupted, "--stop-after-steps", "3", *chunking)) == 0
    assert [step for step, _ in ckpt.list_checkpoints(interrupted)] == [3]
    # A crash while writing a checkpoint leaves only a hidden staging folder, which is ignored.
    (interrupted / "checkpoints" / ".tmp-step-00000004").mkdir()
    # The chunk size is not passed again: a resume takes it from the run's config.json.
    assert train_main(_args(vocab, shards, interrupted, "--resume", "--dev-data", dev, "--dev-max-pairs", "64",
                            "--eval-every", "3")) == 0
    assert train_main(_args(vocab, shards, straight, *chunking)) == 0

    def losses(run: Path) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}

    assert sorted(losses(interrupted)) == [1, 2, 3, 4, 5, 6]
    assert losses(interrupted) == losses(straight)  # bit-identical, steps 4-6 included
    assert len(set(losses(straight).values())) == 6  # and the loss really changes from step to step
    final_a = load_file(ckpt.find_checkpoint(interrupted) / ckpt.MODEL_FILE)
    final_b = load_file(ckpt.find_checkpoint(straight) / ckpt.MODEL_FILE)
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_b)

    # The run directory (contract 9) and what the resumed run evaluated.
    config = json.loads((interrupted / "config.json").read_text())
    assert config["model"]["num_layers"] == 2 and config["model"]["vocab_size"] == 2000
    assert config["train"]["additive_margin"] == 0.3 and config["train"]["scale"] == 20.0
    assert config["train"]["grad_cache_chunk"] == grad_cache_chunk
    assert (interrupted / "vocab.txt").read_text() == vocab.read_text()
    state = ckpt.load_training_state(ckpt.find_checkpoint(interrupted))
    assert state["step"] == 6 and state["data_position"] == 6
    summary = json.loads((interrupted / "train_summary.json").read_text())
    assert summary["finished"] and 0.0 <= summary["dev_accuracy"]["mean"] <= 1.0
    assert summary["grad_cache_chunk"] == grad_cache_chunk
    dev_rows = [m for m in read_metrics(interrupted) if "dev_mean" in m]
    assert [m["step"] for m in dev_rows] == [3, 6] or [m["step"] for m in dev_rows] == [6]
    assert list((interrupted / "tensorboard").glob("events.out.tfevents.*"))


def test_refuses_to_overwrite_and_to_resume_nothing(pair_inputs, tmp_path, caplog):
    vocab, shards = pair_inputs
    run = tmp_path / "run"
    assert train_main(_args(vocab, shards, tmp_path / "empty", "--resume")) == 2
    assert "nothing to resume" in caplog.text
    assert train_main(_args(vocab, shards, run, "--max-steps", "1")) == 0
    # the warm-up (2 steps) is not shorter than the run: said, with the value that fits
    assert "--warmup-steps 2 is not shorter than --max-steps 1: the learning rate never reaches --lr" in caplog.text
    assert "give --warmup-steps <= 0" in caplog.text
    assert train_main(_args(vocab, shards, run, "--max-steps", "1")) == 2
    assert "pass --resume" in caplog.text
    assert train_main(_args(vocab, "/no/such/*.tfrecord", tmp_path / "other")) == 2
    assert "matches no files" in caplog.text


def test_learning_rate_schedule():
    factor = lr_lambda(warmup_steps=4, max_steps=12)
    assert [round(factor(s), 4) for s in range(13)] == [
        0.25, 0.5, 0.75, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0
    ]


def test_a_run_into_a_symlink_of_a_running_run_dir_is_refused(pair_inputs, tmp_path, caplog):
    """Issue 26, item 6: the lock was keyed on the path text, so `ptA` and a symlink to it were two
    locks and two runs interleaved one directory's logs and checkpoints."""
    from labse_model.cli import run_dir_lock
    from labse_model.distributed import DistributedContext

    vocab, shards = pair_inputs
    real, link = tmp_path / "runA", tmp_path / "linkA"
    real.mkdir()
    link.symlink_to(real)
    main_rank = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    with run_dir_lock(real, main_rank):  # a run into runA holds its lock
        assert train_main(_args(vocab, shards, link)) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "lock" in errors[0].lower()
    assert not any(real.iterdir())  # the refused run wrote nothing


def test_compile_wraps_the_trained_model_and_attention_is_fused_sdpa(tmp_path):
    """GPU readiness that a CPU can check: --compile puts torch.compile around what the loop calls
    (checkpoints keep the plain module) and the encoder's attention is torch's fused SDPA."""
    from labse_model.config import ModelConfig, TrainConfig
    from labse_model.distributed import DistributedContext
    from labse_model.encoder import DualEncoder
    from labse_model.loop import LoopParts

    model = DualEncoder(ModelConfig.from_preset("tiny", 100))
    ctx = DistributedContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))

    def parts(compile_: bool) -> LoopParts:
        return LoopParts(ctx=ctx, run_dir=tmp_path, model=model.encoder, trained=model, optimizer=None,
                         scheduler=None, settings=TrainConfig(compile=compile_), log=None)

    assert parts(False).trained is model
    compiled = parts(True)
    assert compiled.trained is not model and compiled.trained._orig_mod is model and compiled.model is model.encoder
    assert model.encoder.bert.config._attn_implementation == "sdpa"


@pytest.fixture
def saved_run(tmp_path):
    """A run directory's config.json and vocab.txt as labse-train writes them (tiny, pooling mean); no training."""
    import shutil

    from labse_model.train import build_parser, make_run_config

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefgh"]) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    args = build_parser().parse_args(["--data", "x", "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                                      "--pooling", "mean"])
    config = make_run_config(args, world_size=1)
    config.save(run / "config.json")
    shutil.copyfile(vocab, run / "vocab.txt")
    return run, vocab


def _changed_on_resume(run: Path, vocab: Path, *options: str) -> list[str]:
    from labse_model.cli import given_options
    from labse_model.config import RunConfig
    from labse_model.train import build_parser, changed_settings

    argv = ["--data", "x", "--vocab", str(vocab), "--output", str(run), "--resume", *options]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given_options = given_options(parser, argv)
    return changed_settings(args, RunConfig.load(run / "config.json"), run)


@pytest.mark.parametrize("option, value, shown", [
    ("--config", "mini", "--config mini (run: tiny)"),
    ("--pooling", "cls", "--pooling cls (run: mean)"),
    ("--init-from", "/elsewhere/encoder", "--init-from /elsewhere/encoder (run: None)"),
])
def test_resume_names_a_changed_model_setting(saved_run, option, value, shown):
    run, vocab = saved_run
    assert _changed_on_resume(run, vocab, option, value) == [shown]


def test_resume_names_a_vocabulary_of_other_contents_and_accepts_a_copy(saved_run, tmp_path):
    run, vocab = saved_run
    copy = tmp_path / "copy.txt"
    copy.write_bytes(vocab.read_bytes())
    assert _changed_on_resume(run, copy) == []
    other = tmp_path / "other.txt"
    other.write_text(vocab.read_text(encoding="utf-8") + "ij\n", encoding="utf-8")
    assert _changed_on_resume(run, other) == [f"--vocab {other} (not the run's vocab.txt: other contents)"]


def test_resume_accepts_the_runs_own_model_settings_given_again(saved_run):
    run, vocab = saved_run
    assert _changed_on_resume(run, vocab, "--config", "tiny", "--pooling", "mean") == []
