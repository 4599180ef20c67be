"""The whole local Kubernetes: a bridge, the real control plane on the bridge's address, and the
process kubelet with its Nodes, as one context manager (`LocalKube`), which
`scripts/kube-local.sh` and the tests share.

The bridge's first address is this machine's on the bridge: the API server listens there (its
certificate names it), and so do the servers a run's pods reach (S3, MLflow). Pods take addresses
from the twentieth on. `stop()` undoes `start()` newest first, past a failing step, and then
sweeps whatever carries the prefix's names (a killed kubelet's namespaces).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.kube_local import net
from scripts.kube_local.control_plane import ControlPlane
from scripts.kube_local.undo import Stack

REPO = Path(__file__).resolve().parents[2]
NODES_READY_S = 30.0


class LocalKubeError(RuntimeError):
    pass


@dataclass
class LocalKube(Stack):
    error = LocalKubeError

    folder: Path
    bin_dir: Path
    nodes: tuple[str, ...] = ("node-1", "node-2")
    subnet: str = "10.214.0.0/24"
    prefix: str = "rfk"
    cpu: str = "8"  # what the scheduler sees (no cgroups): room for a kept cluster beside a run
    memory: str = "32Gi"
    gpus: int = 0
    images: str = ""
    plane: ControlPlane | None = None
    kubelet: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.kubeconfig("admin")

    def start(self) -> None:
        if not net.forwarding_off():
            raise LocalKubeError(
                "this machine forwards IPv4 packets (net.ipv4.ip_forward=1): pods on the bridge "
                "could reach beyond it; not starting"
            )
        net.sweep(self.prefix)
        self.undo("sweep", lambda: net.sweep(self.prefix))
        prefixlen = ipaddress.ip_network(self.subnet).prefixlen
        net.add_bridge(self.bridge, self.address, prefixlen)
        self.undo(f"delete {self.bridge}", lambda: net.del_link(self.bridge))
        self.plane = ControlPlane(
            self.folder / "control-plane", self.bin_dir, self.nodes, self.address
        )
        self.plane.folder.mkdir(parents=True, exist_ok=True)
        self.undo("stop the control plane", self.plane.stop)
        self.plane.start()
        self._start_kubelet()
        self._wait_nodes()

    def kubectl(self, *args: str) -> str:
        assert self.plane is not None
        return self.plane.kubectl(*args)

    def _start_kubelet(self) -> None:
        assert self.plane is not None
        port = self.plane.server.rsplit(":", 1)[1]
        log = open(self.folder / "kubelet.log", "ab")  # noqa: SIM115  (closed on stop)
        self.kubelet = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scripts.kube_local.kubelet",
                f"--root={self.folder / 'kubelet'}",
                f"--kubeconfigs={self.plane.folder}",
                f"--nodes={','.join(self.nodes)}",
                f"--bridge={self.bridge}",
                f"--network={self.subnet}",
                f"--prefix={self.prefix}",
                f"--api-host={self.address}",
                f"--api-port={port}",
                f"--cpu={self.cpu}",
                f"--memory={self.memory}",
                f"--gpus={self.gpus}",
                f"--images={self.images}",
                f"--extra-hosts={self.plane.operator_hosts}",
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )
        self.undo("stop the kubelet", lambda: _stop_kubelet(self.kubelet, log))

    def _wait_nodes(self) -> None:
        deadline = time.monotonic() + NODES_READY_S
        while time.monotonic() < deadline:
            if self.kubelet is not None and self.kubelet.poll() is not None:
                raise LocalKubeError(
                    f"the kubelet exited ({self.kubelet.returncode}): see {self.folder}/kubelet.log"
                )
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            ready = {
                n["metadata"]["name"]
                for n in nodes
                for c in n.get("status", {}).get("conditions") or []
                if c["type"] == "Ready" and c["status"] == "True"
            }
            if set(self.nodes) <= ready:
                return
            time.sleep(0.2)
        raise LocalKubeError(f"the Nodes {', '.join(self.nodes)} not Ready in {NODES_READY_S:g} s")


def _stop_kubelet(proc: subprocess.Popen | None, log) -> None:
    try:
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            if proc is not None:
                os.killpg(proc.pid, signal.SIGKILL)  # what its pods left in its group
        log.close()
