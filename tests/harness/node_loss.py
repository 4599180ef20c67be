"""Losing a worker node of a fake_multinode cluster while one of its trials runs.

Ray's fake provider (ray/autoscaler/_private/fake_multi_node/node_provider.py) starts each worker
"node" inside the head's autoscaler process (monitor.py), as a `ray._private.node.Node`: a raylet
(its environment names the node: RAY_OVERRIDE_NODE_ID_FOR_TESTING), the raylet's children (the
dashboard agent, the runtime env agent and the Ray workers, trials among them), and a log monitor
started just before the raylet, also a child of monitor.py. Killing those processes is what a
machine's loss looks like to the cluster: GCS finds the raylet gone and declares the node dead,
the node's actors die with it. (The fake provider's autoscaler keeps the dead node in its list
until it has been idle for the idle timeout: see the vm_jobs fixture in tests/test_vm.py.)

NodeKiller watches a Tune experiment's trial folders under the storage path (fake nodes share this
machine's files) from a thread, while the run it watches blocks the test; once a running trial has
checkpointed it kills that trial's node, and records what it killed for the test to assert on.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# The fake head's node id (FAKE_HEAD_NODE_ID in Ray's fake node_provider.py): never killed.
FAKE_HEAD_NODE_ID = "f" * 51 + "00000"
NODE_ID_ENV = "RAY_OVERRIDE_NODE_ID_FOR_TESTING"
GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


@dataclass
class NodeLoss:
    """What NodeKiller killed: the trial, the checkpoints it had written, the node's processes."""

    trial_dir: Path  # the trial's folder under the storage path
    checkpoints: list[str]  # its checkpoint_NNNNNN folders when its node was killed
    trial_pid: int  # the trial's process (a `ray::ImplicitFunc` Ray worker)
    node_id: str  # the fake node's id (RAY_OVERRIDE_NODE_ID_FOR_TESTING of its raylet)
    raylet_pid: int
    killed: dict[int, str] = field(default_factory=dict)  # pid: command line, as killed
    seconds: float = 0.0  # from the watch's start to the kill


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()).strip()  # a Ray worker pads its title with spaces
    except (*GONE, psutil.AccessDenied):
        return ""


def trial_process(trial_dir: Path) -> psutil.Process | None:
    """The process running the trial, if one does: Tune runs a trial in a working directory of
    its own, `.../<experiment>/working_dirs/<the trial's folder name>` (Trainable's
    RAY_CHDIR_TO_TRIAL_DIR, on by default). The result.json rows carry the trial's pid too, but
    the copy under the storage path is written when the experiment ends, too late to find a
    trial still running (the node_ip they carry is the same for every fake node)."""
    for proc in psutil.process_iter(["cmdline"]):
        if not " ".join(proc.info["cmdline"] or []).startswith("ray::"):
            continue
        try:
            cwd = Path(proc.cwd())
        except (*GONE, psutil.AccessDenied):  # gone, or another user's
            continue
        if (cwd.name, cwd.parent.parent.name) == (trial_dir.name, trial_dir.parent.name):
            return proc
    return None


def worker_node(proc: psutil.Process) -> tuple[psutil.Process, str]:
    """The raylet of the node a Ray worker runs on (the raylet starts its workers, so it is their
    parent), and that node's id; refused for anything but a fake worker node."""
    raylet = next((p for p in proc.parents() if p.name() == "raylet"), None)
    if raylet is None:
        raise RuntimeError(f"pid {proc.pid} ({_cmdline(proc)!r}) has no raylet above it")
    node_id = raylet.environ().get(NODE_ID_ENV, "")
    autoscaler = raylet.parent()
    # A fake worker node is the autoscaler's child; the head's raylet has no such parent (its
    # `ray start --head` has exited) and bears the head's id.
    if (
        node_id in ("", FAKE_HEAD_NODE_ID)
        or autoscaler is None
        or "monitor.py" not in _cmdline(autoscaler)
    ):
        raise RuntimeError(
            f"raylet {raylet.pid} (node {node_id or '?'}) is not a fake_multinode worker node"
        )
    return raylet, node_id


def node_processes(raylet: psutil.Process) -> list[psutil.Process]:
    """The node's processes: the raylet, everything under it (agents, Ray workers and what they
    started), and its log monitor. The autoscaler starts a node's log monitor just before its
    raylet, both as its children (ray._private.node.Node.start_ray_processes) and one node at a
    time (the provider's lock): the node's log monitor is the autoscaler's last one started
    before this raylet."""
    autoscaler = raylet.parent()
    monitors = [
        p
        for p in (autoscaler.children() if autoscaler else [])
        if "log_monitor.py" in _cmdline(p) and p.create_time() <= raylet.create_time()
    ]
    log_monitor = max(monitors, key=lambda p: p.create_time(), default=None)
    return [raylet, *raylet.children(recursive=True), *([log_monitor] if log_monitor else [])]


def kill_node(raylet: psutil.Process) -> dict[int, str]:
    """SIGKILL the node's processes at once, as a machine that died: none exits cleanly, none
    says goodbye. The raylet is stopped first, so that it starts no worker while they are listed
    (and is killed whatever happens)."""
    killed = {}
    raylet.send_signal(signal.SIGSTOP)
    try:
        for proc in node_processes(raylet):
            line = _cmdline(proc)
            try:
                proc.send_signal(signal.SIGKILL)  # psutil checks the pid is still this process
            except GONE:
                continue
            killed[proc.pid] = line
    finally:
        if raylet.pid not in killed:
            raylet.send_signal(signal.SIGKILL)
    return killed


class NodeKiller(threading.Thread):
    """Kills the worker node of a running trial of the folders `trials` (a glob under `storage`)
    once it has checkpointed twice, and once another live worker node has trained a trial (has written
    a checkpoint): waits for that at most `timeout` s. A trial with `last` checkpoints has
    reported its last epoch: killing it then would restart nothing.

    Why wait for a second node: a trial's process fetches the trainable's parameters (Tune's
    with_parameters object) when it starts. A node that starts its first trial just after the
    kill may ask the dead node for that object, and waits (~30 s here) until GCS has declared
    the node dead and the pull is retried elsewhere. A node that has trained a trial already
    holds it, so the remaining trials, the restarted one among them, start at once.

    `loss` is what was killed, `error` why nothing was: the test asserts on them once the run
    it watched has ended."""

    def __init__(
        self, storage: Path, trials: str, last: int, timeout: float = 600, interval: float = 0.1
    ):
        super().__init__(name="node-killer", daemon=True)
        self.storage, self.trials, self.last = storage, trials, last
        self.timeout, self.interval = timeout, interval
        self.loss: NodeLoss | None = None
        self.error: str | None = None
        self._cancel = threading.Event()
        self._trained: dict[str, psutil.Process] = {}  # node id: raylet, of nodes that trained

    def cancel(self) -> None:
        """Stop waiting: the run ended first (then `error` says so)."""
        self._cancel.set()

    def _victim(self) -> tuple[Path, psutil.Process, psutil.Process, str] | None:
        """A trial to kill the node of, if there is one now: its folder, its process, its node's
        raylet and id. (Not `_target`: Thread has one.)"""
        running = []
        for trial_dir in sorted(self.storage.glob(self.trials)):
            checkpoints = len(list(trial_dir.glob("checkpoint_*")))
            proc = trial_process(trial_dir) if checkpoints else None
            if proc is None:
                continue
            try:
                raylet, node_id = worker_node(proc)
            except GONE:  # the trial ended meanwhile
                continue
            self._trained[node_id] = raylet
            # Two checkpoints at least: Tune has registered the first by then (a function
            # trainable's report returns only once the driver has taken the result before it),
            # while the newest may still be on its way and unknown to Tune: killed after only
            # one, a trial restarted from the start (seen under load).
            if 2 <= checkpoints < self.last:
                running.append((trial_dir, proc, raylet, node_id))
        for trial_dir, proc, raylet, node_id in running:
            if any(other != node_id and live.is_running() for other, live in self._trained.items()):
                return trial_dir, proc, raylet, node_id
        return None

    def run(self) -> None:
        start = time.monotonic()
        try:
            while not self._cancel.wait(self.interval):
                victim = self._victim()
                if victim is not None:
                    self._kill(*victim, time.monotonic() - start)
                    if self.loss is not None:
                        return
                if time.monotonic() - start > self.timeout:
                    self.error = (
                        f"no trial of {self.storage}/{self.trials} checkpointed with another "
                        f"node having trained one, in {self.timeout:.0f} s"
                    )
                    return
            self.error = "the run ended before a trial could be chosen"
        except Exception as err:  # noqa: BLE001 - reported to the test, which fails on it
            self.error = f"{type(err).__name__}: {err}"

    def _kill(
        self, trial_dir: Path, proc: psutil.Process, raylet: psutil.Process, node_id: str, at: float
    ) -> None:
        # Frozen first, the trial writes no checkpoint and reports no epoch more while its node's
        # processes are listed: an epoch takes well under a second, and one reported in between
        # could be its last.
        try:
            proc.send_signal(signal.SIGSTOP)
        except GONE:  # it ended just now: the next look finds another
            return
        if len(list(trial_dir.glob("checkpoint_*"))) >= self.last:  # it got to its end meanwhile
            proc.send_signal(signal.SIGCONT)
            return
        killed = kill_node(raylet)
        self.loss = NodeLoss(
            trial_dir,
            sorted(p.name for p in trial_dir.glob("checkpoint_*")),
            proc.pid,
            node_id,
            raylet.pid,
            killed,
            at,
        )
