"""Shared fixtures. Real-data tests find ../shared/data through LABSE_DATA."""
import importlib
import os
import sys
from pathlib import Path

import pytest

# `gcs`: a local Cloud Storage emulator for the object-store tests (tests/gcs_emulator.py);
# `chains`: the demo's chain run on local disk and on it (tests/cloud_chain.py); `thread_guard`: a test
# that leaves the process's OpenMP (torch, FAISS) thread count changed fails (tests/thread_guard.py).
pytest_plugins = ["gcs_emulator", "cloud_chain", "thread_guard"]

# gcsfs chooses its filesystem class once, when it is first imported: with this variable unset it is the
# class that asks each bucket's type over gRPC, which the emulator does not serve (every new bucket then
# waits ~40 s). Whichever test imports gcsfs first, before or after the `gcs` fixture starts, the
# session must get the plain class (the fixture checks it did).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def _direct_runner_without_prism() -> None:
    """Tests that build `beam.Pipeline()` themselves get what the stage kit gives every local run
    (`pipelines.stage.local_runner`): the DirectRunner without its first attempt, the PrismRunner,
    which downloads a binary from GitHub (tests never use the network). tests/test_local_runner.py
    undoes this for its own tests, which prove that the stage kit does it by itself."""
    from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner

    SwitchingDirectRunner._is_interactive = True


_direct_runner_without_prism()

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def data_root() -> Path:
    return Path(os.environ.get("LABSE_DATA", DEFAULT_DATA)).resolve()


@pytest.fixture(scope="session")
def labse_data() -> Path:
    """The shared real-data folder; a test that needs it fails (never skips) when it is absent."""
    root = data_root()
    if not (root / "README.md").is_file():
        pytest.fail(
            f"real test data not found at {root}: set LABSE_DATA to the shared data folder "
            "(see ../shared/data/README.md)",
            pytrace=False,
        )
    return root


def require_file(root: Path, relative: str) -> Path:
    """Path to one shared data file, failing the test with a clear message if it is missing."""
    path = root / relative
    if not path.exists():
        pytest.fail(f"required data file missing: {path} (LABSE_DATA={root})", pytrace=False)
    return path


@pytest.fixture(scope="session")
def pair_inputs(labse_data, tmp_path_factory):
    """(vocab.txt, shard glob): a small real vocabulary and 32 Multi30k pairs per language as
    labse-tfrecords shards, built once for the trainer tests."""
    from model_helpers import build_vocab, write_shards

    root = tmp_path_factory.mktemp("pair_inputs")
    vocab = build_vocab(labse_data, root / "vocab")
    return vocab, write_shards(labse_data, vocab, root / "shards", pairs_per_lang=32)


@pytest.fixture(scope="session")
def doc_runs(labse_data, tmp_path_factory):
    """The runs of README.md's and the guides' command blocks (tests/test_doc_commands.py), one per
    session: a chain test that checks what a documented command writes on the sample data reads
    it from there (`test_doc_commands.documented_output`) instead of running the command again."""
    from test_doc_commands import start_doc_runs

    return start_doc_runs(labse_data, tmp_path_factory)


def benchmark_script(name: str):
    """The module of `benchmarks/NAME.py`, imported with `benchmarks/` on sys.path only while it loads
    (its siblings import each other by name). Left on sys.path, `benchmarks/vocab.py` would shadow
    the `vocab` package for every test collected later."""
    folder = str(Path(__file__).resolve().parents[1] / "benchmarks")
    saved = list(sys.path)
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved  # the script may have put its folder there again itself (scripts run alone need it)


# `make test` runs two pytest-xdist workers (`-n 2`), and this file's scheduler hands each worker whole
# modules, so a module's fixtures (an emulator, a chain of stages) are built once, on one worker.
# Modules that share an expensive session fixture go to the same worker, so it is built once: the
# documented blocks' runs (`doc_runs`) and the emulator chains (`chains`); the modules whose Dataflow
# dry runs build this package's sdist join the chains' group, because two sdists built at once in the
# same checkout write the same `*.egg-info` folder.
SHARED_GROUPS = {
    "doc_runs": {"test_doc_commands", "test_main_content_pipeline", "test_remine"},
    "cloud_chain": {"test_cloud_chain", "test_dataflow_jobs", "test_report_browser", "test_mine_global",
                    "test_mine_global_cascade"},
}
GROUP_OF_MODULE = {module: group for group, modules in SHARED_GROUPS.items() for module in modules}


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's group, or its module."""
    module = Path(nodeid.split("::", 1)[0]).stem
    return GROUP_OF_MODULE.get(module, module)


# xdist's own `--dist loadgroup` cannot be used: with pytest 9 the `xdist_group` mark no longer reaches
# its scheduler (xdist 3.8 renames `item._nodeid`, which pytest 9 no longer reads), and every test
# is then scheduled alone, each worker building every session fixture.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedFixtureScheduling(config, log)
