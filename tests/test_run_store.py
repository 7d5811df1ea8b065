"""labse_model.run_store on a gs:// run directory (the GCS emulator, no training): which checkpoint
`--resume` takes as the newest, and what it sets aside."""
from __future__ import annotations

import logging

import pytest

from labse_model import run_store
from labse_model.checkpoint import CorruptCheckpointError
from pipelines.io import storage
from pipelines.io.completion import SUCCESS_MARKER


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _publish(store: run_store.RemoteRunDir, step: int) -> None:
    """What the trainer leaves in the mirror after checkpoint `step`, uploaded (files, then marker)."""
    folder = store.local / run_store.CHECKPOINTS / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(f"weights of step {step}".encode())
    (folder / "trainer_state.pt").write_bytes(f"state of step {step}".encode())
    store.publish(step)


@pytest.fixture
def run_url(gcs, cache, tmp_path):
    """gs://B/runs/r with complete checkpoints 2, 9 and 10 (10 after 9 by number, as by name)."""
    url = f"gs://{gcs.new_bucket()}/runs/r"
    store = run_store.RemoteRunDir(url, tmp_path / "writer")
    store.local.mkdir()
    (store.local / "config.json").write_text("{}", encoding="utf-8")
    for step in (2, 9, 10):
        _publish(store, step)
    return url


def _pulled_step(url: str, **kwargs) -> int:
    path = run_store.RemoteRunDir.for_url(url).pull(resume=True, **kwargs)
    assert (path / "model.safetensors").read_bytes() == f"weights of step {int(path.name[5:])}".encode()
    return int(path.name[5:])


def test_resume_takes_the_newest_complete_checkpoint(run_url):
    assert run_store.RemoteRunDir.for_url(run_url).complete_steps() == [2, 9, 10]
    assert _pulled_step(run_url) == 10
    assert _pulled_step(run_url, step=9) == 9
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint for step 5 .*complete steps: \[2, 9, 10\]"):
        _pulled_step(run_url, step=5)


def test_a_checkpoint_without_its_marker_is_not_the_newest(run_url):
    """An upload cut off before its marker: files of step 11 are there, the marker is not."""
    storage.write_bytes(f"{run_url}/checkpoints/step-00000011/model.safetensors", b"half")
    assert _pulled_step(run_url) == 10


def test_a_checkpoint_whose_files_changed_is_skipped_with_one_warning_and_set_aside(run_url, caplog):
    storage.write_bytes(f"{run_url}/checkpoints/step-00000010/model.safetensors", b"other bytes")
    store = run_store.RemoteRunDir.for_url(run_url)
    with caplog.at_level(logging.WARNING, logger="labse_model.run_store"):
        path = store.pull(resume=True)
    assert path.name == "step-00000009"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step 10" in warnings[0] and "does not match the sha256" in warnings[0]
    with pytest.raises(CorruptCheckpointError, match="does not match the sha256"):
        run_store.RemoteRunDir.for_url(run_url).pull(resume=True, step=10)  # asked for by number: no fallback
    # the run goes on from 9: its first upload sets 10 aside (marker renamed, files kept)
    _publish(store, 11)
    assert store.complete_steps() == [2, 9, 11]
    assert storage.exists(f"{run_url}/checkpoints/step-00000010/{run_store.SET_ASIDE_MARKER}")
    assert not storage.exists(f"{run_url}/checkpoints/step-00000010/{SUCCESS_MARKER}")
    assert storage.exists(f"{run_url}/checkpoints/step-00000010/model.safetensors")


def test_a_run_with_checkpoints_is_refused_without_resume(run_url):
    from pipelines.io.config_options import UsageError

    with pytest.raises(UsageError, match="already holds checkpoints: pass --resume"):
        run_store.RemoteRunDir.for_url(run_url).pull(resume=False)
