"""`rayflow logs NAME [JOB] [--follow]`: a kept cluster's job log, from its Jobs API while it runs,
from MLflow (the parent run's `job/driver.log`, kept by rayflow.orchestrator.remote_run) once it
is gone. Masked as every log rayflow shows, and read with a size cap (its last
job_logs.LOG_CAP_BYTES): `rayflow logs` makes it printable where it prints it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rayflow.backends import ClusterHandle, backend_of
from rayflow.backends.kept import KeptCluster
from rayflow.errors import ConfigError
from rayflow.orchestrator import job_logs
from rayflow.orchestrator.job_logs import JOB_LOG, LogStream, bounded_log
from rayflow.orchestrator.submission import jobs_client, wait_for_end
from rayflow.results.run_result import RESULT_MARKER
from rayflow.runtime.activity import user_jobs
from rayflow.security.redaction import mask_text

KEY = "rayflow logs"  # a bad job or name is reported under the command


def _drives_ray(kept: KeptCluster) -> None:
    """A backend whose runs are drivers in the process that started them (spark) submits no Ray
    Job: their output is that process's (a notebook's cells), not a log to show here."""
    if not backend_of(kept).traits.submits_jobs:
        raise ConfigError(
            KEY,
            f"{kept.name} runs no Ray Jobs: a {kept.backend} run drives Ray from the process "
            "that started it, and its output is that process's (a notebook's cells)",
        )


def _job_id(handle: ClusterHandle, kept: KeptCluster, job: str | None) -> str:
    assert handle.submission is not None
    jobs = user_jobs(handle.address, handle.submission.headers)
    ids = [str(j.get("submission_id")) for j in jobs]
    if not ids:
        _drives_ray(kept)
    if job is None:
        if not ids:
            raise ConfigError(KEY, f"no job has run on {kept.name} yet")
        return ids[-1]
    if job not in ids:
        raise ConfigError(
            KEY, f"no job {job!r} on {kept.name}; its jobs: {', '.join(ids[-10:]) or 'none'}"
        )
    return job


def job_log(handle: ClusterHandle, kept: KeptCluster, job: str | None, follow: bool) -> str:
    """The job's log (masked; its end, LOG_CAP_BYTES at most); with `follow`, streamed to stdout
    until the job ends ("")."""
    assert handle.submission is not None
    job_id = _job_id(handle, kept, job)
    client = jobs_client(handle.address, handle.submission.headers)
    if not follow:  # the job's signed result line is for the run that submitted it
        log = bounded_log(client, job_id, [])
        return "".join(
            mask_text(line) for line in log.splitlines(True) if not line.startswith(RESULT_MARKER)
        )
    stream = LogStream(client, job_id, RESULT_MARKER, verbose=True)
    stream.start()
    try:
        wait_for_end(client, job_id)
    finally:
        stream.join(timeout=10)
    return ""


def mlflow_log(kept: KeptCluster, job: str | None) -> str:
    """The last job's log as its MLflow run kept it: all that is left of a cluster that is gone."""
    last = kept.last_job
    if not last.get("run_id"):
        _drives_ray(kept)
        raise ConfigError(
            KEY,
            f"{kept.name} is gone and no job of it left a log in MLflow (tracking=none, or no "
            "job ran)",
        )
    if job is not None and job != last.get("job_id"):
        raise ConfigError(
            KEY,
            f"{kept.name} is gone: only its last job's log ({last.get('job_id')}) was kept, in "
            "MLflow",
        )
    from mlflow.tracking import MlflowClient

    uri = last.get("tracking_uri", "")
    if "***" in uri:  # stored masked: its credentials come from the environment, as for a run
        uri = os.environ.get("MLFLOW_TRACKING_URI", uri)
    with tempfile.TemporaryDirectory(prefix="rayflow-logs-") as tmp:
        path = MlflowClient(uri).download_artifacts(last["run_id"], JOB_LOG, tmp)
        return mask_text(tail_of_file(Path(path), str(last.get("job_id"))))


def tail_of_file(path: Path, job_id: str) -> str:
    """A log file's last job_logs.LOG_CAP_BYTES from its first whole line, after a line saying
    what was left out: never the whole of a file whose size the store decides."""
    cap = job_logs.LOG_CAP_BYTES
    with path.open("rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(max(0, size - cap))
        data = file.read(cap)
    if size <= cap:
        return data.decode(errors="replace")
    kept = data.partition(b"\n")[2]
    return (
        f"[rayflow] the first {(size - len(kept)) / 2**20:.1f} MiB of job {job_id}'s log are left "
        f"out: rayflow reads the last {cap / 2**20:g} MiB\n" + kept.decode(errors="replace")
    )
