"""backend=kuberay: what lets a kept RayCluster delete itself once idle (rayflow.autostop on its
head), with no copied credential: the head pod runs as a ServiceAccount of rayflow's own,
`<cluster>-rayflow-autostop`, whose Role allows `get` and `delete` on exactly that RayCluster and
nothing else.

The right to delete is bound to that account only, never to one other pods may run as: not to
`default` (every pod of the namespace that names no account runs as it), not to an account the
user's manifest names for the head (its workers, or other workloads, may share it). So a manifest
that sets the head's own `serviceAccountName` keeps it, and autostop is off, in one line saying
why (`plan`). An existing ServiceAccount, Role or RoleBinding of that name that this run did not
make is never reused or changed: the run looks before it creates the RayCluster (then the head
does not run as that account) and a create answered 409 AlreadyExists turns autostop off too,
in one line (kuberay.cluster). What it creates is owned by the RayCluster (ownerReferences), so
Kubernetes removes it with it. A RayJob's cluster ends with its job: it gets none.
"""

from __future__ import annotations

import copy
from typing import Any

RBAC_GROUP = "rbac.authorization.k8s.io"
SUFFIX = "-rayflow-autostop"
# The head's dashboard on its own loopback, where the watcher asks whether the cluster is in use
HEAD_DASHBOARD = "http://127.0.0.1:8265"


def head_account(manifest: dict[str, Any]) -> str | None:
    """The head pod template's own serviceAccountName, if the manifest sets one."""
    head = manifest["spec"]["headGroupSpec"]["template"].get("spec") or {}
    return head.get("serviceAccountName")


def account_name(manifest: dict[str, Any]) -> str:
    """The ServiceAccount (and Role, RoleBinding) rayflow makes for this RayCluster's autostop."""
    return f"{manifest['metadata']['name']}{SUFFIX}"


def plan(manifest: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
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
    return changed, rbac(changed, account), None


def existing_off(name: str, where: str, kind: str) -> str:
    """The line that says autostop is off because an object of its name is not this run's."""
    return (
        f"autostop is off: {kind} {where} already exists and this run did not make it (rayflow "
        "never reuses or changes an object it did not make, so nothing is bound to it); stop the "
        f"cluster with `rayflow down {name}`"
    )


def rbac(manifest: dict[str, Any], account: str) -> list[dict[str, Any]]:
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


def owned_by(objects: list[dict[str, Any]], cluster: dict[str, Any]) -> list[dict[str, Any]]:
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
        "kind": "raycluster",
        "namespace": str(meta["namespace"]),
        "name": str(meta["name"]),
        "uid": str(meta["uid"]),
        "dashboard": HEAD_DASHBOARD,
    }
