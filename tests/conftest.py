"""Shared fixtures: config composition, the rayflow command line, Ray process checks, MLflow reads.

Integration tests drive `python -m rayflow` in a subprocess, as a user would, with their
own storage folder and MLflow store under tmp_path; the synthetic data set is written
once per session and shared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rayflow.cli import compose_config

REPO = Path(__file__).resolve().parents[1]
__all__ = ["compose_config"]


@pytest.fixture(scope="session")
def default_config():
    """The default config, composed once for the session: copy before changing it."""
    return compose_config()


def ray_daemon_pids() -> set[int]:
    """Pids of the processes a cluster leaves if not stopped: Ray's GCS servers and raylets,
    and Spark JVMs (the py4j gateway, executors) on this machine."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith((b"/gcs_server", b"/raylet")):
            pids.add(int(entry.name))
        elif argv[0].endswith(b"java") and any(a.startswith(b"org.apache.spark") for a in argv):
            pids.add(int(entry.name))
    return pids


def process_pids(title: bytes) -> set[int]:
    """Pids of processes whose command line starts with `title`: Ray names an actor's
    process after its class, e.g. b"ray::RayTrainWorker" or b"ray::ImplicitFunc"."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(title):
                pids.add(int(entry.name))
        except OSError:
            pass
    return pids


def wait_until(predicate, timeout: float, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cifar-data")


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
