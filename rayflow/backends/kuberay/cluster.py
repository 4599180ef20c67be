"""backend=kuberay: a RayCluster (or RayJob) made by the KubeRay operator, running the workload
as a Ray Job.

rayflow renders the manifest (kuberay.manifest; with backend.manifest=PATH the user's own file,
kuberay.user_manifest and kuberay.user_layers), validates it strictly against KubeRay's CRD and
the operator's own rules before anything is applied (kuberay.checks), asks the API server for a
server-side dry run, creates it with the official `kubernetes` client (a create, never an
overwrite: each run labels what it creates with its own run id and deletes only that), waits
for the head (kuberay.wait), reaches the dashboard through the API server's service proxy
(kuberay.relay: answering only this process, relaying only the Jobs API; kuberay.applied) and
submits the run through the seam backend=vm uses (rayflow.orchestrator.submission). A kept
RayCluster's life, joined by proof, reached and deleted from its record, its autostop's RBAC:
kuberay.kept. `kubernetes` is imported inside the methods.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

import yaml

from rayflow.backends.base import ClusterBackend, KeepsClusters, Rendered, Traits, WorkerPreload
from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster, autostop_minutes
from rayflow.backends.kuberay import applied as kuberay_applied
from rayflow.backends.kuberay import checks as kuberay_checks
from rayflow.backends.kuberay import kept as kuberay_kept
from rayflow.backends.kuberay import manifest as kuberay_manifest
from rayflow.backends.kuberay import ownership, user_layers, user_manifest
from rayflow.backends.kuberay import resources as kuberay_resources
from rayflow.backends.kuberay.applied import Applied
from rayflow.backends.kuberay.kube import server_dry_run
from rayflow.errors import ClusterError, ConfigError
from rayflow.runtime.progress import phase
from rayflow.security.redaction import mask_text

RUN_LABEL = ownership.RUN_LABEL  # the run that created the object (informational: not a proof)
KEPT_LABEL = ownership.KEPT_LABEL  # "true": created with backend.keep_cluster=true


class KubeRayCluster(ClusterBackend, KeepsClusters):
    traits = Traits(submits_jobs=True)

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
        is off where it was asked for and cannot be had (kuberay.kept)."""
        minutes = autostop_minutes(self.section, self.keeps_cluster)
        if manifest["kind"] != "RayCluster" or minutes is None:
            return manifest, [], None
        return kuberay_kept.autostop_plan(manifest)

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
        handle.where = kuberay_kept.where_of(manifest)
        with handle.unwound_on_error():
            kube = Kube(manifest["metadata"]["namespace"], s.kubeconfig, s.context)
            handle.on_stop("close the Kubernetes client", kube.close)
            run = Applied(handle, run_id, manifest, kube, rbac=rbac, base=base)
            self._apply_or_join(run)
            handle.address = kuberay_applied.reach(s, run)
            handle.submission = Submission(
                headers=run.headers(),
                runtime_env=self.job_runtime_env(),
                on_submitted=self._job_submitted(run),
            )
        return handle

    # --- a kept cluster, from its record alone (rayflow status, down, logs: kuberay.kept) -------

    def reach(self, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
        """Only when it is provably the RayCluster its run made (kuberay.kept)."""
        return kuberay_kept.reach(self.section, kept, headers)

    def down(self, kept: KeptCluster) -> None:
        """Deleted only when it is provably the RayCluster its run made (kuberay.kept)."""
        kuberay_kept.down(self.section, kept)

    def _apply_or_join(self, run: Applied) -> None:
        existing = run.kube.get(run.kind, run.object_name)
        if existing is None and self.section.get("join_uid"):
            raise ConfigError(
                "backend.join_uid",
                f"there is no {run.where} to join (its uid was {self.section.join_uid}): drop "
                "backend.join_uid to have this run create one",
            )
        if existing is None:
            kuberay_kept.settle_autostop(run)
            with phase(f"server-side dry run of {run.where}", "kuberay") as step:
                # the API server's admission speaks before anything exists
                run.kube.create(run.manifest, dry_run=True)
                step.done(f"the API server accepts {run.where} (server-side dry run)")
            # registered before the create: a client killed right after it still deletes. A kept
            # one is deleted only if its start fails: it is recorded (and `down` finds it) only
            # once it is reached, so one left then would be out of every rayflow command's sight
            if not self.keeps_cluster:
                run.handle.on_stop(f"delete {run.where}", kuberay_applied.delete, self.section, run)
            else:
                run.handle.on_stop(
                    f"delete {run.where}", kuberay_kept.delete_unless_reached, self.section, run
                )
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
        kuberay_kept.join(self.section, run, existing)

    def _created(self, run: Applied, created: dict[str, Any]) -> None:
        """This run made the object: its uid is what it deletes and records; a kept one gets the
        proof that this user's run made it (kuberay.ownership), then its autostop's RBAC."""
        run.uid = str(created["metadata"]["uid"])
        run.handle.where["uid"] = run.uid
        if self.keeps_cluster:
            kuberay_kept.keep(run, created)
        kuberay_kept.allow_autostop(run, created)

    @staticmethod
    def _job_submitted(run: Applied) -> Callable[[str], None] | None:
        """A RayJob in InteractiveMode learns its job from spec.jobId and tracks it from then on."""
        if run.kind != "RayJob":
            return None
        return lambda job_id: run.kube.merge_patch(
            "RayJob", run.object_name, {"spec": {"jobId": job_id}}
        )


__all__ = ["KubeRayCluster"]
