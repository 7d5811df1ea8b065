"""--resume refuses other inputs and changed settings in one line (issue 26, item 7).

Before, labse-train resumed with other --data, or with --lr / --margin / --grad-cache-chunk given
anew (kept at the run's values without a word), and labse-pretrain with another --mono set.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from labse_model.run_inputs import check_same_inputs, fingerprint


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


def _train_args(vocab: Path, shards: str, output: Path, *extra: str) -> list[str]:
    return ["--data", shards, "--vocab", str(vocab), "--output", str(output), "--config", "tiny",
            "--global-batch-size", "8", "--max-steps", "2", "--log-every", "1", "--warmup-steps", "0",
            "--lr", "1e-3", "--margin", "0.3", *extra]


@pytest.fixture(scope="module")
def train_run(pair_inputs, tmp_path_factory) -> Path:
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    run = tmp_path_factory.mktemp("inputs_run") / "run"
    assert train_main(_train_args(vocab, shards, run, "--stop-after-steps", "1")) == 0
    return run


def _refused(argv: list[str], run: Path, caplog, main, config: str = "config.json") -> str:
    config_before = (run / config).read_bytes()
    caplog.clear()
    assert main(argv) == 2
    errors = _errors(caplog)
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert (run / config).read_bytes() == config_before  # nothing rewritten
    return errors[0]


def test_train_resume_refuses_other_shards(pair_inputs, train_run, tmp_path, caplog):
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    one_shard = sorted(Path(shards).parent.glob("*.tfrecord"))[0]
    error = _refused(_train_args(vocab, str(one_shard), train_run, "--resume"), train_run, caplog, train_main)
    assert "--data is not what" in error and "1 of its files are not given" in error

    # Same names and sizes, other bytes: a copy of the shards with one byte of the first record changed.
    copy = tmp_path / "copy"
    shutil.copytree(Path(shards).parent, copy)
    damaged = sorted(copy.glob("*.tfrecord"))[0]
    data = bytearray(damaged.read_bytes())
    data[40] ^= 0xFF
    damaged.write_bytes(bytes(data))
    error = _refused(_train_args(vocab, str(copy / "*.tfrecord"), train_run, "--resume"), train_run, caplog, train_main)
    assert "same files and sizes, other content" in error


@pytest.mark.parametrize("option, value, shown", [
    ("--lr", "5e-3", "--lr 0.005 (run: 0.001)"),
    ("--margin", "0.1", "--margin 0.1 (run: 0.3)"),
    ("--grad-cache-chunk", "2", "--grad-cache-chunk 2 (run: 0)"),
    ("--dropout", "0.2", "--dropout 0.2 (run: 0.1)"),
])
def test_train_resume_refuses_a_setting_it_cannot_change(pair_inputs, train_run, caplog, option, value, shown):
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    args = _train_args(vocab, shards, train_run, "--resume")
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    error = _refused(args, train_run, caplog, train_main)
    assert shown in error and "a resume cannot change" in error


def test_train_resume_with_the_same_inputs_and_settings_continues(pair_inputs, train_run, tmp_path):
    from labse_model.run_log import read_metrics
    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    run = tmp_path / "run"
    shutil.copytree(train_run, run)
    # The same options again (the run's own values), a resumable one changed, and the shards moved.
    moved = tmp_path / "moved"
    shutil.copytree(Path(shards).parent, moved)
    assert train_main(_train_args(vocab, str(moved / "*.tfrecord"), run, "--resume", "--log-every", "2")) == 0
    assert [m["step"] for m in read_metrics(run)] == [1, 2]


def test_pretrain_resume_refuses_another_mono_set(labse_data, tmp_path, caplog):
    from labse_model.pretrain import main as pretrain_main
    from model_helpers import build_vocab

    vocab = build_vocab(labse_data, tmp_path / "vocab")
    run = tmp_path / "pt"

    def args(*langs: str) -> list[str]:
        return ["--vocab", str(vocab), "--output", str(run), "--config", "tiny", "--global-batch-size", "4",
                "--max-steps", "3", "--max-seq-length", "32", "--heldout-rate", "0", "--stage-layers", "2",
                "--stage-fractions", "1", "--warmup-steps", "0",
                *(a for lang in langs for a in ("--mono", f"{lang}:{labse_data / 'multi30k' / f'train.{lang}.gz'}"))]

    assert pretrain_main([*args("de", "en"), "--stop-after-steps", "1"]) == 0
    error = _refused([*args("de", "fr"), "--resume"], run, caplog, pretrain_main, "pretrain_config.json")
    assert "--mono/--pairs is not what" in error and "en/train.en.gz" in error and "fr/train.fr.gz" in error
    assert pretrain_main([*args("de", "en"), "--resume"]) == 0  # the run's own set continues


def test_fingerprint_keys_files_of_the_same_name_apart_and_ignores_their_folders(tmp_path):
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.txt").write_text(f"text of {folder}\n")
    both = fingerprint([("de/train.txt", str(tmp_path / "a" / "train.txt")),
                        ("de/train.txt", str(tmp_path / "b" / "train.txt"))])
    assert sorted(both["files"]) == ["de/train.txt", "de/train.txt#2"]
    moved = fingerprint([("x", str(tmp_path / "a" / "train.txt"))])
    check_same_inputs("--x", moved, fingerprint([("x", str(tmp_path / "c" / "train.txt"))]) | {"sha256": moved["sha256"]},
                      tmp_path)
    with pytest.raises(ValueError, match="other content"):
        check_same_inputs("--x", moved, fingerprint([("x", str(tmp_path / "c" / "train.txt"))]), tmp_path)
