"""Arming a cluster's autostop: the watcher (rayflow.autostop) submitted to the cluster as a Ray Job
of its own, right after the cluster started, so it runs there whether or not this process lives.

How many minutes: rayflow.backends.kept.autostop_minutes (backend.autostop_idle_minutes). How the
cluster stops itself: its handle's `autostop` (the backend's say; None where it cannot). A joined
cluster keeps the watcher its first run armed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rayflow.backends import ClusterHandle
from rayflow.backends.kept import idle_minutes
from rayflow.errors import JobError
from rayflow.orchestrator.submission import jobs_client, stage_package, submission, submitted_id
from rayflow.runtime.activity import WATCHER_PREFIX
from rayflow.security.printable import printable


def arm(handle: ClusterHandle, minutes: float) -> str:
    """Submit the watcher of the cluster behind `handle` (its job id). The watcher's spec, its
    teardown included, goes in its environment; its command line names only the cluster."""
    assert handle.autostop is not None and handle.submission is not None
    job_id = f"{WATCHER_PREFIX}{handle.owner_run}"
    spec = {**handle.autostop, "idle_minutes": minutes}
    names = handle.autostop.get("temp_dir") or handle.name or ""
    client = jobs_client(handle.address, handle.submission.headers)
    with tempfile.TemporaryDirectory(prefix="rayflow-job-") as tmp:
        arguments = submission(
            [handle.submission.python, "-m", "rayflow.autostop", names],
            {"RAYFLOW_AUTOSTOP": json.dumps(spec)},
            stage_package(Path(tmp)),
            None,
        )
        arguments.update(submission_id=job_id, entrypoint_num_cpus=0)
        submitted_id(client, arguments, handle.address, 120)
    return job_id


def arm_or_warn(handle: ClusterHandle, minutes: float | None) -> None:
    """Arm the watcher where this cluster can stop itself and the run asked for it; a watcher
    that could not be submitted is one warning line (the cluster runs on; `rayflow down`)."""
    if minutes is None or handle.autostop is None or handle.joined:
        return
    try:
        job_id = arm(handle, minutes)
    except JobError as err:
        print(
            f"rayflow: warning: autostop not armed ({printable(str(err))}); stop the cluster "
            "yourself: "
            f"rayflow down {handle.name}",
            file=sys.stderr,
            flush=True,
        )
        return
    print(
        f"[rayflow] autostop: {handle.name} stops itself after {idle_minutes(minutes)} "
        f"(its watcher is job {job_id})",
        flush=True,
    )
