"""backend=kuberay: a RayCluster (or RayJob) made by the KubeRay operator, running the workload
as a Ray Job.

rayflow renders the manifest (kuberay.manifest; with backend.manifest=PATH the user's own file,
kuberay.user_manifest and kuberay.user_layers), validates it strictly against KubeRay's CRD and
the operator's own rules before anything is applied (kuberay.checks), asks the API server for a
server-side dry run, creates it with the official `kubernetes` client (a create, never an
overwrite: each run labels what it creates with its own run id and deletes only that), waits
for the head (kuberay.wait), reaches the dashboard through the API server's service proxy
(kuberay.relay: answering only this process, relaying only the Jobs API) and submits the run
through the seam backend=vm uses (rayflow.orchestrator.submission). `kubernetes` is imported
inside the methods.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from rayflow.backends.base import ClusterBackend, Rendered, WorkerPreload
from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster, autostop_minutes
from rayflow.backends.kuberay import autostop as kuberay_autostop
from rayflow.backends.kuberay import checks as kuberay_checks
from rayflow.backends.kuberay import manifest as kuberay_manifest
from rayflow.backends.kuberay import ownership, user_layers, user_manifest
from rayflow.backends.kuberay import resources as kuberay_resources
from rayflow.backends.kuberay.kube import server_dry_run
from rayflow.backends.kuberay.wait import wait_for_head
from rayflow.errors import ClusterError, ConfigError
from rayflow.runtime.progress import phase
from rayflow.security.redaction import mask_text

DASHBOARD_PORT = 8265  # the head container's port named `dashboard`
MANAGED_BY = ownership.MANAGED_BY
RUN_LABEL = ownership.RUN_LABEL  # the run that created the object (informational: not a proof)
KEPT_LABEL = ownership.KEPT_LABEL  # "true": created with backend.keep_cluster=true
REACH_TIMEOUT_S = 30.0  # a status or logs call waits this long for a kept cluster's head
K8S_AUTH_NEEDS_PROXY = kuberay_checks.K8S_AUTH_NEEDS_PROXY


@dataclass
class _Applied:
    """One start of a KubeRay cluster: the object applied (or joined), the client, the relay."""

    handle: ClusterHandle
    run_id: str  # this run's objects carry it; teardown deletes only those
    manifest: dict[str, Any]
    kube: Any
    joined: bool = False
    relay: Any = None
    ray_token: str | None = None
    # the object this run created or joined, once known: the only one it deletes or reaches
    uid: str | None = None
    # the RBAC its autostop needs (created after the RayCluster), and the manifest without
    # autostop's account (applied instead when that RBAC cannot be rayflow's own)
    rbac: list[dict[str, Any]] = field(default_factory=list)
    base: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def object_name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.manifest["metadata"]["namespace"])

    @property
    def where(self) -> str:
        return f"{self.kind} {self.namespace}/{self.object_name}"

    def headers(self) -> dict[str, str]:
        """The relay's per-run secret (it answers nothing else) and the Ray token from the Secret
        KubeRay made, for the Jobs client (the relay turns it into X-Ray-Authorization for the API
        server's proxy). Never printed, never logged."""
        headers = dict(self.relay.client_headers()) if self.relay is not None else {}
        if self.ray_token:
            headers["Authorization"] = f"Bearer {self.ray_token}"
        return headers

    def cluster_name(self) -> str | None:
        if self.kind == "RayCluster":
            return self.object_name
        status = (self.kube.get("RayJob", self.object_name) or {}).get("status") or {}
        # the operator refused or gave up on it
        if status.get("jobDeploymentStatus") in ("ValidationFailed", "Failed"):
            raise ClusterError(
                f"KubeRay marked RayJob {self.namespace}/{self.object_name} "
                f"{status['jobDeploymentStatus']}: "
                f"{status.get('message') or status.get('reason') or ''}".rstrip(": ")
            )
        return status.get("rayClusterName") or None  # named by the operator


class KubeRayCluster(ClusterBackend):
    submits_jobs = True
    keeps_clusters = True

    @property
    def keeps_cluster(self) -> bool:
        return bool(self.section.keep_cluster)

    def gpu(self) -> bool:
        """The run uses GPUs (compute=gpu): the GPU worker group is rendered too."""
        return str(self.section.get("compute_device")) == "cuda"

    def user_manifest(self) -> str | None:
        """backend.manifest: the user's own RayCluster/RayJob file, or None (rayflow renders
        one)."""
        return self.section.get("manifest") or None

    def _user_render(self, labels: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
        path = self.user_manifest()
        assert path is not None  # asked for only with backend.manifest set
        return user_layers.render(
            user_manifest.read(path),
            kuberay_manifest.plain(self.section),
            self.gpu(),
            self.auth_mode,
            labels,
        )

    def manifest(self, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """The one object rayflow applies (RayCluster or RayJob); a RayCluster that stops itself
        runs its head as the account its autostop deletes it with."""
        return self._autostop_plan(self._base_manifest(labels or {}))[0]

    def _base_manifest(self, labels: dict[str, str]) -> dict[str, Any]:
        """The object as rendered (or the user's, with rayflow's layers), before autostop."""
        import ray

        if self.user_manifest():
            return self._user_render(labels)[0]
        return kuberay_manifest.render(
            self.section,
            self.gpu(),
            self.auth_mode,
            ray.__version__,
            f"{sys.version_info.major}.{sys.version_info.minor}",
            labels,
        )

    def _autostop_plan(
        self, manifest: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict], str | None]:
        """The manifest as it is applied, the RBAC objects that let its cluster delete itself
        once idle (none where it does not: a RayJob, autostop not asked for), and why autostop
        is off where it was asked for and cannot be had (kuberay.autostop)."""
        minutes = autostop_minutes(self.section, self.keeps_cluster)
        if manifest["kind"] != "RayCluster" or minutes is None:
            return manifest, [], None
        return kuberay_autostop.plan(manifest)

    def check(self) -> None:
        import ray

        if self.user_manifest():
            kuberay_checks.check_user_manifest(self.section, self.gpu(), self.auth_mode)
            return
        kuberay_checks.check(
            self.section,
            self.gpu(),
            self.auth_mode,
            ray.__version__,
            f"{sys.version_info.major}.{sys.version_info.minor}",
        )

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        if self.user_manifest():
            manifest = self.manifest()
            group = user_layers.run_group(manifest, self.gpu())
            return kuberay_resources.nodes_at_full_scale(
                manifest, group.get("groupName") if group else None
            )
        return kuberay_resources.capacity(self.section, self.gpu())

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        """Exactly the object applied, so `dry_run=true | kubectl apply -f -` takes it (no token in
        it)."""
        # its notes name each literal secret with the Kubernetes Secret that should hold it;
        # the RBAC of its autostop follows it, as the documents `kubectl apply -f -` takes
        manifest, rbac, _ = self._autostop_plan(self._base_manifest({}))
        s = self.section

        def notes() -> list[str]:  # and the API server's word, where one answers
            return [*self.notes(), server_dry_run(manifest, s.kubeconfig, s.context)]

        return Rendered(
            yaml.safe_dump_all([manifest, *rbac], sort_keys=False), notes, secrets_noted=True
        )

    def teardown_command(self, manifest: dict[str, Any] | None = None) -> str | None:
        """What deletes the cluster if this process dies before it can (printed on every error
        path); None for one this run does not delete (kept)."""
        if self.keeps_cluster:
            return None
        manifest = manifest or self.manifest()
        metadata = manifest["metadata"]
        return (
            f"kubectl delete {manifest['kind'].lower()} {metadata['name']} -n "
            f"{metadata['namespace']}"
        )

    def notes(self) -> list[str]:
        """What rayflow changed in or added to the user's manifest, the documents it leaves, and a
        warning for each literal secret the manifest holds (with the Secret alternative). Masked:
        a note may quote a value."""
        notes = self._user_render({})[1] if self.user_manifest() else []
        off = self._autostop_plan(self._base_manifest({}))[2]
        return (
            [mask_text(note) for note in notes]
            + ([off] if off else [])
            + kuberay_manifest.secret_notes(self.manifest())
        )

    def job_runtime_env(self) -> dict[str, Any]:
        """rayproject/ray images lack rayflow's dependencies unless built with them
        (backends/kuberay/Dockerfile): the job installs `backend.job_pip` (null: them, pinned to
        this machine's versions; the image already has Ray, numpy and pyyaml)."""
        from rayflow.runtime.requirements import pinned

        pip = self.section.get("job_pip")
        if pip is None:
            pip = pinned(
                ("torch", "mlflow", "hydra-core", "omegaconf", "filelock"),
                {"mlflow": "mlflow-skinny"},
            )
        return {"pip": list(pip)} if pip else {}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        from rayflow.backends.kuberay.kube import Kube

        s = self.section
        # what rayflow adds to the user's file, what it leaves to them, literal secrets
        for note in self.notes():
            print(f"[rayflow] kuberay: {note}", file=sys.stderr, flush=True)
        run_id = uuid.uuid4().hex[:12]
        labels = {RUN_LABEL: run_id, **({KEPT_LABEL: "true"} if s.keep_cluster else {})}
        base = self._base_manifest(labels)
        manifest, rbac, _ = self._autostop_plan(base)
        handle = ClusterHandle(
            self.name,
            name=manifest["metadata"]["name"],
            owner_run=run_id,
            kept=self.keeps_cluster,
            teardown_command=self.teardown_command(manifest),
        )
        handle.where = _where(manifest)
        with handle.unwound_on_error():
            kube = Kube(manifest["metadata"]["namespace"], s.kubeconfig, s.context)
            handle.on_stop("close the Kubernetes client", kube.close)
            applied = _Applied(handle, run_id, manifest, kube, rbac=rbac, base=base)
            self._apply_or_join(applied)
            handle.address = self._reach(applied)
            handle.submission = Submission(
                headers=applied.headers(),
                runtime_env=self.job_runtime_env(),
                on_submitted=self._job_submitted(applied),
            )
        return handle

    # --- a kept cluster, from its record alone (rayflow status, down, logs) ------------------

    def _kept_object(self, kept: KeptCluster) -> tuple[_Applied, dict[str, Any] | None, str]:
        """The kept object as it is now and what it is to the record (kuberay.ownership.state:
        mine, gone, replaced, unproven, unrecorded), with a client whose closing is the handle's
        first undo step."""
        from rayflow.backends.kuberay.kube import Kube

        where = kept.where
        handle = ClusterHandle(self.name, name=kept.name, owner_run=kept.owner_run, kept=True)
        kube = Kube(where["namespace"], self.section.kubeconfig, self.section.context)
        handle.on_stop("close the Kubernetes client", kube.close)
        metadata = {"name": where["object"], "namespace": where["namespace"]}
        manifest: dict[str, Any] = {"kind": where["kind"], "metadata": metadata}
        run = _Applied(handle, kept.owner_run, manifest, kube, joined=True, uid=where.get("uid"))
        with handle.unwound_on_error():
            current = kube.get(where["kind"], where["object"])
        return run, current, ownership.state(current, where)

    def _not_reached(self, run: _Applied, verdict: str) -> str:
        delete = f"kubectl delete {run.kind.lower()} {run.object_name} -n {run.namespace}"
        return ownership.not_reached(run.where, verdict, delete)

    def reach(self, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
        """The kept cluster, reached only when it is provably the one its run made (its uid and
        the proof on it); None when it is gone (or another object holds its name now)."""
        run, current, verdict = self._kept_object(kept)
        if verdict in ("gone", "replaced"):
            if verdict == "replaced":
                print(f"[rayflow] kuberay: {self._not_reached(run, verdict)}", file=sys.stderr)
            run.handle.unwind()
            return None
        with run.handle.unwound_on_error():
            if verdict != "mine":
                raise ClusterError(self._not_reached(run, verdict))
            assert current is not None
            run.manifest = current
            run.handle.address = self._reach(run, timeout_s=REACH_TIMEOUT_S)
            run.handle.submission = Submission(headers=run.headers())
        return run.handle

    def down(self, kept: KeptCluster) -> None:
        """Delete the kept cluster, only when it is provably the one its run made; anything else
        under its name is left alone, in one line that says how to finish by hand."""
        run, current, verdict = self._kept_object(kept)
        try:
            if verdict not in ("mine", "gone"):
                raise ClusterError(self._not_reached(run, verdict))
            if verdict == "mine":
                assert current is not None
                run.manifest = current
                self._delete(run)
        finally:
            run.handle.unwind()

    def _apply_or_join(self, run: _Applied) -> None:
        existing = run.kube.get(run.kind, run.object_name)
        if existing is None and self.section.get("join_uid"):
            raise ConfigError(
                "backend.join_uid",
                f"there is no {run.where} to join (its uid was {self.section.join_uid}): drop "
                "backend.join_uid to have this run create one",
            )
        if existing is None:
            self._settle_autostop(run)
            with phase(f"server-side dry run of {run.where}", "kuberay") as step:
                # the API server's admission speaks before anything exists
                run.kube.create(run.manifest, dry_run=True)
                step.done(f"the API server accepts {run.where} (server-side dry run)")
            # registered before the create: a client killed right after it still deletes. A kept
            # one is deleted only if its start fails: it is recorded (and `down` finds it) only
            # once it is reached, so one left then would be out of every rayflow command's sight
            if not self.keeps_cluster:
                run.handle.on_stop(f"delete {run.where}", self._delete, run)
            else:
                run.handle.on_stop(f"delete {run.where}", self._delete_unless_reached, run)
            with phase(f"applying {run.where}", "kuberay") as step:
                # refused (None) if another run made one meanwhile
                created = run.kube.create(run.manifest)
                step.done(
                    f"applied {run.where}"
                    if created is not None
                    else f"{run.where} was made by someone else meanwhile"
                )
            if created is not None:
                self._created(run, created)
                return
            existing = run.kube.get(run.kind, run.object_name)
            if existing is None:
                raise ClusterError(
                    f"{run.where} was made and deleted by someone else while this run created "
                    "it: run again"
                )
        self._join(run, existing)

    def _created(self, run: _Applied, created: dict[str, Any]) -> None:
        """This run made the object: its uid is what it deletes and records; a kept one gets the
        proof that this user's run made it (kuberay.ownership), then its autostop's RBAC."""
        run.uid = str(created["metadata"]["uid"])
        run.handle.where["uid"] = run.uid
        if self.keeps_cluster:
            run.kube.merge_patch(run.kind, run.object_name, ownership.proof_patch(created))
        self._allow_autostop(run, created)

    def _settle_autostop(self, run: _Applied) -> None:
        """Before the RayCluster is made: an object of the autostop RBAC's names that exists is
        not this run's, so the head does not run as that account and autostop is off (one line)."""
        for obj in run.rbac:
            kind, name = obj["kind"], obj["metadata"]["name"]
            if run.kube.read_object(kind, name) is not None:
                where = f"{run.namespace}/{name}"
                warn = kuberay_autostop.existing_off(run.object_name, where, kind)
                print(f"rayflow: warning: {warn}", file=sys.stderr, flush=True)
                assert run.base is not None  # set by start() with the RBAC
                run.manifest, run.rbac = run.base, []
                return

    def _allow_autostop(self, run: _Applied, created: dict[str, Any]) -> None:
        """The RBAC that lets the RayCluster just created delete itself, owned by it, each object
        created by this run (a 409 is someone else's: autostop off, nothing more created); its
        watcher's spec on the handle (rayflow.orchestrator.autostop arms it)."""
        if not run.rbac:
            return
        blocked: dict[str, Any] | None = None
        with phase(f"letting {run.where} delete itself once idle (RBAC)", "kuberay") as step:
            for obj in kuberay_autostop.owned_by(run.rbac, created):
                if not run.kube.create_object(obj):
                    blocked = obj
                    break
            role = run.rbac[-1]["metadata"]["name"]
            step.done(
                f"{run.where} may delete itself: Role {role}"
                if blocked is None
                else f"{blocked['kind']} {blocked['metadata']['name']} is not this run's"
            )
        if blocked is not None:
            where = f"{run.namespace}/{blocked['metadata']['name']}"
            warn = kuberay_autostop.existing_off(run.object_name, where, blocked["kind"])
            print(f"rayflow: warning: {warn}", file=sys.stderr, flush=True)
            return
        run.handle.autostop = kuberay_autostop.watcher_spec(created)

    def _reach(self, run: _Applied, timeout_s: float | None = None) -> str:
        """Wait for the head (up to backend.start_timeout_s, or `timeout_s`), read its Ray token,
        and reach its dashboard through the relay: its URL."""
        s = self.section
        timeout = float(timeout_s if timeout_s is not None else s.start_timeout_s)
        deadline = time.monotonic() + timeout
        access = self._access(run)  # refused before anything is sent, or waited for
        with phase(f"waiting for the head pod of {run.where} (HeadPodReady)", "kuberay") as step:
            head = wait_for_head(
                run.kube,
                run.cluster_name,
                timeout,
                min(timeout, float(s.schedule_grace_s)),
                step=step,
            )
            step.done(f"head pod {head['metadata']['name']} ready")
        cluster = run.cluster_name()
        assert cluster is not None  # the head is ready: its cluster has a name
        self._own_head_service(run, cluster, deadline)
        if _token_secret(run, cluster) is not None:
            with phase(f"reading the Ray token from its Secret ({cluster})", "kuberay"):
                run.ray_token = self._read_token(run, cluster, deadline)
        with phase(f"waiting for the dashboard of {cluster} through {access}", "kuberay") as step:
            relay = self._relay(run, cluster)
            url = relay.start()
            run.relay = relay
            run.handle.on_stop("stop the dashboard relay", relay.stop)
            self._wait_for_jobs_api(run, url, deadline, step)
            step.done(f"dashboard of {cluster} reachable through {access}")
        return str(url)

    def _own_head_service(self, run: _Applied, cluster: str, deadline: float) -> None:
        """The head Service the dashboard is reached through (by the API server's proxy or its
        DNS name) is the cluster's own: owned by the RayCluster, itself this run's object or
        owned by this run's RayJob. Waited for until `deadline` (KubeRay makes it first)."""
        name = f"{cluster}-head-svc"
        while True:
            owner = self._head_cluster_uid(run, cluster)
            service = run.kube.read_object("Service", name)
            if owner is not None and service is not None:
                refused = ownership.head_service_refusal(service, owner, run.namespace, cluster)
                if refused:
                    raise ClusterError(refused)
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"no Service {run.namespace}/{name} of {cluster} within "
                    f"backend.start_timeout_s ({self.section.start_timeout_s} s)"
                )
            time.sleep(1.0)

    @staticmethod
    def _head_cluster_uid(run: _Applied, cluster: str) -> str | None:
        """The uid of the RayCluster whose head runs the job: the run's own object, or the one
        its RayJob made (None: not there yet)."""
        if run.kind == "RayCluster":
            return run.uid
        made = run.kube.get("RayCluster", cluster)
        if made is not None and not ownership.owned_by(made, run.uid):
            raise ClusterError(f"RayCluster {run.namespace}/{cluster} is not {run.where}'s")
        return None if made is None else str(made["metadata"]["uid"])

    @staticmethod
    def _job_submitted(run: _Applied) -> Callable[[str], None] | None:
        """A RayJob in InteractiveMode learns its job from spec.jobId and tracks it from then on."""
        if run.kind != "RayJob":
            return None
        return lambda job_id: run.kube.merge_patch(
            "RayJob", run.object_name, {"spec": {"jobId": job_id}}
        )

    def _join(self, run: _Applied, existing: dict[str, Any]) -> None:
        """Run on an object that already exists, or refuse in one line (kuberay.ownership). Joined
        only with backend.keep_cluster=true (so this run leaves it running): a RayCluster this
        user's own run kept (its uid in this user's registry, and the proof on it), or the one
        whose uid backend.join_uid names. Anything else, an existing RayJob included, is refused
        and never touched."""
        meta = existing["metadata"]
        if meta.get("deletionTimestamp"):
            raise ClusterError(f"{run.where} is being deleted: run again once it is gone")
        if run.kind == "RayJob":
            delete = f"kubectl delete {run.kind.lower()} {run.object_name} -n {run.namespace}"
            labels = meta.get("labels") or {}
            owner = (
                f"made by rayflow run {labels.get(RUN_LABEL, '?')}"
                if labels.get(MANAGED_BY) == "rayflow"
                else "rayflow did not make it"
            )
            raise ConfigError(
                "backend.cluster_name",
                f"{run.where} already exists ({owner}) and a RayJob runs one job: "
                f"choose another backend.cluster_name, or delete it ({delete})",
            )
        refused = ownership.refusal(self.section, self.name, existing, run.where)
        if refused:
            raise ConfigError("backend.cluster_name", refused)
        record = ownership.kept_record(self.name, existing)
        run.manifest, run.joined = existing, True  # its auth decides how the dashboard is reached
        run.uid = str(meta["uid"])
        run.handle.kept = run.handle.joined = True
        run.handle.teardown_command = None
        if record is not None:  # its record (rayflow status) is the run's that kept it
            run.handle.owner_run = record.owner_run
        print(
            f"[rayflow] kuberay: reusing the existing {run.where} as it is (delete it to apply a "
            "changed spec); "
            + (
                "it was kept by an earlier run of yours and stays running"
                if record is not None
                else "you trust it by its uid (backend.join_uid); rayflow leaves it running"
                + (
                    ", and its head sees your Kubernetes token (Kubernetes token auth)"
                    if _k8s_auth(run)
                    else ""
                )
            ),
            flush=True,
        )

    def _access(self, run: _Applied) -> str:
        """How the dashboard is reached: `proxy` (the API server's service proxy) or `service`.
        With Kubernetes token auth only the proxy: the token goes to the API server it came
        from, never straight to a dashboard (backend.dashboard_access=service is refused)."""
        from rayflow.backends.kuberay.kube import in_cluster

        access = str(self.section.dashboard_access)
        if _k8s_auth(run):
            if access == "service":
                raise ConfigError("backend.dashboard_access", K8S_AUTH_NEEDS_PROXY)
            return "proxy"
        return access if access != "auto" else ("service" if in_cluster() else "proxy")

    def _relay(self, run: _Applied, cluster: str) -> Any:
        from rayflow.backends.kuberay.relay import through_api_server, to_service

        service = f"{cluster}-head-svc"  # KubeRay's name for the head service
        k8s = _k8s_auth(run)
        if k8s:
            _need_bearer(run)  # no bearer token: refused before the relay starts
        if self._access(run) == "service":
            return to_service(f"http://{service}.{run.namespace}.svc:{DASHBOARD_PORT}")
        return through_api_server(run.kube, service, "dashboard", k8s_token_auth=k8s)

    def _read_token(self, run: _Applied, cluster: str, deadline: float) -> str:
        found = _token_secret(run, cluster)
        assert found is not None
        secret, key = found
        while True:
            token = run.kube.secret_value(secret, key)
            if token:
                return str(token)
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"no Secret {run.namespace}/{secret} with the Ray token (key {key}) "
                    f"within backend.start_timeout_s ({self.section.start_timeout_s} s)"
                )
            time.sleep(1.0)

    def _wait_for_jobs_api(
        self, run: _Applied, url: str, deadline: float, step: Any = None
    ) -> None:
        """Until the Jobs API answers through the relay (the service may have no endpoint yet:
        503)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{url}/api/version", headers=run.headers())
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10):
                    return
            except urllib.error.HTTPError as err:
                if err.code in (401, 403):
                    token = (
                        "your Kubernetes token (Kubernetes token auth: RBAC verb ray:write on "
                        "rayclusters)"
                        if _k8s_auth(run)
                        else "the token from its Secret"
                    )
                    raise ClusterError(
                        f"the dashboard of {run.cluster_name()} refused {token} ({err.code})"
                    ) from None
                status = f"HTTP {err.code}"
            except (urllib.error.URLError, OSError) as err:
                status = str(getattr(err, "reason", err))
            if step is not None:
                step.status(f"last answer: {status}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the dashboard of {run.cluster_name()} did not answer through "
                    f"{self._access(run)} within backend.start_timeout_s "
                    f"({self.section.start_timeout_s} s): {status}"
                )
            time.sleep(1.0)

    def _delete_unless_reached(self, run: _Applied) -> None:
        """A kept cluster's undo: nothing once its start has reached it (it is kept)."""
        if not run.handle.address:
            self._delete(run)

    def _delete(self, run: _Applied) -> None:
        """Delete the RayCluster (or RayJob; its cluster goes with it) and wait until its pods are
        gone. A finalizer that holds it past backend.delete_timeout_s is reported by name."""
        current = run.kube.get(run.kind, run.object_name)
        meta = (current or {}).get("metadata") or {}
        owner = (meta.get("labels") or {}).get(RUN_LABEL)
        # By the uid this run created (or a kept record holds); by the run's label only when the
        # create's answer never came back. Another run's object (made first, or since) is left.
        mine = meta.get("uid") == run.uid if run.uid else owner == run.run_id
        if current is not None and not mine:
            print(
                f"[rayflow] kuberay: {run.where} is not this run's "
                f"({RUN_LABEL}={owner or 'none'}, uid {meta.get('uid')}): left alone",
                flush=True,
            )
            return
        cluster = run.cluster_name() if run.kind == "RayCluster" else _last_cluster_name(run)
        if current is None or not run.kube.delete(
            run.kind, run.object_name, uid=current["metadata"].get("uid")
        ):
            print(f"[rayflow] kuberay: {run.kind} {run.object_name} was already gone", flush=True)
        self._wait_deleted(run, cluster)

    def _wait_deleted(self, run: _Applied, cluster: str | None) -> None:
        timeout = float(self.section.delete_timeout_s)
        deadline = time.monotonic() + timeout
        while True:
            left = run.kube.get(run.kind, run.object_name)
            pods = run.kube.pods(f"ray.io/cluster={cluster}") if cluster else []
            if left is None and not pods:
                print(
                    f"[rayflow] kuberay: deleted {run.where}"
                    + (" and its pods" if cluster else ""),
                    flush=True,
                )
                return
            if time.monotonic() > deadline:
                finalizers = (left or {}).get("metadata", {}).get("finalizers") or []
                if finalizers:
                    raise ClusterError(
                        f"{run.kind} {run.object_name} is held by finalizer(s) "
                        f"{', '.join(finalizers)} after {timeout:g} s; whatever owns them must "
                        "finish, or remove them with kubectl patch"
                    )
                raise ClusterError(
                    f"{len(pods)} pod(s) of {cluster} still there after {timeout:g} s: "
                    + ", ".join(p["metadata"]["name"] for p in pods[:5])
                )
            time.sleep(1.0)


def _where(manifest: dict[str, Any]) -> dict[str, str]:
    """What a kept cluster's record holds of it: the object, never a credential (the kubeconfig
    and context are in the backend section it is rebuilt from)."""
    meta = manifest["metadata"]
    return {"kind": manifest["kind"], "namespace": meta["namespace"], "object": meta["name"]}


def _token_secret(run: _Applied, cluster: str) -> tuple[str, str] | None:
    """(Secret, key) of the Ray token the applied cluster requires, or None (no token auth):
    what KubeRay generates for authOptions.mode token (named after the cluster, or
    authOptions.secretName), or the Secret a head's RAY_AUTH_TOKEN reads in a user's manifest."""
    auth = user_layers.auth_of(kuberay_manifest.cluster_of(run.manifest))
    # Kubernetes token auth: no Ray token, no Secret
    if auth is None or auth["mode"] != "token" or auth["k8s"]:
        return None
    return auth["secret"] or cluster, auth["key"]


def _k8s_auth(run: _Applied) -> bool:
    """The cluster delegates Ray's token check to Kubernetes (enableK8sTokenAuth): the dashboard
    takes this client's own Kubernetes bearer token (TokenReview, RBAC verb ray:write)."""
    auth = user_layers.auth_of(kuberay_manifest.cluster_of(run.manifest))
    return auth is not None and auth["mode"] == "token" and bool(auth["k8s"])


def _need_bearer(run: _Applied) -> None:
    """Kubernetes token auth needs a bearer token in this client's Kubernetes credentials (the
    relay passes it on as Ray's); a client certificate cannot be: one line."""
    token = {k.lower(): v for k, v in run.kube.auth_headers().items()}.get("authorization")
    if not token:
        raise ClusterError(
            f"{run.cluster_name()} uses Kubernetes token auth (enableK8sTokenAuth), but these "
            "Kubernetes credentials hold no bearer token (a client certificate cannot be passed "
            "on to Ray's dashboard): use a kubeconfig user with a token or an exec plugin "
            "(backend.kubeconfig, backend.context)"
        )


def _last_cluster_name(run: _Applied) -> str | None:
    try:
        return run.cluster_name()
    except ClusterError:  # the API server went away: delete() reports it
        return None


__all__ = ["KubeRayCluster"]
