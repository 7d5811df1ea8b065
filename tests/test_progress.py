"""Progress of a local Beam stage: trackers in the workers, one board on the launcher."""
from __future__ import annotations

import io
import time
import pickle

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import progress
from pipelines.progress import ProgressBoard, ProgressTracker, CountInto, describe, read_total, runs_locally


def test_workers_counts_reach_the_board_through_a_real_pipeline(tmp_path, monkeypatch):
    board = ProgressBoard("labse-test", "records", total=300)
    seen = []
    with board:
        with beam.Pipeline(options=PipelineOptions(["--direct_running_mode", "multi_processing",
                                                    "--direct_num_workers", "2"])) as pipeline:
            _ = pipeline | beam.Create(range(300)) | beam.Reshuffle() | beam.ParDo(CountInto(board.tracker()))
        seen.append(read_total(board.folder))
    assert seen == [300]
    assert board.folder is None  # the folder is gone with the board


def test_a_tracker_pickles_without_its_count_and_writes_its_own_file(tmp_path):
    tracker = ProgressTracker(str(tmp_path))
    tracker.advance(5)
    copy = pickle.loads(pickle.dumps(tracker))
    copy.advance(2)
    copy.flush()
    tracker.flush()
    assert read_total(str(tmp_path)) == 7 and len(list(tmp_path.iterdir())) == 2


def test_a_disabled_board_gives_trackers_that_do_nothing(tmp_path):
    stream = io.StringIO()
    with ProgressBoard("labse-test", "records", enabled=False, stream=stream) as board:
        tracker = board.tracker()
        tracker.advance(10)
        tracker.flush()
    assert board.folder is None and stream.getvalue() == ""


def test_without_a_terminal_the_board_prints_plain_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "REFRESH_SECONDS", 0.01)
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 0.0)
    stream = io.StringIO()
    with ProgressBoard("labse-test", "pairs", total=10, stream=stream) as board:
        tracker = board.tracker()
        tracker.advance(4)
        tracker.flush()
        for _ in range(6000):  # the board's thread prints within a few of its 0.01 s refreshes
            if "4 / 10 pairs" in stream.getvalue():
                break
            time.sleep(0.01)
    assert "labse-test: 4 / 10 pairs (40%)" in stream.getvalue()


def test_the_line_gives_a_rate_and_an_estimate_only_when_it_can():
    assert describe("labse-x", "pairs", 50, 200, 10.0) == "labse-x: 50 / 200 pairs (25%), 5/s, ~30 s left"
    assert describe("labse-x", "pairs", 50, None, 10.0) == "labse-x: 50 pairs, 5/s"
    assert describe("labse-x", "pairs", 0, 200, 0.0) == "labse-x: 0 / 200 pairs (0%), 0/s"


def test_only_the_direct_runner_runs_locally():
    assert runs_locally(PipelineOptions([]))
    assert runs_locally(PipelineOptions(["--runner", "DirectRunner"]))
    assert runs_locally(PipelineOptions(["--runner", "BundleBasedDirectRunner"]))
    assert not runs_locally(PipelineOptions(["--runner", "DataflowRunner"]))
    assert not runs_locally(PipelineOptions(["--runner", "PortableRunner"]))


def test_units_counted_through_reason_counters_reach_the_board_of_the_run(monkeypatch):
    """A stage's `<unit>.read` counters advance the board the stage kit opens (through the
    LABSE_PROGRESS_DIR it names for the run), and nothing else does."""
    from pipelines.accounting import ReasonCounters

    monkeypatch.setattr(progress, "WRITE_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(progress, "_WORKER_TRACKERS", {})
    with ProgressBoard("labse-test", "documents") as board:
        with beam.Pipeline(options=PipelineOptions([])) as pipeline:
            _ = (pipeline | beam.Create(range(40))
                 | beam.Map(lambda _: ReasonCounters("test").inc_tally({"documents.read": 1, "documents.kept": 1,
                                                                         "sentences.read": 3})))
        totals = progress.read_totals(board.folder)
    assert totals == {"documents": 40, "sentences": 120}
    assert progress.PROGRESS_ENV not in __import__("os").environ
