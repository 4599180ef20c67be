"""Network namespaces on a bridge of this machine: the plumbing the process kubelet's pods (and
tests/harness/ssh_hosts.py's SSH hosts) stand on.

Each namespace gets one veth pair: its `eth0` inside, the other end enslaved to the bridge, an
IPv4 address on the bridge's subnet and (optionally) a default route through the bridge's own
address. IPv6 is off on every link made, so nothing autoconfigures an address that leaves the
subnet. The machine does not forward packets (`net.ipv4.ip_forward=0`, checked by
`forwarding_off`), so a default route reaches the bridge's address and the other namespaces on it,
and nothing beyond.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

NETNS_DIR = "/run/netns"


class NetError(RuntimeError):
    pass


def run(
    argv: list[str], timeout: float = 30, check: bool = True, what: str | None = None
) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NetError(f"{what or shlex.join(argv)}: no answer within {timeout:g} s") from None
    if check and done.returncode != 0:
        raise NetError(
            f"{what or shlex.join(argv)} failed (exit {done.returncode}): "
            f"{done.stderr.strip() or done.stdout.strip()}"
        )
    return done


def wait(predicate, timeout: float, interval: float = 0.1):
    """predicate()'s first true value, or its last false one after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def netns_names() -> list[str]:
    # The files `ip netns add` makes, read directly: `ip netns list` opens each namespace for its
    # id and can fail on one being deleted, and an empty answer there made a close skip a delete.
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def link_names() -> list[str]:
    done = run(["ip", "-o", "link", "show"], check=False)
    return [
        line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines() if ":" in line
    ]


def forwarding_off() -> bool:
    return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"


def disable_ipv6(link: str) -> None:
    path = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if path.exists():
        path.write_text("1\n")


def add_bridge(name: str, address: str, prefixlen: int) -> None:
    """The bridge `name` with `address` on it, up; nothing of it is left if a step fails."""
    run(["ip", "link", "add", name, "type", "bridge"])
    try:
        disable_ipv6(name)
        run(["ip", "addr", "add", f"{address}/{prefixlen}", "dev", name])
        run(["ip", "link", "set", name, "up"])
    except BaseException:
        del_link(name)
        raise


def add_netns(
    ns: str, veth: str, bridge: str, address: str, prefixlen: int, gateway: str | None = None
) -> None:
    """The namespace `ns`, its eth0 at `address` joined to `bridge` through the host-side `veth`;
    nothing of it is left if a step fails. Its undo is del_netns(ns) then del_link(veth)."""
    run(["ip", "netns", "add", ns])
    try:
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        disable_ipv6(veth)
        run(["ip", "link", "set", veth, "master", bridge, "up"])
        off = "/proc/sys/net/ipv6/conf/{}/disable_ipv6"
        run(
            ["ip", "netns", "exec", ns, "sh", "-c"]
            + [f"echo 1 > {off.format('all')}; echo 1 > {off.format('default')}"]
        )
        run(["ip", "-n", ns, "addr", "add", f"{address}/{prefixlen}", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        if gateway:
            run(["ip", "-n", ns, "route", "add", "default", "via", gateway])
    except BaseException:
        del_netns(ns)
        del_link(veth)
        raise


def kill_netns_processes(ns: str) -> None:
    done = run(["ip", "netns", "pids", ns], check=False)
    for pid in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    wait(lambda: not run(["ip", "netns", "pids", ns], check=False).stdout.split(), timeout=10)


def del_netns(ns: str) -> None:
    if ns not in netns_names():
        return
    kill_netns_processes(ns)
    run(["ip", "netns", "delete", ns])


def del_link(name: str) -> None:
    if name in link_names():
        run(["ip", "link", "delete", name])


def is_mount_point(path: str) -> bool:
    """From mountinfo: os.path.ismount misses a bind mount of a directory onto itself (ip's)."""
    try:
        return any(
            line.split()[4] == path
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        )
    except OSError:
        return False


def remove_netns_dir_if_empty() -> None:
    """`ip netns add` made /run/netns (a mount point); take it away again if nothing else uses it."""
    if os.path.isdir(NETNS_DIR) and not os.listdir(NETNS_DIR):
        for _ in range(8):  # ip may have stacked more than one mount there
            if not is_mount_point(NETNS_DIR) or run(["umount", NETNS_DIR], check=False).returncode:
                break
        with contextlib.suppress(OSError):
            os.rmdir(NETNS_DIR)


def sweep(prefix: str) -> None:
    """Remove the namespaces and links named `prefix-...` that a killed run left."""
    for ns in netns_names():
        if ns.startswith(f"{prefix}-"):
            kill_netns_processes(ns)
            run(["ip", "netns", "delete", ns], check=False)
    for link in link_names():
        if link.startswith(f"{prefix}-"):
            run(["ip", "link", "delete", link], check=False)
    remove_netns_dir_if_empty()
