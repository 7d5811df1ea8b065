"""pipelines.io.atomic: complete files only, ordinary permissions, nothing left behind on failure."""
import json
import os
import stat

import pytest

from pipelines.io import atomic
from pipelines.io.atomic import atomic_path, durable_replace, write_json_atomic, write_text_atomic


def test_json_is_written_whole_with_shareable_permissions(tmp_path):
    old_umask = os.umask(0o022)
    try:
        path = tmp_path / "nested" / "stats.json"
        write_json_atomic(path, {"lang": "ltg", "count": 3})
        assert json.loads(path.read_text(encoding="utf-8")) == {"lang": "ltg", "count": 3}
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600
        write_text_atomic(path, "replaced\n")
        assert path.read_text(encoding="utf-8") == "replaced\n"
    finally:
        os.umask(old_umask)
    assert [p.name for p in path.parent.iterdir()] == ["stats.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as handle:
                handle.write(b"half")
            raise RuntimeError("writer crashed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def _record_fsyncs_and_renames(monkeypatch) -> list[tuple[str, str]]:
    """Log of ("fsync", path) and ("replace", target) in the order they happen."""
    events: list[tuple[str, str]] = []
    opened: dict[int, str] = {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def recording_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        opened[fd] = os.path.abspath(path)
        return fd

    def recording_fsync(fd):
        real_fsync(fd)
        events.append(("fsync", opened[fd]))

    def recording_replace(source, target):
        real_replace(source, target)
        events.append(("replace", os.path.abspath(target)))

    monkeypatch.setattr(atomic.os, "open", recording_open)
    monkeypatch.setattr(atomic.os, "fsync", recording_fsync)
    monkeypatch.setattr(atomic.os, "replace", recording_replace)
    return events


def test_a_file_reaches_the_disk_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    events = _record_fsyncs_and_renames(monkeypatch)
    path = tmp_path / "stats.json"
    write_json_atomic(path, {"kept": 1})
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(str(tmp_path / ".stats.json."))  # the temporary file's data
    assert events[1][1] == str(path)
    assert events[2][1] == str(tmp_path)  # the directory entry of the rename


def test_a_staged_folder_is_flushed_file_by_file_before_it_is_renamed(tmp_path, monkeypatch):
    staging = tmp_path / ".tmp-step-00000003"
    (staging / "sub").mkdir(parents=True)
    (staging / "model.safetensors").write_bytes(b"weights")
    (staging / "sub" / "rng.pt").write_bytes(b"rng")
    events = _record_fsyncs_and_renames(monkeypatch)
    final = tmp_path / "step-00000003"
    durable_replace(staging, final)
    before = {path for kind, path in events[:events.index(("replace", str(final)))]}
    assert {str(staging / "model.safetensors"), str(staging / "sub" / "rng.pt"), str(staging),
            str(staging / "sub")} <= before
    assert events[-1] == ("fsync", str(tmp_path))
    assert (final / "sub" / "rng.pt").read_bytes() == b"rng"
