"""Whether a Ray cluster is in use, and how much it has been used, from its dashboard alone.

Read over HTTP, never as a driver (a driver would itself be activity): the Jobs API (submitted
jobs pending or running), Ray's own activity endpoint (`/api/component_activities`: drivers
connected, the last one's end), the autoscaler's report (`/api/cluster_status`: demand still
waiting for resources) and the state API's nodes (alive now, the most at once, node-seconds).
The autostop watcher on the cluster (rayflow.autostop) and `rayflow status` decide alike.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# The autostop watcher runs as a job of the cluster it watches: never activity of its own.
WATCHER_PREFIX = "rayflow-autostop-"
BUSY_JOB = ("PENDING", "RUNNING")


@dataclass
class Activity:
    """What a cluster is doing: `busy` says why it is not idle (empty: idle since
    `last_active`, seconds since the epoch, None when nothing ran yet)."""

    busy: list[str] = field(default_factory=list)
    last_active: float | None = None
    nodes: int = 0  # alive now
    peak_nodes: int = 0  # the most alive at once
    node_seconds: float = 0.0  # every node's life so far, summed
    jobs: list[dict[str, Any]] = field(default_factory=list)  # submitted jobs, newest last


def get_json(url: str, headers: dict[str, str], timeout_s: float = 10.0) -> Any:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read().decode())


def user_jobs(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The cluster's submitted jobs, oldest first, the autostop watcher left out."""
    jobs = [
        job
        for job in get_json(f"{url}/api/jobs/", headers)
        if job.get("type") == "SUBMISSION"
        and not str(job.get("submission_id") or "").startswith(WATCHER_PREFIX)
    ]
    return sorted(jobs, key=lambda job: job.get("start_time") or 0)


def _demand(url: str, headers: dict[str, str]) -> list[str]:
    """Resource requests the autoscaler still waits to place (tasks, actors, placement groups)."""
    status = get_json(f"{url}/api/cluster_status", headers).get("data", {}).get("clusterStatus")
    load = (status or {}).get("loadMetricsReport") or {}
    # (not requestDemand: a `request_resources` call stays there until called again)
    waiting = [*(load.get("resourceDemand") or []), *(load.get("pgDemand") or [])]
    return [f"{len(waiting)} resource request(s) waiting"] if waiting else []


def _nodes(url: str, headers: dict[str, str], activity: Activity) -> None:
    answer = get_json(f"{url}/api/v0/nodes?limit=10000&detail=true", headers)
    nodes = answer.get("data", {}).get("result", {}).get("result", [])
    now = time.time()
    spans = []
    for node in nodes:
        start = (node.get("start_time_ms") or 0) / 1000
        end = (node.get("end_time_ms") or 0) / 1000 if node.get("state") == "DEAD" else now
        if start:
            spans.append((start, max(end, start)))
    activity.nodes = sum(1 for node in nodes if node.get("state") == "ALIVE")
    activity.node_seconds = sum(end - start for start, end in spans)
    # the most alive at once: walk the starts and ends in time order
    alive = peak = 0
    for _, step in sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans if e < now]):
        alive += step
        peak = max(peak, alive)
    activity.peak_nodes = max(peak, activity.nodes)


def activity(url: str, headers: dict[str, str]) -> Activity:
    """The cluster behind dashboard `url` (urllib errors propagate: the caller decides what an
    unreachable dashboard means)."""
    found = Activity(jobs=user_jobs(url, headers))
    running = [j for j in found.jobs if j.get("status") in BUSY_JOB]
    found.busy += [f"job {j.get('submission_id')} {str(j.get('status')).lower()}" for j in running]
    drivers = get_json(f"{url}/api/component_activities", headers).get("driver") or {}
    if drivers.get("is_active") == "ACTIVE":
        found.busy.append(str(drivers.get("reason") or "a driver is connected"))
    found.busy += _demand(url, headers)
    ends = [(j.get("end_time") or 0) / 1000 for j in found.jobs]
    ends.append(float(drivers.get("last_activity_at") or 0))
    found.last_active = max(ends) or None
    _nodes(url, headers, found)
    return found


def reachable(url: str, headers: dict[str, str], timeout_s: float = 5.0) -> bool:
    """Whether the dashboard answers at all (any HTTP status counts: it is up)."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/api/version", headers=headers), timeout=timeout_s
        ):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
