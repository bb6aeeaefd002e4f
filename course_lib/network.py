"""This node on the network, torch-free: its interfaces (which one gloo would bind to,
loopback's name, which one holds an address), free ports, the sockets a process holds, and,
before a multi-node launch, whether another node reaches this one's port and this node
reaches it back.

    network_interfaces()      # each interface, its IPv4 address, the one gloo would use
    loopback_interface()      # "lo" on Linux, "lo0" on macOS: where the launcher's ranks talk
    interface_of("10.0.0.5")  # the interface that holds an address
    free_port(), free_ports(2)              # ports nobody listens on now (MASTER_PORT, endpoints)
    non_loopback(socket_addresses(pid))     # a process's sockets outside loopback

On node 0:      python -m course_lib doctor --listen 29500
On each other:  python -m course_lib doctor --peer node0:29500

The peer connects to HOST:PORT, names a port it listens on (on the address it used), and
the listener connects back to it: both directions that gloo's full mesh needs. A failure
names the problem (unknown host, nothing listening, no answer) instead of a hang at start-up.
psutil is imported only where it is used: the launcher imports this module for
loopback_interface and free_port alone.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time
from dataclasses import dataclass

HELLO = "course-doctor-peer"


@dataclass
class Reach:
    ok: bool
    detail: str


def network_interfaces() -> list[dict[str, str]]:
    """This machine's interfaces with their IPv4 address, and which one gloo would bind to:
    GLOO_SOCKET_IFNAME's if set, otherwise the one holding the hostname's address."""
    rows = [{"interface": name, "ipv4": next(iter(ips), "")}
            for name, ips in _ipv4_addresses().items()]
    chosen = os.environ.get("GLOO_SOCKET_IFNAME", "")
    try:
        host_ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        host_ip = ""
    for row in rows:
        by_env = row["interface"] == chosen
        by_host = not chosen and row["ipv4"] == host_ip
        row["gloo"] = ("<- GLOO_SOCKET_IFNAME" if by_env else
                       f"<- hostname {socket.gethostname()} resolves here" if by_host else "")
    return rows


def loopback_interface() -> str:
    """The loopback interface's name: "lo" on Linux, "lo0" on macOS."""
    names = {name for _, name in socket.if_nameindex()}
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise RuntimeError(f"no loopback interface found among {sorted(names)} on {sys.platform}")


def interface_of(ip: str) -> str:
    """The name of the interface that holds `ip` ("?" when none is found)."""
    return next((name for name, ips in _ipv4_addresses().items() if ip in ips), "?")


def free_ports(n: int = 1) -> list[int]:
    """`n` different TCP ports that nobody listens on now on 127.0.0.1 (the OS picks them),
    for MASTER_PORT and rendezvous endpoints. All are held until all are chosen, so none
    repeats; the caller only passes the numbers on, as torchrun does."""
    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    """One TCP port that nobody listens on now."""
    return free_ports(1)[0]


def socket_addresses(pid: int | None = None) -> list[tuple[str, str, int]]:
    """(status, local ip, local port) for every inet socket the process holds (default:
    this one): the proof that a launch's ranks stay on loopback."""
    import psutil

    proc = psutil.Process(pid)
    return [(c.status, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
            if c.laddr]


def non_loopback(addresses: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The sockets bound to an address other than 127.0.0.0/8 or ::1 (wildcards included)."""
    return [a for a in addresses if not ipaddress.ip_address(a[1].split("%")[0]).is_loopback]


def _ipv4_addresses() -> dict[str, list[str]]:
    """Each interface's name and its IPv4 addresses (none for an IPv6-only one)."""
    import psutil

    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def probe(host: str, port: int, wait: float = 10.0) -> Reach:
    """Connect to host:port (retrying for `wait` s while nothing listens yet), then ask the
    listener there to connect back to this node."""
    try:
        socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return Reach(False, f"cannot resolve {host!r} ({exc.strerror}): use the name or "
                            "address the other node has on the cluster's network")
    conn = _connect(host, port, wait)
    if isinstance(conn, Reach):
        return conn
    with conn:
        local = conn.getsockname()[0]
        there = f"{host}:{port} reached from {local} (interface {interface_of(local)})"
        with socket.create_server((local, 0)) as back:
            back.settimeout(5.0)
            conn.sendall(f"{HELLO} {back.getsockname()[1]}\n".encode())
            conn.settimeout(5.0)
            try:
                reply = conn.recv(200).decode(errors="replace").strip()
            except OSError:
                reply = ""
            if not reply.startswith(HELLO):
                return Reach(True, f"{there}; something else listens there (the rendezvous "
                                   "already running?), so the way back was not tested: run "
                                   f"`doctor --listen {port}` there before starting torchrun")
            if reply != f"{HELLO} ok":
                return Reach(False, f"{there}, but it could not connect back to {local}: "
                                    f"{reply[len(HELLO):].strip()}; a firewall on this node, "
                                    "or set GLOO_SOCKET_IFNAME to an interface it reaches")
    return Reach(True, f"{there}; it connected back to {local}: both ways work")


def _connect(host: str, port: int, wait: float) -> socket.socket | Reach:
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port), timeout=max(0.1, min(3.0, left)))
        except ConnectionRefusedError:
            if left <= 0.2:
                return Reach(False, f"nothing listens on {host}:{port} (connection refused "
                                    f"for {wait:g} s): start node 0 first, and check that "
                                    "this is the port it was given")
            time.sleep(0.2)
        except TimeoutError:
            if time.monotonic() >= deadline:
                return Reach(False, f"no answer from {host}:{port} in {wait:g} s: a firewall "
                                    "drops the packets, or the address is not one this node "
                                    "can route to")
        except OSError as exc:
            return Reach(False, f"cannot connect to {host}:{port}: {exc.strerror or exc}")


def listen(port: int, wait: float = 30.0) -> Reach:
    """Answer one peer on `port`: connect back to the port it names, tell it how that went."""
    try:
        server = socket.create_server(("", port))
    except OSError as exc:
        return Reach(False, f"cannot listen on port {port}: {exc.strerror}; something else "
                            "holds it (a torchrun still running?), or pick another port")
    with server:
        server.settimeout(wait)
        try:
            conn, (peer, _) = server.accept()
        except TimeoutError:
            return Reach(False, f"no peer connected to port {port} in {wait:g} s: run "
                                f"`doctor --peer THIS_HOST:{port}` on the other node")
    with conn:
        conn.settimeout(5.0)
        words = conn.recv(200).decode(errors="replace").split()
        if len(words) != 2 or words[0] != HELLO:
            return Reach(False, f"{peer} connected but is not `doctor --peer`")
        try:
            socket.create_connection((peer, int(words[1])), timeout=5.0).close()
        except OSError as exc:
            conn.sendall(f"{HELLO} {exc.strerror or exc}\n".encode())
            return Reach(False, f"{peer} reached port {port}, but connecting back to "
                                f"{peer}:{words[1]} failed: {exc.strerror or exc}")
        conn.sendall(f"{HELLO} ok\n".encode())
    return Reach(True, f"{peer} reached port {port}, and this node reached it back")
