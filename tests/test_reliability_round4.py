"""Issue 34, items 5-7: bad values are counted (not lost), every environment error is one line
naming its cause, and the smaller defects. Fast: each case builds only what it needs."""
from __future__ import annotations

import errno
import json
import os

import pytest

from pipelines.io.overlap import OutputUnwritableError, check_output_place


# ------------------------------------------------------------------ item 6: environment errors
def test_labse_eval_batch_size_zero_is_one_line(tmp_path, capsys):
    from labse_model import evaluate

    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["tatoeba", "--model", "usem3", "--data", str(tmp_path), "--batch-size", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-size must be at least 1, got 0" in err and "Traceback" not in err


@pytest.mark.parametrize("flag, value", [("--max-class-ratio", "-1"), ("--max-class-ratio", "0.5"),
                                         ("--max-class-ratio", "inf"), ("--max-lines-per-page", "0")])
def test_main_content_build_data_refuses_a_meaningless_balance(tmp_path, capsys, flag, value):
    from pipelines.main_content import cli

    rc = cli.main(["build-data", "--input", str(tmp_path / "in.warc.gz"), "--output", str(tmp_path / "out"),
                   flag, value])
    assert rc == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("output", ["gs://bucket", "gs://bucket/", "gs://bucket//", "gs://bucket/a/.."])
def test_a_bucket_root_is_refused_as_an_output(output):
    with pytest.raises(OutputUnwritableError, match="is a bucket's root: name a folder inside it"):
        check_output_place(output)
    check_output_place("gs://bucket/run1")  # a folder in the bucket is fine (nothing is contacted)


def test_a_bucket_root_output_is_one_line_from_the_stage_kit(capsys):
    from pipelines.stage import run_stage

    def never(_pipeline):
        raise AssertionError("wired although the output was refused")

    rc = run_stage("labse-test", "gs://bucket", overwrite=True, beam_args=[], wire=never, finish=dict)
    assert rc == 2
    err = capsys.readouterr().err
    assert "gs://bucket is a bucket's root" in err and len(err.strip().splitlines()) == 1


def test_a_read_only_parent_is_refused_before_the_run(tmp_path, monkeypatch):
    target = tmp_path / "ro" / "deeper" / "out"
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(tmp_path / "ro") else real_access(path, mode))
    with pytest.raises(OutputUnwritableError, match=f"{tmp_path / 'ro'} is read-only"):
        check_output_place(target)
    check_output_place(tmp_path / "elsewhere" / "out")


@pytest.mark.parametrize("number, cause", [(errno.ENOSPC, "no space left on the device"),
                                           (errno.EROFS, "the file system is read-only")])
def test_a_full_or_read_only_disk_during_a_stage_is_one_line(tmp_path, capsys, number, cause):
    import apache_beam as beam

    from pipelines.stage import run_stage

    def fail(_):
        raise OSError(number, os.strerror(number), str(tmp_path / "out" / "part-0.parquet"))

    def wire(pipeline):
        pipeline | beam.Create([1]) | beam.Map(fail)

    rc = run_stage("labse-test", str(tmp_path / "out"), overwrite=False, beam_args=[], wire=wire, finish=dict)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"labse-test: error: {cause}") and "part-0.parquet" in err[0]


def test_a_bug_in_a_stage_keeps_its_traceback(tmp_path):
    import apache_beam as beam

    from pipelines.stage import run_stage

    def wire(pipeline):
        pipeline | beam.Create([1]) | beam.Map(lambda _: 1 / 0)

    with pytest.raises(Exception, match="division by zero"):
        run_stage("labse-test", str(tmp_path / "out"), overwrite=False, beam_args=[], wire=wire, finish=dict)


@pytest.mark.parametrize("modules", [{"0": {"idx": 0, "type": "sentence_transformers.models.Transformer"}},
                                     [{"type": "sentence_transformers.models.Transformer", "path": ""}],
                                     ["Transformer"]])
def test_a_malformed_modules_json_is_one_line(tmp_path, modules):
    from labse_model.starting_point import load_starting_point
    from pipelines.io.config_options import UsageError

    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UsageError, match=r"modules\.json must be a list of modules, each with an integer \"idx\""):
        load_starting_point(tmp_path)
