"""A guard for the whole suite: a test that leaves this process's OpenMP thread count changed fails.

torch and FAISS share one OpenMP runtime, so a count one test sets (torch.set_num_threads, or
faiss.omp_set_num_threads in code it runs in-process) stays for every later test of the pytest
process: slower, and a different reduction order for every matmul, which broke weight comparisons
at 1e-7 in a later module. The guard reads the count before and after each test (only when torch
or FAISS is imported: no cost to the other tests), gives the old count back, and fails the test
that changed it, naming both counts."""
from __future__ import annotations

import subprocess
import sys

import pytest

_FRESH: dict[str, int] = {}


def openmp_threads() -> tuple[str, int] | None:
    """(module, count) read through torch, else FAISS, whichever this process has imported."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return "torch", torch.get_num_threads()
    faiss = sys.modules.get("faiss")
    if faiss is not None and hasattr(faiss, "omp_get_max_threads"):
        return "faiss", faiss.omp_get_max_threads()
    return None


def set_openmp_threads(module: str, count: int) -> None:
    if module == "torch":
        sys.modules["torch"].set_num_threads(count)
    else:
        sys.modules["faiss"].omp_set_num_threads(count)


def fresh_process_threads(module: str) -> int:
    """The count a fresh process starts with (asked once per session, only when a test is the first
    to import torch or FAISS, so there was no count to read before it)."""
    if module not in _FRESH:
        read = "torch.get_num_threads()" if module == "torch" else "faiss.omp_get_max_threads()"
        _FRESH[module] = int(subprocess.run([sys.executable, "-c", f"import {module}; print({read})"],
                                            capture_output=True, text=True, check=True).stdout.split()[-1])
    return _FRESH[module]


@pytest.fixture(autouse=True)
def openmp_threads_unchanged(request):
    before = openmp_threads()
    yield
    after = openmp_threads()
    if after is None:
        return
    module, count = after
    # torch and FAISS share the count where they share the OpenMP runtime (pip's wheels do); where
    # the module read before is another, the count is compared with a fresh process's.
    expected = before[1] if before is not None and before[0] == module else fresh_process_threads(module)
    if count != expected:
        set_openmp_threads(module, expected)
        pytest.fail(f"{request.node.nodeid} left this process's OpenMP thread count at {count} (it was {expected}; "
                    "torch and FAISS share it, so later tests would run with it): give the count back "
                    "(pipelines.index.shards.faiss_threads, or torch.set_num_threads in a finally)", pytrace=False)
