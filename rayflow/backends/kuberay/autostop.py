"""backend=kuberay: what lets a kept RayCluster delete itself once idle (rayflow.autostop on its
head), with no copied credential: the head pod runs as a ServiceAccount whose Role allows `get`
and `delete` on exactly that RayCluster and nothing else.

`rbac(...)` renders the ServiceAccount, Role and RoleBinding (a dry run prints them after the
RayCluster); `with_service_account(...)` puts the account in the head's pod template (a user's
own `serviceAccountName` is kept, and bound instead). They are created right after the RayCluster,
owned by it (ownerReferences), so Kubernetes removes them with it. A RayJob's cluster ends with its
job: it gets none.
"""

from __future__ import annotations

import copy
from typing import Any

RBAC_GROUP = "rbac.authorization.k8s.io"
SUFFIX = "-autostop"
# The head's dashboard on its own loopback, where the watcher asks whether the cluster is in use
HEAD_DASHBOARD = "http://127.0.0.1:8265"


def head_account(manifest: dict[str, Any]) -> str | None:
    """The head pod template's own serviceAccountName, if the manifest sets one."""
    head = manifest["spec"]["headGroupSpec"]["template"].get("spec") or {}
    return head.get("serviceAccountName")


def with_service_account(manifest: dict[str, Any]) -> tuple[dict[str, Any], str, bool]:
    """The RayCluster with its head running as the autostop account: (manifest, the account,
    whether rayflow makes it). An account the manifest names already is used as it is."""
    own, account = head_account(manifest), f"{manifest['metadata']['name']}{SUFFIX}"
    if own:  # the user's, or rayflow's put there already
        return manifest, own, own == account
    changed = copy.deepcopy(manifest)
    changed["spec"]["headGroupSpec"]["template"].setdefault("spec", {})["serviceAccountName"] = (
        account
    )
    return changed, account, True


def rbac(manifest: dict[str, Any], account: str, make_account: bool) -> list[dict[str, Any]]:
    """The objects that let `account` read and delete this RayCluster, and only it."""
    meta = manifest["metadata"]
    name, namespace = str(meta["name"]), str(meta["namespace"])
    common = {"namespace": namespace, "labels": dict(meta.get("labels") or {})}
    role = f"{name}{SUFFIX}"
    objects: list[dict[str, Any]] = []
    if make_account:
        objects.append(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, **common}}
        )
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
