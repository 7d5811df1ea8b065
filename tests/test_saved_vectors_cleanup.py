"""`vectors:DIR`'s open files close quietly, once: on `close()`, when the embedder is collected, or at
interpreter exit (before modules are torn down), also for a copy sharing the files, an embedder in
a reference cycle and one a thread still holds when the interpreter exits."""
from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipelines.embed.saved_vectors import SavedVectorsEmbedder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal((3, 4)).astype(np.float32))
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} sentence {i}\n" for i in range(3)), encoding="utf-8")
    return tmp_path


def _descriptors(embedder: SavedVectorsEmbedder) -> list[int]:
    return [keyed._fd for keyed in embedder._files]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_close_closes_every_file_once_and_collection_closes_them_too(folder):
    embedder = SavedVectorsEmbedder(folder)
    fds = _descriptors(embedder)
    assert all(map(_is_open, fds))
    embedder.close()
    embedder.close()  # a second close does nothing (it must not close a descriptor reused since)
    assert not any(map(_is_open, fds))

    collected = SavedVectorsEmbedder(folder)
    fds = _descriptors(collected)
    del collected
    gc.collect()
    assert not any(map(_is_open, fds))


def test_nothing_is_printed_when_the_interpreter_exits(folder):
    script = textwrap.dedent(f"""
        import copy, gc, threading, time
        from pipelines.embed.saved_vectors import SavedVectorsEmbedder
        first = SavedVectorsEmbedder({str(folder)!r})
        twin = copy.copy(first)  # shares the open files: they must close once, not twice
        cycle = SavedVectorsEmbedder({str(folder)!r})
        cycle.me = cycle  # freed by the last collection only
        gc.disable()
        held = SavedVectorsEmbedder({str(folder)!r})
        threading.Thread(target=lambda: (held, time.sleep(60)), daemon=True).start()
        del first
        print(twin.encode(["a sentence 1"]).shape)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "(1, 4)", done.stderr
    assert done.stderr == ""


def test_a_copy_does_not_close_the_files_under_the_original(folder):
    original = SavedVectorsEmbedder(folder)
    twin = copy.copy(original)
    del twin
    gc.collect()
    assert original.encode(["b sentence 2"]).shape == (1, 4)
