"""Keep every rank's sockets on the loopback interface."""

from __future__ import annotations

from course_lib.network import loopback_interface


def loopback_env() -> dict[str, str]:
    """Environment that binds gloo's and NCCL's sockets to loopback (docs/facts.md)."""
    iface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}
