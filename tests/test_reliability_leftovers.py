"""Issue 26, the items left after the first rounds: labse-export never writes over its run, locks
are taken on real paths, labse-eval checks --model before work, exports respect the umask,
--init-from's modules.json stays inside its directory, out-of-vocabulary ids name their shard,
--mono content errors name the file and null rows are skipped, pretrain_summary.json keeps the
stages of a crashed invocation, a checkpoint without its digest is exported with a warning, and
labse-mine's counts are bounded."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from labse_model import checkpoint as ckpt
from labse_model.export import main as export_main
from labse_model.train import main as train_main
from pipelines.io.completion import mark_complete
from pipelines.io.locks import OutputLockedError, output_lock


@pytest.fixture(scope="module")
def finished_run(pair_inputs, tmp_path_factory) -> Path:
    """A finished 2-step tiny run; tests that could damage it work on copies."""
    vocab, shards = pair_inputs
    run = tmp_path_factory.mktemp("leftovers_run") / "run"
    assert train_main(["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
                       "--global-batch-size", "8", "--max-steps", "2", "--lr", "1e-3", "--warmup-steps", "0",
                       "--save-every", "2"]) == 0
    return run


def _copy_run(run: Path, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run, where / "run"))


def _files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ item 1: export never overwrites its run
@pytest.mark.parametrize("output", ["run", "run/checkpoints", "."])
def test_export_refuses_an_output_that_is_inside_or_holds_its_run(finished_run, tmp_path, caplog, output):
    runs = tmp_path / "runs"
    run = _copy_run(finished_run, runs)
    before = _files_of(runs)
    assert export_main(["--run", str(run), "--output", str(runs / output), "--overwrite"]) == 2
    assert "the input" in caplog.text and str(run) in caplog.text
    assert _files_of(runs) == before  # nothing removed, nothing written


# ------------------------------------------------------------------ item 6: locks on the real path
def test_the_output_lock_is_taken_on_the_real_path(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")  # a symlinked parent
    (tmp_path / "real" / "out").mkdir()
    os.symlink(tmp_path / "real" / "out", tmp_path / "out-link")  # a symlinked output
    with output_lock(tmp_path / "real" / "out"):
        for spelling in (tmp_path / "alias" / "out", tmp_path / "out-link", f"{tmp_path}/real/./out/"):
            with pytest.raises(OutputLockedError):
                with output_lock(spelling):
                    pass
    with output_lock(tmp_path / "alias" / "out"):  # released: free again, under any spelling
        pass


# ------------------------------------------------------------------ item 9: the smaller ones
def _remove_weights(model: Path) -> None:
    for weights in model.rglob("*.safetensors"):
        weights.unlink()


def _truncate_weights(model: Path) -> None:
    for weights in model.rglob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:100])


def _modules_json_not_a_list(model: Path) -> None:
    (model / "modules.json").write_text(json.dumps({"Transformer": ""}))


@pytest.mark.parametrize("damage", [_remove_weights, _truncate_weights, _modules_json_not_a_list])
def test_labse_eval_refuses_a_directory_that_is_not_a_model_in_one_line(labse_data, tmp_path, capsys, damage):
    from conftest import require_file
    from labse_model.evaluate import main as eval_main
    from model_helpers import save_tiny_sentence_transformer

    require_file(labse_data, "tatoeba/tatoeba.deu-eng.deu")
    (tmp_path / "work").mkdir()
    model = save_tiny_sentence_transformer(tmp_path / "work", tmp_path / "model")
    damage(model)
    capsys.readouterr()
    assert eval_main(["tatoeba", "--model", str(model), "--data", str(labse_data / "tatoeba"), "--langs", "deu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("labse-eval: error:") and str(model) in err[0], err


def test_export_respects_the_umask(finished_run, tmp_path):
    old = os.umask(0o022)
    try:
        assert export_main(["--run", str(finished_run), "--output", str(tmp_path / "model")]) == 0
    finally:
        os.umask(old)
    model = tmp_path / "model"
    assert stat.S_IMODE(model.stat().st_mode) == 0o755
    assert stat.S_IMODE((model / "model.safetensors").stat().st_mode) == 0o644
    modes = {stat.S_IMODE(p.stat().st_mode) for p in model.rglob("*")}
    assert modes <= {0o755, 0o644}, sorted(oct(m) for m in modes)


@pytest.mark.parametrize("escape", ["../model/{path}", "{model}/{path}"])
def test_init_from_refuses_module_paths_that_leave_the_directory(tmp_path, escape):
    from labse_model.starting_point import load_starting_point
    from model_helpers import save_tiny_sentence_transformer

    (tmp_path / "work").mkdir()
    model = save_tiny_sentence_transformer(tmp_path / "work", tmp_path / "model")
    shutil.copyfile(tmp_path / "work" / "vocab.txt", model / "vocab.txt")  # as labse-export writes it
    load_starting_point(model)  # the model itself loads
    wrapper = tmp_path / "wrapper"
    wrapper.mkdir()
    shutil.copyfile(model / "vocab.txt", wrapper / "vocab.txt")
    modules = json.loads((model / "modules.json").read_text())
    for entry in modules:
        entry["path"] = escape.format(model=model, path=entry["path"]).rstrip("/")
    (wrapper / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="leaves the directory"):
        load_starting_point(wrapper)


def test_an_out_of_vocabulary_id_names_its_shard_in_one_line(pair_inputs, tmp_path, caplog):
    from pipelines.io.tfrecord import TFRecordWriter, encode_example

    vocab, _ = pair_inputs
    vocab_size = len(vocab.read_text(encoding="utf-8").splitlines())
    shards = tmp_path / "shards"
    shards.mkdir()
    shard = shards / "pairs-00000-of-00001.tfrecord"
    with TFRecordWriter(shard) as writer:
        for i in range(16):
            tgt = [2, 10 + i, 3] if i != 11 else [2, vocab_size + 7, 3]
            writer.write(encode_example({"src_ids": [2, 20 + i, 3], "tgt_ids": tgt}))
    mark_complete(shards, {}, stage="test shards")
    # 2 steps of 8 = every record of the epoch: the bad one is met whatever the order.
    assert train_main(["--data", str(shards), "--vocab", str(vocab), "--output", str(tmp_path / "run"),
                       "--config", "tiny", "--global-batch-size", "8", "--max-steps", "2",
                       "--warmup-steps", "0"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(shard) in errors[0] and str(vocab_size + 7) in errors[0], errors


def _packer(vocab: Path):
    from labse_model.pretrain_data import Packer
    from pipelines.text.wordpiece import CLS_ID, SEP_ID, hf_tokenizer

    return Packer(hf_tokenizer(vocab), 32, CLS_ID, SEP_ID)


def test_mono_null_and_empty_rows_are_skipped_and_counted(pair_inputs, tmp_path):
    from labse_model.pretrain_data import PARQUET

    vocab, _ = pair_inputs
    path = tmp_path / "part.parquet"
    texts = ["A man rides a horse.", None, "", "Two dogs play in the snow."]
    pq.write_table(pa.table({"text": texts, "doc_id": ["d1", "d1", "d1", "d2"]}), path)
    packer = _packer(vocab)
    sequences = list(packer.pack(str(path), PARQUET))
    assert packer.rows_skipped == 2
    assert [(s.first_row, s.next_row) for s in sequences] == [(0, 3), (3, 4)]


@pytest.mark.parametrize("table", [
    pa.table({"sentence": ["A man rides a horse."], "doc_id": ["d1"]}),  # no text column
    pa.table({"text": [17], "doc_id": ["d1"]}),  # not strings
])
def test_mono_content_errors_name_the_file(pair_inputs, tmp_path, table):
    from labse_model.pretrain_data import PARQUET

    vocab, _ = pair_inputs
    path = tmp_path / "part.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=f"--mono file {path}"):
        list(_packer(vocab).pack(str(path), PARQUET))


def test_a_mono_text_file_that_is_not_utf8_is_named(pair_inputs, tmp_path):
    from labse_model.pretrain_data import TEXT

    vocab, _ = pair_inputs
    path = tmp_path / "de.txt"
    path.write_bytes("Ein Hund läuft.\n".encode("utf-8") + "Ein Hund läuft.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=f"--mono file {path}: 'utf-8' codec"):
        list(_packer(vocab).pack(str(path), TEXT))


def test_the_pretrain_summary_keeps_the_stages_finished_before_a_crash(labse_data, pair_inputs, tmp_path,
                                                                       monkeypatch):
    from labse_model import pretrain_data
    from labse_model.pretrain import main as pretrain_main
    from model_helpers import udhr_lines

    vocab, shards = pair_inputs
    sentences = tmp_path / "clean" / "sentences" / "lang=en"
    sentences.mkdir(parents=True)
    lines = udhr_lines(labse_data, "eng")
    pq.write_table(pa.table({"text": lines, "doc_id": [f"d{i // 12}" for i in range(len(lines))]}),
                   sentences / "part-00000-of-00001.parquet")
    mark_complete(tmp_path / "clean", {}, stage="test: labse-clean's layout")
    args = ["--mono", str(sentences.parent), "--vocab", str(vocab), "--output", str(tmp_path / "pt"),
            "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions", "1,1", "--max-steps", "6",
            "--global-batch-size", "4", "--max-seq-length", "32", "--warmup-steps", "0", "--save-every", "3",
            "--heldout-rate", "0"]
    calls = {"n": 0}
    real_next = pretrain_data.PretrainBatches.__next__

    def crash_at_step_five(self):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("simulated crash in stage 2")
        return real_next(self)

    monkeypatch.setattr(pretrain_data.PretrainBatches, "__next__", crash_at_step_five)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain_main(args)
    monkeypatch.setattr(pretrain_data.PretrainBatches, "__next__", real_next)
    assert pretrain_main(args + ["--resume"]) == 0
    summary = json.loads((tmp_path / "pt" / "pretrain_summary.json").read_text())
    assert summary["finished"]
    assert {k: s["steps_timed"] for k, s in summary["stages"].items()} == {"0": 3, "1": 3}


def test_exporting_a_checkpoint_without_its_digest_warns_in_one_line(finished_run, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    run = _copy_run(finished_run, tmp_path)
    weights = ckpt.find_checkpoint(run) / ckpt.MODEL_FILE
    save_file(load_file(weights), weights, metadata={"format": "pt"})  # the format before the digest
    assert export_main(["--run", str(run), "--output", str(tmp_path / "model")]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "digest" in r.getMessage()]
    assert len(warnings) == 1 and str(weights) in warnings[0] and "\n" not in warnings[0]
    caplog.clear()
    assert export_main(["--run", str(finished_run), "--output", str(tmp_path / "model2")]) == 0
    assert "digest" not in caplog.text  # a checkpoint with its digest exports silently


# ------------------------------------------------------------------ item 5: labse-mine's counts are bounded
@pytest.mark.parametrize("field", ["src_blocks", "tgt_shards", "k", "batch_size"])
def test_mine_config_bounds_its_counts(field):
    from pipelines.mine.config import MAX_COUNTS, MineConfig

    MineConfig(src_lang="de", tgt_lang="en", **{field: MAX_COUNTS[field]})
    with pytest.raises(ValueError, match=f"{field} .*between 1 and"):
        MineConfig(src_lang="de", tgt_lang="en", **{field: 10 ** 15})


def test_labse_mine_refuses_huge_src_blocks_in_one_line(tmp_path, capsys):
    from pipelines.mine import cli as mine_cli

    assert mine_cli.main(["--src", str(tmp_path / "de"), "--tgt", str(tmp_path / "en"), "--src-lang", "de",
                          "--tgt-lang", "en", "--output", str(tmp_path / "pairs"),
                          "--src-blocks", str(10 ** 15)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--src-blocks" in err[0] and not (tmp_path / "pairs").exists(), err
