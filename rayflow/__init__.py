"""rayflow: one Hydra config, the same Ray Tune / Ray Train job on a laptop, Spark, KubeRay or VMs.

From Python (a notebook): rayflow.run(...), rayflow.resume(PATH), rayflow.compose(...),
rayflow.dry_run(...); a Hydra task's intermediate results under hydra/sweeper=rayflow:
rayflow.report(...); the kept clusters: rayflow.clusters(), rayflow.down(...), rayflow.logs(...)
(rayflow.api). Importing rayflow loads Hydra's config layer only; ray, torch and mlflow load when a
job runs.
"""

__version__ = "0.1.0"

from rayflow.api import clusters, compose, down, dry_run, logs, resume, run
from rayflow.errors import (
    ConfigError,
    RunFailed,
    RunInterrupted,
)
from rayflow.results.run_result import RunResult
from rayflow.runtime.report import report

__all__ = [
    "ConfigError",
    "RunFailed",
    "RunInterrupted",
    "RunResult",
    "clusters",
    "compose",
    "down",
    "dry_run",
    "logs",
    "report",
    "resume",
    "run",
]
