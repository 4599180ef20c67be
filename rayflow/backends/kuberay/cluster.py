"""backend=kuberay: a RayCluster (or RayJob) made by the KubeRay operator, running the workload
as a Ray Job.

rayflow renders the manifest (kuberay.manifest; with backend.manifest=PATH the user's own file,
kuberay.user_manifest and kuberay.user_layers), validates it strictly against KubeRay's CRD and
the operator's own rules before anything is applied (kuberay.checks), asks the API server for a
server-side dry run, creates it with the official `kubernetes` client (a create, never an
overwrite: each run labels what it creates with its own run id and deletes only that), waits
for the head (kuberay.wait), reaches
the dashboard through the API server's service proxy (kuberay.relay: answering only this
process, relaying only the Jobs API) and submits the run
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
from rayflow.backends.kuberay import user_layers, user_manifest
from rayflow.backends.kuberay.wait import wait_for_head
from rayflow.errors import ClusterError, ConfigError
from rayflow.progress import phase
from rayflow.redaction import mask_text

DASHBOARD_PORT = 8265  # the head container's port named `dashboard`
MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_LABEL = "rayflow.io/run"  # the run that created the object: the only one that deletes it
KEPT_LABEL = "rayflow.io/keep"  # "true": created with backend.keep_cluster=true, open to later runs


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

    def user_manifest(self) -> str | None:
        """backend.manifest: the user's own RayCluster/RayJob file, or None (rayflow renders one)."""
        return self.section.get("manifest") or None

    def _user_render(self, labels: dict) -> tuple[dict, list[str]]:
        return user_layers.render(user_manifest.read(self.user_manifest()), kuberay_manifest.plain(self.section),
                                  self.gpu(), self.auth_mode, labels)

    def manifest(self, labels: dict | None = None) -> dict:
        """The one object rayflow applies (RayCluster or RayJob)."""
        import ray

        if self.user_manifest():
            return self._user_render(labels or {})[0]
        return kuberay_manifest.render(self.section, self.gpu(), self.auth_mode, ray.__version__,
                                       f"{sys.version_info.major}.{sys.version_info.minor}", labels or {})

    def check(self) -> None:
        import ray

        if self.user_manifest():
            kuberay_checks.check_user_manifest(self.section, self.gpu(), self.auth_mode)
            return
        kuberay_checks.check(self.section, self.gpu(), self.auth_mode, ray.__version__,
                             f"{sys.version_info.major}.{sys.version_info.minor}")

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        if self.user_manifest():
            manifest = self.manifest()
            group = user_layers.run_group(manifest, self.gpu())
            return kuberay_resources.nodes_at_full_scale(manifest, group.get("groupName") if group else None)
        return kuberay_resources.capacity(self.section, self.gpu())

    def render(self) -> str:
        """Exactly the object applied, so `dry_run=true | kubectl apply -f -` takes it (no token in it)."""
        return yaml.safe_dump(self.manifest(), sort_keys=False)

    def teardown_command(self) -> str | None:
        """What deletes the cluster if this process dies before it can (printed on every error path);
        None for one this run does not delete (kept, or joined)."""
        if not self.owns_cluster or getattr(self, "_joined", False):
            return None
        manifest = getattr(self, "_manifest", None) or self.manifest()  # what start() applied, once it has
        metadata = manifest["metadata"]
        return f"kubectl delete {manifest['kind'].lower()} {metadata['name']} -n {metadata['namespace']}"

    def notes(self) -> list[str]:
        """What rayflow changed in or added to the user's manifest, the documents it leaves, and a
        warning for each literal secret the manifest holds (with the Secret alternative). Masked:
        a note may quote a value."""
        notes = self._user_render({})[1] if self.user_manifest() else []
        return [mask_text(note) for note in notes] + kuberay_manifest.secret_notes(self.manifest())

    # --- the seam (rayflow.remote): what the submitted job needs from this backend -----------------

    def job_headers(self) -> dict[str, str]:
        """The relay's per-run secret (it answers nothing else) and the Ray token from the Secret
        KubeRay made, for the Jobs client (the relay turns it into X-Ray-Authorization for the API
        server's proxy). Never printed, never logged."""
        relay = getattr(self, "_relay_server", None)
        headers = dict(relay.client_headers()) if relay is not None else {}
        if getattr(self, "_ray_token", None):
            headers["Authorization"] = f"Bearer {self._ray_token}"
        return headers

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
        for note in self.notes():  # what rayflow adds to the user's file, what it leaves to them, literal secrets
            print(f"[rayflow] kuberay: {note}", file=sys.stderr, flush=True)
        self._run_id = uuid.uuid4().hex[:12]  # this run's objects carry it; teardown deletes only those
        labels = {RUN_LABEL: self._run_id, **({KEPT_LABEL: "true"} if s.keep_cluster else {})}
        manifest = self.manifest(labels)
        self._manifest = manifest
        self._kind, self._object_name = manifest["kind"], manifest["metadata"]["name"]
        self._namespace = manifest["metadata"]["namespace"]
        self.kube = Kube(self._namespace, s.kubeconfig, s.context)
        self.on_stop("close the Kubernetes client", self.kube.close)
        where = f"{self._kind} {self._namespace}/{self._object_name}"
        existing = self.kube.get(self._kind, self._object_name)
        if existing is None:
            with phase(f"server-side dry run of {where}", "kuberay") as step:
                self.kube.create(manifest, dry_run=True)  # the API server's admission speaks before anything exists
                step.done(f"the API server accepts {where} (server-side dry run)")
            if self.owns_cluster:  # registered before the create: a client killed right after it still deletes
                self.on_stop(f"delete {where}", self._delete)
            with phase(f"applying {where}", "kuberay") as step:
                created = self.kube.create(manifest)  # refused (None) if another run made one meanwhile
                step.done(f"applied {where}" if created is not None else f"{where} was made by someone else meanwhile")
            if created is None:
                existing = self.kube.get(self._kind, self._object_name)
                if existing is None:
                    raise ClusterError(f"{where} was made and deleted by someone else while this run created it: run again")
        if existing is not None:
            self._join(existing, where)
        deadline = time.monotonic() + float(s.start_timeout_s)
        with phase(f"waiting for the head pod of {where} (HeadPodReady)", "kuberay") as step:
            head = wait_for_head(self.kube, self._cluster_name, float(s.start_timeout_s), float(s.schedule_grace_s), step=step)
            step.done(f"head pod {head['metadata']['name']} ready")
        cluster = self._cluster_name()
        if self._token_secret(cluster) is not None:
            with phase(f"reading the Ray token from its Secret ({cluster})", "kuberay"):
                self._ray_token = self._read_token(cluster, deadline)
        else:
            self._ray_token = None
        with phase(f"waiting for the dashboard of {cluster} through {self._access()}", "kuberay") as step:
            relay = self._relay(cluster)
            url = relay.start()
            self._relay_server = relay
            self.on_stop("stop the dashboard relay", relay.stop)
            self._wait_for_jobs_api(url, deadline, step)
            step.done(f"dashboard of {cluster} reachable through {self._access()}")
        return url

    def _join(self, existing: dict, where: str) -> None:
        """Run on an object that already exists, or refuse in one line. Joined only: a RayCluster,
        with backend.keep_cluster=true (so this run leaves it running), that a rayflow run kept or
        rayflow did not make. A RayCluster another rayflow run is using (and deletes at its end) and
        any existing RayJob are refused; neither is touched."""
        meta = existing["metadata"]
        labels = meta.get("labels") or {}
        delete = f"kubectl delete {self._kind.lower()} {self._object_name} -n {self._namespace}"
        if meta.get("deletionTimestamp"):
            raise ClusterError(f"{where} is being deleted: run again once it is gone")
        rayflows = labels.get(MANAGED_BY) == "rayflow"
        owner = f"made by rayflow run {labels.get(RUN_LABEL, '?')}" if rayflows else "rayflow did not make it"
        if self._kind == "RayJob":
            raise ConfigError("backend.cluster_name", f"{where} already exists ({owner}) and a RayJob runs one job: "
                                                      f"choose another backend.cluster_name, or delete it ({delete})")
        if rayflows and labels.get(KEPT_LABEL) != "true":
            raise ConfigError("backend.cluster_name", f"{where} belongs to another rayflow run ({RUN_LABEL}={labels.get(RUN_LABEL, '?')}), "
                                                      f"which deletes it when it ends: choose another backend.cluster_name "
                                                      f"(if that run is gone: {delete})")
        if not self.section.keep_cluster:
            why = "was kept by an earlier rayflow run" if rayflows else "exists and rayflow did not make it"
            raise ConfigError("backend.keep_cluster", f"{where} {why}: to run on it as it is, set backend.keep_cluster=true "
                                                      f"(rayflow then leaves it running); else choose another backend.cluster_name")
        self._manifest, self._joined = existing, True  # its auth decides how the dashboard is reached
        print(f"[rayflow] kuberay: reusing the existing {where} as it is (delete it to apply a changed spec); "
              + ("it was kept by an earlier run and stays running" if rayflows else "rayflow did not make it and leaves it running"),
              flush=True)

    def _cluster_name(self) -> str | None:
        if self._kind == "RayCluster":
            return self._object_name
        status = (self.kube.get("RayJob", self._object_name) or {}).get("status") or {}
        if status.get("jobDeploymentStatus") in ("ValidationFailed", "Failed"):  # the operator refused or gave up on it
            raise ClusterError(f"KubeRay marked RayJob {self._namespace}/{self._object_name} "
                               f"{status['jobDeploymentStatus']}: {status.get('message') or status.get('reason') or ''}".rstrip(": "))
        return status.get("rayClusterName") or None  # named by the operator

    def _access(self) -> str:
        from rayflow.backends.kuberay.kube import in_cluster

        access = str(self.section.dashboard_access)
        return access if access != "auto" else ("service" if in_cluster() else "proxy")

    def _relay(self, cluster: str):
        from rayflow.backends.kuberay.relay import DashboardRelay, ssl_context

        service = f"{cluster}-head-svc"  # KubeRay's name for the head service
        ray_credentials = None
        if self._k8s_auth():
            self._k8s_credentials()  # no bearer token: refused before the relay starts
            ray_credentials = self._k8s_credentials
        if self._access() == "service":
            return DashboardRelay(f"http://{service}.{self._namespace}.svc:{DASHBOARD_PORT}", dict, ray_credentials=ray_credentials)
        return DashboardRelay(self.kube.service_proxy_url(service, "dashboard"), self.kube.auth_headers,
                              ssl_context(self.kube.configuration), ray_credentials=ray_credentials)

    def _token_secret(self, cluster: str) -> tuple[str, str] | None:
        """(Secret, key) of the Ray token the applied cluster requires, or None (no token auth):
        what KubeRay generates for authOptions.mode token (named after the cluster, or
        authOptions.secretName), or the Secret a head's RAY_AUTH_TOKEN reads in a user's manifest."""
        auth = user_layers.auth_of(kuberay_manifest.cluster_of(self._manifest))
        if auth is None or auth["mode"] != "token" or auth["k8s"]:  # Kubernetes token auth: no Ray token, no Secret
            return None
        return auth["secret"] or cluster, auth["key"]

    def _k8s_auth(self) -> bool:
        """The cluster delegates Ray's token check to Kubernetes (enableK8sTokenAuth): the dashboard
        takes this client's own Kubernetes bearer token (TokenReview, RBAC verb ray:write)."""
        auth = user_layers.auth_of(kuberay_manifest.cluster_of(self._manifest))
        return auth is not None and auth["mode"] == "token" and auth["k8s"]

    def _k8s_credentials(self) -> dict[str, str]:
        """This client's Kubernetes bearer token as Ray's header, fetched per request (exec plugins
        refresh it). Without one (a client certificate) the dashboard cannot be reached: one line."""
        token = {k.lower(): v for k, v in self.kube.auth_headers().items()}.get("authorization")
        if not token:
            raise ClusterError(f"{self._cluster_name()} uses Kubernetes token auth (enableK8sTokenAuth), but these Kubernetes "
                               "credentials hold no bearer token (a client certificate cannot be passed on to Ray's dashboard): "
                               "use a kubeconfig user with a token or an exec plugin (backend.kubeconfig, backend.context)")
        return {"X-Ray-Authorization": token}

    def _read_token(self, cluster: str, deadline: float) -> str:
        secret, key = self._token_secret(cluster)
        while True:
            token = self.kube.secret_value(secret, key)
            if token:
                return token
            if time.monotonic() > deadline:
                raise ClusterError(f"no Secret {self._namespace}/{secret} with the Ray token (key {key}) "
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
        current = self.kube.get(self._kind, self._object_name)
        run = ((current or {}).get("metadata", {}).get("labels") or {}).get(RUN_LABEL)
        if current is not None and run != self._run_id:  # another run's (it made one first, or since)
            print(f"[rayflow] kuberay: {self._kind} {self._namespace}/{self._object_name} is not this run's "
                  f"({RUN_LABEL}={run or 'none'}): left alone", flush=True)
            return
        cluster = self._cluster_name() if self._kind == "RayCluster" else self._last_cluster_name()
        if current is None or not self.kube.delete(self._kind, self._object_name, uid=current["metadata"].get("uid")):
            print(f"[rayflow] kuberay: {self._kind} {self._object_name} was already gone", flush=True)
        timeout = float(self.section.delete_timeout_s)
        deadline = time.monotonic() + timeout
        while True:
            left = self.kube.get(self._kind, self._object_name)
            pods = self.kube.pods(f"ray.io/cluster={cluster}") if cluster else []
            if left is None and not pods:
                print(f"[rayflow] kuberay: deleted {self._kind} {self._namespace}/{self._object_name}"
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
