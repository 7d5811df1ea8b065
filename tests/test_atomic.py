"""pipelines.io.atomic: complete files only, ordinary permissions, nothing left behind on failure."""
import json
import os
import stat

import pytest

from pipelines.io.atomic import atomic_path, write_json_atomic, write_text_atomic


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
