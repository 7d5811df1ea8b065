"""tests/model_helpers' port helpers: a port chosen for a later server is kept from plain binds
(TIME_WAIT) yet open to the SO_REUSEADDR bind of the server; a spawn that lost the port retries."""
import socket

import pytest
import torch.multiprocessing as mp

from model_helpers import free_port, spawn_on_free_port


def test_a_free_port_is_refused_to_a_plain_bind_and_open_to_a_server_that_reuses_addresses():
    port = free_port()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)


def test_a_spawn_whose_port_was_taken_runs_again_on_another(monkeypatch):
    calls = []

    def spawn(run, args, nprocs):
        calls.append(args)
        if len(calls) == 1:
            raise mp.ProcessRaisedException("... name: EADDRINUSE, message: address already in use", 0, 1)

    monkeypatch.setattr(mp, "spawn", spawn)
    spawn_on_free_port(print, lambda port: ("x", port), nprocs=2)
    assert len(calls) == 2 and calls[0][1] != calls[1][1] and calls[0][0] == "x"


def test_any_other_failure_of_a_spawned_rank_is_raised_at_once(monkeypatch):
    calls = []

    def spawn(run, args, nprocs):
        calls.append(args)
        raise mp.ProcessRaisedException("AssertionError: gradients differ", 1, 2)

    monkeypatch.setattr(mp, "spawn", spawn)
    with pytest.raises(mp.ProcessRaisedException, match="gradients differ"):
        spawn_on_free_port(print, lambda port: (port,), nprocs=2)
    assert len(calls) == 1
