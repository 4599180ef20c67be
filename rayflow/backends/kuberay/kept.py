"""backend=kuberay: a kept RayCluster's life (`backend.keep_cluster=true`), by proof, never by name
(kuberay.ownership).

A run keeps the RayCluster it made by writing on it the proof that this user's run made it
(`keep`), and joins an existing one only when it is such a cluster, or the one whose uid
backend.join_uid names (`join`); anything else under the name is refused in one line. A kept
cluster is deleted by its run only when its start fails before it is reached (and recorded).
From its record alone (rayflow.backends.kept), `reach` gives `rayflow status` and `logs` its
dashboard and `down` deletes it, each only while it is provably the object its run made.

Autostop: a RayCluster deletes itself once idle (rayflow.autostop on its head; a kept one by
default, a run's own one when backend.autostop_idle_minutes asks) with no copied credential: the
head pod runs as a ServiceAccount of rayflow's own, `<cluster>-rayflow-autostop`, whose Role
allows `get` and `delete` on exactly that RayCluster and nothing else.

The right to delete is bound to that account only, never to one other pods may run as: not to
`default` (every pod of the namespace that names no account runs as it), not to an account the
user's manifest names for the head (its workers, or other workloads, may share it). So a manifest
that sets the head's own `serviceAccountName` keeps it, and autostop is off, in one line saying
why (`autostop_plan`). An existing ServiceAccount, Role or RoleBinding of that name that this run
did not make is never reused or changed: the run looks before it creates the RayCluster
(`settle_autostop`: then the head does not run as that account) and a create answered 409
AlreadyExists turns autostop off too, in one line (`allow_autostop`). What it creates is owned by
the RayCluster (ownerReferences), so Kubernetes removes it with it. A RayJob's cluster ends with
its job: it gets none.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.backends.kuberay import applied, ownership
from rayflow.backends.kuberay.applied import Applied
from rayflow.errors import ClusterError, ConfigError
from rayflow.runtime.progress import phase

REACH_TIMEOUT_S = 30.0  # a status or logs call waits this long for a kept cluster's head
RBAC_GROUP = "rbac.authorization.k8s.io"
SUFFIX = "-rayflow-autostop"
# The head's dashboard on its own loopback, where the watcher asks whether the cluster is in use
HEAD_DASHBOARD = "http://127.0.0.1:8265"


def where_of(manifest: dict[str, Any]) -> dict[str, str]:
    """What a kept cluster's record holds of it: the object, never a credential (the kubeconfig
    and context are in the backend section it is rebuilt from)."""
    meta = manifest["metadata"]
    return {"kind": manifest["kind"], "namespace": meta["namespace"], "object": meta["name"]}


# --- a run's: kept, joined ------------------------------------------------------------------------


def keep(run: Applied, created: dict[str, Any]) -> None:
    """Mark the RayCluster this run just made kept: the proof that this user's run made it
    (kuberay.ownership), which is what a later run joins it by."""
    run.kube.merge_patch(run.kind, run.object_name, ownership.proof_patch(created))


def delete_unless_reached(section: Any, run: Applied) -> None:
    """A kept cluster's undo: nothing once its start has reached it (it is kept)."""
    if not run.handle.address:
        applied.delete(section, run)


def join(section: Any, run: Applied, existing: dict[str, Any]) -> None:
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
            f"made by rayflow run {labels.get(ownership.RUN_LABEL, '?')}"
            if labels.get(ownership.MANAGED_BY) == "rayflow"
            else "rayflow did not make it"
        )
        raise ConfigError(
            "backend.cluster_name",
            f"{run.where} already exists ({owner}) and a RayJob runs one job: "
            f"choose another backend.cluster_name, or delete it ({delete})",
        )
    name = str(section.name)
    refused = ownership.refusal(section, name, existing, run.where)
    if refused:
        raise ConfigError("backend.cluster_name", refused)
    record = ownership.kept_record(name, existing)
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
                if applied.k8s_auth(run)
                else ""
            )
        ),
        flush=True,
    )


# --- a kept cluster, from its record alone (rayflow status, down, logs) --------------------------


def _kept_object(section: Any, kept: KeptCluster) -> tuple[Applied, dict[str, Any] | None, str]:
    """The kept object as it is now and what it is to the record (kuberay.ownership.state:
    mine, gone, replaced, unproven, unrecorded), with a client whose closing is the handle's
    first undo step."""
    from rayflow.backends.kuberay.kube import Kube

    where = kept.where
    handle = ClusterHandle(str(section.name), name=kept.name, owner_run=kept.owner_run, kept=True)
    kube = Kube(where["namespace"], section.kubeconfig, section.context)
    handle.on_stop("close the Kubernetes client", kube.close)
    metadata = {"name": where["object"], "namespace": where["namespace"]}
    manifest: dict[str, Any] = {"kind": where["kind"], "metadata": metadata}
    run = Applied(handle, kept.owner_run, manifest, kube, joined=True, uid=where.get("uid"))
    with handle.unwound_on_error():
        current = kube.get(where["kind"], where["object"])
    return run, current, ownership.state(current, where)


def _not_reached(run: Applied, verdict: str) -> str:
    delete = f"kubectl delete {run.kind.lower()} {run.object_name} -n {run.namespace}"
    return ownership.not_reached(run.where, verdict, delete)


def reach(section: Any, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
    """The kept cluster, reached only when it is provably the one its run made (its uid and
    the proof on it); None when it is gone (or another object holds its name now)."""
    run, current, verdict = _kept_object(section, kept)
    if verdict in ("gone", "replaced"):
        if verdict == "replaced":
            print(f"[rayflow] kuberay: {_not_reached(run, verdict)}", file=sys.stderr)
        run.handle.unwind()
        return None
    with run.handle.unwound_on_error():
        if verdict != "mine":
            raise ClusterError(_not_reached(run, verdict))
        assert current is not None
        run.manifest = current
        run.handle.address = applied.reach(section, run, timeout_s=REACH_TIMEOUT_S)
        run.handle.submission = Submission(headers=run.headers())
    return run.handle


def down(section: Any, kept: KeptCluster) -> None:
    """Delete the kept cluster, only when it is provably the one its run made; anything else
    under its name is left alone, in one line that says how to finish by hand."""
    run, current, verdict = _kept_object(section, kept)
    try:
        if verdict not in ("mine", "gone"):
            raise ClusterError(_not_reached(run, verdict))
        if verdict == "mine":
            assert current is not None
            run.manifest = current
            applied.delete(section, run)
    finally:
        run.handle.unwind()


# --- autostop: the RayCluster deletes itself once idle, as an account of rayflow's own -----------


def head_account(manifest: dict[str, Any]) -> str | None:
    """The head pod template's own serviceAccountName, if the manifest sets one."""
    head = manifest["spec"]["headGroupSpec"]["template"].get("spec") or {}
    return head.get("serviceAccountName")


def account_name(manifest: dict[str, Any]) -> str:
    """The ServiceAccount (and Role, RoleBinding) rayflow makes for this RayCluster's autostop."""
    return f"{manifest['metadata']['name']}{SUFFIX}"


def autostop_plan(
    manifest: dict[str, Any],
) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """(the RayCluster as applied, the RBAC objects to create after it, why autostop is off or
    None). The head runs as rayflow's own account; a manifest that names another one for the head
    keeps it, and gets no rights."""
    meta, account = manifest["metadata"], account_name(manifest)
    own = head_account(manifest)
    if own and own != account:  # its name is rayflow's own when a dry run's output comes back
        return (
            manifest,
            [],
            f"autostop is off: the manifest runs the head of RayCluster {meta.get('namespace')}/"
            f"{meta['name']} as ServiceAccount {own!r}, and rayflow gives the right to delete it "
            f"only to an account of its own ({account}), never to one other pods may share; "
            f"stop it with `rayflow down {meta['name']}`",
        )
    changed = copy.deepcopy(manifest)
    changed["spec"]["headGroupSpec"]["template"].setdefault("spec", {})["serviceAccountName"] = (
        account
    )
    return changed, _rbac(changed, account), None


def _existing_off(name: str, where: str, kind: str) -> str:
    """The line that says autostop is off because an object of its name is not this run's."""
    return (
        f"autostop is off: {kind} {where} already exists and this run did not make it (rayflow "
        "never reuses or changes an object it did not make, so nothing is bound to it); stop the "
        f"cluster with `rayflow down {name}`"
    )


def _rbac(manifest: dict[str, Any], account: str) -> list[dict[str, Any]]:
    """The objects that let `account`, rayflow's own, read and delete this RayCluster, and only
    it: the account first, then the Role, then the binding (created in that order)."""
    meta = manifest["metadata"]
    name, namespace = str(meta["name"]), str(meta["namespace"])
    common = {"namespace": namespace, "labels": dict(meta.get("labels") or {})}
    role = f"{name}{SUFFIX}"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, **common}}
    ]
    rule = {
        "apiGroups": ["ray.io"],
        "resources": ["rayclusters"],
        "resourceNames": [name],
        "verbs": ["get", "delete"],
    }
    objects.append(
        {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "Role",
            "metadata": {"name": role, **common},
            "rules": [rule],
        }
    )
    objects.append(
        {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role, **common},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": role},
        }
    )
    return objects


def _owned_by(objects: list[dict[str, Any]], cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects, each owned by the created RayCluster (its uid): removed with it."""
    owner = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "name": cluster["metadata"]["name"],
        "uid": cluster["metadata"]["uid"],
    }
    owned = copy.deepcopy(objects)
    for obj in owned:
        obj["metadata"]["ownerReferences"] = [owner]
    return owned


def watcher_spec(cluster: dict[str, Any]) -> dict[str, str]:
    """What the watcher on the head deletes once idle: this RayCluster, by uid (one recreated
    under the name is not it)."""
    meta = cluster["metadata"]
    return {
        "backend": "kuberay",
        "kind": "raycluster",
        "namespace": str(meta["namespace"]),
        "name": str(meta["name"]),
        "uid": str(meta["uid"]),
        "dashboard": HEAD_DASHBOARD,
    }


def settle_autostop(run: Applied) -> None:
    """Before the RayCluster is made: an object of the autostop RBAC's names that exists is
    not this run's, so the head does not run as that account and autostop is off (one line)."""
    for obj in run.rbac:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if run.kube.read_object(kind, name) is not None:
            where = f"{run.namespace}/{name}"
            warn = _existing_off(run.object_name, where, kind)
            print(f"rayflow: warning: {warn}", file=sys.stderr, flush=True)
            assert run.base is not None  # set by start() with the RBAC
            run.manifest, run.rbac = run.base, []
            return


def allow_autostop(run: Applied, created: dict[str, Any]) -> None:
    """The RBAC that lets the RayCluster just created delete itself, owned by it, each object
    created by this run (a 409 is someone else's: autostop off, nothing more created); its
    watcher's spec on the handle (rayflow.orchestrator.autostop arms it)."""
    if not run.rbac:
        return
    blocked: dict[str, Any] | None = None
    with phase(f"letting {run.where} delete itself once idle (RBAC)", "kuberay") as step:
        for obj in _owned_by(run.rbac, created):
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
        warn = _existing_off(run.object_name, where, blocked["kind"])
        print(f"rayflow: warning: {warn}", file=sys.stderr, flush=True)
        return
    run.handle.autostop = watcher_spec(created)


# --- from the head: what the watcher of an idle RayCluster (rayflow.autostop) runs -----------

# Where Kubernetes mounts a pod's service account (its token, the API server's CA)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def stop_idle(spec: dict[str, Any]) -> None:
    """DELETE this RayCluster (by uid) as the head pod's service account, the way in-cluster
    clients reach the API server; its Role allows exactly that."""
    import ssl
    import urllib.request

    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    host = f"[{host}]" if ":" in host else host
    url = (
        f"https://{host}:{port}/apis/ray.io/v1/namespaces/{spec['namespace']}"
        f"/rayclusters/{spec['name']}"
    )
    options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
    options.update(propagationPolicy="Background", preconditions={"uid": spec["uid"]})
    request = urllib.request.Request(
        url,
        data=json.dumps(options).encode(),
        method="DELETE",
        headers={
            "Authorization": f"Bearer {(SERVICE_ACCOUNT / 'token').read_text().strip()}",
            "Content-Type": "application/json",
        },
    )
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            print(f"[autostop] deleted RayCluster {spec['name']} ({answer.status})", flush=True)
    except urllib.error.HTTPError as err:  # 404: gone already; 409: another of the name
        print(f"[autostop] the API server answered {err.code}: {err.read()[:300]!r}", flush=True)
