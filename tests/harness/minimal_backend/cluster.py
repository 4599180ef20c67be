"""backend=minimal: joins the Ray cluster at `backend.address`, as attach does, with the contract's
members only: render, start (its one undo step, ray.shutdown), check. Never stops the cluster."""

from __future__ import annotations

import yaml

from rayflow.backends import ClusterBackend, ClusterHandle, Rendered, Traits, WorkerPreload
from rayflow.errors import ConfigError


class MinimalCluster(ClusterBackend):
    traits = Traits(joins_running=True, single_machine=True)

    def check(self) -> None:
        host, _, port = str(self.section.address or "").rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                "backend.address", f"expected HOST:PORT, got {self.section.address!r}"
            )

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        spec = {"backend": self.name, "address": str(self.section.address), "lifecycle": "joined"}
        return Rendered(yaml.safe_dump(spec, sort_keys=False))

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        import ray

        handle = ClusterHandle(self.name, address=str(self.section.address))
        with handle.unwound_on_error():
            ray.init(address=handle.address)
            handle.on_stop("ray.shutdown(): leave the joined cluster running", ray.shutdown)
        return handle
