"""A sweep on a backend that submits (vm, kuberay): the jobs, the task function and Hydra's state go
to the head in one pickled bundle as a Ray Job's working_dir; there rayflow.launcher.on_head runs
the same loop as a connected launcher would, and ends its log with one line holding every job's
end (outputs included), read back here from the job's whole log."""

from __future__ import annotations

import base64
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rayflow.errors import RunFailed
from rayflow.launcher.jobs import Finished, HydraJob, Shared

BUNDLE = "rayflow-sweep.pkl"
MARKER = "[rayflow-sweep] "  # the head's last line: base64 of the pickled list of Finished


@dataclass
class SweepBundle:
    shared: Shared
    jobs: list[HydraJob]
    max_concurrent: int | None
    on_failure: str
    schedule_timeout_s: float


def submit_batch(backend, shared: Shared, jobs: list[HydraJob], settings) -> list[Finished]:
    import cloudpickle

    from rayflow.job_files import merge_runtime_env
    from rayflow.remote import run_as_job

    bundle = SweepBundle(shared, jobs, settings.max_concurrent, settings.on_failure, settings.schedule_timeout_s)
    with tempfile.TemporaryDirectory(prefix="rayflow-sweep-") as staging:
        Path(staging, BUNDLE).write_bytes(cloudpickle.dumps(bundle))
        # fake_multinode's nodes are this machine: the folder is used where it is (rayflow.job_files)
        working_dir = f"local://{staging}" if backend.shares_filesystem else staging
        python = sys.executable if backend.shares_filesystem else "python"
        env = {"PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": settings.auth_mode}
        outcome = run_as_job(backend.address, [python, "-m", "rayflow.launcher.on_head", BUNDLE], env,
                             headers=backend.job_headers(), runtime_env=merge_runtime_env(backend.job_runtime_env(), {"working_dir": working_dir}),
                             on_submitted=backend.job_submitted, hidden=MARKER.strip())
    finished = read_result(outcome.log)
    if outcome.status != "SUCCEEDED" or finished is None:
        from rayflow.session import print_last_lines

        print_last_lines("\n".join(line for line in outcome.log.splitlines() if not line.startswith(MARKER)), outcome.job_id)
        reason = f": {outcome.error}" if outcome.error else ""
        raise RunFailed(f"the sweep's job on backend={backend.name} ended {outcome.status}{reason}")
    return finished


def result_line(finished: list[Finished]) -> str:
    import cloudpickle

    return MARKER + base64.b64encode(cloudpickle.dumps(finished)).decode("ascii")


def read_result(log: str) -> list[Finished] | None:
    import cloudpickle

    for line in reversed(log.splitlines()):
        if line.startswith(MARKER):
            return cloudpickle.loads(base64.b64decode(line[len(MARKER):]))
    return None
