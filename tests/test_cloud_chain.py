"""The demo's chain with every input and output on gs:// (the local Cloud Storage emulator) gives
what the same chain gives on local disk, and the object-store rules of the README's Reliability
section hold on gs://, shown by running the commands: the lock, refusal of an existing output,
--overwrite, _SUCCESS last, refusal of an input without _SUCCESS, the identity check read back from
the bucket, and a run killed mid-way then rerun.

The chain (tests/cloud_chain.py): labse-main-content build-data and train, labse-clean with that
model, labse-vocab, labse-mine, labse-score, labse-tfrecords, labse-distill, each a subprocess of its console
script, small inputs (a couple of minutes per chain on 2 cores).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from cloud_chain import Chains, command_path, run_command

pytestmark = pytest.mark.slow

# Keys whose values differ between two runs of the same stage on the same input: clocks, and the
# paths themselves (replaced by ROOT / INPUTS before comparing).
VOLATILE_KEYS = {"seconds", "completed_at", "train_seconds", "outputs"}


def normalised(value, chains: Chains):
    """A stats JSON with clocks dropped and each chain's root replaced by the same name."""
    if isinstance(value, dict):
        return {k: normalised(v, chains) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [normalised(v, chains) for v in value]
    if isinstance(value, str):
        return value.replace(chains.gs, "ROOT").replace(str(chains.local), "ROOT")
    return value


def stats_of(folder: Path, name: str, chains: Chains):
    return normalised(json.loads((folder / name).read_text(encoding="utf-8")), chains)


def rows_of(folder: Path, chains: Chains) -> list[dict]:
    """Every Parquet row below `folder`, sorted, with the chain's root replaced (URLs of text
    files carry it)."""
    rows = [normalised(row, chains) for path in sorted(folder.rglob("*.parquet"))
            for row in pq.read_table(path).to_pylist()]
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True, default=str))


def both(chains: Chains, relative: str) -> tuple[Path, Path]:
    return chains.local / relative, chains.gs_copy / relative


# ------------------------------------------------------------------------ the chain's outputs
def test_main_content_data_and_model_are_the_same_on_gs(chains):
    local, remote = both(chains, "main_content/data")
    for name in ("train.txt", "dev.pages.jsonl", "test.pages.jsonl"):
        assert (local / name).read_bytes() == (remote / name).read_bytes(), name
    assert stats_of(local, "stats.json", chains) == stats_of(remote, "stats.json", chains)
    local_model, remote_model = both(chains, "main_content/model.bin")
    assert local_model.read_bytes() == remote_model.read_bytes()  # one fastText thread: repeatable
    metrics = [stats_of(m.parent, m.name + ".metrics.json", chains) for m in (local_model, remote_model)]
    assert metrics[0] == metrics[1]


def test_cleaned_sentences_and_stats_are_the_same_on_gs(chains):
    local, remote = both(chains, "clean")
    local_rows = rows_of(local / "sentences", chains)
    assert local_rows and local_rows == rows_of(remote / "sentences", chains)
    assert stats_of(local, "stats.json", chains) == stats_of(remote, "stats.json", chains)
    assert json.loads((remote / "_SUCCESS").read_text())["stats"]["identity_holds"] is True


def test_vocabulary_is_the_same_on_gs(chains):
    local, remote = both(chains, "vocab")
    assert (local / "vocab.txt").read_bytes() == (remote / "vocab.txt").read_bytes()
    assert stats_of(local, "vocab.stats.json", chains) == stats_of(remote, "vocab.stats.json", chains)


def test_mined_scored_pairs_and_tfrecords_are_the_same_on_gs(chains):
    """Mining embeds in batches keyed by content (pipelines.mine.transforms.Embed), so both chains
    embed the same batches and mine the same pairs with the same margins, to the last bit; scoring
    and TFRecords then read identical inputs and must agree exactly too."""
    local, remote = both(chains, "pairs")
    local_pairs, remote_pairs = rows_of(local, chains), rows_of(remote, chains)
    assert local_pairs, "the chain mined no pairs"
    assert local_pairs == remote_pairs
    local_stats, remote_stats = (stats_of(d, "_stats.json", chains) for d in (local, remote))
    assert local_stats["accounting"] == remote_stats["accounting"]
    local, remote = both(chains, "scored")
    assert rows_of(local, chains) == rows_of(remote, chains)
    assert stats_of(local, "_stats.json", chains) == stats_of(remote, "_stats.json", chains)
    local, remote = both(chains, "tfrecords")
    shards = sorted(p.name for p in local.glob("*.tfrecord*"))
    assert shards and shards == sorted(p.name for p in remote.glob("*.tfrecord*"))
    for name in shards:
        assert (local / name).read_bytes() == (remote / name).read_bytes(), name
    for name in ("stats.json", "schema.json"):
        assert stats_of(local, name, chains) == stats_of(remote, name, chains)


def test_distilled_miner_is_the_same_on_gs_and_resumes_from_the_bucket(chains, gcs, monkeypatch, tmp_path):
    """labse-distill from gs:// sentences, text and vocabulary into a gs:// output, its teacher pass
    and checkpoint in gs://.../distill.work: the same table and books as the local chain's, and the
    model (copied down) embeds as the local one does. Rerun with --overwrite where the checkpoint's
    local copy is gone (a fresh LABSE_CACHE, as on another machine): the teacher pass is reused and
    the training resumes from the bucket's checkpoint, giving the same model."""
    from cloud_chain import chain_commands
    from pipelines.embed.static import StaticEmbedder, read_table

    local, remote = both(chains, "distill")
    for local_part, remote_part in zip(read_table(local), read_table(remote)):
        np.testing.assert_array_equal(local_part, remote_part)
    books = [stats_of(folder, "stats.json", chains) for folder in (local, remote)]
    for stats in books:  # named by fingerprints of their inputs' paths
        assert stats.pop("teacher_pass").startswith("ROOT/distill.work/teacher-")
        assert stats.pop("checkpoint").startswith("ROOT/distill.work/checkpoint-")
    assert books[0] == books[1] and books[0]["identity_holds"]
    assert stats_of(local, "static_embedder.json", chains) == stats_of(remote, "static_embedder.json", chains)
    sentences = (chains.local / "mine" / "de" / "sentences.txt").read_text(encoding="utf-8").splitlines()[:50]
    np.testing.assert_array_equal(StaticEmbedder(local).encode(sentences), StaticEmbedder(remote).encode(sentences))
    work = objects(gcs, f"{chains.gs}/distill.work")
    assert any(name.startswith("teacher-") and name.endswith("/_SUCCESS") for name in work)
    assert any(name.startswith("checkpoint-") and name.endswith(".safetensors") for name in work)

    monkeypatch.setenv("LABSE_CACHE", str(tmp_path / "elsewhere"))
    rerun = run_command([*dict(chain_commands(chains.gs))["distill"], "--overwrite"])
    assert "teacher vectors: reusing" in rerun.stderr and "2 epoch(s) done, 0 to go" in rerun.stderr, rerun.stderr
    assert rerun.stdout.startswith("labse-distill: ") and "sentences read" in rerun.stdout, rerun.stdout
    table = gcs.list(f"{chains.gs}/distill")["model.safetensors"]
    assert table == (remote / "model.safetensors").read_bytes()


# ------------------------------------------------------------------------ rules on gs://
def objects(gcs, url: str) -> list[str]:
    return gcs.names(url)


def score_argv(chains: Chains, output: str, *extra: str) -> list[str]:
    return ["labse-score", "--pairs", f"{chains.gs}/pairs", "--output", output,
            "--model", f"{chains.gs}/scorer", "--keep-precision", "0.8", *extra]


def test_gs_output_is_locked_refused_and_overwritten(chains, gcs):
    from pipelines.io.locks import output_lock

    output = f"gs://{chains.bucket}/rules/scored"
    lock = f"gs://{chains.bucket}/rules"
    # Another run holds the lock: held here, in this live process, rather than by a real first run,
    # which could end before the second reaches the lock (it checks and builds its pipeline first).
    with output_lock(output):
        second = run_command(score_argv(chains, output, "--overwrite"), expect=2)
    assert "being written by another run" in second.stderr and "scored.lock" in second.stderr
    assert not objects(gcs, output)  # refused before anything was written
    run_command(score_argv(chains, output))
    written = objects(gcs, output)
    assert "_SUCCESS" in written and "scored.lock" not in objects(gcs, lock)

    refused = run_command(score_argv(chains, output), expect=2)
    assert "already holds output" in refused.stderr and "--overwrite" in refused.stderr
    assert objects(gcs, output) == written  # a refused run touches nothing

    run_command(score_argv(chains, output, "--overwrite"))
    assert objects(gcs, output) == written
    marker = json.loads(gcs.list(output)["_SUCCESS"])
    assert marker["stats"]["identity_holds"] is True


def test_success_marker_is_the_last_object_written(chains, gcs):
    bucket = gcs.client().bucket(chains.bucket)
    for stage in ("main_content/data", "clean", "pairs", "scored", "tfrecords", "distill"):
        prefix = f"{stage}/"
        blobs = {b.name[len(prefix):]: b.updated for b in bucket.list_blobs(prefix=prefix)}
        assert "_SUCCESS" in blobs, stage
        assert blobs["_SUCCESS"] == max(blobs.values()), stage


def test_identity_check_reads_gs_stats_back(gcs):
    """run_stage checks the identity of stats its Beam workers wrote to the bucket (it used to
    return 0 for any object-store output without reading them)."""
    import apache_beam as beam

    from pipelines.io.completion import finish_output, read_output_stats
    from pipelines.stage import run_stage

    bucket = gcs.new_bucket()
    balanced = {"accounting": {"pairs": {"read": 3, "kept": 2, "dropped": {"low": 1}, "errored": 0}}}
    broken = {"accounting": {"pairs": {"read": 3, "kept": 1, "dropped": {"low": 1}, "errored": 0}}}

    def run(output, stats) -> int:
        def wire(pipeline):  # the stats are written by the pipeline, as every stage's last step does
            _ = pipeline | beam.Create([None]) | beam.Map(lambda _: finish_output(output, stats, stage="test", shards_in_root=True))

        return run_stage("test", output, overwrite=False, beam_args=[], wire=wire,
                         finish=lambda: read_output_stats(output))

    assert run(f"gs://{bucket}/good", balanced) == 0
    assert run(f"gs://{bucket}/bad", broken) == 1


def test_killed_run_is_not_complete_and_a_rerun_succeeds(chains, gcs):
    output = f"gs://{chains.bucket}/killed/clean"
    argv = ["labse-clean", "--input", f"{chains.gs}/crawl/*.warc.gz", "--output", output,
            "--main-content-model", f"{chains.gs}/main_content/model.bin"]
    run = subprocess.Popen([command_path(argv[0]), *argv[1:]], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not set(objects(gcs, output)) - {"_STARTED"}:  # Beam has started writing into the output
            assert run.poll() is None, "the run ended before anything was written: nothing to kill"
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    left = objects(gcs, output)
    assert "_SUCCESS" not in left and "_STARTED" in left
    assert "clean.lock" in objects(gcs, f"gs://{chains.bucket}/killed")  # the dead run's lock stays

    # the next stage refuses it as input (exit 2, one line)
    refused = run_command(["labse-vocab", "--input", f"{output}/sentences", "--output",
                           f"gs://{chains.bucket}/killed/vocab.txt", "--vocab-size", "3000"], expect=2)
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    # a rerun without --overwrite is refused (the partial output is there) ...
    assert "already holds output" in run_command(argv, expect=2).stderr
    # ... with --overwrite it replaces it: the dead run's lock is taken over (same host, no process)
    run_command([*argv, "--overwrite"])
    assert "_SUCCESS" in objects(gcs, output)
    rerun = json.loads(gcs.list(output)["_SUCCESS"])["stats"]
    chain = json.loads((chains.local / "clean" / "stats.json").read_text())
    assert rerun["accounting"] == chain["accounting"]


def test_an_input_without_success_is_refused(chains, gcs):
    """Shards all there but no _SUCCESS (a run still writing, or one that died before its last
    write): the next stage refuses the input, naming the marker."""
    bucket = gcs.client().bucket(chains.bucket)
    for stage in ("clean", "pairs"):
        for blob in bucket.list_blobs(prefix=f"{stage}/"):
            if not blob.name.endswith("/_SUCCESS"):
                bucket.copy_blob(blob, bucket, f"unfinished/{blob.name}")
    unfinished = f"gs://{chains.bucket}/unfinished"
    refused = run_command(["labse-vocab", "--input", f"{unfinished}/clean/sentences", "--output",
                           f"{unfinished}/vocab.txt", "--vocab-size", "3000"], expect=2)
    assert "no _SUCCESS" in refused.stderr and "Traceback" not in refused.stderr
    refused = run_command(["labse-score", "--pairs", f"{unfinished}/pairs", "--output", f"{unfinished}/scored",
                           "--model", f"{chains.gs}/scorer"], expect=2)
    assert "no _SUCCESS" in refused.stderr and "Traceback" not in refused.stderr
    assert not gcs.list(f"{unfinished}/scored")
