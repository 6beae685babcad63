"""Where the servers of an openrlhf-backend run listen (docs/security.md).

A Ray that mmrl starts itself (no ``cluster.ray_address``) is a one-machine cluster: every Ray server (GCS, raylet,
object manager, workers, agents) and every torch-distributed store accepts connections on loopback only, and Ray's
dashboard runs only when ``cluster.dashboard`` asks for it (on 127.0.0.1). Ray's job and client APIs are
unauthenticated by default, so a port on a reachable address lets anyone who reaches it run code as this user.

Pure Python: this module imports neither Ray nor torch, because Ray must be told before it is imported.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"  # Linux's loopback interface, for gloo's and NCCL's own sockets

# Ray reads this once, when it is imported: with it off, Ray runs as a one-machine cluster and gives every server
# the loopback address (on Linux it otherwise resolves even an explicit 127.0.0.1 node address to the machine's
# network address, and binds there and on every interface).
SINGLE_MACHINE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# gloo (the CPU collectives and the rehearsal's weight sync) and NCCL's bootstrap open their own sockets, on the
# address the host name resolves to unless told an interface
COLLECTIVES_ENV = {"GLOO_SOCKET_IFNAME": LOOPBACK_INTERFACE, "NCCL_SOCKET_IFNAME": LOOPBACK_INTERFACE}


def single_machine_ray() -> None:
    """Make the Ray this process starts a loopback-only one; call it before ``import ray``."""
    wanted = {k: v for k, v in SINGLE_MACHINE_ENV.items() if os.environ.get(k) != v}
    if wanted and "ray" in sys.modules:
        raise RuntimeError("ray was imported before mmrl.openrlhf.network.single_machine_ray(); a local Ray would "
                           "listen on the machine's network address")
    os.environ.update(wanted)


def local_ray_options(dashboard: bool = False) -> dict[str, Any]:
    """``ray.init`` options of a Ray started on this machine: loopback, no dashboard unless asked (then on
    127.0.0.1, reached through an ssh tunnel)."""
    options: dict[str, Any] = {"_node_ip_address": LOOPBACK, "include_dashboard": dashboard}
    if dashboard:
        options["dashboard_host"] = LOOPBACK
    return options


def local_job_env(env: dict[str, str]) -> dict[str, str]:
    """The job's worker environment on a local Ray: collectives on the loopback interface (a value the user set in
    ``env`` or this process's environment wins)."""
    return {**{k: os.environ.get(k, v) for k, v in COLLECTIVES_ENV.items()}, **env}


def bound_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on exactly ``host:port`` (not every interface), for a ``TCPStore``'s
    ``master_listen_fd``: torch's store server otherwise binds ``::``, whatever host it is given."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
