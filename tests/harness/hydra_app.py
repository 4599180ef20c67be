"""A Hydra app of the user's (examples/hydra-app, copied outside the repository) swept with
`hydra/launcher=rayflow` in a subprocess, as its user runs it, and what it left in its sweep dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.harness.examples import copy_example


class HydraApp:
    def __init__(self, folder: Path):
        self.folder = copy_example("hydra-app", folder)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
        self.env.pop("RAY_AUTH_MODE", None)  # the launcher makes driver and cluster agree by itself
        self.sweep_dir = self.folder / "sweep"

    def sweep(self, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [sys.executable, "my_app.py", "-m", "hydra/launcher=rayflow", f"hydra.sweep.dir={self.sweep_dir}", *overrides]
        return subprocess.run(argv, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=timeout)

    def job_dirs(self) -> list[Path]:
        return sorted((p for p in self.sweep_dir.iterdir() if p.is_dir()), key=lambda p: int(p.name))

    def metrics(self) -> dict[int, dict]:
        """metrics.json of each job that wrote one, by job number."""
        return {int(p.name): json.loads((p / "metrics.json").read_text()) for p in self.job_dirs() if (p / "metrics.json").exists()}

    def assert_hydra_outputs(self, job_dir: Path) -> None:
        """What Hydra writes for every job, found where the user looks: the local sweep dir."""
        for name in (".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "my_app.log"):
            assert (job_dir / name).is_file(), f"{job_dir / name} is missing; {sorted(p.name for p in job_dir.rglob('*'))}"
