"""The stage kit (`pipelines.stage.run_stage`), the one way every Beam stage runs: its order of
operations (inputs, then the pipeline and all its options, only then the lock and the removal of
the old output, the run, the stats), and issue 34 item 2 through every stage's command: with
`--overwrite`, a misspelt `--runner`, a Dataflow option missing or a staged file absent is one
line (exit 2) and the old output is left byte for byte as it was."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import apache_beam as beam
import pytest

from conftest import require_file
from pipelines import stage
from pipelines.io.config_options import UsageError
from pipelines.io.completion import mark_complete
from pipelines.io.overlap import OutputExistsError
from test_stage_reliability import _one_line_error, _pairs_output, _text_file, _tiny_vocab

WARC = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"
DATAFLOW = ["--runner", "DataflowRunner", "--project", "labse-test-project", "--region", "us-central1",
            "--temp_location", "gs://labse-test-bucket/tmp", "--no_auth", "--dry_run", "True"]


# ------------------------------------------------------------------ run_stage's order of operations
def _recording(monkeypatch, events: list[str]):
    """Record the kit's steps: the lock, the output's preparation and the run."""
    real_lock, real_prepare = stage.output_lock, stage.prepare_output

    @contextmanager
    def lock(path):
        events.append("lock")
        with real_lock(path) as holder:
            yield holder
        events.append("unlock")

    def prepare(path, **kwargs):
        events.append("prepare")
        real_prepare(path, **kwargs)

    def run(pipeline, name):
        events.append("run")
        return True

    monkeypatch.setattr(stage, "output_lock", lock)
    monkeypatch.setattr(stage, "prepare_output", prepare)
    monkeypatch.setattr(stage, "run_to_completion", run)


def _old_output(path: Path) -> dict[str, bytes]:
    path.mkdir(parents=True)
    (path / "part-00000-of-00001.parquet").write_bytes(b"an earlier run's shard")
    (path / "stats.json").write_text('{"read": 1}\n', encoding="utf-8")
    mark_complete(path, {"read": 1}, stage="earlier")
    return _snapshot(path)


def _snapshot(*paths: Path) -> dict[str, bytes]:
    found = {}
    for path in paths:
        for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
            if item.is_file():
                found[str(item)] = item.read_bytes()
    return found


def _books(read: int, kept: int) -> dict:
    return {"accounting": {"sentences": {"read": read, "kept": kept, "dropped": {}, "errored": 0}}}


def _plan(events: list[str], output: Path, **overrides) -> dict:
    plan = dict(overwrite=True, beam_args=[], inputs=[], check_inputs=lambda: events.append("check_inputs"),
                wire=lambda pipeline: events.append("wire"),
                finish=lambda: events.append("finish") or _books(read=1, kept=1))
    plan.update(overrides)
    return plan


def test_inputs_then_pipeline_then_lock_and_removal_then_run_then_stats(monkeypatch, tmp_path, capsys):
    events: list[str] = []
    _recording(monkeypatch, events)
    output = tmp_path / "out"
    _old_output(output)
    assert stage.run_stage("fake", str(output), **_plan(events, output), summarise=lambda s: "summary") == 0
    assert events == ["check_inputs", "wire", "lock", "prepare", "run", "finish", "unlock"]
    # --overwrite removed the old output, after everything was checked; the run (faked here) would
    # have removed the marker it started with when it wrote _SUCCESS
    assert list(output.iterdir()) == [output / "_STARTED"]
    assert capsys.readouterr().out.strip() == "summary"


def test_a_stage_whose_beam_work_is_done_is_locked_and_prepared_then_finished_without_a_run(monkeypatch, tmp_path,
                                                                                          capsys):
    events: list[str] = []
    _recording(monkeypatch, events)
    output = tmp_path / "out"
    _old_output(output)
    plan = _plan(events, output, wire=lambda pipeline: events.append("wire") or stage.NOTHING_TO_RUN)
    assert stage.run_stage("fake", str(output), **plan) == 0
    assert events == ["check_inputs", "wire", "lock", "prepare", "finish", "unlock"]  # no run
    assert list(output.iterdir()) == [output / "_STARTED"]
    events.clear()  # a dry run on Dataflow: nothing built, nothing finished
    monkeypatch.setattr(stage, "builds_only", lambda pipeline: True)
    assert stage.execute_stage("fake", str(output), **plan) is None
    assert "finish" not in events and "Beam work is done already" in capsys.readouterr().out


@pytest.mark.parametrize("failing", ["check_inputs", "wire", "beam_options", "output_apart"])
def test_nothing_is_locked_or_removed_when_a_check_fails(monkeypatch, tmp_path, capsys, failing):
    events: list[str] = []
    _recording(monkeypatch, events)
    output = tmp_path / "out"
    before = _old_output(output)

    def refuse(*_):
        raise UsageError(f"{failing} refused")

    overrides = {"beam_options": {"beam_args": ["--runner", "NoSuchRunner"]},
                 "output_apart": {"inputs": [str(output / "part-00000-of-00001.parquet")]},
                 "check_inputs": {"check_inputs": refuse}, "wire": {"wire": refuse}}[failing]
    assert stage.run_stage("fake", str(output), **_plan(events, output, **overrides)) == 2
    _one_line_error(capsys, "fake")
    assert "lock" not in events and "prepare" not in events and "run" not in events
    assert _snapshot(output) == before


def test_a_dry_run_removes_nothing_even_with_overwrite(monkeypatch, tmp_path, capsys):
    output = tmp_path / "out"
    before = _old_output(output)
    plan = _plan([], output, beam_args=["--dry_run", "True"], wire=lambda pipeline: pipeline | beam.Create([1]))
    monkeypatch.setattr(stage, "builds_only", lambda pipeline: True)  # as Dataflow's dry run, offline
    monkeypatch.setattr(stage, "run_to_completion", lambda pipeline, name: False)
    assert stage.run_stage("fake", str(output), **plan) == 0
    assert _snapshot(output) == before
    with pytest.raises(OutputExistsError):  # while without --overwrite a dry run refuses what a run would
        stage.execute_stage("fake", str(output), **{**plan, "overwrite": False})


def test_only_a_runner_that_honours_dry_run_builds_only():
    from types import SimpleNamespace

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    assert not stage.builds_only(stage.beam_pipeline(["--dry_run", "True"]))  # the DirectRunner runs it anyway
    # a Dataflow pipeline as built offline (Beam's validators would reach for the bucket)
    assert stage.builds_only(SimpleNamespace(options=PipelineOptions(DATAFLOW), runner=DataflowRunner()))
    assert not stage.builds_only(SimpleNamespace(options=PipelineOptions(DATAFLOW[:-2]), runner=DataflowRunner()))


def test_an_output_of_files_is_removed_when_the_run_fails_and_its_books_are_reported(monkeypatch, tmp_path, capsys):
    events: list[str] = []
    _recording(monkeypatch, events)
    files = [tmp_path / "v.txt", tmp_path / "v.stats.json"]

    def fail():
        for path in files:
            path.write_text("partial", encoding="utf-8")
        raise RuntimeError("interrupted")

    plan = _plan(events, tmp_path, finish=fail, output_files=[str(p) for p in files])
    with pytest.raises(RuntimeError):
        stage.run_stage("fake", str(files[0]), **plan)
    assert not any(path.exists() for path in files)
    unbalanced = _books(read=3, kept=1)
    assert stage.run_stage("fake", str(files[0]), **{**plan, "finish": lambda: unbalanced}) == 1
    assert "accounting identity" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 34 item 2, every stage's command
BAD_OPTIONS = {
    "misspelt runner": (["--runner", "DataflowRuner"], "DataflowRuner"),
    "no --region": ([a for a in DATAFLOW if a not in ("--region", "us-central1")], "region"),
    "absent --requirements_file": ([*DATAFLOW, "--requirements_file", "/nonexistent/requirements.txt"],
                                   "--requirements_file"),
    "absent --setup_file": ([*DATAFLOW, "--setup_file", "/nonexistent/setup.py"], "--setup_file"),
}


def _stage_commands(labse_data, tmp_path, monkeypatch):
    """(prog, main, argv without the Beam options, the paths of its old output) for each stage."""
    from pipelines.clean.cli import main as clean_main
    from pipelines.main_content.cli import main as main_content_main
    from pipelines.mine.cli import main as mine_main
    from pipelines.score import scorer
    from pipelines.score.cli import main as score_main
    from pipelines.tfrecords.cli import main as tfrecords_main
    from vocab.cli import main as vocab_main

    warc = tmp_path / "crawl" / "sample.warc.gz"
    warc.parent.mkdir()
    shutil.copyfile(require_file(labse_data, WARC), warc)
    de = _text_file(labse_data, "multi30k/val.de.gz", tmp_path / "text" / "de.txt")
    en = _text_file(labse_data, "multi30k/val.en.gz", tmp_path / "text" / "en.txt")
    pairs = _pairs_output(labse_data, tmp_path / "pairs")
    vocab = _tiny_vocab(tmp_path / "vocab.txt")
    monkeypatch.setattr(scorer.QualityScorer, "load", classmethod(lambda cls, path: None))  # no scorer needed here
    out = tmp_path / "old"
    for name in ("clean", "build-data", "mine", "score", "tfrecords"):
        _old_output(out / name)
    (out / "v.txt").write_text("[PAD]\n[UNK]\nold\n", encoding="utf-8")
    (out / "v.stats.json").write_text('{"read": 1}\n', encoding="utf-8")
    (out / "v.work").mkdir()
    (out / "v.work" / "counts-00000-of-00001.tsv").write_text("de\tHund\t9\n", encoding="utf-8")
    return [
        ("labse-clean", clean_main, ["--input", str(warc), "--output", str(out / "clean")], [out / "clean"]),
        ("labse-main-content build-data", main_content_main,
         ["build-data", "--input", str(warc), "--output", str(out / "build-data")], [out / "build-data"]),
        ("labse-vocab", vocab_main, ["--input-text", f"en={en}", "--output", str(out / "v.txt")],
         [out / "v.txt", out / "v.stats.json", out / "v.work"]),
        ("labse-mine", mine_main, ["--src", str(de), "--tgt", str(en), "--src-lang", "de", "--tgt-lang", "en",
                                   "--output", str(out / "mine")], [out / "mine"]),
        ("labse-score", score_main, ["--pairs", str(pairs), "--model", str(tmp_path / "scorer"),
                                     "--output", str(out / "score")], [out / "score"]),
        ("labse-tfrecords", tfrecords_main, ["--pairs", str(pairs), "--vocab", str(vocab),
                                             "--output", str(out / "tfrecords")], [out / "tfrecords"]),
    ]


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_overwrite_with_a_bad_beam_option_is_one_line_and_the_old_output_stays(labse_data, tmp_path, capsys,
                                                                               monkeypatch, case):
    from apache_beam.options.pipeline_options import GoogleCloudOptions
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    # as on a machine without gcloud: no default region to fall back on; and no test reaches the network
    monkeypatch.setattr(DataflowRunner, "get_default_gcp_region", staticmethod(lambda: None))
    monkeypatch.setattr(GoogleCloudOptions, "_warn_if_soft_delete_policy_enabled", lambda self, option: None)
    beam_args, named = BAD_OPTIONS[case]
    for prog, main, argv, old in _stage_commands(labse_data, tmp_path, monkeypatch):
        before = _snapshot(*old)
        assert main([*argv, "--overwrite", *beam_args]) == 2, prog
        assert named in _one_line_error(capsys, prog), prog
        assert _snapshot(*old) == before, prog
        assert not Path(f"{old[0]}.lock").exists(), prog
