"""FAISS work gives the process's OpenMP thread count back (issue 34, a leak between tests).

torch and FAISS share one OpenMP runtime: labse-index and labse-mine's index search set FAISS to
one thread per bundle, and on the DirectRunner that ran in the launching process, leaving torch at
1 thread for everything after (a later test's weight comparisons at 1e-7 failed). Each case sets a
count other than 1 first, so it fails on a leak whatever the machine's core count."""
from __future__ import annotations

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")


@pytest.fixture
def two_threads():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    yield 2
    faiss.omp_set_num_threads(before)


def _unit_rows(n: int, dim: int = 8) -> np.ndarray:
    rows = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_training_an_index_gives_the_thread_count_back(two_threads):
    from pipelines.index.shards import train_index

    index = train_index(_unit_rows(64), "IVF2,Flat", threads=1)
    assert index.is_trained
    assert faiss.omp_get_max_threads() == two_threads


def test_the_index_search_step_runs_on_one_thread_and_gives_the_count_back(tmp_path, monkeypatch, two_threads):
    from pipelines.index import shards
    from pipelines.mine import index_search

    index = faiss.IndexFlatIP(8)
    index.add(_unit_rows(3))
    (tmp_path / "shard-00000-of-00001.faiss").write_bytes(shards.to_bytes(index))
    (tmp_path / "shard-00000-of-00001.txt").write_text("a\nb\nc\n", encoding="utf-8")
    during = []
    real_search = index_search.search_shard
    monkeypatch.setattr(index_search, "search_shard",
                        lambda *args: during.append(faiss.omp_get_max_threads()) or real_search(*args))
    step = index_search._SearchShard({"tgt": str(tmp_path)}, {"tgt": 1}, 2, {"tgt": 0})
    step.setup()
    hits = list(step.process(("tgt", "shard-00000-of-00001", ["q0", "q1"], _unit_rows(2))))
    assert len(hits) == 4 and during == [1]
    assert faiss.omp_get_max_threads() == two_threads


def test_the_shard_fill_step_runs_on_one_thread_and_gives_the_count_back(tmp_path, monkeypatch, two_threads):
    from pipelines.index import shards, transforms

    trained = tmp_path / "trained.faiss"
    trained.write_bytes(shards.to_bytes(faiss.IndexFlatIP(8)))
    during = []
    monkeypatch.setattr(transforms._FillShard, "_fill",
                        lambda self, plan, index, *spools: during.append(faiss.omp_get_max_threads()) or {})
    step = transforms._FillShard([], str(tmp_path))
    step.setup()
    assert list(step.process(shards.ShardPlan(0, 1, ()), str(trained))) == [{}]
    assert during == [1] and faiss.omp_get_max_threads() == two_threads


def test_the_suite_guard_fails_a_test_that_leaves_the_count_changed(tmp_path):
    """tests/thread_guard.py, the autouse fixture every test of this suite runs under, in a pytest
    of its own: the leaking test errors naming itself, the count is given back for the next test."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                                          "pytest_plugins = ['thread_guard']\n")
    (tmp_path / "test_leaks.py").write_text("""
import subprocess, sys

import faiss

FRESH = int(subprocess.run([sys.executable, "-c", "import faiss; print(faiss.omp_get_max_threads())"],
                           capture_output=True, text=True, check=True).stdout.split()[-1])

def test_leaks():
    faiss.omp_set_num_threads(FRESH + 1)

def test_gives_back():
    faiss.omp_set_num_threads(FRESH + 2)
    faiss.omp_set_num_threads(FRESH)

def test_after_the_leak_the_count_is_back():
    assert faiss.omp_get_max_threads() == FRESH
""")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                             str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "3 passed, 1 error" in result.stdout, result.stdout[-3000:]
    assert "test_leaks.py::test_leaks left this process's OpenMP thread count at" in result.stdout
