"""A sweep on a backend that submits (vm, kuberay): the jobs, the task function and Hydra's state go
to the head in one pickled bundle as a Ray Job's working_dir (this process made it: the head
unpickles what it was sent); there rayflow.launcher.on_head runs the same loop as a connected
launcher would, and ends its log with one line holding every job's end (outputs included).

That line comes back through the job's log, which every task of the sweep prints into, so it is
data, never code: JSON through rayflow.security.result_channel, signed with a key made for this
submission, read only from a job that SUCCEEDED. A job's return value travels as JSON: one that JSON
cannot hold (an object, a tuple's kind) comes back as its repr string; a failed job's exception
comes back as its type's name and message (a builtin exception type as itself, any other as
RuntimeError "Type: message"). Its outputs come back as a size-limited tar, unpacked under the job's
own output folder only (rayflow.launcher.outputs.unpack)."""

from __future__ import annotations

import base64
import builtins
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayflow.backends import ClusterHandle
from rayflow.errors import RunFailed
from rayflow.launcher.jobs import Finished, HydraJob, Shared
from rayflow.runtime import hydra_internals

BUNDLE = "rayflow-sweep.pkl"
MARKER = "[rayflow-sweep] "  # the head's last line: MAC and JSON of every job's Finished


@dataclass
class SweepBundle:
    shared: Shared
    jobs: list[HydraJob]
    max_concurrent: int | None
    on_failure: str
    schedule_timeout_s: float


def submit_batch(
    handle: ClusterHandle, shared: Shared, jobs: list[HydraJob], settings: Any
) -> list[Finished]:
    """The sweep as one Ray Job on the head of the cluster behind `handle`; every job's end, from
    the job's signed line (rayflow.orchestrator.submission, the protocol a run's job uses too)."""
    import cloudpickle

    from rayflow.orchestrator.job_logs import print_last_lines
    from rayflow.orchestrator.submission import submit

    assert handle.submission is not None
    in_place = handle.submission.in_place
    bundle = SweepBundle(
        shared, jobs, settings.max_concurrent, settings.on_failure, settings.schedule_timeout_s
    )
    with tempfile.TemporaryDirectory(prefix="rayflow-sweep-") as staging:
        Path(staging, BUNDLE).write_bytes(cloudpickle.dumps(bundle))
        # fake_multinode's nodes are this machine: the folder is used where it is
        # (rayflow.orchestrator.job_files)
        working_dir = f"local://{staging}" if in_place else staging
        env = {"PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": settings.auth_mode}
        done = submit(
            handle,
            [handle.submission.python, "-m", "rayflow.launcher.on_head", BUNDLE],
            env,
            MARKER,
            runtime_env={"working_dir": working_dir},
        )
    finished = read_result(done.outcome.log, done.key) if done.succeeded else None
    if finished is None:
        print_last_lines(done.log(), done.outcome.job_id)
        status, error = done.outcome.status, done.outcome.error
        reason = (
            f": {error}"
            if error
            else ""
            if status != "SUCCEEDED"
            else ": it ended without its result line"
        )
        raise RunFailed(f"the sweep's job on backend={handle.backend} ended {status}{reason}")
    return finished


def read_result(log: str, key: bytes) -> list[Finished] | None:
    """The jobs' ends from the line of `log` that `key` verifies (None: there is none)."""
    from rayflow.security.result_channel import read

    data = read(log, MARKER, key)
    return [finished_from(item) for item in data] if isinstance(data, list) else None


def result_line(finished: list[Finished]) -> str:
    """The head's last line: every job's end, signed (rayflow.security.result_channel.take_key, at
    the start)."""
    from rayflow.security.result_channel import signed_line

    line = signed_line(MARKER, [finished_data(f) for f in finished])
    return (
        line
        if line is not None
        else "[rayflow] no result key in this job's environment: no result line"
    )


# --- Finished as JSON ----------------------------------------------------------------------------


def _b64(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode("ascii") if data is not None else None


def _container(config) -> Any:
    """A DictConfig as plain data: resolved where it resolves on the node, else as written."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if config is None:
        return None
    try:
        return OmegaConf.to_container(config, resolve=True, enum_to_str=True)
    except OmegaConfBaseException:
        return OmegaConf.to_container(config, resolve=False, enum_to_str=True)


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    raise TypeError(type(value).__name__)


def returned_value(value: Any) -> dict:
    """A task's return value for the line: {"json": value} where JSON holds it (numpy numbers as
    numbers), else {"repr": repr(value)} (documented: such a value comes back as its repr)."""
    try:
        return {"json": json.loads(json.dumps(value, default=_plain))}
    except (TypeError, ValueError, OverflowError, RecursionError):
        return {"repr": repr(value)}


def _error_data(err: BaseException) -> dict:
    return {"type": type(err).__name__, "message": str(err)}


def _error_from(data: dict) -> BaseException:
    """A builtin exception type as itself (ValueError stays ValueError), any other name as a
    RuntimeError naming it: no type is looked up anywhere else."""
    name, message = str(data.get("type")), str(data.get("message"))
    found = getattr(builtins, name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        return found(message)
    return RuntimeError(f"{name}: {message}")


def finished_data(finished: Finished) -> dict:
    from hydra.core.utils import JobStatus

    ret = finished.job_return
    job_return = None
    if ret is not None:
        failed = ret.status == JobStatus.FAILED
        value = hydra_internals.job_return_value(ret)  # what it returned, or what it raised
        job_return = {
            "overrides": list(ret.overrides or []),
            "cfg": _container(ret.cfg),
            "hydra_cfg": _container(ret.hydra_cfg),
            "working_dir": ret.working_dir,
            "task_name": ret.task_name,
            "status": ret.status.name,
            "error": _error_data(value) if failed and isinstance(value, BaseException) else None,
            "value": None if failed else returned_value(value),
        }
    return {
        "idx": finished.idx,
        "job_return": job_return,
        "files": _b64(finished.files),
        "node_output_dir": finished.node_output_dir,
        "left_out": list(finished.left_out),
        "error": finished.error,
        "in_output_dir": finished.in_output_dir,
        "cwd_files": _b64(finished.cwd_files),
    }


def finished_from(data: dict) -> Finished:
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    ret = None
    if data.get("job_return") is not None:
        item = data["job_return"]
        status = JobStatus[item["status"]]
        ret = JobReturn(
            overrides=list(item["overrides"]),
            cfg=OmegaConf.create(item["cfg"]) if item["cfg"] is not None else None,
            hydra_cfg=OmegaConf.create(item["hydra_cfg"])
            if item["hydra_cfg"] is not None
            else None,
            working_dir=item["working_dir"],
            task_name=item["task_name"],
            status=status,
        )
        if status == JobStatus.FAILED:
            ret.return_value = _error_from(
                item["error"] or {"type": "RuntimeError", "message": "the job failed"}
            )
        elif item["value"] is not None:
            ret.return_value = (
                item["value"]["json"] if "json" in item["value"] else item["value"]["repr"]
            )
    files, cwd_files = data.get("files"), data.get("cwd_files")
    return Finished(
        int(data["idx"]),
        ret,
        base64.b64decode(files) if files is not None else None,
        data.get("node_output_dir"),
        list(data.get("left_out") or []),
        data.get("error"),
        bool(data.get("in_output_dir")),
        base64.b64decode(cwd_files) if cwd_files is not None else None,
    )
