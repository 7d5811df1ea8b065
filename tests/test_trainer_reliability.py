"""The trainers, labse-export and --init-from meet damaged checkpoints, bad numbers and absent devices.

Issue 15, items 6-8: a corrupt latest checkpoint is named and skipped for the newest one that
loads (or the command stops with one line when a step was asked for), nothing is ever unpickled,
and bad options are refused before any work starts, each as one line with exit status 2.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from labse_model import checkpoint as ckpt
from labse_model.export import main as export_main
from labse_model.run_log import read_metrics
from labse_model.starting_point import load_starting_point
from labse_model.train import main as train_main



def _args(vocab: Path, shards: str, output: Path, *extra: str) -> list[str]:
    # Dropout on (the default): a resume must restore RNG streams, so a wrong fallback shows in the losses.
    return ["--data", shards, "--vocab", str(vocab), "--output", str(output), "--config", "tiny",
            "--global-batch-size", "8", "--max-steps", "6", "--lr", "2e-3", "--warmup-steps", "2",
            "--log-every", "1", "--save-every", "3", "--keep-checkpoints", "0", *extra]


@pytest.fixture(scope="module")
def finished_run(pair_inputs, tmp_path_factory) -> Path:
    """A finished 6-step run with checkpoints at steps 3 and 6; tests damage copies of it."""
    vocab, shards = pair_inputs
    run = tmp_path_factory.mktemp("reliability_run") / "run"
    assert train_main(_args(vocab, shards, run)) == 0
    assert [step for step, _ in ckpt.list_checkpoints(run)] == [3, 6]
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run) if "loss" in m}


class _RunsCodeWhenUnpickled:
    """Unpickling this calls open(marker, "w"): the file appears if the loader ever unpickles it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


# How a file in the latest checkpoint gets damaged: a crash or a full disk truncates it, a bad copy
# fills it with garbage, or someone replaces the training state by a pickle that runs code.
def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def fill_with_garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def flip_one_bit(path: Path) -> None:
    """A changed byte of the same size, inside the tensor data (a safetensors file ends with it)."""
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10
    path.write_bytes(bytes(data))


def replace_with_code_pickle(path: Path) -> None:
    torch.save({"step": 6, "optimizer": _RunsCodeWhenUnpickled(path.parent / "PWNED")}, path)


DAMAGES = {
    "model-truncated": (ckpt.MODEL_FILE, truncate),
    "model-garbage": (ckpt.MODEL_FILE, fill_with_garbage),
    "model-bit-flip": (ckpt.MODEL_FILE, flip_one_bit),
    "state-truncated": (ckpt.STATE_FILE, truncate),
    "state-code-pickle": (ckpt.STATE_FILE, replace_with_code_pickle),
    "rng-garbage": ("rng-rank00000.pt", fill_with_garbage),
}


def _errors(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


def _warnings_about(caplog, text: str) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and text in record.getMessage()]


def _assert_never_unpickled_or_advised(run: Path, caplog, capsys) -> None:
    assert not list(run.rglob("PWNED")), "the pickled code ran"
    captured = capsys.readouterr()
    for text in (caplog.text, captured.err, captured.out):
        assert "weights_only=False" not in text and "weights_only` set to `False" not in text


# ----------------------------------------------------------------------------------------------
# Item 6: corrupt checkpoints


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_resume_skips_a_corrupt_latest_checkpoint_and_continues_exactly(pair_inputs, finished_run, tmp_path, caplog,
                                                                        capsys, damage):
    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    name, spoil = DAMAGES[damage]
    damaged = run / "checkpoints" / "step-00000006" / name
    spoil(damaged)
    original = _losses(finished_run)

    assert train_main(_args(vocab, shards, run, "--resume")) == 0

    fallback = _warnings_about(caplog, "the newest checkpoint that loads")
    assert len(fallback) == 1 and "\n" not in fallback[0]
    assert str(damaged) in fallback[0] and "step-00000003" in fallback[0]
    assert not _errors(caplog)
    _assert_never_unpickled_or_advised(run, caplog, capsys)
    # The damaged checkpoint is kept aside, out of every reader's way; the run rewrote steps 4-6
    # from step 3 exactly as the uninterrupted run had (the resume is bit-exact from any checkpoint).
    assert (run / "checkpoints" / "step-00000006.corrupt" / name).read_bytes() != \
        (finished_run / "checkpoints" / "step-00000006" / name).read_bytes()
    assert [step for step, _ in ckpt.list_checkpoints(run)] == [3, 6]
    assert _losses(run) == original


def test_a_code_pickle_is_refused_in_one_line_that_never_advises_unsafe_loading(finished_run, tmp_path, caplog,
                                                                               capsys):
    run = _copy(finished_run, tmp_path)
    state = run / "checkpoints" / "step-00000006" / ckpt.STATE_FILE
    replace_with_code_pickle(state)
    with pytest.raises(ckpt.CorruptCheckpointError) as raised:
        ckpt.load_training_state(state.parent)
    message = str(raised.value)
    assert message.startswith(str(state)) and "not a valid or trusted checkpoint" in message
    assert "\n" not in message and "weights_only" not in message
    _assert_never_unpickled_or_advised(run, caplog, capsys)


def test_an_explicit_step_that_is_corrupt_stops_with_one_line(pair_inputs, finished_run, tmp_path, caplog, capsys):
    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    state = run / "checkpoints" / "step-00000006" / ckpt.STATE_FILE
    replace_with_code_pickle(state)

    assert train_main(_args(vocab, shards, run, "--resume", "--resume-step", "6")) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and "\n" not in errors[0]
    assert str(state) in errors[0] and "not a valid or trusted checkpoint" in errors[0]
    _assert_never_unpickled_or_advised(run, caplog, capsys)
    assert [step for step, _ in ckpt.list_checkpoints(run)] == [3, 6]  # nothing renamed, nothing trained
    assert _losses(run) == _losses(finished_run)

    caplog.clear()
    assert train_main(_args(vocab, shards, run, "--resume-step", "3")) == 2
    assert _errors(caplog) == ["--resume-step needs --resume"]


def test_no_checkpoint_that_loads_is_one_line_naming_each(pair_inputs, finished_run, tmp_path, caplog):
    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    for step in ("step-00000003", "step-00000006"):
        truncate(run / "checkpoints" / step / ckpt.MODEL_FILE)
    assert train_main(_args(vocab, shards, run, "--resume")) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and "\n" not in errors[0] and errors[0].startswith(f"no checkpoint of {run} loads")
    assert "step-00000003" in errors[0] and "step-00000006" in errors[0]


def test_resume_from_an_earlier_step_sets_the_later_checkpoints_aside(pair_inputs, finished_run, tmp_path, caplog):
    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    assert train_main(_args(vocab, shards, run, "--resume", "--resume-step", "3")) == 0
    assert _losses(run) == _losses(finished_run)
    assert (run / "checkpoints" / "step-00000006.superseded" / ckpt.MODEL_FILE).is_file()
    assert [step for step, _ in ckpt.list_checkpoints(run)] == [3, 6]
    assert _warnings_about(caplog, "step-00000006.superseded")


def test_export_skips_a_corrupt_latest_checkpoint_unless_the_step_is_named(finished_run, tmp_path, caplog):
    run = _copy(finished_run, tmp_path)
    damaged = run / "checkpoints" / "step-00000006" / ckpt.MODEL_FILE
    fill_with_garbage(damaged)

    assert export_main(["--run", str(run), "--output", str(tmp_path / "model")]) == 0
    fallback = _warnings_about(caplog, "the newest checkpoint that loads")
    assert len(fallback) == 1 and str(damaged) in fallback[0] and "--step N" in fallback[0]
    assert (tmp_path / "model" / "modules.json").is_file()
    assert (run / "checkpoints" / "step-00000006").is_dir()  # export only reads the run

    caplog.clear()
    assert export_main(["--run", str(run), "--output", str(tmp_path / "model6"), "--step", "6"]) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and str(damaged) in errors[0] and "not a valid safetensors file" in errors[0]
    assert not (tmp_path / "model6").exists()


def test_init_from_skips_a_corrupt_latest_checkpoint_and_names_damaged_weights(pair_inputs, finished_run, tmp_path,
                                                                               caplog, capsys):
    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    damaged = run / "checkpoints" / "step-00000006" / ckpt.MODEL_FILE
    truncate(damaged)

    start = load_starting_point(run)
    assert start.source == run / "checkpoints" / "step-00000003" / ckpt.MODEL_FILE
    assert len(_warnings_about(caplog, "the newest checkpoint that loads")) == 1

    # A weights file named directly is used or refused, never replaced by another.
    new_run = tmp_path / "from_damaged"
    train_args = ["--data", shards, "--vocab", str(vocab), "--output", str(new_run), "--global-batch-size", "8",
                  "--max-steps", "1", "--init-from", str(damaged)]
    caplog.clear()
    assert train_main(train_args) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and str(damaged) in errors[0] and not new_run.exists()

    # A Hugging Face directory whose pytorch_model.bin is a code pickle.
    bert_dir = tmp_path / "bert"
    bert_dir.mkdir()
    (bert_dir / "config.json").write_text('{"model_type": "bert"}')
    torch.save({"embeddings.word_embeddings.weight": _RunsCodeWhenUnpickled(bert_dir / "PWNED")},
               bert_dir / "pytorch_model.bin")
    caplog.clear()
    assert train_main([*train_args[:-1], str(bert_dir)]) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and str(bert_dir / "pytorch_model.bin") in errors[0]
    assert "not a valid or trusted checkpoint" in errors[0]
    _assert_never_unpickled_or_advised(bert_dir, caplog, capsys)


# ----------------------------------------------------------------------------------------------
# Item 7: numbers out of range are refused before any work starts


def _assert_refused_before_any_work(status: int, caplog, tmp_path: Path, expected: str) -> None:
    """Exit 2 with one error line about the option. The data, vocabulary and output named on the
    command line do not exist: an error about them would mean work started before the check."""
    assert status == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert expected in errors[0], errors[0]
    assert not list(tmp_path.iterdir())  # no run directory, no lock file


NO_INPUTS = ["--data", "/no/such/shards/*.tfrecord", "--vocab", "/no/such/vocab.txt"]

BAD_TRAIN_OPTIONS = [
    (("--max-steps", "-1"), "max_steps must be an integer >= 1, got -1"),
    (("--max-steps", "0"), "max_steps must be an integer >= 1"),
    (("--global-batch-size", "0"), "global_batch_size must be an integer >= 2"),
    (("--lr", "nan"), "learning_rate (--lr) must be a finite number"),
    (("--lr", "inf"), "learning_rate (--lr) must be a finite number"),
    (("--lr", "-0.001"), "learning_rate (--lr) must be a finite number in [0, inf)"),
    (("--weight-decay", "-0.1"), "weight_decay must be"),
    (("--warmup-steps", "-1"), "warmup_steps must be an integer >= 0"),
    (("--max-grad-norm", "nan"), "max_grad_norm must be"),
    (("--dropout", "1"), "--dropout must be a finite number in [0, 1)"),
    (("--dropout", "nan"), "--dropout must be"),
    (("--margin", "inf"), "margin must be a finite number"),
    (("--margin", "-0.3"), "margin must be a finite number in [0, inf)"),
    (("--scale", "0"), "scale must be a finite number in (0, inf)"),
    (("--scale", "nan"), "scale must be"),
    (("--max-seq-length", "1"), "max_seq_length must be an integer >= 2"),
    (("--seed", "-1"), "seed must be an integer in [0, 2**63)"),
    (("--shuffle-window", "0"), "shuffle_window must be"),
    (("--grad-cache-chunk", "-2"), "grad_cache_chunk must be"),
    (("--log-every", "0"), "log_every must be an integer >= 1"),
    (("--save-every", "-1"), "save_every must be"),
    (("--eval-every", "-1"), "eval_every must be"),
    (("--keep-checkpoints", "-1"), "keep_checkpoints must be"),
    (("--num-workers", "-1"), "num_workers must be"),
    (("--dev-max-pairs", "0"), "--dev-max-pairs must be an integer >= 1"),
    (("--nproc-per-node", "0"), "--nproc-per-node must be an integer >= 1"),
    (("--stop-after-steps", "0"), "--stop-after-steps must be an integer >= 1"),
    (("--resume", "--resume-step", "0"), "--resume-step must be an integer >= 1"),
    (("--resume", "--max-steps", "-5"), "max_steps must be an integer >= 1"),  # checked on resume too
]


@pytest.mark.parametrize("option,expected", BAD_TRAIN_OPTIONS, ids=[" ".join(o) for o, _ in BAD_TRAIN_OPTIONS])
def test_train_refuses_numbers_out_of_range_before_any_work(tmp_path, caplog, option, expected):
    status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--config", "tiny", *option])
    _assert_refused_before_any_work(status, caplog, tmp_path, expected)


BAD_PRETRAIN_OPTIONS = [
    (("--max-steps", "-1"), "max_steps must be an integer >= 1, got -1"),
    (("--global-batch-size", "0"), "global_batch_size must be an integer >= 1"),
    (("--lr", "0"), "learning_rate (--lr) must be a finite number in (0, inf)"),
    (("--lr", "nan"), "learning_rate (--lr) must be"),
    (("--warmup-steps", "-1"), "warmup_steps must be"),
    (("--dropout", "1.5"), "--dropout must be"),
    (("--mask-prob", "0"), "mask_prob must be a finite number in (0, 1)"),
    (("--mask-prob", "nan"), "mask_prob must be"),
    (("--max-predictions", "0"), "max_predictions must be"),
    (("--tlm-fraction", "1.5"), "tlm_fraction must be a finite number in [0, 1]"),
    (("--lang-alpha", "-1"), "lang_alpha must be"),
    (("--lang-alpha", "inf"), "lang_alpha must be"),
    (("--stage-layers", "1,0", "--stage-fractions", "1,1"), "stage_layers entry must be an integer >= 1"),
    (("--stage-fractions", "1,inf"), "stage_fractions entry must be a finite number in (0, inf)"),
    (("--heldout-rate", "1"), "heldout_rate must be a finite number in [0, 1)"),
    (("--heldout-per-language", "0"), "heldout_per_language must be"),
    (("--max-seq-length", "4"), "max_seq_length must be an integer >= 5"),
    (("--max-grad-norm", "-1"), "max_grad_norm must be"),
    (("--seed", "-1"), "seed must be"),
    (("--log-every", "0"), "log_every must be"),
    (("--nproc-per-node", "-2"), "--nproc-per-node must be"),
]


@pytest.mark.parametrize("option,expected", BAD_PRETRAIN_OPTIONS,
                         ids=[" ".join(o) for o, _ in BAD_PRETRAIN_OPTIONS])
def test_pretrain_refuses_numbers_out_of_range_before_any_work(tmp_path, caplog, option, expected):
    from labse_model.pretrain import main as pretrain_main

    status = pretrain_main(["--mono", "/no/such/sentences", "--vocab", "/no/such/vocab.txt", "--output",
                            str(tmp_path / "pt"), "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions",
                            "1,1", *option])
    _assert_refused_before_any_work(status, caplog, tmp_path, expected)


def test_a_run_config_with_a_bad_number_is_refused_naming_the_file(pair_inputs, finished_run, tmp_path, caplog):
    import json

    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["train"]["learning_rate"] = float("nan")  # json writes NaN, which Python's json reads back
    (run / "config.json").write_text(json.dumps(config))

    assert train_main(_args(vocab, shards, run, "--resume")) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and str(run / "config.json") in errors[0] and "learning_rate (--lr)" in errors[0]
    caplog.clear()
    assert export_main(["--run", str(run), "--output", str(tmp_path / "model")]) == 2
    assert len(_errors(caplog)) == 1 and str(run / "config.json") in _errors(caplog)[0]


def test_a_checkpoint_of_another_model_is_refused_in_one_line(pair_inputs, finished_run, tmp_path, caplog, capsys):
    """config.json describing another model than the checkpoint holds (a checkpoint copied into the
    wrong run, an edited config): export and --resume stop with one line naming the weights file,
    exit 2, no traceback (it used to be a bare ValueError)."""
    import json

    vocab, shards = pair_inputs
    run = _copy(finished_run, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["model"]["intermediate_size"] *= 2
    (run / "config.json").write_text(json.dumps(config))
    weights = run / "checkpoints" / "step-00000006" / ckpt.MODEL_FILE

    assert export_main(["--run", str(run), "--output", str(tmp_path / "model")]) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and str(weights) in errors[0] and "does not match the model" in errors[0]
    assert "\n" not in errors[0] and not (tmp_path / "model").exists()
    caplog.clear()
    assert train_main(_args(vocab, shards, run, "--resume")) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and str(weights) in errors[0] and "other shapes" in errors[0]
    assert "Traceback" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Item 8: a device this host does not have is refused before any work starts

NO_GPU = "no CUDA GPU is available on this host"


@pytest.mark.parametrize("device,expected", [
    ("cuda:7", NO_GPU), ("cuda", NO_GPU), ("tpu", "the trainers run on cpu, cuda"),
    ("mps", "the trainers run on cpu, cuda"), ("cuda:x", "the trainers run on cpu, cuda"),
])
def test_a_device_this_cpu_host_lacks_is_refused_before_any_work(tmp_path, caplog, monkeypatch, device, expected):
    from labse_model.pretrain import main as pretrain_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this host has no GPU, whatever torch sees
    status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--config", "tiny", "--device", device])
    _assert_refused_before_any_work(status, caplog, tmp_path, f"--device {device}: {expected}")
    caplog.clear()
    status = pretrain_main(["--mono", "/no/such/sentences", "--vocab", "/no/such/vocab.txt", "--output",
                            str(tmp_path / "pt"), "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions",
                            "1,1", "--device", device])
    _assert_refused_before_any_work(status, caplog, tmp_path, f"--device {device}: {expected}")


@pytest.mark.parametrize("options,expected", [
    (("--device", "cuda:7"), "--device cuda:7: this host has 1 GPU (cuda:0 to cuda:0)"),
    (("--device", "cuda", "--nproc-per-node", "2"), "2 processes on this host need one GPU each with --device cuda"),
    (("--nproc-per-node", "2"), "2 processes on this host need one GPU each with the default device"),
    (("--device", "cuda:0", "--nproc-per-node", "2"), "--device cuda:0 names one GPU for 2 processes"),
])
def test_a_gpu_this_one_gpu_host_lacks_is_refused_before_any_work(tmp_path, caplog, monkeypatch, options, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--config", "tiny", *options])
    _assert_refused_before_any_work(status, caplog, tmp_path, expected)


def test_the_one_gpu_of_a_one_gpu_host_passes_the_device_check(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in ("cuda:0", "cuda", "cpu"):
        caplog.clear()
        status = train_main([*NO_INPUTS, "--output", str(tmp_path / "run"), "--device", device])
        # Past the device check, the first thing train() looks at is the missing data.
        _assert_refused_before_any_work(status, caplog, tmp_path, "matches no files")


def test_weights_carry_a_digest_that_catches_a_same_size_change_and_files_without_one_still_read(tmp_path):
    from safetensors.torch import save_file

    tensors = {"bert.embeddings.weight": torch.randn(7, 4).to(torch.bfloat16), "head.bias": torch.zeros(4),
               "step": torch.tensor(3)}
    path = tmp_path / "encoder.safetensors"
    ckpt.save_weights(tensors, path)
    read = ckpt.read_weights(path)
    assert all(torch.equal(read[name], tensors[name]) for name in tensors)
    flip_one_bit(path)
    with pytest.raises(ckpt.CorruptCheckpointError, match="do not match the sha256"):
        ckpt.read_weights(path)
    # A file written elsewhere (a Hugging Face model.safetensors) has no digest: read as it is.
    foreign = tmp_path / "model.safetensors"
    save_file({"weight": torch.ones(2, 2)}, str(foreign), metadata={"format": "pt"})
    assert torch.equal(ckpt.read_weights(foreign)["weight"], torch.ones(2, 2))


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
