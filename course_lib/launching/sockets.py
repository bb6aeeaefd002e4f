"""Which addresses a process's sockets use: the proof that ranks stay on loopback."""

from __future__ import annotations

import ipaddress

import psutil


def socket_addresses(pid: int | None = None) -> list[tuple[str, str, int]]:
    """(status, local ip, local port) for every inet socket the process holds."""
    proc = psutil.Process(pid)
    return [(c.status, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
            if c.laddr]


def non_loopback(addresses: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The sockets bound to an address other than 127.0.0.0/8 or ::1 (wildcards included)."""
    return [a for a in addresses if not ipaddress.ip_address(a[1].split("%")[0]).is_loopback]
