"""What the cluster used while a job ran: its peak node count and node-seconds per node type,
sampled from the connected driver (the job's own, for a submitted run)."""

from __future__ import annotations

import threading
import time


def node_type(node: dict) -> str:
    """A node's type as the launcher named it (KubeRay group, cluster-launcher node type), else
    head/worker."""
    labels = node.get("Labels") or {}
    for key in ("ray.io/node-group", "ray.io/node-type", "ray.io/node_type"):
        if labels.get(key):
            return str(labels[key])
    return "head" if "node:__internal_head__" in (node.get("Resources") or {}) else "worker"


class NodePeak:
    """The most Ray nodes alive at once (head included), and node-seconds alive per node type
    (what an autoscaling cluster costs), sampled each second while a job runs."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.peak = 0
        self.node_seconds: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rayflow-node-peak", daemon=True)

    def _sample(self) -> None:
        import ray

        last = time.monotonic()
        while not self._stop.is_set():
            # Broad on purpose: a best-effort sampler must never fail the job it samples; whatever
            # ray.nodes() raises (the driver is disconnecting), the figures so far stand.
            try:
                alive = [node for node in ray.nodes() if node["Alive"]]
            except Exception:  # noqa: BLE001
                return
            now = time.monotonic()
            self.peak = max(self.peak, len(alive))
            for node in alive:
                kind = node_type(node)
                self.node_seconds[kind] = self.node_seconds.get(kind, 0.0) + (now - last)
            last = now
            self._stop.wait(self.interval_s)

    def metrics(self) -> dict[str, float]:
        per_type = {
            f"cluster_node_seconds/{kind}": round(s, 1)
            for kind, s in sorted(self.node_seconds.items())
        }
        return {
            "cluster_nodes_peak": self.peak,
            "cluster_node_seconds": round(sum(self.node_seconds.values()), 1),
            **per_type,
        }

    def __enter__(self) -> NodePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
