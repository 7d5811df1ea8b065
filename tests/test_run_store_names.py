"""Issue 34 item 1: a name from a bucket (a listed object, a key of a checkpoint marker) never
becomes a local path outside its folder. `labse_model.run_store` mirrors runs and models through
`pipelines.io.storage.local_child`, which refuses in one line before anything is written."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from labse_model import run_store
from pipelines.io import storage
from pipelines.io.config_options import UsageError
from pipelines.io.storage import UnsafeNameError, local_child


@pytest.mark.parametrize("name", ["/etc/passwd", "//home/u/.bashrc", "../x", "a/../../x", "a//b", "./a", "a/.",
                                  "", "a/..", "..", "C:/x", "a\\..\\..\\x"])
def test_a_name_that_would_leave_its_folder_is_refused(tmp_path, name):
    with pytest.raises(UnsafeNameError) as caught:
        local_child(tmp_path / "mirror", name, source=f"gs://B/runs/r2/{name}")
    assert isinstance(caught.value, UsageError) and "\n" not in str(caught.value)
    assert "gs://B/runs/r2/" in str(caught.value)
    assert not (tmp_path / "mirror").exists()


def test_a_symlink_inside_the_folder_that_points_out_is_refused(tmp_path):
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "tb").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(UnsafeNameError, match="resolves outside"):
        local_child(tmp_path / "mirror", "tb/events")
    assert local_child(tmp_path / "mirror", "checkpoints/step-00000001/model.safetensors") == \
        tmp_path / "mirror" / "checkpoints" / "step-00000001" / "model.safetensors"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _put(client, bucket: str, name: str, data: bytes) -> None:
    client.bucket(bucket).blob(name).upload_from_string(data)


def _run_with_a_hostile_object(gcs, tmp_path) -> tuple[str, Path]:
    """A run directory on the bucket whose listing holds `runs/r2//ABSOLUTE/home/u/bashrc`."""
    bucket = gcs.new_bucket()
    client = gcs.client()
    victim = tmp_path / "home" / "u" / "bashrc"
    _put(client, bucket, "runs/r2/config.json", b"{}")
    _put(client, bucket, f"runs/r2/{victim}", b"echo pwned\n")  # a doubled slash: an absolute name
    return f"gs://{bucket}/runs/r2", victim


def test_pulling_a_run_refuses_an_object_whose_name_is_absolute(gcs, tmp_path, cache):
    url, victim = _run_with_a_hostile_object(gcs, tmp_path)
    assert any(name.startswith("/") for name in storage.walk(url))  # the listing really has it
    store = run_store.RemoteRunDir.for_url(url)
    with pytest.raises(UnsafeNameError, match=r"runs/r2//.*bashrc"):
        store.pull(resume=False)
    assert not victim.exists()


def test_fetching_a_model_refuses_an_object_whose_name_is_absolute(gcs, tmp_path, cache):
    url, victim = _run_with_a_hostile_object(gcs, tmp_path)
    with pytest.raises(UnsafeNameError, match=r"bashrc"):
        run_store.fetch_model(url)
    assert not victim.exists()


def test_a_checkpoint_marker_naming_a_file_outside_its_folder_is_refused_before_writing(gcs, tmp_path, cache):
    """`--resume` / `--init-from gs://RUN` / `labse-export --run gs://RUN`: the marker's keys are
    file names; `../../x` would land beside the mirror (and stay there when the digest check fails)."""
    bucket = gcs.new_bucket()
    client = gcs.client()
    data = b"not really weights"
    step = "runs/r3/checkpoints/step-00000002"
    _put(client, bucket, "runs/r3/config.json", b"{}")
    # (the object `../../x` itself is not needed: the name is refused before any download)
    _put(client, bucket, f"{step}/_SUCCESS", json.dumps(
        {"complete": True, "step": 2, "files": {"../../x": {"size": len(data),
                                                            "sha256": hashlib.sha256(data).hexdigest()}}}).encode())
    store = run_store.RemoteRunDir.for_url(f"gs://{bucket}/runs/r3")
    with pytest.raises(UnsafeNameError, match=r"_SUCCESS: file '\.\./\.\./x'"):
        store.pull(resume=True)
    assert not [p for p in cache.rglob("x") if p.is_file()]
    assert not (store.local / "x").exists() and not (store.local.parent / "x").exists()
