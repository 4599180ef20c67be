"""A Hydra app of the user's (examples/hydra-app, copied outside the repository) swept with
`hydra/launcher=rayflow` in a subprocess, as its user runs it, and what it left in its sweep dir."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rayflow.launcher import keep_clusters
from rayflow.testing.processes import ray_daemon_pids, wait_until
from tests.harness.examples import copy_example


class HydraApp:
    def __init__(self, folder: Path):
        self.folder = copy_example("hydra-app", folder)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
        self.env.pop("RAY_AUTH_MODE", None)  # the launcher makes driver and cluster agree by itself
        self.sweep_dir = self.folder / "sweep"

    def sweep(self, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [
            sys.executable,
            "my_app.py",
            "-m",
            "hydra/launcher=rayflow",
            f"hydra.sweep.dir={self.sweep_dir}",
            *overrides,
        ]
        return subprocess.run(
            argv, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def job_dirs(self) -> list[Path]:
        return sorted(
            (p for p in self.sweep_dir.iterdir() if p.is_dir()), key=lambda p: int(p.name)
        )

    def metrics(self) -> dict[int, dict]:
        """metrics.json of each job that wrote one, by job number."""
        return {
            int(p.name): json.loads((p / "metrics.json").read_text())
            for p in self.job_dirs()
            if (p / "metrics.json").exists()
        }

    def assert_hydra_outputs(self, job_dir: Path) -> None:
        """What Hydra writes for every job, found where the user looks: the local sweep dir."""
        for name in (
            ".hydra/config.yaml",
            ".hydra/overrides.yaml",
            ".hydra/hydra.yaml",
            "my_app.log",
        ):
            assert (job_dir / name).is_file(), (
                f"{job_dir / name} is missing; {sorted(p.name for p in job_dir.rglob('*'))}"
            )


class KeptCluster:
    """Mixed into a subclass of Hydra's LauncherTestSuite: its tests share one cluster, started by
    the first launch and stopped after the last (rayflow.launcher.keep_clusters); the subclass gives
    `launcher_name` and `overrides` (a fresh list per test: the suite extends it)."""

    @pytest.fixture
    def launcher_name(self) -> str:
        return "rayflow"

    @pytest.fixture(autouse=True)
    def _fresh_version_base(self):
        """As in a fresh process, which the suite assumes: a version_base set by an earlier test's
        composition in this pytest worker would change Hydra's defaults (hydra.job.chdir)."""
        from hydra.core.singleton import Singleton
        from hydra.version import VersionBase

        previous = Singleton._instances.pop(VersionBase, None)
        yield
        if previous is not None:
            Singleton._instances[VersionBase] = previous

    @pytest.fixture(scope="class", autouse=True)
    def _one_cluster(self):
        before = ray_daemon_pids()
        with keep_clusters():
            yield
        assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), (
            "the suite's cluster was left running"
        )


def sweep_comes_home(folder: Path, backend: list[str]) -> subprocess.CompletedProcess:
    """The app swept on `backend` from its own folder, on nodes that do not share this machine's
    files as far as rayflow knows: each job ran in a scratch folder on its node, and its outputs are
    in the local sweep dir; nothing is left running."""
    before = ray_daemon_pids()
    app = HydraApp(folder)
    out = app.sweep(*backend, "lr=0.01,0.1", "hold_s=1", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    dirs = app.job_dirs()
    assert [d.name for d in dirs] == ["0", "1"]
    for job_dir in dirs:
        app.assert_hydra_outputs(job_dir)
        ran_in = OmegaConf.load(job_dir / ".hydra" / "hydra.yaml").hydra.runtime.output_dir
        assert "rayflow-hydra-job-" in ran_in, (
            "the job ran in a scratch folder of its node, and came back"
        )
        assert "loss" in (job_dir / "my_app.log").read_text()
    metrics = app.metrics()
    assert [metrics[n]["job_num"] for n in (0, 1)] == [0, 1] and all(
        m["decay"] > 0 for m in metrics.values()
    )
    assert metrics[0]["loss"] > metrics[1]["loss"]  # lr=0.1 fits the line better in 100 steps
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), (
        "the cluster was left running"
    )
    return out


class SweepApp:
    """examples/hydra-sweep, copied outside the repository, searched with hydra/sweeper=rayflow
    in a subprocess as its user runs it, and what it left in its sweep dir."""

    def __init__(self, folder: Path):
        self.folder = copy_example("hydra-sweep", folder)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env.pop("RAY_AUTH_MODE", None)  # the sweeper makes driver and cluster agree itself
        self.env["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
        self.sweep_dir = folder / "sweep"

    def argv(self, *overrides: str, multirun: bool = True) -> list[str]:
        return [
            sys.executable,
            "sphere.py",
            *(["-m", f"hydra.sweep.dir={self.sweep_dir}"] if multirun else []),
            *overrides,
        ]

    def run(self, *overrides: str, multirun: bool = True, timeout: float = 300):
        return subprocess.run(
            self.argv(*overrides, multirun=multirun),
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def table(self) -> list[dict]:
        with (self.sweep_dir / "trials.csv").open() as f:
            return list(csv.DictReader(f))

    def results(self) -> dict:
        return OmegaConf.to_container(OmegaConf.load(self.sweep_dir / "optimization_results.yaml"))

    def trial_reports(self) -> dict[int, list[dict]]:
        """Each trial's reports (Tune's result.json), by its job's number (in its params.json)."""
        found = {}
        for path in (self.sweep_dir / "search").glob("*/result.json"):
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            params = json.loads((path.parent / "params.json").read_text())
            if rows:
                found[int(params["_hydra_job_num"])] = rows
        return found

    def trial_spans(self) -> dict[int, tuple[float, float]]:
        """Each reporting trial's life on this machine's clock, by its job's number: from its Hydra
        job starting (its `.hydra/config.yaml` written, in place in the sweep dir) to its last
        report, that start plus the trial's own `time_total_s`. Tune's result timestamps are
        whole seconds, and it writes result.json at the end."""
        spans = {}
        for job, rows in self.trial_reports().items():
            started = (self.sweep_dir / str(job) / ".hydra" / "config.yaml").stat().st_mtime
            spans[job] = (started, started + rows[-1]["time_total_s"])
        return spans


def search_comes_home(folder: Path, backend: list[str], env: dict | None = None) -> SweepApp:
    """The sweep example searched on `backend`, whose nodes do not share this machine's files as
    far as rayflow knows: each trial's job ran in its Tune trial folder on its node, and came home
    into the local sweep dir with Tune's sync; nothing is left running."""
    before = ray_daemon_pids()
    app = SweepApp(folder)
    app.env.update(env or {})
    out = app.run(*backend, "hydra.sweeper.n_trials=3", "steps=2", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs_came_home(app, 3)
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), "left running"
    return app


def jobs_came_home(app: SweepApp, n_trials: int) -> None:
    """Each of the search's `n_trials` trials completed, its job run in its Tune trial's folder
    on its node and copied home into the sweep dir; the best value is the best of the table."""
    rows = app.table()
    assert [r["state"] for r in rows] == ["completed"] * n_trials, rows
    for row in rows:
        job = app.sweep_dir / row["job"]
        ran_in = OmegaConf.load(job / ".hydra" / "hydra.yaml").hydra.runtime.output_dir
        # ran in its Tune trial's folder on its node (its job/ folder), then came home
        assert ran_in.endswith(f"/job/{row['job']}") and not ran_in.startswith(str(app.sweep_dir))
        assert f"x={float(row['x'])} y={row['y']}" in (job / "sphere.log").read_text()
    assert app.results()["best_value"] == min(float(r["objective"]) for r in rows)
