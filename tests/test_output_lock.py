"""pipelines.io.locks.output_lock: the lock is taken on the output's real path, so every
spelling of one output (a symlinked parent, a symlinked output, `./`, a trailing slash) meets it."""
from __future__ import annotations

import os

import pytest

from pipelines.io.locks import OutputLockedError, output_lock


def test_the_output_lock_is_taken_on_the_real_path(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")  # a symlinked parent
    (tmp_path / "real" / "out").mkdir()
    os.symlink(tmp_path / "real" / "out", tmp_path / "out-link")  # a symlinked output
    with output_lock(tmp_path / "real" / "out"):
        for spelling in (tmp_path / "alias" / "out", tmp_path / "out-link", f"{tmp_path}/real/./out/"):
            with pytest.raises(OutputLockedError):
                with output_lock(spelling):
                    pass
    with output_lock(tmp_path / "alias" / "out"):  # released: free again, under any spelling
        pass
