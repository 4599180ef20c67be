"""A running cluster, as a user's existing one: `ray start --head` on loopback (ray_head)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_head(num_cpus: int = 1):
    """A real cluster started with `ray start --head`, as a user's existing cluster would be: its
    address. Stopped by its own temp dir, never by `ray stop` (which stops every Ray cluster on the
    machine)."""
    import tempfile

    from rayflow.runtime.processes import stop_processes_mentioning

    ray_cli = str(Path(sys.executable).parent / "ray")
    # short: Ray's socket paths must stay < 108 chars
    temp_dir = tempfile.mkdtemp(prefix="rf-head-")
    env = dict(os.environ, RAY_AUTH_MODE="token")
    try:
        for attempt in range(1, TRIES + 1):
            port = _free_port()
            started = subprocess.run(
                [ray_cli, "start", "--head", f"--port={port}", *_options(num_cpus, temp_dir)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if started.returncode == 0:
                break
            # a port chosen free was taken before Ray bound it (another worker's cluster
            # starting at the same moment): what this try started goes, the next chooses anew
            stop_processes_mentioning(temp_dir)
            if attempt == TRIES:
                raise RuntimeError(
                    f"ray start --head failed {TRIES} times; its last stderr:\n"
                    f"{started.stderr[-3000:]}"
                )
        yield f"127.0.0.1:{port}"
    finally:
        stop_processes_mentioning(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


TRIES = 3


def _options(num_cpus: int, temp_dir: str) -> list[str]:
    return [
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={num_cpus}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--ray-client-server-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
    ]
