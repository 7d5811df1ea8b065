"""A local run of a Beam stage uses the network for nothing: Beam 2.77's DirectRunner first tries
the PrismRunner, which downloads its binary from GitHub while the pipeline starts (offline that
fails and Beam falls back); the stage kit (`pipelines.stage.local_runner`) skips that attempt, so
every local run goes straight to Beam's in-process runner, whatever the DirectRunner options."""
from __future__ import annotations

import logging
import socket
import urllib.request

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import stage
from pipelines.io.completion import finish_output, read_completion, read_output_stats

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "", None)


@pytest.fixture(autouse=True)
def beams_own_default(monkeypatch):
    """conftest skips Prism for every test's own `beam.Pipeline()`; these tests prove the stage kit
    skips it by itself, so they run with Beam's own default back."""
    from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner

    monkeypatch.setattr(SwitchingDirectRunner, "_is_interactive", False)


@pytest.fixture
def network_attempts(monkeypatch) -> list[str]:
    """Every attempt to reach a host other than this machine (name lookup, connection, URL),
    refused and recorded; local connections (Beam's own workers) go through."""
    attempts: list[str] = []
    real_getaddrinfo, real_connect, real_connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex

    def refused(target) -> OSError:
        attempts.append(str(target))
        return OSError(f"a test may not use the network (tried {target})")

    def getaddrinfo(host, *args, **kwargs):
        if host not in LOCAL_HOSTS:
            raise refused(host)
        return real_getaddrinfo(host, *args, **kwargs)

    def remote(address) -> bool:
        return isinstance(address, tuple) and address[0] not in LOCAL_HOSTS

    def connect(self, address):
        if remote(address):
            raise refused(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        if remote(address):
            raise refused(address)
        return real_connect_ex(self, address)

    def urlopen(url, *args, **kwargs):
        raise refused(getattr(url, "full_url", url))

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return attempts


@pytest.mark.parametrize("beam_args", [
    [],
    ["--runner", "DirectRunner"],
    ["--runner", "apache_beam.runners.direct.direct_runner.DirectRunner"],
    ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"],
], ids=["default", "DirectRunner", "qualified-name", "multi_processing"])
def test_a_local_stage_run_tries_no_download_and_no_prism(beam_args, tmp_path, network_attempts, caplog, capsys):
    caplog.set_level(logging.INFO)
    output = str(tmp_path / "out")

    def wire(pipeline):  # what runs on a worker names only the project's modules (workers import those)
        return (pipeline | beam.Create(range(1, 11)) | beam.CombineGlobally(sum)
                | beam.Map(lambda total: finish_output(output, {"accounting": {"numbers": {
                    "read": total, "kept": total, "dropped": {}, "errored": 0}}}, stage="tiny")))

    status = stage.run_stage("tiny", output, overwrite=False, beam_args=beam_args, wire=wire,
                             finish=lambda: read_output_stats(output))
    assert status == 0, capsys.readouterr().err
    assert read_output_stats(output)["accounting"]["numbers"]["read"] == 55  # the pipeline ran, whole
    assert read_completion(output) is not None
    assert network_attempts == []
    assert "prism" not in caplog.text.lower()


def test_the_direct_runner_is_chosen_without_prism_and_other_runners_are_left_to_beam():
    for args in ([], ["--runner", "DirectRunner"], ["--runner", "direct"], ["--runner", "SwitchingDirectRunner"]):
        runner = stage.local_runner(PipelineOptions(args))
        assert type(runner).__name__ == "SwitchingDirectRunner" and runner._is_interactive, args
    for name in ("DataflowRunner", "PortableRunner", "PrismRunner", "BundleBasedDirectRunner"):
        assert stage.local_runner(PipelineOptions(["--runner", name])) is None, name
