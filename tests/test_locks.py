"""pipelines.io.locks: one lock rule, local (flock) and on object storage (create-if-absent)."""
import json
import logging
import os
import socket
import subprocess
import sys
import threading

import pytest

from pipelines.io import storage
from pipelines.io.config_options import UsageError
from pipelines.io.locks import OutputLockedError, lock_key, lock_path_of, output_lock
from tests.object_store import ObjectStoreOnDisk

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_the_lock_is_held_across_processes_and_released_when_the_holder_dies(tmp_path):
    out = tmp_path / "out"
    script = ("import sys; from pipelines.io.locks import output_lock\n"
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


def test_the_lock_error_is_a_one_line_usage_error(tmp_path):
    with output_lock(tmp_path / "out"):
        with pytest.raises(UsageError) as caught:
            with output_lock(tmp_path / "out"):
                pass
    assert isinstance(caught.value, OutputLockedError) and "\n" not in str(caught.value)


# ------------------------------------------------------------------ object stores
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_object_store_lock_is_refused_while_held_and_removed_on_release(tmp_path):
    out = ObjectStoreOnDisk.PREFIX + str(tmp_path / "remote")
    lock_file = tmp_path / "remote.lock"
    with output_lock(out) as holder:
        assert json.loads(lock_file.read_text())["token"] == holder["token"]
        with pytest.raises(OutputLockedError, match="remote.lock.*delete the lock object"):
            with output_lock(out):
                pass
    assert not lock_file.exists()


def test_one_takeover_rule_a_dead_holder_on_this_host_only(tmp_path, caplog):
    """The lock of a run killed on this host is taken over with one warning line; a holder on
    another host may be alive, so its lock stands (the same rule for the pipelines and the trainer)."""
    out = ObjectStoreOnDisk.PREFIX + str(tmp_path / "remote")
    lock_file = tmp_path / "remote.lock"
    lock_file.write_text(json.dumps({"pid": 4242, "host": "elsewhere", "token": "theirs"}))
    with pytest.raises(OutputLockedError, match="pid 4242 on elsewhere"):
        with output_lock(out):
            pass
    assert json.loads(lock_file.read_text())["token"] == "theirs"  # their lock is left alone
    dead = _dead_pid()
    lock_file.write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "token": "gone"}))
    with caplog.at_level(logging.WARNING, logger="pipelines.io.locks"):
        with output_lock(out) as holder:
            assert json.loads(lock_file.read_text())["token"] == holder["token"]
    taken = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert len(taken) == 1 and f"pid {dead}" in taken[0] and "\n" not in taken[0]
    assert not lock_file.exists()


def test_the_gs_lock_is_an_atomic_create_if_absent(fake_gcs):
    """On fake-gcs-server, which honours preconditions: the lock object is created with
    `ifGenerationMatch=0`, so a second create fails (HTTP 412) instead of overwriting the first
    holder's token, and of runs racing for the lock exactly one wins, with no settle wait."""
    lock = f"gs://{fake_gcs}/runs/x.lock"
    storage.write_bytes(lock, b'{"token": "first"}', create_only=True)
    with pytest.raises(FileExistsError):
        storage.write_bytes(lock, b'{"token": "second"}', create_only=True)
    assert json.loads(storage.read_bytes(lock)) == {"token": "first"}
    storage.remove(lock)

    out = f"gs://{fake_gcs}/runs/y"
    won, refused = [], []
    start, release = threading.Barrier(4), threading.Event()

    def run():
        start.wait(30)
        try:
            with output_lock(out):
                won.append(1)
                release.wait(30)  # hold it until the others have tried
        except OutputLockedError:
            refused.append(1)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(600):
        if len(won) + len(refused) == 4 or len(refused) == 3:
            break
        threading.Event().wait(0.05)
    release.set()
    for thread in threads:
        thread.join(60)
    assert len(won) == 1 and len(refused) == 3, (won, refused)
    assert not storage.exists(lock_path_of(out))  # released


def test_object_store_lock_is_keyed_on_the_output_not_its_spelling(fake_gcs):
    """On Cloud Storage (fake-gcs-server) `gs://b/x`, `gs://b//x`, `gs://b/x/` and `gs://b/./x` take
    one lock object, `gs://b/x.lock`. Keyed on the URL text, `gs://b//x` locked the object `/x.lock`
    and a second run into the same output went ahead."""
    bucket = fake_gcs
    out = f"gs://{bucket}/runs/x"
    for spelling in (f"gs://{bucket}//runs/x", f"gs://{bucket}/runs//x/", f"gs://{bucket}/./runs/x"):
        with output_lock(out):
            assert storage.walk(f"gs://{bucket}").keys() == {"runs/x.lock"}
            with pytest.raises(OutputLockedError, match="x.lock"):
                with output_lock(spelling):
                    pass
        with output_lock(spelling):  # and the other way round
            assert storage.walk(f"gs://{bucket}").keys() == {"runs/x.lock"}
            with pytest.raises(OutputLockedError):
                with output_lock(out):
                    pass
        assert not storage.walk(f"gs://{bucket}")  # released


def test_lock_key_normalises_object_store_urls_only_after_the_bucket():
    assert {lock_key(u) for u in ("gs://b/x", "gs://b//x", "gs://b/x/", "gs://b/./x//")} == {"gs://b/x"}
    assert lock_path_of("gs://b//x/y//") == "gs://b/x/y.lock"
    assert lock_key("gs://b/") == "gs://b" and lock_key("file:///tmp//x/") == "file:///tmp/x"
    assert lock_key("s3://b/x/../y") == "s3://b/x/../y"  # `..` is a name on an object store: kept


def test_the_trainer_and_the_pipelines_share_one_lock(tmp_path):
    """A run directory on object storage (the trainer) and a stage output take the same lock
    object, keyed the same way, through the same function."""
    with output_lock("memory://bucket/runs/a"):
        assert storage.exists("memory://bucket/runs/a.lock")
        with pytest.raises(OutputLockedError):
            with output_lock("memory://bucket//runs/a/"):
                pass
    assert not storage.exists("memory://bucket/runs/a.lock")
