"""backend=spark: the Ray-on-Spark cluster this process keeps (`backend.keep_cluster=true`), for
the next run in this process (a notebook kernel) to join, under an idle timer.

Ray on Spark's head is a child of this process and dies with it, so a kept cluster lives at most
as long as the kernel. The timer (a daemon thread, `_watch`) shuts it down after
`backend.autostop_idle_minutes` with no run here, no driver and no waiting demand
(rayflow.runtime.activity, as the watcher on a vm or kuberay cluster decides), or cleans up once
its head has exited (stopped from another process by `rayflow down`).
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time
import urllib.error
import uuid
from dataclasses import dataclass, field
from typing import Any

import psutil

from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster, idle_minutes
from rayflow.runtime import ray_internals
from rayflow.runtime.activity import activity, reachable
from rayflow.runtime.processes import (
    GONE,
    kill_processes_mentioning,
    processes_mentioning,
    stop_processes_mentioning,
    terminate,
)
from rayflow.security.redaction import mask_text

# What a kept cluster's idle timer does how often: its head is a child of this process (a poll is
# free); its dashboard is asked over HTTP, as rayflow.autostop's watcher asks a vm cluster's.
HEAD_POLL_S = 1.0
IDLE_POLL_S = 10.0
# Ray on Spark names a cluster's temp dir `ray-<head port>-<8 hex>` (under ray_temp_root_dir):
# `rayflow down` stops only processes naming a folder of that shape, whatever a record says.
RAY_ON_SPARK_TEMP = re.compile(r"ray-\d+-[0-9a-f]{8}")


def kept_note(kept: Kept) -> None:
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main is not None and str(main.name).startswith("rayflow."):
        print(
            "rayflow: warning: backend.keep_cluster=true keeps a Ray-on-Spark cluster in the "
            "process that started it, and `python -m rayflow` ends with this run: keep it from "
            "a notebook (rayflow.run)",
            file=sys.stderr,
            flush=True,
        )
    stops = f"after {idle_minutes(kept.minutes)}, " if kept.minutes else ""
    print(
        f"[rayflow] spark: the Ray-on-Spark cluster {kept.name} is kept running in this process "
        "(backend.keep_cluster=true): the next run here with the same backend section joins "
        f"it; it stops {stops}with `rayflow down {kept.name}`, or when this process exits",
        flush=True,
    )


def is_launcher(proc: psutil.Process) -> bool:
    """Ray on Spark's `start_ray_node`: a node's launcher, which stops its node and cleans up."""
    try:
        return "ray.util.spark.start_ray_node" in proc.cmdline()
    except GONE:
        return False


def process_alive(where: dict[str, str]) -> bool:
    """Whether the process a record names still runs: its pid, started when the record says (a
    reused pid is another process)."""
    try:
        started = psutil.Process(int(where["pid"])).create_time()
        return abs(started - float(where["pid_started"])) < 1.0
    except (KeyError, ValueError, *GONE):
        return False


# --- the cluster this process keeps ---------------------------------------------------------------


@dataclass
class Kept:
    """The Ray-on-Spark cluster this process keeps: how a run joins it, how it is shut down (the
    undo steps its start registered), and what its idle timer asks."""

    key: str  # SparkCluster.cluster_key() of the run that started it
    name: str
    owner_run: str
    address: str  # its head's GCS address, for a driver
    where: dict[str, str]  # its record's (pid, pid_started, url, temp_dir)
    tags: dict[str, str]  # for the MLflow parent runs of the runs that join it
    steps: ClusterHandle  # its undo steps: Ray on Spark's shutdown, the session rayflow built
    head: Any  # the head node's launcher (a Popen: a child of this process)
    headers: dict[str, str]  # what a request to its dashboard carries
    minutes: float | None  # autostop: idle this long, it is shut down (None: never)
    users: int = 0  # runs of this process on it now
    idle_since: float = field(default_factory=time.time)
    done: threading.Event = field(default_factory=threading.Event)


class _Holder:
    """The cluster this process keeps (`held`), and the lock every change of it, or of its run
    count, holds (the idle timer is a thread of its own). Process-wide, the spark package's one:
    Ray on Spark itself holds its cluster in a global of this process
    (cluster_init._active_ray_cluster, one a process), and a kept one outlives the run, and the
    backend object, that started it; the next run in this kernel, a new backend object, finds it
    here. Its one instance is `_HOLDER`."""

    def __init__(self) -> None:
        self.held: Kept | None = None
        self.lock = threading.RLock()

    def let_go_of(self, kept: Kept) -> None:
        """Forget `kept` if it is the one held."""
        with self.lock:
            if self.held is kept:
                self.held = None


_HOLDER = _Holder()


def alive_held() -> Kept | None:
    """The cluster this process keeps; one whose head has exited (stopped from another process,
    or failed) is shut down first, what is left of it, and None."""
    with _HOLDER.lock:
        held = _HOLDER.held
        if held is not None and held.head.poll() is not None:
            let_go(held, "its head node exited")
            return None
        return held


def hold(kept: Kept) -> None:
    with _HOLDER.lock:
        _HOLDER.held = kept
    threading.Thread(target=_watch, args=(kept,), name=f"rayflow-{kept.name}", daemon=True).start()
    # A clean shutdown (logs collected) when this process ends. Not atexit alone: Python runs
    # atexit functions once its non-daemon threads have ended, and Ray on Spark's thread that
    # relays its head's output is one, which ends only with the head (`python -m rayflow` hung
    # at exit). threading's own exit hooks (concurrent.futures' too) run before that wait.
    register = getattr(threading, "_register_atexit", atexit.register)
    register(_at_exit, kept)


def stop_unless_kept(steps: ClusterHandle) -> None:
    """The run's teardown of the cluster it started: none once it is kept (handed to the
    holder), else every undo step of its start (a start that failed before it was kept)."""
    if not steps.kept:
        steps.unwind()


def done_with(kept: Kept) -> None:
    """A run on the kept cluster ended (its driver disconnected first): idle from now."""
    with _HOLDER.lock:
        kept.users = max(0, kept.users - 1)
        kept.idle_since = time.time()


def _in_use(kept: Kept) -> bool:
    """A run of this process holds it, or this process is connected to Ray at all
    (shutdown_ray_cluster() would disconnect that driver, whichever cluster it is on)."""
    ray = sys.modules.get("ray")
    return kept.users > 0 or bool(ray is not None and ray.is_initialized())


def _idle_s(kept: Kept) -> float:
    """How long the kept cluster has been idle, as its dashboard says (rayflow.runtime.activity:
    a job, a connected driver, waiting demand are activity), and as this process knows."""
    try:
        found = activity(kept.where["url"], kept.headers)
    except (urllib.error.URLError, OSError, ValueError):
        return 0.0  # not known to be idle (a head that exited is seen by its poll)
    now = time.time()
    if found.busy or _in_use(kept):
        kept.idle_since = now
    elif found.last_active:
        kept.idle_since = max(kept.idle_since, found.last_active)
    return now - kept.idle_since


def _watch(kept: Kept) -> None:
    """The kept cluster's idle timer, a daemon thread: shut it down once idle for its autostop
    minutes, or what is left of it once its head has exited."""
    asked = 0.0
    while not kept.done.wait(HEAD_POLL_S):
        if kept.head.poll() is not None:
            let_go(kept, "its head node exited")
            return
        if kept.minutes is None or time.monotonic() - asked < IDLE_POLL_S:
            continue
        asked = time.monotonic()
        if _idle_s(kept) < kept.minutes * 60:
            continue
        with _HOLDER.lock:  # a run that joins meanwhile waits, then starts a new cluster
            if not _in_use(kept):
                let_go(kept, f"idle for {kept.minutes:g} min")
                return


def let_go(kept: Kept, why: str) -> None:
    """Shut the kept cluster down as the run that started it would have, had it not kept it:
    Ray on Spark, then the session and JVM rayflow built. Once; the holder forgets it."""
    with _HOLDER.lock:
        if kept.done.is_set():
            return
        kept.done.set()
        _HOLDER.let_go_of(kept)
        print(f"[rayflow] spark: shutting down the kept cluster {kept.name} ({why})", flush=True)
        kept.steps.unwind()


def _at_exit(kept: Kept) -> None:
    let_go(kept, "this process exits")


def let_go_if_mine(owner_run: str, why: str) -> bool:
    """Shut down the cluster this process keeps if it is the one `owner_run` started."""
    with _HOLDER.lock:
        held = _HOLDER.held
        if held is None or held.owner_run != owner_run:
            return False
        let_go(held, why)
        return True


# --- a kept cluster, from its record alone (rayflow status, down) -------------------------------


def reach(kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
    """Its dashboard, while the process that keeps it lives and the dashboard answers."""
    url = kept.where.get("url", "")
    if not (process_alive(kept.where) and url and reachable(url, headers)):
        return None
    return ClusterHandle(
        kept.backend,
        address=url,
        name=kept.name,
        owner_run=kept.owner_run,
        kept=True,
        where=dict(kept.where),
        submission=Submission(headers=headers),
    )


def down(kept: KeptCluster) -> None:
    """In the process that keeps it: shut down as its idle timer would. From another: stop
    its Ray nodes on this machine (the head, and the worker nodes of local Spark workers),
    each by its own launcher first, so it collects its logs and removes its temp dir. The
    keeping process's timer sees its head gone and stops the rest there (Ray on Spark's
    Spark jobs, the SparkSession rayflow built); worker nodes on other Spark machines exit on
    their own once their head is gone (Ray's GCS reconnect timeout, about 60 s)."""
    if let_go_if_mine(kept.owner_run, "rayflow down"):
        return
    temp_dir = kept.where.get("temp_dir", "")
    if not RAY_ON_SPARK_TEMP.fullmatch(os.path.basename(temp_dir)):
        from rayflow.errors import ClusterError  # nothing to stop by: never "torn down"

        raise ClusterError(
            f"spark cluster {kept.name}: its record names no Ray-on-Spark temp dir "
            f"({temp_dir or 'none'}): nothing stopped; shut it down in its notebook "
            "(ray.util.spark.shutdown_ray_cluster())"
        )
    launchers = [p for p in processes_mentioning(temp_dir) if is_launcher(p)]
    terminate(launchers, timeout_s=30)
    stop_processes_mentioning(temp_dir)
    kill_processes_mentioning(temp_dir)


def keep(
    key: str, handle: ClusterHandle, steps: ClusterHandle, token: str | None, minutes: float | None
) -> None:
    """Hand the cluster just started (the run's `handle`, its own undo `steps`) to this process's
    holder, under its idle timer; the run's handle then only disconnects its driver."""
    ray_cluster = ray_internals.active_ray_on_spark_cluster()
    host = handle.address.rsplit(":", 1)[0]
    me = psutil.Process()
    where = {
        "pid": str(me.pid),
        "pid_started": repr(me.create_time()),
        "url": f"http://{host}:{ray_cluster.ray_dashboard_port}",
    }
    if ray_cluster.temp_dir:
        where["temp_dir"] = str(ray_cluster.temp_dir)
    kept = Kept(
        key=key,
        name=f"spark-{me.pid}",
        owner_run=uuid.uuid4().hex,
        address=handle.address,
        where=where,
        tags=dict(handle.tags),
        steps=steps,
        head=ray_cluster.head_proc,
        headers={"Authorization": f"Bearer {token}"} if token else {},
        minutes=minutes,
    )
    steps.kept = True  # the run's teardown now leaves it (stop_unless_kept)
    hold(kept)
    _as_kept(handle, kept)
    kept_note(kept)


def join(key: str, handle: ClusterHandle) -> bool:
    """Join the cluster this process keeps, if it was started with the same backend section
    (`key`): the run's handle on it, its driver still to connect; False when there is none."""
    held = alive_held()
    with _HOLDER.lock:
        if held is None or held.done.is_set() or held.key != key:
            return False  # (a cluster of another section: refused by check())
        held.users += 1  # the idle timer leaves it alone from now on
    handle.address, handle.joined = held.address, True
    handle.tags.update(held.tags)
    _as_kept(handle, held)
    print(
        f"[rayflow] spark: joining the Ray-on-Spark cluster {held.name} this process keeps "
        f"(head {mask_text(held.address)}); it keeps running after this run",
        flush=True,
    )
    return True


def _as_kept(handle: ClusterHandle, kept: Kept) -> None:
    """The run's handle on the kept cluster: what its record says, and, when the run ends, its
    idle timer starting again."""
    handle.kept, handle.name, handle.owner_run = True, kept.name, kept.owner_run
    handle.where = dict(kept.where)
    handle.on_stop("let go of the kept Ray-on-Spark cluster", done_with, kept)
