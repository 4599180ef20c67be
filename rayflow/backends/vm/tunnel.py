"""backend=vm: the head's dashboard reached through an SSH tunnel, as `ray dashboard` does.

A head on another machine (provider local, aws, gcp) listens on its own loopback
(`--dashboard-host=127.0.0.1`); rayflow forwards to it over SSH with the cluster's own auth
settings (`auth.ssh_user`, `auth.ssh_private_key`, `auth.ssh_proxy_command`, as Ray's launcher
bootstraps them), so the Jobs API and its bearer token never cross the network in clear. The
tunnel lives as long as the run and is stopped with it.

No local port is chosen, closed and bound again by another process: ssh forwards a Unix socket in
a fresh 0700 folder of this user's (`ssh -L FOLDER/dashboard.sock:127.0.0.1:8265`), which no one
else can take first or connect to, and this process serves the URL that Ray's Jobs client and
rayflow's own requests take (they speak TCP) on a loopback port it binds itself (port 0, the
kernel's choice), piping each connection to that socket. The port stays this process's until the
tunnel closes, so even an ssh that exits mid-run frees nothing another user could bind to receive
the token; and the relay answers only this user's connections (rayflow.security.ports.peer_uid).
ssh's own command line (rayflow.security.ssh) pins the head's host key per cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from rayflow.errors import ClusterError
from rayflow.security import ports, ssh

CHUNK = 1 << 16


def ssh_auth(config: Mapping) -> dict:
    """The cluster's SSH settings as Ray's launcher uses them: its bootstrapped config (an AWS
    key pair Ray made is filled in there), else the file's own `auth`."""
    from ray.autoscaler import sdk

    try:
        return dict(sdk.bootstrap_config(dict(config), no_config_cache=True).get("auth") or {})
    except (KeyError, ValueError, RuntimeError):  # a provider that bootstraps nothing of auth
        return dict(config.get("auth") or {})


def tunnel_command(
    auth: Mapping, head_ip: str, local_socket: str, remote_port: int, cluster: str
) -> list[str]:
    """`ssh -N -L SOCKET:127.0.0.1:REMOTE -- USER@HEAD` with the cluster's auth and pinned host
    keys; the socket file only this user may use (0600, in a 0700 folder)."""
    return ssh.command(
        auth,
        head_ip,
        cluster,
        options=[
            "-N",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
            "-o",
            "StreamLocalBindMask=0177",
            "-L",
            f"{local_socket}:127.0.0.1:{remote_port}",
        ],
    )


def _copy(src: socket.socket, dst: socket.socket) -> None:
    """One direction of a connection; its end is passed on, a reset ends both directions."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


class _Pipe(socketserver.BaseRequestHandler):
    server: Relay

    def handle(self) -> None:
        client = self.request
        if ports.peer_uid(client) != os.getuid():
            return  # another user's connection: closed, nothing relayed
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
            try:
                upstream.connect(self.server.target)
            except OSError:  # ssh has not bound its end yet, or has exited: the client sees EOF
                return
            with self.server.tracked(client):
                back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
                back.start()
                _copy(client, upstream)
                back.join()


class Relay(socketserver.ThreadingTCPServer):
    """127.0.0.1:<a port this process binds and holds> -> the tunnel's Unix socket."""

    daemon_threads = True

    def __init__(self, target: str):
        self.target = target
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Pipe)
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @contextlib.contextmanager
    def tracked(self, conn: socket.socket) -> Iterator[None]:
        with self._lock:
            self._open.add(conn)
        try:
            yield
        finally:
            with self._lock:
                self._open.discard(conn)

    def close(self) -> None:
        """Stop accepting, then end every connection still open."""
        self.shutdown()
        self.server_close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


@dataclass
class Tunnel:
    """The tunnel's ssh process, its private folder, and the relay serving its URL."""

    proc: subprocess.Popen
    folder: str
    relay: Relay
    host: str
    cluster: str


def open_tunnel(auth: Mapping, head_ip: str, remote_port: int, cluster: str) -> tuple[Tunnel, str]:
    """The tunnel to the head's dashboard and the local URL of it."""
    folder = tempfile.mkdtemp(prefix="rf-tunnel-")  # 0700, new: nothing in it is anyone else's
    target = os.path.join(folder, "dashboard.sock")
    relay: Relay | None = None
    try:
        command = tunnel_command(auth, head_ip, target, remote_port, cluster)
        relay = Relay(target)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except BaseException:
        if relay is not None:
            relay.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Tunnel(proc, folder, relay, head_ip, cluster), relay.url


def tunnel_failed(tunnel: Tunnel) -> ClusterError | None:
    """The error of a tunnel whose ssh exited (one line: a changed host key says so), else None."""
    proc = tunnel.proc
    if proc.poll() is None:
        return None
    said = proc.stderr.read() if proc.stderr else ""
    return ClusterError(
        "backend=vm: the SSH tunnel to the head's dashboard failed: "
        + ssh.failure(said, tunnel.host, tunnel.cluster, proc.returncode)
    )


def close_tunnel(tunnel: Tunnel) -> None:
    tunnel.relay.close()
    proc = tunnel.proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.stderr:
        proc.stderr.close()
    shutil.rmtree(tunnel.folder, ignore_errors=True)
