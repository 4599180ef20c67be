"""backend=kuberay: a RayCluster (or RayJob) made by the KubeRay operator, running the workload
as a Ray Job.

rayflow renders the manifest (kuberay_manifest), validates it strictly against KubeRay's CRD
and the operator's own rules before anything is applied (kuberay_checks), applies it with the
official `kubernetes` client (server-side apply), waits for the head (kuberay_wait), reaches
the dashboard through the API server's service proxy (kuberay_relay) and submits the run
through the seam backend=vm uses (rayflow.remote). `kubernetes` is imported inside the methods.
"""

from __future__ import annotations

import sys

import yaml

from rayflow.backends import kuberay_checks, kuberay_manifest
from rayflow.backends.base import ClusterBackend


class KubeRayCluster(ClusterBackend):
    connects_driver = False
    submits_jobs = True
    shares_filesystem = False  # pods have their own filesystems

    @property
    def owns_cluster(self) -> bool:
        return not bool(self.section.keep_cluster)

    def gpu(self) -> bool:
        """The run uses GPUs (compute=gpu): the GPU worker group is rendered too."""
        return str(self.section.get("compute_device")) == "cuda"

    def manifest(self, labels: dict | None = None) -> dict:
        import ray

        return kuberay_manifest.render(self.section, self.gpu(), self.auth_mode, ray.__version__,
                                       f"{sys.version_info.major}.{sys.version_info.minor}", labels or {})

    def check(self) -> None:
        import ray

        kuberay_checks.check(self.section, self.gpu(), self.auth_mode, ray.__version__,
                             f"{sys.version_info.major}.{sys.version_info.minor}")

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        return kuberay_manifest.capacity(self.section, self.gpu())

    def render(self) -> str:
        return yaml.safe_dump({"backend": "kuberay", "manifest": self.manifest()}, sort_keys=False)

    def start(self) -> str:
        raise NotImplementedError("the lifecycle lands next")


__all__ = ["KubeRayCluster"]
