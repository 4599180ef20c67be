"""backend=kuberay: a RayCluster (or RayJob) made by the KubeRay operator, running the workload
as a Ray Job.

rayflow renders the manifest (kuberay.manifest), validates it strictly against KubeRay's CRD
and the operator's own rules before anything is applied (kuberay.checks), applies it with the
official `kubernetes` client (server-side apply), waits for the head (kuberay.wait), reaches
the dashboard through the API server's service proxy (kuberay.relay) and submits the run
through the seam backend=vm uses (rayflow.remote). `kubernetes` is imported inside the methods.
"""

from __future__ import annotations

import sys
import time
import uuid

import yaml

from rayflow.backends.base import ClusterBackend
from rayflow.backends.kuberay import checks as kuberay_checks
from rayflow.backends.kuberay import manifest as kuberay_manifest
from rayflow.backends.kuberay import resources as kuberay_resources
from rayflow.backends.kuberay.wait import wait_for_head
from rayflow.errors import ClusterError
from rayflow.progress import phase

DASHBOARD_PORT = 8265  # the head container's port named `dashboard`


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
        return kuberay_resources.capacity(self.section, self.gpu())

    def render(self) -> str:
        return yaml.safe_dump({"backend": "kuberay", "manifest": self.manifest()}, sort_keys=False)

    def teardown_command(self) -> str | None:
        """What deletes the cluster if this process dies before it can (printed on every error path)."""
        kind = "rayjob" if str(self.section.mode) == "rayjob" else "raycluster"
        return f"kubectl delete {kind} {self.section.cluster_name} -n {self.section.namespace}"

    def notes(self) -> list[str]:
        return kuberay_manifest.notes(self.section) if hasattr(kuberay_manifest, "notes") else []

    # --- the seam (rayflow.remote): what the submitted job needs from this backend -----------------

    def job_headers(self) -> dict[str, str]:
        """The Ray token from the Secret KubeRay made, for the Jobs client (the relay turns it into
        X-Ray-Authorization for the API server's proxy). Never printed, never logged."""
        return {"Authorization": f"Bearer {self._ray_token}"} if getattr(self, "_ray_token", None) else {}

    def job_runtime_env(self) -> dict:
        """rayproject/ray images lack rayflow's dependencies unless built with them
        (backends/kuberay/Dockerfile): the job installs `backend.job_pip` (null: them, pinned to
        this machine's versions; the image already has Ray, numpy and pyyaml)."""
        from rayflow.dependencies import pinned

        pip = self.section.get("job_pip")
        if pip is None:
            pip = pinned(("torch", "mlflow", "hydra-core", "omegaconf", "filelock"), {"mlflow": "mlflow-skinny"})
        return {"pip": list(pip)} if pip else {}

    def job_submitted(self, job_id: str) -> None:
        """A RayJob in InteractiveMode learns its job from spec.jobId and tracks it from then on."""
        if self._kind == "RayJob":
            self.kube.merge_patch("RayJob", self._object_name, {"spec": {"jobId": job_id}})

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> str:
        from rayflow.backends.kuberay.kube import Kube

        s = self.section
        self.kube = Kube(str(s.namespace), s.kubeconfig, s.context)
        self.on_stop("close the Kubernetes client", self.kube.close)
        manifest = self.manifest({"rayflow.io/run": uuid.uuid4().hex[:12]})
        self._kind, self._object_name = manifest["kind"], manifest["metadata"]["name"]
        where = f"{self._kind} {s.namespace}/{self._object_name}"
        if self.owns_cluster:  # registered before the apply: a client killed right after it still deletes
            self.on_stop(f"delete {where}", self._delete)
        existing = self.kube.get(self._kind, self._object_name)
        if existing is not None and self._kind == "RayCluster" and not existing["metadata"].get("deletionTimestamp"):
            print(f"[rayflow] kuberay: reusing the existing {where} as it is (delete it to apply a changed spec)", flush=True)
        else:
            with phase(f"applying {where}", "kuberay") as step:
                self.kube.apply(manifest)
                step.done(f"applied {where}")
        deadline = time.monotonic() + float(s.start_timeout_s)
        with phase(f"waiting for the head pod of {where} (HeadPodReady)", "kuberay") as step:
            head = wait_for_head(self.kube, self._cluster_name, float(s.start_timeout_s), float(s.schedule_grace_s), step=step)
            step.done(f"head pod {head['metadata']['name']} ready")
        cluster = self._cluster_name()
        if self.auth_mode == "token":
            with phase(f"reading the Ray token from its Secret ({cluster})", "kuberay"):
                self._ray_token = self._read_token(cluster, deadline)
        else:
            self._ray_token = None
        with phase(f"waiting for the dashboard of {cluster} through {self._access()}", "kuberay") as step:
            relay = self._relay(cluster)
            url = relay.start()
            self.on_stop("stop the dashboard relay", relay.stop)
            self._wait_for_jobs_api(url, deadline, step)
            step.done(f"dashboard of {cluster} reachable through {self._access()}")
        return url

    def _cluster_name(self) -> str | None:
        if self._kind == "RayCluster":
            return self._object_name
        status = (self.kube.get("RayJob", self._object_name) or {}).get("status") or {}
        if status.get("jobDeploymentStatus") in ("ValidationFailed", "Failed"):  # the operator refused or gave up on it
            raise ClusterError(f"KubeRay marked RayJob {self.section.namespace}/{self._object_name} "
                               f"{status['jobDeploymentStatus']}: {status.get('message') or status.get('reason') or ''}".rstrip(": "))
        return status.get("rayClusterName") or None  # named by the operator

    def _access(self) -> str:
        from rayflow.backends.kuberay.kube import in_cluster

        access = str(self.section.dashboard_access)
        return access if access != "auto" else ("service" if in_cluster() else "proxy")

    def _relay(self, cluster: str):
        from rayflow.backends.kuberay.relay import DashboardRelay, ssl_context

        service = f"{cluster}-head-svc"  # KubeRay's name for the head service
        if self._access() == "service":
            return DashboardRelay(f"http://{service}.{self.section.namespace}.svc:{DASHBOARD_PORT}", dict)
        return DashboardRelay(self.kube.service_proxy_url(service, "dashboard"), self.kube.auth_headers,
                              ssl_context(self.kube.configuration))

    def _read_token(self, cluster: str, deadline: float) -> str:
        """The token KubeRay generated into a Secret named after the cluster (or authOptions.secretName)."""
        manifest_auth = (self.manifest().get("spec") or {}).get("authOptions") or {}
        secret = manifest_auth.get("secretName") or cluster
        while True:
            token = self.kube.secret_value(secret, "auth_token")
            if token:
                return token
            if time.monotonic() > deadline:
                raise ClusterError(f"KubeRay made no Secret {self.section.namespace}/{secret} with the Ray token "
                                   f"within backend.start_timeout_s ({self.section.start_timeout_s} s)")
            time.sleep(1.0)

    def _wait_for_jobs_api(self, url: str, deadline: float, step=None) -> None:
        """Until the Jobs API answers through the relay (the service may have no endpoint yet: 503)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{url}/api/version", headers=self.job_headers())
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10):
                    return
            except urllib.error.HTTPError as err:
                if err.code in (401, 403):
                    raise ClusterError(f"the dashboard of {self._cluster_name()} refused the token from its Secret ({err.code})") from None
                status = f"HTTP {err.code}"
            except (urllib.error.URLError, OSError) as err:
                status = str(getattr(err, "reason", err))
            if step is not None:
                step.status(f"last answer: {status}")
            if time.monotonic() > deadline:
                raise ClusterError(f"the dashboard of {self._cluster_name()} did not answer through {self._access()} "
                                   f"within backend.start_timeout_s ({self.section.start_timeout_s} s): {status}")
            time.sleep(1.0)

    def _delete(self) -> None:
        """Delete the RayCluster (or RayJob; its cluster goes with it) and wait until its pods are
        gone. A finalizer that holds it past backend.delete_timeout_s is reported by name."""
        cluster = self._cluster_name() if self._kind == "RayCluster" else self._last_cluster_name()
        if not self.kube.delete(self._kind, self._object_name):
            print(f"[rayflow] kuberay: {self._kind} {self._object_name} was already gone", flush=True)
        timeout = float(self.section.delete_timeout_s)
        deadline = time.monotonic() + timeout
        while True:
            left = self.kube.get(self._kind, self._object_name)
            pods = self.kube.pods(f"ray.io/cluster={cluster}") if cluster else []
            if left is None and not pods:
                print(f"[rayflow] kuberay: deleted {self._kind} {self.section.namespace}/{self._object_name}"
                      + (" and its pods" if cluster else ""), flush=True)
                return
            if time.monotonic() > deadline:
                finalizers = (left or {}).get("metadata", {}).get("finalizers") or []
                if finalizers:
                    raise ClusterError(f"{self._kind} {self._object_name} is held by finalizer(s) {', '.join(finalizers)} "
                                       f"after {timeout:g} s; whatever owns them must finish, or remove them with kubectl patch")
                raise ClusterError(f"{len(pods)} pod(s) of {cluster} still there after {timeout:g} s: "
                                   + ", ".join(p["metadata"]["name"] for p in pods[:5]))
            time.sleep(1.0)

    def _last_cluster_name(self) -> str | None:
        try:
            return self._cluster_name()
        except ClusterError:  # the API server went away: delete() reports it
            return None


__all__ = ["KubeRayCluster"]
