"""A real `mlflow server` (SQLite store, proxied artifacts) for the tests whose runs log over HTTP."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from rayflow.testing.processes import wait_until


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(folder: Path, host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """Yields (its URL, its process id, which leads a process group of its own); the group is
    killed at the end. Its store, artifacts and log (mlflow.log) are in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port(host)
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    # MLflow's job runner (huey consumers polling its store) serves no rayflow feature, and its
    # polling took about 20 s of the suite's CPU per server.
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    argv = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        host,
        "--port",
        str(port),
        "--backend-store-uri",
        f"sqlite:///{folder / 'server.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--workers",
        "1",
    ]
    if host != "127.0.0.1":  # MLflow answers only the host names it is told, loopback's by default
        argv += ["--allowed-hosts", f"{host}:{port},{host}"]
    with open(folder / "mlflow.log", "w") as log:  # the child holds its own copy
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def up() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    try:
        assert wait_until(up, timeout=60), (folder / "mlflow.log").read_text()[-2000:]
        yield f"http://{host}:{port}", proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
