"""Where an openrlhf-backend run listens (docs/security.md): the torch-distributed stores that mmrl hosts (DeepSpeed's
rendezvous, the rehearsal's weight-sync group) accept connections on the address their ranks are given, never on
every interface. Ray's own servers are checked while a rehearsal runs (tests/rehearsal_run.py) and when the backend
starts a local Ray (tests/test_openrlhf_devices.py)."""

from __future__ import annotations

import datetime
import os
import socket
import threading

import pytest
import torch
import torch.distributed as dist
from listeners import exposed, is_loopback, listeners

from mmrl.openrlhf.network import bound_listener, local_ray_options


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_loopback_addresses_are_told_apart():
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1"))


def test_a_store_on_every_interface_is_seen():
    """The check itself: torch's own store server listens on every interface, and tests/listeners.py finds it."""
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    assert any(f":{store.port} " in line for line in exposed())


def test_a_bound_listener_is_on_its_address_only():
    port = free_port()
    with bound_listener("127.0.0.1", port):
        mine = [(a, p) for _, _, a, p in listeners() if p == port]
        assert mine == [("127.0.0.1", port)]


def test_the_weight_sync_group_listens_on_its_host_only():
    from mmrl.openrlhf.vllm_stand_in import PyNcclCommunicator, StatelessProcessGroup

    port, received = free_port(), torch.zeros(3)

    def engine() -> None:  # the rollout side, rank 1
        PyNcclCommunicator(StatelessProcessGroup.create("127.0.0.1", port, 1, 2)).broadcast(received, 0)

    thread = threading.Thread(target=engine)
    thread.start()
    policy = PyNcclCommunicator(StatelessProcessGroup.create("127.0.0.1", port, 0, 2))
    policy.broadcast(torch.ones(3), 0)
    thread.join(timeout=60)
    assert received.tolist() == [1.0, 1.0, 1.0]
    assert not exposed() and any(p == port for _, _, _, p in listeners())


def test_deepspeeds_rendezvous_is_hosted_on_master_addr_only(monkeypatch):
    """The env:// rendezvous DeepSpeed's ``init_distributed`` runs: rank 0 hosts the store on ``MASTER_ADDR``."""
    from openrlhf_stubs import openrlhf_importable

    with openrlhf_importable():
        from mmrl.openrlhf.strategy import AGENT_STORE_ENV, host_rendezvous_store
    port = free_port()
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       AGENT_STORE_ENV: ""}.items():
        monkeypatch.setenv(key, value)
    hosted = host_rendezvous_store()
    assert hosted is not None and os.environ[AGENT_STORE_ENV] == "True"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # init_method env://, as DeepSpeed's
    try:
        dist.all_reduce(torch.ones(1))
        assert not exposed() and any(p == port for _, _, _, p in listeners())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dashboard", [False, True])
def test_a_local_ray_gets_loopback_and_a_dashboard_only_when_asked(dashboard):
    options = local_ray_options(dashboard)
    assert options["_node_ip_address"] == "127.0.0.1" and options["include_dashboard"] is dashboard
    assert options.get("dashboard_host", "127.0.0.1") == "127.0.0.1"
