"""Keep every rank's sockets on the loopback interface."""

from __future__ import annotations

import socket

from course_lib.network import loopback_interface


def loopback_env() -> dict[str, str]:
    """Environment that binds gloo's and NCCL's sockets to loopback (docs/facts.md)."""
    iface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now; only exported as MASTER_PORT, as torchrun does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
