"""Local ports are never chosen, closed and trusted again (issue 43, class 3): a loopback port
that rayflow picks before Ray binds it may be taken first by another user of the machine, who
would then receive the Ray token. Before anything is sent, the listener is looked up in the
kernel's socket table (rayflow.security.ports); another user's is one line, and the listener
records that it received nothing, not even a connection. The SSH tunnel's own port is held by
rayflow itself and answers only this user (tests/test_security_ssh.py starts one).

`nobody` (uid 65534) plays the other user: those tests need root. No cluster is started.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayflow.errors import ClusterError
from rayflow.security import ports
from tests.harness.needs import NOBODY, need_root

SQUATTED = "is held by user nobody (uid 65534), another user of this machine: nothing was sent"


@contextlib.contextmanager
def nobody_listens(
    host: str = "127.0.0.1", port: int = 0, family: int = socket.AF_INET
) -> Iterator[tuple[int, dict[str, int]]]:
    """A listener of user nobody's on host:port (0: any): yields its port and, once the block
    ends, what it received: {"connections": n, "bytes": m}."""
    port_r, port_w = os.pipe()
    done_r, done_w = os.pipe()
    heard_r, heard_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: only system calls from here on, then _exit
        code = 1
        try:
            for fd in (port_r, done_w, heard_r):
                os.close(fd)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            server = socket.socket(family, socket.SOCK_STREAM)
            server.bind((host, port))
            server.listen(16)
            os.write(port_w, str(server.getsockname()[1]).encode())
            connections = received = 0
            while done_r not in select.select([server, done_r], [], [])[0]:
                conn, _ = server.accept()
                connections += 1
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    received += len(conn.recv(65536))
                conn.close()
            os.write(heard_w, f"{connections} {received}".encode())
            code = 0
        finally:
            os._exit(code)
    for fd in (port_w, done_r, heard_w):
        os.close(fd)
    heard: dict[str, int] = {}
    try:
        got = os.read(port_r, 16)
        assert got, "nobody's listener did not start"
        yield int(got), heard
    finally:
        os.close(done_w)
        said = os.read(heard_r, 64).split()
        os.waitpid(pid, 0)
        for fd in (port_r, heard_r):
            os.close(fd)
        if said:
            heard.update(connections=int(said[0]), bytes=int(said[1]))


# --- the check itself ------------------------------------------------------------------------


def test_a_port_another_user_took_first_is_refused_before_anything_is_sent():
    need_root()
    from rayflow.backends.vm.start import wait_for_dashboard

    with nobody_listens() as (port, heard):
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(ClusterError) as held:
            ports.held("127.0.0.1", port, "the dashboard")
        # what a fake_multinode head's start or join waits with: refused on its first look
        started = time.monotonic()
        with pytest.raises(ClusterError) as waited:
            wait_for_dashboard(url, 30, "backend=vm")
        assert time.monotonic() - started < 5
    assert heard == {"connections": 0, "bytes": 0}
    assert str(held.value).startswith(f"the dashboard: port {port} on 127.0.0.1 {SQUATTED}")
    assert str(waited.value).startswith(
        f"backend=vm: the dashboard: port {port} on 127.0.0.1 {SQUATTED}"
    )
    assert "\n" not in str(waited.value)


def test_a_listener_on_another_address_that_takes_the_connection_counts():
    """localhost is ::1 as well as 127.0.0.1, and a socket on :: takes IPv4 connections too."""
    need_root()
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    try:
        with nobody_listens("::1", family=socket.AF_INET6) as (port, heard):
            with pytest.raises(ClusterError, match=re.escape(SQUATTED)):
                ports.url_held(f"http://localhost:{port}", "the dashboard")
            assert ports.listeners("127.0.0.1", port) == []  # not where 127.0.0.1 goes
        with nobody_listens("::", family=socket.AF_INET6) as (wide, heard_wide):
            with pytest.raises(ClusterError, match=re.escape(SQUATTED)):
                ports.held("127.0.0.1", wide, "the dashboard")
    except OSError as err:
        pytest.skip(f"IPv6 loopback unusable here: {err}")
    assert heard == heard_wide == {"connections": 0, "bytes": 0}


def test_this_users_listener_is_held_and_a_silent_port_is_waited_for_with_an_end():
    with socket.socket() as own:
        own.bind(("127.0.0.1", 0))
        own.listen()
        port = own.getsockname()[1]
        assert ports.held("127.0.0.1", port, "x") and ports.url_held(
            f"http://127.0.0.1:{port}", "x"
        )
        ports.wait_held("127.0.0.1", port, "x", timeout_s=1)
    with pytest.raises(ClusterError) as waited:
        ports.wait_held("127.0.0.1", port, "the dashboard", timeout_s=0.5)
    assert str(waited.value) == (
        f"the dashboard: nothing listened on 127.0.0.1:{port} within 0.5 s of its start"
    )
    # a head on another machine: its sockets are not this machine's to look up
    assert ports.url_held("http://192.0.2.77:8265", "x")


# --- backend=local: the dashboard port rayflow chooses for ray.init ---------------------------


@pytest.mark.no_store  # tracking=none: no MLflow store is made
def test_the_local_dashboard_port_another_user_holds_is_refused_before_ray_starts(rayflow):
    need_root()
    with nobody_listens() as (port, heard):
        out = rayflow.run(f"backend.dashboard_port={port}", "tracking=none", timeout=120)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"rayflow: error: backend=local: the Ray dashboard: port {port} on 127.0.0.1 {SQUATTED}"
        )
    )
    assert heard == {"connections": 0, "bytes": 0}


def test_the_dashboard_port_chosen_skips_one_listened_on_where_clients_connect():
    from rayflow.backends.local import free_dashboard_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert free_dashboard_port("127.0.0.1", first=port) != port
    if socket.has_ipv6:  # bindable on 127.0.0.1, yet http://localhost may reach [::1] first
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET6) as v6:
            v6.bind(("::1", 0))
            v6.listen()
            port = v6.getsockname()[1]
            assert free_dashboard_port("localhost", first=port) != port


# --- the autostop watcher of a fake_multinode cluster, polling its dashboard here -----------------


def test_the_autostop_watcher_sends_nothing_to_a_dashboard_port_another_user_took(
    monkeypatch, capsys
):
    need_root()
    from rayflow import autostop

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with nobody_listens() as (port, heard):
        spec = {"dashboard": f"http://127.0.0.1:{port}", "idle_minutes": 1}
        assert autostop.watch(spec) is False  # it stops watching; it tears nothing down
    assert heard == {"connections": 0, "bytes": 0}
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith(f"[autostop] the dashboard: port {port} on 127.0.0.1 {SQUATTED}")


# --- the tunnel's relay: a port this process holds, answering only this user -----------------


@contextlib.contextmanager
def unix_server(path: Path) -> Iterator[list[bytes]]:
    """A server on a Unix socket (as ssh's end of the tunnel): answers `ok`, records what came."""
    got: list[bytes] = []
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    got.append(conn.recv(65536))
                    conn.sendall(b"ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()


def test_the_tunnel_relay_answers_this_user_only(tmp_path):
    need_root()
    from rayflow.backends.vm.tunnel import Relay

    with unix_server(tmp_path / "s.sock") as got:
        relay = Relay(str(tmp_path / "s.sock"))
        try:
            port = relay.server_address[1]
            assert [s.uid for s in ports.listeners("127.0.0.1", port)] == [os.getuid()]
            with socket.create_connection(("127.0.0.1", port), timeout=10) as mine:
                mine.sendall(b"GET / HTTP/1.0\r\n\r\n")
                assert mine.recv(100) == b"ok"
            pid = os.fork()
            if pid == 0:  # nobody connects and sends; what it reads back is its exit code
                code = 3
                try:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                    with socket.create_connection(("127.0.0.1", port), timeout=10) as theirs:
                        with contextlib.suppress(OSError):
                            theirs.sendall(b"GET / HTTP/1.0\r\n\r\n")
                        code = 0 if theirs.recv(100) == b"" else 2
                finally:
                    os._exit(code)
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0  # closed, unanswered
        finally:
            relay.close()
    assert got == [b"GET / HTTP/1.0\r\n\r\n"]  # this user's request only
