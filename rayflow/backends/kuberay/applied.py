"""backend=kuberay: the object one start applied or joined (`Applied`: the RayCluster or RayJob, its
client, its relay), reached and deleted, for a run (kuberay.cluster) and for a kept cluster from
its record (kuberay.kept).

Reached: the head pod waited for (kuberay.wait), the head Service proven the cluster's own, the
Ray token read from its Secret, and the dashboard through the relay (kuberay.relay: the API
server's service proxy or the head Service) until the Jobs API answers. Deleted: by the uid this
run created (or a kept record holds), never by name alone, its pods waited out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rayflow.backends.handle import ClusterHandle
from rayflow.backends.kuberay import manifest as kuberay_manifest
from rayflow.backends.kuberay import ownership, user_layers
from rayflow.backends.kuberay.checks import K8S_AUTH_NEEDS_PROXY
from rayflow.backends.kuberay.wait import wait_for_head
from rayflow.errors import ClusterError, ConfigError
from rayflow.runtime.progress import phase

DASHBOARD_PORT = 8265  # the head container's port named `dashboard`
RUN_LABEL = ownership.RUN_LABEL  # the run that created the object (informational: not a proof)


@dataclass
class Applied:
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


# --- reached: the head, its Service, its token, the dashboard through the relay ------------------


def reach(section: Any, run: Applied, timeout_s: float | None = None) -> str:
    """Wait for the head (up to backend.start_timeout_s, or `timeout_s`), read its Ray token,
    and reach its dashboard through the relay: its URL."""
    s = section
    timeout = float(timeout_s if timeout_s is not None else s.start_timeout_s)
    deadline = time.monotonic() + timeout
    how = access(section, run)  # refused before anything is sent, or waited for
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
    _own_head_service(section, run, cluster, deadline)
    if token_secret(run, cluster) is not None:
        with phase(f"reading the Ray token from its Secret ({cluster})", "kuberay"):
            run.ray_token = _read_token(section, run, cluster, deadline)
    with phase(f"waiting for the dashboard of {cluster} through {how}", "kuberay") as step:
        started = relay(section, run, cluster)
        url = started.start()
        run.relay = started
        run.handle.on_stop("stop the dashboard relay", started.stop)
        _wait_for_jobs_api(section, run, url, deadline, step)
        step.done(f"dashboard of {cluster} reachable through {how}")
    return str(url)


def _own_head_service(section: Any, run: Applied, cluster: str, deadline: float) -> None:
    """The head Service the dashboard is reached through (by the API server's proxy or its
    DNS name) is the cluster's own: owned by the RayCluster, itself this run's object or
    owned by this run's RayJob. Waited for until `deadline` (KubeRay makes it first)."""
    name = f"{cluster}-head-svc"
    while True:
        owner = _head_cluster_uid(run, cluster)
        service = run.kube.read_object("Service", name)
        if owner is not None and service is not None:
            refused = ownership.head_service_refusal(service, owner, run.namespace, cluster)
            if refused:
                raise ClusterError(refused)
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"no Service {run.namespace}/{name} of {cluster} within "
                f"backend.start_timeout_s ({section.start_timeout_s} s)"
            )
        time.sleep(1.0)


def _head_cluster_uid(run: Applied, cluster: str) -> str | None:
    """The uid of the RayCluster whose head runs the job: the run's own object, or the one
    its RayJob made (None: not there yet)."""
    if run.kind == "RayCluster":
        return run.uid
    made = run.kube.get("RayCluster", cluster)
    if made is not None and not ownership.owned_by(made, run.uid):
        raise ClusterError(f"RayCluster {run.namespace}/{cluster} is not {run.where}'s")
    return None if made is None else str(made["metadata"]["uid"])


def access(section: Any, run: Applied) -> str:
    """How the dashboard is reached: `proxy` (the API server's service proxy) or `service`.
    With Kubernetes token auth only the proxy: the token goes to the API server it came
    from, never straight to a dashboard (backend.dashboard_access=service is refused)."""
    from rayflow.backends.kuberay.kube import in_cluster

    how = str(section.dashboard_access)
    if k8s_auth(run):
        if how == "service":
            raise ConfigError("backend.dashboard_access", K8S_AUTH_NEEDS_PROXY)
        return "proxy"
    return how if how != "auto" else ("service" if in_cluster() else "proxy")


def relay(section: Any, run: Applied, cluster: str) -> Any:
    """The relay to the cluster's dashboard (not started yet), as `access` says."""
    from rayflow.backends.kuberay.relay import through_api_server, to_service

    service = f"{cluster}-head-svc"  # KubeRay's name for the head service
    k8s = k8s_auth(run)
    if k8s:
        _need_bearer(run)  # no bearer token: refused before the relay starts
    if access(section, run) == "service":
        return to_service(f"http://{service}.{run.namespace}.svc:{DASHBOARD_PORT}")
    return through_api_server(run.kube, service, "dashboard", k8s_token_auth=k8s)


def _read_token(section: Any, run: Applied, cluster: str, deadline: float) -> str:
    found = token_secret(run, cluster)
    assert found is not None
    secret, key = found
    while True:
        token = run.kube.secret_value(secret, key)
        if token:
            return str(token)
        if time.monotonic() > deadline:
            raise ClusterError(
                f"no Secret {run.namespace}/{secret} with the Ray token (key {key}) "
                f"within backend.start_timeout_s ({section.start_timeout_s} s)"
            )
        time.sleep(1.0)


def _wait_for_jobs_api(
    section: Any, run: Applied, url: str, deadline: float, step: Any = None
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
                    if k8s_auth(run)
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
                f"{access(section, run)} within backend.start_timeout_s "
                f"({section.start_timeout_s} s): {status}"
            )
        time.sleep(1.0)


def token_secret(run: Applied, cluster: str) -> tuple[str, str] | None:
    """(Secret, key) of the Ray token the applied cluster requires, or None (no token auth):
    what KubeRay generates for authOptions.mode token (named after the cluster, or
    authOptions.secretName), or the Secret a head's RAY_AUTH_TOKEN reads in a user's manifest."""
    auth = user_layers.auth_of(kuberay_manifest.cluster_of(run.manifest))
    # Kubernetes token auth: no Ray token, no Secret
    if auth is None or auth["mode"] != "token" or auth["k8s"]:
        return None
    return auth["secret"] or cluster, auth["key"]


def k8s_auth(run: Applied) -> bool:
    """The cluster delegates Ray's token check to Kubernetes (enableK8sTokenAuth): the dashboard
    takes this client's own Kubernetes bearer token (TokenReview, RBAC verb ray:write)."""
    auth = user_layers.auth_of(kuberay_manifest.cluster_of(run.manifest))
    return auth is not None and auth["mode"] == "token" and bool(auth["k8s"])


def _need_bearer(run: Applied) -> None:
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


# --- deleted: by uid, its pods waited out -------------------------------------------------------


def delete(section: Any, run: Applied) -> None:
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
    _wait_deleted(section, run, cluster)


def _wait_deleted(section: Any, run: Applied, cluster: str | None) -> None:
    timeout = float(section.delete_timeout_s)
    deadline = time.monotonic() + timeout
    while True:
        left = run.kube.get(run.kind, run.object_name)
        pods = run.kube.pods(f"ray.io/cluster={cluster}") if cluster else []
        if left is None and not pods:
            print(
                f"[rayflow] kuberay: deleted {run.where}" + (" and its pods" if cluster else ""),
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


def _last_cluster_name(run: Applied) -> str | None:
    try:
        return run.cluster_name()
    except ClusterError:  # the API server went away: delete() reports it
        return None
