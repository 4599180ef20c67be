"""Shared fixtures: config composition, the rayflow command line, Ray process checks, MLflow reads.

Integration tests drive `python -m rayflow` in a subprocess, as a user would, with their
own storage folder and MLflow store under tmp_path; the synthetic data set is written
once per session and shared.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rayflow.cli import compose_config
from rayflow.testing.processes import process_pids, ray_daemon_pids, wait_until

REPO = Path(__file__).resolve().parents[1]
__all__ = ["compose_config", "process_pids", "ray_daemon_pids", "wait_until"]


@pytest.fixture(scope="session")
def default_config():
    """The default config, composed once for the session: copy before changing it."""
    return compose_config()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cifar-data")


def _cifar_archive(folder: Path) -> bytes:
    """A tiny archive laid out like the official cifar-10-python.tar.gz."""
    from rayflow import data

    data.write_synthetic(folder / "src" / data.BATCH_DIR, 50, 10, seed=1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder / "src" / data.BATCH_DIR, arcname=data.BATCH_DIR)
    return buffer.getvalue()


@pytest.fixture
def archive_server(tmp_path):
    """A loopback HTTP server holding a CIFAR-format archive; counts the downloads.
    `?bytes_per_s=N` sends it at about N bytes a second (a download that lasts), and
    `&length=0` without a Content-Length (the total unknown to the client)."""
    served = tmp_path / "served"
    served.mkdir()
    payload = _cifar_archive(tmp_path)
    (served / "cifar-10-python.tar.gz").write_bytes(payload)
    hits = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if "bytes_per_s" not in query:
                return super().do_GET()
            rate = float(query["bytes_per_s"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            if query.get("length", ["1"])[0] != "0":
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            chunk = 8192
            for start in range(0, len(payload), chunk):
                self.wfile.write(payload[start:start + chunk])
                self.wfile.flush()
                time.sleep(chunk / rate)
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    yield url, hashlib.md5(payload).hexdigest(), hits
    server.shutdown()


class Rayflow:
    """Runs `python -m rayflow` in a work folder of its own, with small, isolated defaults."""

    def __init__(self, workdir: Path, data_root: Path):
        self.workdir = workdir
        self.storage = workdir / "ray_results"
        self.db = workdir / "mlflow.db"
        self.base = [
            f"storage_path={self.storage}",
            f"data.root={data_root}",
            "data.synthetic=true",
            "data.synthetic_train_size=1000",
            "data.synthetic_test_size=100",
        ]
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0", HYDRA_FULL_ERROR="0")
        self.env.pop("MLFLOW_TRACKING_URI", None)  # each test has its own store in its work folder
        self.env.pop("RAY_AUTH_MODE", None)  # rayflow must make driver and cluster agree by itself

    def argv(self, *args: str, base: bool = True) -> list[str]:
        flags = [a for a in args if a.startswith("-")]  # Hydra wants -m before the overrides
        overrides = [a for a in args if not a.startswith("-")]
        return [sys.executable, "-m", "rayflow", *flags, *(self.base if base else []), *overrides]

    def run(self, *args: str, base: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args, base=base), cwd=self.workdir, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )

    def start(self, *args: str, log_name: str = "run.log") -> tuple[subprocess.Popen, Path]:
        log = self.workdir / log_name
        proc = subprocess.Popen(
            self.argv(*args), cwd=self.workdir, env=self.env,
            stdout=open(log, "w"), stderr=subprocess.STDOUT,
        )
        return proc, log

    def experiments(self) -> list[Path]:
        return sorted(p.parent for p in self.storage.glob("*/tuner.pkl"))

    def checkpoints(self) -> list[Path]:
        return sorted(self.storage.glob("*/*/checkpoint_*/checkpoint.pt"))

    def mlflow(self, experiment: str = "cifar"):
        """(parent runs, {parent run id: [nested runs]}) of an MLflow experiment in this store."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{self.db}")
        found = client.get_experiment_by_name(experiment)
        assert found is not None, f"no MLflow experiment {experiment!r} in {self.db}"
        runs = client.search_runs([found.experiment_id], max_results=1000)
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        children = {p.info.run_id: [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id] for p in parents}
        return client, parents, children

    def plots(self, client, run) -> dict[str, dict]:
        """{PNG name: the summary it stores} of the plots/ artifacts of an MLflow run (rayflow.plots)."""
        from rayflow.plots import read_meta

        names = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
        folder = self.workdir / "downloaded" / run.info.run_id
        folder.mkdir(parents=True, exist_ok=True)
        local = Path(client.download_artifacts(run.info.run_id, "plots", str(folder)))
        return {Path(n).name: read_meta(local / Path(n).name) for n in names if n.endswith(".png")}


@pytest.fixture
def rayflow(tmp_path, data_root) -> Rayflow:
    before = ray_daemon_pids()
    yield Rayflow(tmp_path, data_root)
    # Whatever a test did, rayflow must not leave a Ray cluster behind.
    leftover = wait_until(lambda: not (ray_daemon_pids() - before), timeout=20) or (ray_daemon_pids() - before)
    if leftover is not True:
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"Ray daemons left running after the test: {sorted(leftover)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="class")
def head_node():
    """A real cluster started with `ray start --head`, as a user's existing cluster would be.
    Stopped by its own temp dir, never by `ray stop` (which stops every Ray cluster on the machine)."""
    import tempfile

    from rayflow.processes import stop_processes_mentioning

    ray_cli = str(Path(sys.executable).parent / "ray")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="rf-head-")  # short: Ray's socket paths must stay < 108 chars
    env = dict(os.environ, RAY_AUTH_MODE="token")
    try:
        subprocess.run(
            [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}",
             f"--dashboard-agent-listen-port={_free_port()}", f"--ray-client-server-port={_free_port()}",
             f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}"],
            check=True, env=env, capture_output=True, timeout=120,
        )
        yield f"127.0.0.1:{port}"
    finally:
        stop_processes_mentioning(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
