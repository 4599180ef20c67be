"""Who holds a TCP port of this machine: checked before rayflow sends anything to a service it
started on a port chosen ahead of the process that binds it.

Ray's dashboard (backend=local's `ray.init`, vm fake_multinode's `ray start --head`) binds a port
that rayflow picks first, since every Ray process must be told the address before it starts. In
between, another user of the machine can bind that port and would then receive the Ray token
with the first request. So before the first request, the listener that a connection to the
address would reach is looked up in the kernel's socket table (/proc/net/tcp and tcp6, readable by
every user, with each socket's owner): a listener of another user is a one-line ClusterError and
nothing is sent; no listener yet means the service has not bound it yet. The SSH tunnel needs no
such check: its port is bound by this process itself (rayflow.backends.vm.tunnel), which uses
`peer_uid` to answer only this user's connections.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rayflow.errors import ClusterError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}
LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp writes the state


@dataclass(frozen=True)
class Socket:
    """One row of the kernel's TCP table."""

    local: Address
    port: int
    remote: Address
    remote_port: int
    listening: bool
    uid: int


def _address(text: str) -> tuple[Address, int]:
    """`0100007F:1F90` (the kernel's 32-bit words, in this machine's byte order) as (ip, port)."""
    hexed, port = text.split(":")
    raw = b"".join(struct.pack("=I", int(hexed[i : i + 8], 16)) for i in range(0, len(hexed), 8))
    return ipaddress.ip_address(raw), int(port, 16)


def sockets() -> list[Socket]:
    """Every TCP socket of this machine's network namespace (IPv6 too, where the kernel has it)."""
    found = []
    for table in TABLES.values():
        try:
            lines = table.read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            local, port = _address(fields[1])
            remote, remote_port = _address(fields[2])
            found.append(
                Socket(local, port, remote, remote_port, fields[3] == LISTEN, int(fields[7]))
            )
    return found


def _targets(host: str) -> list[Address]:
    """The addresses a client connecting to `host` may reach (localhost: both loopbacks)."""
    text = host.strip("[]")
    if text.lower() == "localhost":
        return [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    try:
        return [ipaddress.ip_address(text.split("%")[0])]
    except ValueError:
        infos = socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
        return sorted(
            {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}, key=str
        )


def _reaches(listener: Address, target: Address) -> bool:
    """Whether a socket listening on `listener` takes connections to `target`: the same address,
    its family's any-address, or an IPv6 any-address (dual stack) or mapped form for IPv4."""
    if listener == target or (listener.version == target.version and listener.is_unspecified):
        return True
    if isinstance(listener, ipaddress.IPv6Address) and target.version == 4:
        return listener.is_unspecified or listener.ipv4_mapped == target
    return False


def listeners(host: str, port: int) -> list[Socket]:
    """The listening sockets a connection to host:port may reach."""
    targets = _targets(host)
    return [
        s
        for s in sockets()
        if s.listening and s.port == port and any(_reaches(s.local, t) for t in targets)
    ]


def _who(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def held(host: str, port: int, what: str) -> bool:
    """Whether a process of this user's listens on host:port; ClusterError (one line) when one of
    another user's does, before anything is sent there."""
    found = listeners(host, port)
    for s in found:
        if s.uid != os.getuid():
            raise ClusterError(
                f"{what}: port {port} on {host} is held by {_who(s.uid)}, another user of this "
                "machine: nothing was sent to it (it would receive the Ray token); stop that "
                "process, or run again on another port"
            )
    return bool(found)


def local_host(host: str) -> bool:
    """Whether `host` names this machine: loopback or one of its interfaces' addresses, so its
    sockets are in this machine's table (a remote head's are not)."""
    import psutil

    try:
        targets = _targets(host)
    except OSError:  # a name that does not resolve here: not this machine
        return False
    mine = {
        str(a.address).split("%")[0]
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in TABLES
    }
    return all(t.is_loopback or str(t) in mine for t in targets)


def url_held(url: str, what: str) -> bool:
    """`held` for an http(s) URL on this machine; True for one on another machine (its sockets
    are not in this machine's table)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return held(host, port, what) if local_host(host) else True


def wait_held(host: str, port: int, what: str, timeout_s: float) -> None:
    """Until a process of this user's listens on host:port (at most `timeout_s`); another user's
    listener is refused at once."""
    deadline = time.monotonic() + timeout_s
    while not held(host, port, what):
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{what}: nothing listened on {host}:{port} within {timeout_s:g} s of its start"
            )
        time.sleep(0.2)


def peer_uid(conn: socket.socket) -> int | None:
    """The user who owns the other end of an accepted loopback TCP connection (its socket's row:
    local address our peer, remote address our end), or None when it is not in the table."""
    peer, own = conn.getpeername()[:2], conn.getsockname()[:2]
    for s in sockets():
        if (str(s.local), s.port, str(s.remote), s.remote_port) == (*peer, *own):
            return s.uid
    return None
