"""`python -m rayflow` run as a user runs it, in a work folder of its own (the `rayflow` fixture)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

# the presets whose data set (conf/workload/data/) sits at the root as `data`
DATA_WORKLOADS = ("cifar", "ddp")
# What a `no_dashboard` test's local runs start without Ray's dashboard: Ray Train's runs (ddp,
# train) use the state API it serves, so they keep it.
WITHOUT_DASHBOARD = ("cifar", "tune", "rllib", "ppo")


# rayflow's one resume instruction after a failed or interrupted run
CONTINUE = re.compile(r"Continue with: (python -m rayflow resume=.+)$", re.M)


def printed_resume(out: str) -> str:
    """The one resume instruction of a run's output: rayflow's, never Ray's Tuner.restore(...)."""
    assert "Tuner.restore" not in out and ".restore(" not in out, out[-3000:]
    commands = set(CONTINUE.findall(out))
    assert len(commands) == 1, out[-3000:]
    return commands.pop()


def _choice(args, group: str, default: str) -> str:
    return next((a.split("=", 1)[1] for a in args if a.split("=", 1)[0] == group), default)


class Rayflow:
    """Runs `python -m rayflow` in a work folder of its own, with small, isolated defaults."""

    def __init__(self, workdir: Path, data_root: Path, dashboard: bool = True):
        self.workdir = workdir
        self.dashboard = dashboard  # False: see WITHOUT_DASHBOARD
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

    def base_for(self, args) -> list[str]:
        """The defaults for a command line: the data keys only where its workload reads the CIFAR
        data set (the presets cifar, the default, and ddp bring the `data` section; others have
        none); without the dashboard where `dashboard` is False and WITHOUT_DASHBOARD allows."""
        workload = _choice(args, "workload", "cifar")
        base = (
            self.base
            if workload in DATA_WORKLOADS
            else [b for b in self.base if not b.startswith("data.")]
        )
        if not self.dashboard and workload in WITHOUT_DASHBOARD:
            if _choice(args, "backend", "local") == "local":
                base = [*base, "backend.include_dashboard=false"]
        return base

    def argv(self, *args: str, base: bool = True) -> list[str]:
        flags = [a for a in args if a.startswith("-")]  # Hydra wants -m before the overrides
        overrides = [a for a in args if not a.startswith("-")]
        return [
            sys.executable,
            "-m",
            "rayflow",
            *flags,
            *(self.base_for(overrides) if base else []),
            *overrides,
        ]

    def run(
        self, *args: str, base: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args, base=base),
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_verbatim(self, command: str, timeout: float = 400) -> subprocess.CompletedProcess:
        """`command` as a user pastes it, in the folder they ran the first command from."""
        argv = [sys.executable if word == "python" else word for word in shlex.split(command)]
        return subprocess.run(
            argv, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self, *args: str, log_name: str = "run.log") -> tuple[subprocess.Popen, Path]:
        log = self.workdir / log_name
        proc = subprocess.Popen(
            self.argv(*args),
            cwd=self.workdir,
            env=self.env,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )
        return proc, log

    def run_jobs(self, *commands: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        """The jobs of several command lines in one process, in order, through session.run_jobs
        (what `-m` and rayflow.run(multirun=True) call): consecutive jobs with the same backend
        config share one cluster, started once."""
        script = (
            "import json, sys\n"
            "from rayflow.orchestrator.preflight import preflight\n"
            "from rayflow.orchestrator.session import run_jobs\n"
            "results = run_jobs([job for c in json.loads(sys.argv[1]) for job in preflight([a for a in c if a != '-m'], '-m' in c)])\n"
            # what each job returned, as a caller of rayflow.run sees it (RunResult's public values)
            "print('RUN_RESULTS', json.dumps([r and {'type': type(r).__name__, 'workload': r.workload,\n"
            "    'best_metrics': r.best_metrics, 'best_config': r.best_config, 'mlflow_run_id': r.mlflow_run_id,\n"
            "    'experiment_dir': str(r.experiment_dir), 'trials': len(r.trials)} for r in results], default=str))\n"
        )
        lines = [[*self.base_for(command), *command] for command in commands]
        return subprocess.run(
            [sys.executable, "-c", script, json.dumps(lines)],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @staticmethod
    def run_results(out: subprocess.CompletedProcess) -> list[dict | None]:
        """What run_jobs returned for each job (RUN_RESULTS line of run_jobs' output)."""
        [line] = [line for line in out.stdout.splitlines() if line.startswith("RUN_RESULTS ")]
        return json.loads(line.split(" ", 1)[1])

    def experiments(self) -> list[Path]:
        return sorted(p.parent for p in self.storage.glob("*/tuner.pkl"))

    def run_logs(self, experiments: str = "*") -> str:
        """The runs' logs (EXPERIMENT/rayflow.log) of the experiments under storage matching
        `experiments`, one after the other: Ray's own lines a run leaves off the terminal."""
        return "".join(
            p.read_text() for p in sorted(self.storage.glob(f"{experiments}/rayflow.log"))
        )

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
        children = {
            p.info.run_id: [
                r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id
            ]
            for p in parents
        }
        return client, parents, children

    def plots(self, client, run) -> dict[str, dict]:
        """{PNG name: the summary it stores} of the plots/ artifacts of an MLflow run (rayflow.results.plots)."""
        from rayflow.results.plots.make import read_meta

        names = [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
        folder = self.workdir / "downloaded" / run.info.run_id
        folder.mkdir(parents=True, exist_ok=True)
        local = Path(client.download_artifacts(run.info.run_id, "plots", str(folder)))
        return {Path(n).name: read_meta(local / Path(n).name) for n in names if n.endswith(".png")}
