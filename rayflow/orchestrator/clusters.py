"""The clusters rayflow kept, seen and stopped: what `rayflow status`, `rayflow down` and `rayflow
logs` (and `rayflow.clusters()`, `down()`, `logs()`) do.

A kept cluster is recorded when its run starts it or joins it (`kept_started`, from the cluster's
life in rayflow.orchestrator.cluster) and its record learns each job run on it (`job_ran`). Every
command asks the cluster itself before it says anything (its backend's `reach`): a cluster gone
behind rayflow's back (its autostop, a host rebooted, `kubectl delete`) is reported gone once and
its record moved to the registry's gone/ (rayflow.backends.kept), where `logs` still finds the
last job's log in MLflow. `down` tears down what its run started, through the same backend code
that ends a run, and refuses a cluster a job is using unless forced. A cluster `down` did not
reach, or did not finish tearing down, is never reported torn down: its record stays, and one
line says what was not done and how to finish by hand.
"""

from __future__ import annotations

import time
import urllib.error
from dataclasses import asdict, dataclass

from rayflow.backends import ClusterBackend, ClusterHandle, KeepsClusters, backend_of
from rayflow.backends import kept as registry
from rayflow.backends.kept import KeptCluster
from rayflow.errors import ClusterError, ConfigError
from rayflow.orchestrator.autostop import arm_or_warn
from rayflow.runtime.activity import Activity, activity
from rayflow.schema.values import to_container
from rayflow.security.auth import auth_token
from rayflow.security.redaction import mask_text


@dataclass
class ClusterStatus:
    """One row of `rayflow status`: a kept cluster as it is now."""

    backend: str
    name: str
    state: str  # busy, idle, gone, unreachable
    detail: str = ""  # why busy, why gone or out of reach
    nodes: int | None = None  # alive now
    peak_nodes: int | None = None
    up_s: float = 0.0
    idle_s: float | None = None
    autostop_idle_minutes: float | None = None
    autostop_in_s: float | None = None  # the watcher tears it down in this long, if still idle
    node_seconds: float | None = None
    jobs: int | None = None
    address: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _keeper(kept: KeptCluster) -> KeepsClusters:
    """The backend of a kept cluster's record, by its capability: only a KeepsClusters backend
    writes one (record(), below)."""
    backend = backend_of(kept)
    if not isinstance(backend, KeepsClusters):
        raise ClusterError(f"{kept.name}: backend {kept.backend!r} keeps no cluster")
    return backend


def kept_started(backend: ClusterBackend, handle: ClusterHandle) -> None:
    """A cluster a run started or joined: its autostop armed and, when it is kept, its record
    written (a cluster this run started only), so it can be seen and stopped once the run is
    gone."""
    minutes = registry.autostop_minutes(backend.section, handle.kept)
    arm_or_warn(handle, minutes)
    # Only the run that started a kept cluster records it: a joined one's record is its first
    # run's (when it started, its autostop, how to stop it), and a cluster rayflow did not make
    # (kuberay) is not rayflow's to list or stop.
    if handle.joined or not (handle.kept and isinstance(backend, KeepsClusters) and handle.name):
        return
    record = handle.record()
    registry.keep(
        KeptCluster(
            backend=backend.name,
            name=handle.name,
            owner_run=handle.owner_run or "",
            section=dict(to_container(backend.section)),
            auth_mode=backend.auth_mode,
            address=record["address"],
            # none where a cluster run as submitted jobs has no watcher to stop it (kuberay:
            # autostop off, said why); one a run keeps in its own process (spark) times itself
            autostop_idle_minutes=(
                minutes if handle.autostop is not None or not backend.traits.submits_jobs else None
            ),
            where=record["where"],
        )
    )


def job_ran(
    handle: ClusterHandle, job_id: str, tracking_uri: str | None, run_id: str | None
) -> None:
    """The record of a kept cluster learns the last job run on it (and where its log went)."""
    if handle.kept and handle.name:
        last = {"job_id": job_id, "tracking_uri": tracking_uri or "", "run_id": run_id or ""}
        registry.note(f"{handle.backend}.{handle.name}", last_job=last)


def _headers(kept: KeptCluster) -> dict[str, str]:
    """What a request to a vm cluster's dashboard carries: this user's Ray token (a kuberay
    cluster's handle brings its own, read from the cluster's Secret)."""
    token = auth_token() if kept.auth_mode == "token" else None
    return {"Authorization": f"Bearer {token}"} if token else {}


def _row(kept: KeptCluster, state: str, detail: str = "") -> ClusterStatus:
    return ClusterStatus(
        kept.backend,
        kept.name,
        state,
        mask_text(detail),
        up_s=time.time() - kept.started_at,
        autostop_idle_minutes=kept.autostop_idle_minutes,
        address=kept.address,
    )


def _with_activity(row: ClusterStatus, kept: KeptCluster, found: Activity) -> ClusterStatus:
    now = time.time()
    row.state, row.detail = ("busy", "; ".join(found.busy)) if found.busy else ("idle", "")
    row.nodes, row.peak_nodes, row.node_seconds = found.nodes, found.peak_nodes, found.node_seconds
    row.jobs = len(found.jobs)
    if not found.busy:
        row.idle_s = now - max(found.last_active or 0, kept.kept_since)
        if kept.autostop_idle_minutes:
            row.autostop_in_s = max(0.0, kept.autostop_idle_minutes * 60 - row.idle_s)
    return row


def status_of(kept: KeptCluster) -> ClusterStatus:
    """The kept cluster as it is now; one found gone leaves the registry (after this answer)."""
    row = _asked(kept)
    if row.state == "gone":
        registry.forget(kept)
    return row


def _asked(kept: KeptCluster) -> ClusterStatus:
    """The kept cluster as it is now, its record left as it is."""
    try:
        handle = _keeper(kept).reach(kept, _headers(kept))
    except ClusterError as err:
        return _row(kept, "unreachable", str(err))
    if handle is None:
        return _row(kept, "gone", "stopped outside this command (autostop, or by hand)")
    try:
        assert handle.submission is not None
        found = activity(handle.address, handle.submission.headers)
    except (urllib.error.URLError, OSError, ValueError) as err:
        return _row(kept, "unreachable", f"its dashboard did not answer: {err}")
    finally:
        handle.unwind()
    return _with_activity(_row(kept, "running"), kept, found)


def clusters() -> list[ClusterStatus]:
    """Every cluster rayflow kept for this user, asked as it is now."""
    return [status_of(kept) for kept in registry.records()]


def _one(name: str, command: str, gone: bool = False) -> KeptCluster:
    """The one record `name` means, for `rayflow COMMAND` (a bad name is reported under it)."""
    found = registry.named(name, gone=gone)
    if not found and not gone:
        raise ConfigError(
            f"rayflow {command}", f"no kept cluster named {name!r} (`rayflow status` lists them)"
        )
    if len(found) > 1 and not gone:
        raise ConfigError(
            f"rayflow {command}",
            f"{name!r} names {len(found)} kept clusters: say which, as "
            + " or ".join(f"{k.backend}/{k.name}" for k in found),
        )
    return found[-1] if found else _one(name, command)


class NotTornDown(ClusterError):
    """`rayflow down` reached and tore down `done`, but not the rest: one line each (`lines`),
    saying what was not done and how to finish by hand; their records are kept."""

    def __init__(self, lines: list[str], done: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines, self.done = lines, done


def down(name: str | None = None, force: bool = False) -> list[str]:
    """Tear down the kept cluster `name` (None: every one), what its run started and only that;
    the names torn down. A cluster a job or driver is using is refused unless `force`. A cluster
    whose teardown did not reach it, or failed, keeps its record: NotTornDown, after the others
    are torn down."""
    done, failed = down_each(name, force)
    if failed:
        raise NotTornDown(failed, done)
    return done


def down_each(name: str | None = None, force: bool = False) -> tuple[list[str], list[str]]:
    """`down`, as the CLI reports it: the names torn down, and one line for each cluster that
    was not (its record kept)."""
    chosen = registry.records() if name is None else [_one(name, "down")]
    if not force:
        for kept in chosen:
            row = _asked(kept)
            if row.state == "busy":
                raise ConfigError(
                    "rayflow down",
                    f"{kept.name} is in use ({row.detail}): wait for it, or tear it down anyway "
                    "with --force",
                )
    done, failed = [], []
    for kept in chosen:
        try:
            _keeper(kept).down(kept)
        except ClusterError as err:  # not reached, or not all of it: never "torn down"
            failed.append(_not_torn_down(kept, err))
            continue
        registry.forget(kept)
        done.append(kept.name)
    return done, failed


def _not_torn_down(kept: KeptCluster, err: ClusterError) -> str:
    text = " ".join(str(err).split())
    return mask_text(
        f"{text}; {kept.name} is not torn down, its record is kept: `rayflow down {kept.name}` "
        f"tries again, `rm {registry.record_path(kept)}` forgets it once you have stopped it "
        "by hand"
    )


def logs(name: str, job: str | None = None, follow: bool = False) -> str:
    """A kept cluster's job log: `job`, or the last one a run of rayflow ran there; streamed to
    stdout as it grows with `follow`. From MLflow once the cluster is gone (its last job's)."""
    from rayflow.orchestrator.cluster_logs import job_log, mlflow_log

    found = registry.named(name)
    kept = _one(name, "logs") if found else _one(name, "logs", gone=True)
    handle = None if kept.gone_at else _reach(kept)
    if handle is None:
        return mlflow_log(kept, job)
    try:
        return job_log(handle, kept, job, follow)
    finally:
        handle.unwind()


def _reach(kept: KeptCluster) -> ClusterHandle | None:
    handle = _keeper(kept).reach(kept, _headers(kept))
    if handle is None:
        registry.forget(kept)
        kept.gone_at = time.time()
    return handle
