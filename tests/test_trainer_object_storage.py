"""The trainer on object storage (issue 22, item 3), against the local Cloud Storage emulator (`gcs`):
shards streamed from gs://, a run directory on gs:// killed mid-upload and resumed, a half-uploaded
or changed checkpoint never taken as the newest, --init-from gs://, labse-export to gs://.

Every gs:// result is compared with the same run on local disk."""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labse_model import checkpoint as ckpt
from labse_model.export import main as export_main
from labse_model.run_log import read_metrics
from labse_model.train import main as train_main

REPO = Path(__file__).resolve().parents[1]
STEP3, STEP6 = "checkpoints/step-00000003", "checkpoints/step-00000006"


def _args(vocab: Path, data: str, output: str | Path, *extra: str) -> list[str]:
    # Dropout on (the default): a resume must restore every RNG stream for the losses to match.
    return ["--data", data, "--vocab", str(vocab), "--output", str(output), "--config", "tiny",
            "--global-batch-size", "8", "--max-steps", "6", "--lr", "2e-3", "--warmup-steps", "2",
            "--log-every", "1", "--save-every", "3", "--keep-checkpoints", "0", *extra]


def _losses(metrics: list[dict]) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics if "loss" in m}


def _remote_metrics(gcs, url: str) -> list[dict]:
    text = gcs.list(url)["metrics.jsonl"].decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _weights(data: bytes, tmp_path: Path) -> dict[str, torch.Tensor]:
    path = tmp_path / f"w-{len(list(tmp_path.iterdir()))}.safetensors"
    path.write_bytes(data)
    return ckpt.read_weights(path)


@pytest.fixture(scope="module", autouse=True)
def fresh_process_threads():
    """The runs compared here to 1e-7 run partly in this process and partly in fresh ones, whose torch
    thread count (the reduction order of every matmul) is torch's default: this process's is set to the
    same for the module, whatever earlier tests of the session left it at, and given back after."""
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)
    before = torch.get_num_threads()
    torch.set_num_threads(default)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """$LABSE_CACHE for this module's runs (mirrors and downloads), in the test's temporary folder."""
    root = tmp_path_factory.mktemp("labse_cache")
    saved = os.environ.get("LABSE_CACHE")
    os.environ["LABSE_CACHE"] = str(root)
    yield root
    if saved is None:
        os.environ.pop("LABSE_CACHE")
    else:
        os.environ["LABSE_CACHE"] = saved


@pytest.fixture(scope="module")
def bucket_shards(gcs, pair_inputs, tmp_path_factory) -> tuple[str, str]:
    """(bucket, shard glob on it): the pair_inputs shards uploaded with the _SUCCESS labse-tfrecords writes last."""
    from pipelines.io.completion import mark_complete

    _, shards = pair_inputs
    folder = tmp_path_factory.mktemp("shards_upload")
    for path in Path(shards).parent.glob("*.tfrecord*"):  # the shards and their offset indexes
        shutil.copy(path, folder / path.name)
    mark_complete(folder, {"records": 96}, stage="labse-tfrecords")
    bucket = gcs.new_bucket()
    gcs.upload_tree(folder, f"gs://{bucket}/shards")
    return bucket, f"gs://{bucket}/shards/*.tfrecord"


@pytest.fixture(scope="module")
def local_run(pair_inputs, tmp_path_factory) -> Path:
    """The reference: the same 6-step run on local disk (checkpoints at steps 3 and 6)."""
    vocab, shards = pair_inputs
    run = tmp_path_factory.mktemp("local_reference") / "run"
    assert train_main(_args(vocab, shards, run)) == 0
    return run


KILL_MID_UPLOAD = """
import os, signal, sys
from labse_model import train
from pipelines.io import storage

real_upload = storage.upload

def upload(local, url):
    real_upload(local, url)
    if url.endswith("step-00000006/model.safetensors"):  # its other files and its marker never arrive
        os.kill(os.getpid(), signal.SIGKILL)

storage.upload = upload
sys.exit(train.main(sys.argv[1:]))
"""


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _train_logged(argv: list[str]) -> tuple[int, str]:
    handler = _Messages()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        return train_main(argv), "\n".join(handler.lines)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.fixture(scope="module")
def resumed_run(gcs, cache, pair_inputs, bucket_shards):
    """A run on gs:// killed (SIGKILL) while uploading its step-6 checkpoint, then resumed: what the
    bucket held after the kill, and what the --resume said."""
    vocab, _ = pair_inputs
    bucket, data = bucket_shards
    url = f"gs://{bucket}/runs/first"
    # Two DataLoader workers stream the shards (forked after gcsfs was used in the parent); the local
    # reference has none: the batches and the RNG streams must not depend on them.
    workers = ("--num-workers", "2")
    killed = subprocess.run([sys.executable, "-c", KILL_MID_UPLOAD, *_args(vocab, data, url, *workers)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    after_kill = gcs.list(url)
    runs_after_kill = sorted(gcs.list(f"gs://{bucket}/runs"))
    resumed = _train_logged(_args(vocab, data, url, "--resume", *workers))
    return {"url": url, "bucket": bucket, "after_kill": after_kill, "runs_after_kill": runs_after_kill,
            "resumed": resumed}


@pytest.mark.slow
def test_a_run_killed_mid_upload_resumes_from_the_last_complete_checkpoint_as_on_local_disk(
        gcs, local_run, resumed_run):
    url, bucket, after_kill = resumed_run["url"], resumed_run["bucket"], resumed_run["after_kill"]
    # The kill left step 3 complete, step 6 half-uploaded (weights, no marker), and the lock object.
    assert f"{STEP3}/_SUCCESS" in after_kill and f"{STEP6}/model.safetensors" in after_kill
    assert f"{STEP6}/_SUCCESS" not in after_kill and f"{STEP6}/training_state.pt" not in after_kill
    marker = json.loads(after_kill[f"{STEP3}/_SUCCESS"])
    assert sorted(marker["files"]) == ["model.safetensors", "rng-rank00000.pt", "training_state.pt"]
    assert "first.lock" in resumed_run["runs_after_kill"]

    # The one takeover rule: the killed run (this host, its process gone) left its locks; the resume
    # takes them over with a warning line each (a holder on another host would stop it: test_locks.py,
    # which also runs the gs:// precondition on fake-gcs-server; this emulator ignores preconditions).
    status, said = resumed_run["resumed"]
    assert status == 0
    taken = [line for line in said.splitlines() if "taking over the lock" in line]
    assert taken and all("of a run that is gone" in line for line in taken), said
    assert "resumed" in said and "step-00000003 at step 3" in said
    final = gcs.list(url)
    assert {f"{STEP3}/_SUCCESS", f"{STEP6}/_SUCCESS", "config.json", "vocab.txt", "train_summary.json"} <= set(final)
    assert not any(name.endswith(".lock") for name in gcs.list(f"gs://{bucket}/runs"))
    # Losses of steps 1-6 (metrics.jsonl on the bucket) and the final weights equal the local run's.
    remote_losses = _losses(_remote_metrics(gcs, url))
    local_losses = _losses(read_metrics(local_run))
    assert sorted(remote_losses) == [1, 2, 3, 4, 5, 6]
    assert remote_losses == pytest.approx(local_losses, rel=1e-6, abs=1e-7)
    local_weights = ckpt.read_weights(local_run / STEP6 / "model.safetensors")
    remote_weights = _weights(final[f"{STEP6}/model.safetensors"], local_run.parent)
    assert all(torch.allclose(remote_weights[k], local_weights[k], rtol=1e-5, atol=1e-7) for k in local_weights)


@pytest.mark.slow
def test_a_checkpoint_whose_objects_changed_is_not_taken_as_the_newest(gcs, resumed_run, local_run, caplog,
                                                                       tmp_path):
    from labse_model.run_store import fetch_run
    from labse_model.starting_point import load_starting_point

    copy = resumed_run["url"] + "-changed"
    local_copy = tmp_path / "copy"
    for name, data in gcs.list(resumed_run["url"]).items():
        (local_copy / name).parent.mkdir(parents=True, exist_ok=True)
        (local_copy / name).write_bytes(data)
    # Same size, one byte different: only the marker's sha256 can tell.
    state = bytearray((local_copy / STEP6 / "training_state.pt").read_bytes())
    state[len(state) // 2] ^= 0xFF
    (local_copy / STEP6 / "training_state.pt").write_bytes(bytes(state))
    gcs.upload_tree(local_copy, copy)

    with caplog.at_level(logging.WARNING):
        _, checkpoint = fetch_run(copy)
    assert checkpoint.name == "step-00000003"
    assert "step 6" in caplog.text and "does not match the sha256" in caplog.text
    with pytest.raises(ckpt.CorruptCheckpointError, match="training_state.pt does not match"):
        fetch_run(copy, step=6)
    # --init-from the changed run starts from step 3's weights, those of the local run's step 3.
    start = load_starting_point(copy)
    local = ckpt.read_weights(local_run / STEP3 / "model.safetensors")
    assert all(torch.allclose(start.weights[k], local[k], rtol=1e-5, atol=1e-7) for k in local)


@pytest.mark.slow
def test_export_to_gs_loads_back_with_the_local_exports_embeddings(gcs, labse_data, pair_inputs, resumed_run,
                                                                    local_run, tmp_path, caplog, monkeypatch):
    from sentence_transformers import SentenceTransformer

    from model_helpers import LANGS, read_multi30k

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    output = resumed_run["url"].replace("/runs/first", "/models/first")
    assert export_main(["--run", resumed_run["url"], "--output", output]) == 0
    exported = gcs.list(output)
    assert "_SUCCESS" in exported and "modules.json" in exported
    assert export_main(["--run", resumed_run["url"], "--output", output]) == 2
    assert "pass --overwrite" in caplog.text
    assert export_main(["--run", resumed_run["url"], "--output", output, "--overwrite"]) == 0

    downloaded = tmp_path / "downloaded"
    for name, data in gcs.list(output).items():
        (downloaded / name).parent.mkdir(parents=True, exist_ok=True)
        (downloaded / name).write_bytes(data)
    assert export_main(["--run", str(local_run), "--output", str(tmp_path / "local_model")]) == 0
    sentences = [line for lang in (*LANGS, "en") for line in read_multi30k(labse_data, "val", lang, 2)]
    remote = SentenceTransformer(str(downloaded), device="cpu").encode(sentences)
    local = SentenceTransformer(str(tmp_path / "local_model"), device="cpu").encode(sentences)
    assert torch.allclose(torch.tensor(remote), torch.tensor(local), atol=1e-5)


@pytest.mark.slow
def test_init_from_a_sentence_transformers_folder_on_gs(gcs, pair_inputs, bucket_shards, resumed_run, local_run,
                                                        tmp_path):
    from labse_model.starting_point import load_starting_point

    vocab, _ = pair_inputs
    _, data = bucket_shards
    model = resumed_run["url"].replace("/runs/first", "/models/for-init")
    assert export_main(["--run", str(local_run), "--output", model]) == 0
    run = tmp_path / "fine-tuned"
    assert train_main(_args(vocab, data, run, "--init-from", model)) == 0
    start = load_starting_point(model)
    assert start.kind == "sentence-transformers"
    local = ckpt.read_weights(local_run / STEP6 / "model.safetensors")
    assert all(torch.allclose(start.weights[k], local[k], atol=1e-6) for k in local)
    assert json.loads((run / "config.json").read_text())["init_from"] == model


def test_shards_on_gs_without_success_are_refused(gcs, pair_inputs, tmp_path, caplog):
    vocab, shards = pair_inputs
    bucket = gcs.new_bucket()
    # the fixture's shards are a complete output; the copy leaves out its _SUCCESS (an unfinished upload)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(Path(shards).parent, unfinished, ignore=shutil.ignore_patterns("_SUCCESS"))
    gcs.upload_tree(unfinished, f"gs://{bucket}/unfinished")
    assert train_main(_args(vocab, f"gs://{bucket}/unfinished/*.tfrecord", tmp_path / "run")) == 2
    assert "complete stage output (no _SUCCESS" in caplog.text  # the same rule as local shards


@pytest.mark.slow
def test_pretrain_streams_mono_and_pairs_from_gs_into_a_gs_run_as_on_local_disk(gcs, cache, labse_data, pair_inputs,
                                                                                 bucket_shards, tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from labse_model.pretrain import main as pretrain_main
    from model_helpers import read_multi30k, udhr_lines

    vocab, shards = pair_inputs
    bucket, remote_shards = bucket_shards
    # labse-clean's layout (sentences/lang=XX/*.parquet) for de and en, and a gzipped text file for fr.
    mono = tmp_path / "mono"
    for lang, udhr in (("de", "deu"), ("en", "eng")):
        lines = udhr_lines(labse_data, udhr)[:120]
        table = pa.table({"text": lines, "doc_id": [f"{udhr}-{i // 12}" for i in range(len(lines))],
                          "lang": [lang] * len(lines)})
        (mono / "clean" / "sentences" / f"lang={lang}").mkdir(parents=True)
        pq.write_table(table, mono / "clean" / "sentences" / f"lang={lang}" / "part-00000-of-00001.parquet",
                       row_group_size=16)
    (mono / "clean" / "_SUCCESS").write_text("{}")  # a complete labse-clean output, as readers require
    (mono / "text").mkdir()
    with gzip.open(mono / "text" / "fr.txt.gz", "wt", encoding="utf-8") as handle:
        for i, line in enumerate(read_multi30k(labse_data, "val", "fr", 120)):
            handle.write(line + ("\n\n" if i % 10 == 9 else "\n"))
    gcs.upload_tree(mono, f"gs://{bucket}/mono")

    def args(sentences: str, text: str, pairs: str, output: str) -> list[str]:
        return ["--mono", sentences, "--mono", f"fr:{text}", "--pairs", pairs, "--vocab", str(vocab),
                "--output", output, "--config", "tiny", "--stage-layers", "1,2", "--stage-fractions", "1,1",
                "--max-steps", "4", "--global-batch-size", "8", "--tlm-fraction", "0.25", "--max-seq-length", "48",
                "--lr", "1e-3", "--warmup-steps", "1", "--log-every", "1", "--save-every", "2", "--eval-every", "2",
                "--keep-checkpoints", "1", "--heldout-rate", "0.1"]

    local = tmp_path / "pt"
    remote = f"gs://{bucket}/pretrain/pt"
    assert pretrain_main(args(str(mono / "clean"), str(mono / "text" / "*.txt.gz"), shards, str(local))) == 0
    assert pretrain_main(args(f"gs://{bucket}/mono/clean", f"gs://{bucket}/mono/text/*.txt.gz", remote_shards,
                              remote)) == 0
    uploaded = gcs.list(remote)
    # keep-checkpoints 1 prunes the bucket as the disk: only step 4 is left, complete.
    assert sorted(n for n in uploaded if n.startswith("checkpoints/")) == [
        f"checkpoints/step-00000004/{name}" for name in
        ("_SUCCESS", "model.safetensors", "rng-rank00000.pt", "training_state.pt")]
    assert {"encoder.safetensors", "pretrain_config.json", "pretrain_summary.json", "vocab.txt"} <= set(uploaded)
    remote_metrics = [json.loads(line) for line in uploaded["metrics.jsonl"].decode().splitlines()]
    assert remote_metrics == read_metrics(local)  # losses, held-out scores and stages, step by step
    assert not any((cache / "runs").iterdir())  # the finished run's local mirror is gone
    remote_encoder = _weights(uploaded["encoder.safetensors"], tmp_path)
    local_encoder = ckpt.read_weights(local / "encoder.safetensors")
    assert remote_encoder.keys() == local_encoder.keys()
    assert all(torch.equal(remote_encoder[k], local_encoder[k]) for k in local_encoder)
    # The pre-trained encoder on the bucket is a starting point for labse-train, as the local one is.
    from labse_model.starting_point import load_starting_point

    start = load_starting_point(remote)
    assert start.kind == "pretrain"
    assert all(torch.equal(start.weights[k], local_encoder[k]) for k in local_encoder)


def test_mono_sentences_on_gs_without_success_are_refused(gcs, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from labse_model.pretrain_data import find_mono_corpora
    from pipelines.io.config_options import UsageError

    partition = tmp_path / "clean" / "sentences" / "lang=de"
    partition.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["Ein Satz."], "lang": ["de"]}), partition / "part-00000-of-00001.parquet")
    bucket = gcs.new_bucket()
    gcs.upload_tree(tmp_path / "clean", f"gs://{bucket}/clean")  # an interrupted labse-clean: no _SUCCESS
    with pytest.raises(UsageError, match="no _SUCCESS"):
        find_mono_corpora([f"gs://{bucket}/clean"])
