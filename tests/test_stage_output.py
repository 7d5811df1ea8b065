"""pipelines.io.stage_output: the lock, the overwrite rule, the completion marker, strict JSON."""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines.io import stage_output as so
from pipelines.io.completion import (
    IncompleteOutputError,
    mark_complete,
    require_complete,
    strict_json,
    write_stats_json,
)
from pipelines.io.locks import OutputLockedError, output_lock
from pipelines.io.overlap import OutputExistsError, prepare_output
from tests.object_store import ObjectStoreOnDisk

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_a_second_lock_fails_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    with output_lock(out) as holder:
        assert (tmp_path / "out.lock").is_file() and not out.exists()  # beside the output, not in it
        with pytest.raises(OutputLockedError) as caught:
            with output_lock(str(out) + "/"):
                pass
        message = str(caught.value)
        assert f"pid {os.getpid()}" in message and holder["host"] in message and "out.lock" in message
        assert holder["started"] in message and "command:" in message
    assert not (tmp_path / "out.lock").exists()  # released and removed
    with output_lock(out):  # and free again
        pass


@pytest.mark.timeout(120)  # a child that never takes the lock leaves readline() waiting
def test_the_lock_is_held_across_processes_and_released_when_the_holder_dies(tmp_path):
    out = tmp_path / "out"
    script = ("import sys; from pipelines.io.stage_output import output_lock\n"
              "with output_lock(sys.argv[1]):\n    print('locked', flush=True); sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLockedError, match=f"pid {child.pid} "):
            with output_lock(out):
                pass
    finally:
        child.kill()  # SIGKILL: no clean-up code runs, the kernel releases the flock
        child.wait()
    with output_lock(out) as holder:  # a stale lock file from a dead run does not block
        assert json.loads((tmp_path / "out.lock").read_text())["pid"] == os.getpid() == holder["pid"]


def test_prepare_output_refuses_existing_output_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    prepare_output(out, overwrite=False)  # missing: created
    assert out.is_dir()
    prepare_output(out, overwrite=False)  # empty: fine
    (out / "part-0.parquet").write_text("x")
    mark_complete(out, {"rows": 1})
    with pytest.raises(OutputExistsError, match="--overwrite"):
        prepare_output(out, overwrite=False)
    prepare_output(out, overwrite=True)
    assert out.is_dir() and list(out.iterdir()) == []
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="existing file"):
            prepare_output(a_file, overwrite=overwrite)
    assert a_file.read_text() == "keep me"


def test_completion_marker_is_required_and_carries_the_stats(tmp_path):
    out = tmp_path / "pairs"
    out.mkdir()
    with pytest.raises(IncompleteOutputError, match="interrupted or is still running: rerun the stage"):
        require_complete(out, "--pairs")
    mark_complete(out, {"pairs": 3, "threshold": float("inf")}, stage="labse-mine")
    marker = require_complete(out, "--pairs")
    assert marker["stage"] == "labse-mine" and marker["stats"] == {"pairs": 3, "threshold": None}
    _strict_loads((out / "_SUCCESS").read_text())
    (out / "_SUCCESS").write_text("")  # an empty Hadoop/Spark marker counts too
    assert require_complete(out, "--pairs") == {}


def test_marker_lock_and_stats_leave_the_documented_pyarrow_reads_working(tmp_path):
    table = pa.table({"text": ["a", "b"], "score": [0.5, 0.7]})
    flat = tmp_path / "scored"
    flat.mkdir()
    pq.write_table(table, flat / "part-00000-of-00001.parquet")
    write_stats_json(flat / "_stats.json", {"kept": 2})
    mark_complete(flat, {"kept": 2})
    hive = tmp_path / "clean"
    (hive / "sentences" / "lang=de").mkdir(parents=True)
    pq.write_table(table, hive / "sentences" / "lang=de" / "part-00000-of-00001.parquet")
    write_stats_json(hive / "stats.json", {"kept": 2})
    mark_complete(hive, {"kept": 2})
    with output_lock(flat), output_lock(hive):
        assert ds.dataset(str(flat), format="parquet").to_table().num_rows == 2
        sentences = ds.dataset(str(hive / "sentences"), partitioning="hive").to_table()
        assert sentences.num_rows == 2 and set(sentences.column("lang").to_pylist()) == {"de"}
    # what issue 13 reported: a plain stats.json beside the shards breaks the same call
    (flat / "stats.json").write_text("{}")
    with pytest.raises(pa.ArrowInvalid):
        ds.dataset(str(flat), format="parquet").to_table()


def test_strict_json_writes_non_finite_numbers_as_null(tmp_path, caplog):
    import numpy as np

    text = strict_json({"a": float("nan"), "b": [1.0, float("-inf")], "c": np.float32("inf"), "d": 2})
    assert _strict_loads(text) == {"a": None, "b": [1.0, None], "c": None, "d": 2}
    assert "a=nan" in caplog.text and "b[1]=-inf" in caplog.text
    write_stats_json(tmp_path / "stats.json", {"x": float("nan")})
    assert _strict_loads((tmp_path / "stats.json").read_text()) == {"x": None}


# ------------------------------------------------------------------ object stores (labsetest://)
def test_object_store_output_rule_and_marker(tmp_path):
    out = ObjectStoreOnDisk.PREFIX + str(tmp_path / "remote")
    prepare_output(out, overwrite=False)  # nothing there
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "part-0.parquet").write_text("x")
    with pytest.raises(IncompleteOutputError):
        require_complete(out, "--pairs")
    mark_complete(out, {"n": 1})
    assert require_complete(out, "--pairs")["stats"] == {"n": 1}
    with pytest.raises(OutputExistsError, match="part-0.parquet"):
        prepare_output(out, overwrite=False)
    prepare_output(out, overwrite=True)
    assert not (tmp_path / "remote" / "part-0.parquet").exists()
    assert not (tmp_path / "remote" / "_SUCCESS").exists()


def test_object_store_lock_checks_before_and_after(tmp_path, monkeypatch):
    monkeypatch.setattr(so, "OBJECT_STORE_LOCK_SETTLE_SECONDS", 0)
    out = ObjectStoreOnDisk.PREFIX + str(tmp_path / "remote")
    lock_file = tmp_path / "remote.lock"
    with output_lock(out) as holder:
        assert json.loads(lock_file.read_text())["token"] == holder["token"]
        with pytest.raises(OutputLockedError, match="remote.lock"):  # before: the lock object exists
            with output_lock(out):
                pass
    assert not lock_file.exists()

    # after: another run wrote its lock object while we waited; the last writer wins, we give up
    def another_run_writes(_seconds):
        lock_file.write_text(json.dumps({"pid": 4242, "host": "elsewhere", "token": "theirs"}))

    monkeypatch.setattr(so.time, "sleep", another_run_writes)
    with pytest.raises(OutputLockedError, match="pid 4242 on elsewhere"):
        with output_lock(out):
            pass
    assert json.loads(lock_file.read_text())["token"] == "theirs"  # their lock is left alone


def test_the_module_imports_without_beam_torch_or_tensorflow():
    """labse_model imports it on GPU hosts, where Apache Beam is not installed."""
    code = ("import sys, pipelines.io.stage_output\n"
            "heavy = [m for m in ('apache_beam', 'torch', 'tensorflow', 'pyarrow') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_fresh_output_locks_then_refuses_what_exists_and_shard_stats_round_trip(tmp_path):
    out = tmp_path / "out"
    with so.fresh_output(out, overwrite=False):
        assert out.is_dir() and (tmp_path / "out.lock").is_file()
        so.finish_output(out, {"pairs": 3}, stage="test", shards_in_root=True)
    assert not (tmp_path / "out.lock").exists()
    assert so.read_output_stats(out) == {"pairs": 3}
    assert so.require_complete(out, "out")["stage"] == "test"
    with pytest.raises(so.OUTPUT_REFUSED):
        with so.fresh_output(out, overwrite=False):
            pass
    with so.fresh_output(out, overwrite=True):
        assert not list(out.iterdir())


def test_object_store_lock_is_keyed_on_the_output_not_its_spelling(gcs, monkeypatch):
    """On Cloud Storage (the emulator) `gs://b/x`, `gs://b//x`, `gs://b/x/` and `gs://b/./x` take
    one lock object, `gs://b/x.lock`. Keyed on the URL text, `gs://b//x` locked the object `/x.lock`
    and a second run into the same output went ahead."""
    monkeypatch.setattr(so, "OBJECT_STORE_LOCK_SETTLE_SECONDS", 0)
    bucket = gcs.new_bucket()
    out = f"gs://{bucket}/runs/x"
    for spelling in (f"gs://{bucket}//runs/x", f"gs://{bucket}/runs//x/", f"gs://{bucket}/./runs/x"):
        with output_lock(out):
            assert sorted(gcs.list(f"gs://{bucket}")) == ["runs/x.lock"]
            with pytest.raises(OutputLockedError, match="x.lock"):
                with output_lock(spelling):
                    pass
        with output_lock(spelling):  # and the other way round
            assert sorted(gcs.list(f"gs://{bucket}")) == ["runs/x.lock"]
            with pytest.raises(OutputLockedError):
                with output_lock(out):
                    pass
        assert not gcs.list(f"gs://{bucket}")  # released


def test_lock_key_normalises_object_store_urls_only_after_the_bucket():
    assert {so.lock_key(u) for u in ("gs://b/x", "gs://b//x", "gs://b/x/", "gs://b/./x//")} == {"gs://b/x"}
    assert so.lock_path_of("gs://b//x/y//") == "gs://b/x/y.lock"
    assert so.lock_key("gs://b/") == "gs://b" and so.lock_key("file:///tmp//x/") == "file:///tmp/x"
    assert so.lock_key("s3://b/x/../y") == "s3://b/x/../y"  # `..` is a name on an object store: kept


def test_the_trainers_object_lock_is_keyed_the_same_way(monkeypatch):
    """labse_model.storage.object_lock (fsspec, for gs:// run directories) shares the key."""
    from pipelines.io import storage

    monkeypatch.setattr(storage, "LOCK_SETTLE_SECONDS", 0)
    with storage.object_lock("memory://bucket/runs/a"):
        assert storage.exists("memory://bucket/runs/a.lock")
        with pytest.raises(storage.ObjectLockedError):
            with storage.object_lock("memory://bucket//runs/a/"):
                pass
    assert not storage.exists("memory://bucket/runs/a.lock")
