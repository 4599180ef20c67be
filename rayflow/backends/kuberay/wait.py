"""Waiting for a KubeRay head, and failing fast, in one line, on what keeps it from coming up.

The wait is on the RayCluster's `HeadPodReady` condition, not on `status.state: ready`: the
state waits for every worker pod, so one GPU worker pod that no node can hold would block it
forever, while the run only needs the head (the autoscaler and the placement watch take care
of workers). While waiting, the head pod and the events about it and the RayCluster are read
for what users hit most: an image that cannot be pulled, a pod nothing can schedule (after a
grace period: a cluster autoscaler may be adding a node), a spec the operator refused
(`InvalidRayClusterSpec`, which is an event, not an API error), a container that keeps crashing,
or one that ended in error in a pod that is never restarted.
`diagnose` is a pure function of those objects, so it is tested without a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rayflow.errors import ClusterError
from rayflow.runtime.progress import Phase

PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_FAILURES = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def head_ready(cluster: dict | None) -> bool:
    conditions = ((cluster or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "HeadPodReady" and c.get("status") == "True" for c in conditions)


def _latest(events: list[dict], reason: str) -> dict | None:
    found = [e for e in events if e.get("reason") == reason and e.get("type") == "Warning"]
    return (
        max(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if found
        else None
    )


def _statuses(pod: dict) -> list[dict]:
    status = pod.get("status") or {}
    return (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])


def _ended_for_good(pod: dict, status: dict) -> str | None:
    """How a container of a pod that is never restarted (restartPolicy Never: what autoscaler v2
    renders) ended in error, else None: its kubelet will not start it again, so the head never
    becomes ready (KubeRay replaces the pod, which ends the same way)."""
    if (pod.get("spec") or {}).get("restartPolicy") != "Never":
        return None
    ended = (status.get("state") or {}).get("terminated") or {}
    if ended.get("exitCode") in (None, 0):
        return None
    line = f"exited with code {ended['exitCode']} ({ended.get('reason', 'Error')})"
    last = (ended.get("message") or "").strip().splitlines()
    return line + (f": {last[-1]}" if last else "")


def unschedulable(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def diagnose(
    cluster_name: str,
    cluster_events: list[dict],
    head: dict | None,
    head_events: list[dict],
    unschedulable_for_s: float,
    grace_s: float,
) -> str | None:
    """Why the head will not come up, as one line; None while it may still come up."""
    invalid = _latest(cluster_events, "InvalidRayClusterSpec")
    if invalid is not None:
        return (
            f"KubeRay refused RayCluster {cluster_name} (InvalidRayClusterSpec): "
            f"{invalid.get('message', '').strip()}"
        )
    if head is None:
        return None
    name = head["metadata"]["name"]
    for status in _statuses(head):
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason"), (waiting.get("message") or "").strip()
        if reason in PULL_FAILURES:
            return f"the head pod {name} cannot pull its image {status.get('image')}: {reason}" + (
                f": {message}" if message else ""
            )
        if reason in CONFIG_FAILURES:
            return f"the head pod {name} cannot start container {status.get('name')}: {reason}" + (
                f": {message}" if message else ""
            )
        if reason == "CrashLoopBackOff":
            last = (status.get("lastState") or {}).get("terminated") or {}
            detail = f"last exit {last.get('reason', '?')} (code {last.get('exitCode', '?')})"
            if last.get("message"):
                detail += f": {last['message'].strip().splitlines()[-1]}"
            return (
                f"the head pod {name}'s container {status.get('name')} keeps crashing "
                f"(CrashLoopBackOff, {status.get('restartCount', 0)} restarts), {detail}"
            )
        ended = _ended_for_good(head, status)
        if ended:
            return f"the head pod {name}'s container {status.get('name')} {ended}"
    if (head.get("status") or {}).get("phase") == "Failed":
        pod = head.get("status") or {}
        return f"the head pod {name} failed: {pod.get('message') or pod.get('reason')}"
    if unschedulable(head) and unschedulable_for_s >= grace_s:
        event = _latest(head_events, "FailedScheduling")
        why = (event or {}).get("message") or next(
            (
                c.get("message")
                for c in head["status"].get("conditions", [])
                if c.get("type") == "PodScheduled"
            ),
            "",
        )
        return (
            f"no node can hold the head pod {name} (FailedScheduling for "
            f"{unschedulable_for_s:.0f} s): {why.strip()}"
        )
    return None


def describe(head: dict | None) -> str:
    """What the head pod is doing now, for the progress line."""
    if head is None:
        return "no head pod yet"
    status = head.get("status") or {}
    for container in _statuses(head):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"{status.get('phase', 'Pending')} ({waiting['reason']})"
    return "unschedulable" if unschedulable(head) else str(status.get("phase") or "Pending")


def wait_for_head(
    kube,
    cluster_name: Callable[[], str | None],
    timeout_s: float,
    grace_s: float,
    poll_s: float = 2.0,
    step: Phase | None = None,
) -> dict:
    """Until the RayCluster's HeadPodReady; returns the head pod. `cluster_name` names the
    RayCluster once known (a RayJob's cluster is named by the operator). Raises ClusterError.
    `step` (a progress phase) is told what the head pod is doing: its ticker shows it on a
    terminal."""
    started = time.monotonic()
    unschedulable_since: float | None = None
    while True:
        name = cluster_name()
        cluster = kube.get("RayCluster", name) if name else None
        pods = kube.pods(f"ray.io/cluster={name},ray.io/node-type=head") if name else []
        head = pods[0] if pods else None
        if head_ready(cluster) and head is not None:
            return head
        now = time.monotonic()
        if head is not None and unschedulable(head):
            unschedulable_since = unschedulable_since or now
        else:
            unschedulable_since = None
        if name:
            problem = diagnose(
                name,
                kube.events(name),
                head,
                kube.events(head["metadata"]["name"]) if head else [],
                now - unschedulable_since if unschedulable_since else 0.0,
                grace_s,
            )
            if problem:
                raise ClusterError(problem)
        waited = now - started
        if waited > timeout_s:
            raise ClusterError(
                f"the head of RayCluster {name or '(not created yet)'} was not ready within "
                f"{timeout_s:g} s (backend.start_timeout_s); it is {describe(head)}"
            )
        if step is not None:
            step.status(f"head pod {describe(head)}, limit {timeout_s:g} s")
        time.sleep(poll_s)
