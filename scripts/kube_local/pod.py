"""One pod on the process kubelet: its sandbox (network namespace, folder, volumes), its containers'
lives (init containers in order, then the containers, restarted by the pod's restartPolicy with
the kubelet's back-off), their probes, and the status and Events the kubelet reports.

`PodWorker.run` is the pod's loop, one thread per pod: it ticks every TICK_S, and ends once the
pod is deleted (its containers stopped within the grace period, then the object removed with
grace 0, as the kubelet confirms a deletion) or gone from the API server.
"""

from __future__ import annotations

import datetime
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scripts.kube_local import containers as ct
from scripts.kube_local.podfs import DEFAULT_WORKDIR, Mount, PodFolder, container_argv, machine_path
from scripts.kube_local.volumes import VolumeError, materialise

if TYPE_CHECKING:
    from scripts.kube_local.kubelet import NodeAgent

TICK_S = 0.5
BACKOFF_S, BACKOFF_MAX_S = 10.0, 300.0  # the kubelet's crash-loop and image-pull back-off


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Box:
    """What the kubelet knows of one container."""

    spec: dict[str, Any]
    init: bool = False
    process: ct.Process | None = None
    env: dict[str, str] = field(default_factory=dict)
    pulled: bool = False
    pull_failures: int = 0
    restarts: int = 0
    not_before: float = 0.0  # back-off: no (re)start or pull before this monotonic time
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    terminated: dict[str, Any] | None = None
    last: dict[str, Any] | None = None  # lastState.terminated
    started_at: str | None = None
    ready: bool = False
    probes: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # kind: ok, bad, due

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class PodWorker:
    def __init__(self, agent: NodeAgent, pod: dict[str, Any]):
        self.agent, self.pod = agent, pod
        self.uid = pod["metadata"]["uid"]
        self.lock = threading.Lock()
        self.deleted = False  # gone from the API server (a forced delete)
        spec = pod["spec"]
        self.boxes = [Box(c, init=True) for c in spec.get("initContainers") or []]
        self.boxes += [Box(c) for c in spec["containers"]]
        self.ip: str | None = None
        self.netns: str | None = None
        self.folder: PodFolder | None = None
        self.mounts: dict[str, Any] = {}
        self.started = now()
        self.reported: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self.run, name=f"pod-{self.name}", daemon=True)

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    def update(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pod = pod

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.agent.stopping.is_set():
                with self.lock:
                    pod = self.pod
                if self.deleted or pod["metadata"].get("deletionTimestamp"):
                    self._terminate(pod)
                    return
                if self.folder is None and not self._sandbox():
                    time.sleep(2)
                    continue
                self._step()
                self._report()
                time.sleep(TICK_S)
        finally:
            self._stop_all(0 if self.deleted or self.agent.stopping.is_set() else 30)
            self.agent.release(self)

    def _sandbox(self) -> bool:
        """The pod's network namespace, folder and volumes; False (with an Event) until it can."""
        if self.netns is None:
            self.ip, self.netns = self.agent.network_for(self)
        self.folder = self.folder or PodFolder(self.agent.root, self.uid)
        try:
            self.mounts = materialise(self.agent, self.pod, self.folder)
        except VolumeError as err:
            self.agent.event(self.pod, "Warning", "FailedMount", str(err))
            return False
        self.agent.hosts_changed()
        return True

    def _step(self) -> None:
        inits = [b for b in self.boxes if b.init]
        for box in inits:
            if box.terminated and box.terminated["exitCode"] == 0:
                continue
            self._live(box)
            return  # one init container at a time, each to completion
        for box in self.boxes:
            if not box.init:
                self._live(box)
                self._probe(box)

    def _live(self, box: Box) -> None:
        """Start, watch and restart one container."""
        if box.running:
            return
        if box.process is not None:  # it has just ended
            self._ended(box)
        if box.terminated and not self._restarts(box):
            return
        if time.monotonic() < box.not_before:
            return
        if not box.pulled and not self._pull(box):
            return
        self._start(box)

    def _restarts(self, box: Box) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        code = box.terminated["exitCode"] if box.terminated else 0
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _pull(self, box: Box) -> bool:
        image = box.spec.get("image", "")
        if self.agent.image_allowed(image):
            box.pulled = True
            self.agent.event(
                self.pod,
                "Normal",
                "Pulled",
                f'Container image "{image}" already present on machine',
                box.name,
            )
            return True
        box.pull_failures += 1
        reason = "ErrImagePull" if box.pull_failures == 1 else "ImagePullBackOff"
        message = (
            f'Failed to pull image "{image}": this kubelet runs no images; '
            f"allowed: {', '.join(self.agent.images)}"
        )
        box.waiting = (
            reason,
            message if reason == "ErrImagePull" else f'Back-off pulling image "{image}"',
        )
        box.not_before = time.monotonic() + min(
            BACKOFF_S * 2 ** (box.pull_failures - 1), BACKOFF_MAX_S
        )
        self.agent.event(self.pod, "Warning", "Failed", message, box.name)
        if reason == "ImagePullBackOff":
            self.agent.event(self.pod, "Normal", "BackOff", box.waiting[1], box.name)
        return False

    def _start(self, box: Box) -> None:
        try:
            # the pod as its status will say once reported (status.podIP before the API has it)
            status = {**(self.pod.get("status") or {}), **self._addresses()}
            pod = {**self.pod, "status": status}
            box.env = ct.environment(pod, box.spec, self._lookup, self._base_env(box))
            command = ct.argv(box.spec, box.env)
        except ct.MissingEnv as err:
            box.waiting = ("CreateContainerConfigError", str(err))
            box.not_before = time.monotonic() + 2
            self.agent.event(self.pod, "Warning", "Failed", f"Error: {err}", box.name)
            return
        if box.terminated:  # a restart
            box.last, box.terminated = box.terminated, None
            box.restarts += 1
        workdir = box.spec.get("workingDir") or DEFAULT_WORKDIR
        argv = container_argv(
            self.netns, self.folder, self.hostname(), workdir, self._mounts(box), command
        )
        box.process = ct.Process(argv, box.env, self.folder.log(box.name))
        box.process.find_pid1()
        box.waiting, box.started_at, box.ready, box.probes = None, now(), False, {}
        self.agent.event(self.pod, "Normal", "Created", f"Created container {box.name}", box.name)
        self.agent.event(self.pod, "Normal", "Started", f"Started container {box.name}", box.name)

    def _ended(self, box: Box) -> None:
        code = box.process.poll()
        box.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": box.started_at,
            "finishedAt": now(),
        }
        if code != 0 and box.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            # the kubelet's fallback: the log's last 80 lines, at most 2048 bytes (there is no
            # termination-log file here: /dev is the machine's)
            tail = self.folder.log(box.name).read_bytes()[-2048:].decode(errors="replace")
            box.terminated["message"] = "\n".join(tail.splitlines()[-80:])
        box.process, box.ready = None, False
        if self._restarts(box):
            # the kubelet's back-off: 10 s, doubling to 5 min, reset after 10 min of running
            ran = time.time() - datetime.datetime.fromisoformat(box.started_at).timestamp()
            tries = 0 if ran > 600 else box.restarts
            delay = min(BACKOFF_S * 2**tries, BACKOFF_MAX_S)
            box.not_before = time.monotonic() + delay
            box.waiting = (
                "CrashLoopBackOff",
                f"back-off {delay:g}s restarting failed container={box.name} "
                f"pod={self.name}_{self.namespace}({self.uid})",
            )
            if code != 0:
                self.agent.event(
                    self.pod,
                    "Warning",
                    "BackOff",
                    f"Back-off restarting failed container {box.name} in pod "
                    f"{self.name}_{self.namespace}({self.uid})",
                    box.name,
                )

    def _probe(self, box: Box) -> None:
        """Readiness and liveness, each at its period, after its initial delay."""
        if not box.running:
            return
        started = datetime.datetime.fromisoformat(box.started_at).timestamp()
        if "readinessProbe" not in box.spec:
            box.ready = True
        for kind in ("readinessProbe", "livenessProbe"):
            spec = box.spec.get(kind)
            if not spec:
                continue
            ok, bad, due = box.probes.get(
                kind, (0, 0, started + spec.get("initialDelaySeconds", 0))
            )
            if time.time() < due:
                continue
            failed = ct.probe(spec, self.ip, box.process, box.env)
            ok, bad = (0, bad + 1) if failed else (ok + 1, 0)
            box.probes[kind] = (ok, bad, time.time() + spec.get("periodSeconds", 10))
            name = "Readiness" if kind == "readinessProbe" else "Liveness"
            if failed:
                self.agent.event(
                    self.pod, "Warning", "Unhealthy", f"{name} probe failed: {failed}", box.name
                )
            if kind == "readinessProbe":
                if ok >= spec.get("successThreshold", 1):
                    box.ready = True
                elif bad >= spec.get("failureThreshold", 3):
                    box.ready = False
            elif bad >= spec.get("failureThreshold", 3):
                self.agent.event(
                    self.pod,
                    "Normal",
                    "Killing",
                    f"Container {box.name} failed liveness probe, will be restarted",
                    box.name,
                )
                box.process.stop(self._grace())

    # --- what a container sees ------------------------------------------------------------------

    def _lookup(self, kind: str, name: str, key: str) -> str | None:
        data = self.agent.read_keyed(kind, self.namespace, name)
        return None if data is None or key not in data else data[key].decode()

    def hostname(self) -> str:
        return self.pod["spec"].get("hostname") or self.name[:63]

    def _base_env(self, box: Box) -> dict[str, str]:
        env = {
            "HOME": box.spec.get("workingDir") or DEFAULT_WORKDIR,
            "HOSTNAME": self.hostname(),
            "PATH": machine_path(self.agent.venv_bin),
            "LANG": "C.UTF-8",
            **self.agent.service_env(),
        }
        return env

    def _mounts(self, box: Box) -> list[Mount]:
        found = []
        for mount in box.spec.get("volumeMounts") or []:
            source = self.mounts.get(mount["name"])
            if source is None:
                continue
            if mount.get("subPath"):
                source = source / mount["subPath"]
            found.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly"))))
        return found

    # --- status ---------------------------------------------------------------------------------

    def _grace(self) -> float:
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(grace)

    def _terminate(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        for box in self.boxes:
            if box.running:
                self.agent.event(
                    pod, "Normal", "Killing", f"Stopping container {box.name}", box.name
                )
        self._stop_all(self._grace())
        if not self.deleted:
            self._report()
            self.agent.confirm_deletion(pod)

    def _stop_all(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        running = [b for b in self.boxes if b.running]
        for box in running:  # all at once, then each waited for within what is left
            box.process.signal(signal.SIGTERM)
        for box in running:
            box.process.stop(max(0.0, deadline - time.monotonic()))
            self._ended(box)

    def status(self) -> dict[str, Any]:
        inits = [b for b in self.boxes if b.init]
        mains = [b for b in self.boxes if not b.init]
        initialized = all(b.terminated and b.terminated["exitCode"] == 0 for b in inits)
        ready = initialized and all(b.ready and b.running for b in mains)
        return {
            "phase": self._phase(initialized, mains),
            "conditions": [
                _condition("Initialized", initialized),
                _condition("ContainersReady", ready),
                _condition("Ready", ready),
            ],
            **self._addresses(),
            "startTime": self.started,
            "initContainerStatuses": [_container_status(b) for b in inits],
            "containerStatuses": [_container_status(b) for b in mains],
        }

    def _addresses(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "hostIP": self.agent.host_ip,
            "hostIPs": [{"ip": self.agent.host_ip}],
        }
        if self.ip:
            found.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        return found

    def _phase(self, initialized: bool, mains: list[Box]) -> str:
        if not initialized:
            init_failed = any(
                b.terminated and b.terminated["exitCode"] != 0 and not self._restarts(b)
                for b in self.boxes
                if b.init
            )
            return "Failed" if init_failed else "Pending"
        if any(b.running for b in mains) or any(b.terminated and self._restarts(b) for b in mains):
            return "Running"
        if all(b.terminated for b in mains):
            return "Succeeded" if all(b.terminated["exitCode"] == 0 for b in mains) else "Failed"
        return "Pending"

    def _report(self) -> None:
        status = self.status()
        if status != self.reported:
            self.agent.patch_status(self.pod, status)
            self.reported = status


def _condition(kind: str, true: bool) -> dict[str, Any]:
    return {"type": kind, "status": "True" if true else "False", "lastTransitionTime": None}


def _container_status(box: Box) -> dict[str, Any]:
    if box.running:
        state: dict[str, Any] = {"running": {"startedAt": box.started_at}}
    elif box.waiting:
        state = {"waiting": {"reason": box.waiting[0], "message": box.waiting[1] or None}}
    elif box.terminated:
        state = {"terminated": box.terminated}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    return {
        "name": box.name,
        "image": box.spec.get("image", ""),
        "imageID": "",
        "containerID": f"process://{box.process.pid1}" if box.running and box.process else None,
        "ready": box.ready and box.running,
        "started": box.running,
        "restartCount": box.restarts,
        "state": state,
        "lastState": {"terminated": box.last} if box.last else {},
    }
