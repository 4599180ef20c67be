"""backend=local: an in-process Ray cluster on this machine, started with ray.init."""

from __future__ import annotations

import os

import yaml

from rayflow.backends.base import ClusterBackend
from rayflow.config import positive_int, positive_number


def local_cuda_devices() -> int:
    import torch  # only when a GPU is asked for

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class LocalCluster(ClusterBackend):
    def check(self) -> None:
        b = self.cfg.backend
        if b.num_cpus is not None:
            positive_int(self.cfg, "backend.num_cpus")
        if b.num_gpus is not None:
            positive_number(self.cfg, "backend.num_gpus", allow_zero=True)
        if b.object_store_memory is not None:
            positive_int(self.cfg, "backend.object_store_memory", minimum=78643200)  # Ray's floor
        if b.include_dashboard and b.dashboard_port is not None:
            positive_int(self.cfg, "backend.dashboard_port")

    def cluster_gpus(self) -> float | None:
        b = self.cfg.backend
        if b.num_gpus is not None:
            return float(b.num_gpus) if local_cuda_devices() else 0.0
        return float(local_cuda_devices())

    def init_kwargs(self) -> dict:
        b = self.cfg.backend
        kwargs = {
            "address": "local",  # always a new cluster, even when RAY_ADDRESS points elsewhere
            "num_cpus": b.num_cpus if b.num_cpus is not None else os.cpu_count(),
            "num_gpus": b.num_gpus,
            "object_store_memory": b.object_store_memory,
            "include_dashboard": bool(b.include_dashboard),
        }
        if b.include_dashboard:
            kwargs["dashboard_host"] = b.dashboard_host
            if b.dashboard_port is not None:
                kwargs["dashboard_port"] = int(b.dashboard_port)
        return kwargs

    def render(self) -> str:
        spec = {
            "backend": "local",
            "ray.init": self.init_kwargs(),
            "auth_mode": os.environ.get("RAY_AUTH_MODE", self.cfg.ray_auth_mode),
        }
        return yaml.safe_dump(spec, sort_keys=False)

    def start(self) -> str:
        import ray

        context = ray.init(**self.init_kwargs(), log_to_driver=True)
        self._started = True
        return context.address_info["address"]

    def stop(self) -> None:
        if getattr(self, "_started", False):
            import ray

            ray.shutdown()
            self._started = False


__all__ = ["LocalCluster"]
