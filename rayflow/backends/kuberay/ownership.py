"""backend=kuberay: which existing RayCluster a run, `rayflow status`, `logs` and `down` may treat
as this user's own. Joining is by proof, never by name or labels.

A kept RayCluster is this user's when both hold:
- this user's registry of kept clusters (rayflow.backends.kept, a 0700 folder of the user's) holds
  its uid. The API server gives every object a uid of its own; no one can give it to another
  object, so a cluster deleted and made again under the name, labels and annotations copied, is
  not it.
- it carries `ANNOTATION`: this user's MAC (rayflow.security.keys.user_mac) of its namespace, name
  and uid, which the run that created it wrote right after the create (when the uid is known).
  Only a holder of this user's key can make it, and it is bound to that one object.

Anything else that exists under the name is refused in one line, whatever its labels say: with
`backend.keep_cluster=false` always (such a run makes its own cluster and deletes it), with
`keep_cluster=true` unless the user trusts it explicitly by its uid (`backend.join_uid`, read with
kubectl): then the job and its secrets go to a head this user chose.
"""

from __future__ import annotations

import hmac
from typing import Any

from rayflow.backends import kept as registry
from rayflow.backends.kept import KeptCluster
from rayflow.errors import ConfigError
from rayflow.security.keys import user_mac

ANNOTATION = "rayflow.io/owner-proof"
PURPOSE = "kuberay-join"
MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_LABEL = "rayflow.io/run"
KEPT_LABEL = "rayflow.io/keep"


def proof(namespace: str, name: str, uid: str) -> str:
    return user_mac(PURPOSE, f"{namespace}/{name}/{uid}")


def proof_patch(created: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that puts the proof on an object this run just created."""
    meta = created["metadata"]
    mac = proof(str(meta["namespace"]), str(meta["name"]), str(meta["uid"]))
    return {"metadata": {"annotations": {ANNOTATION: mac}}}


def carries_proof(obj: dict[str, Any]) -> bool:
    """The object's annotation is this user's MAC of its own namespace, name and uid."""
    meta = obj.get("metadata") or {}
    uid, given = meta.get("uid"), (meta.get("annotations") or {}).get(ANNOTATION)
    if not uid or not isinstance(given, str):
        return False
    expected = proof(str(meta.get("namespace")), str(meta.get("name")), str(uid))
    return hmac.compare_digest(given.encode(), expected.encode())


def kept_record(backend: str, obj: dict[str, Any]) -> KeptCluster | None:
    """This user's record of the kept cluster `obj` is, by its uid (None: none)."""
    meta = obj["metadata"]
    for record in registry.records():
        where = record.where
        if (
            record.backend == backend
            and where.get("uid") == meta.get("uid")
            and where.get("namespace") == meta.get("namespace")
            and where.get("object") == meta.get("name")
        ):
            return record
    return None


def state(current: dict[str, Any] | None, where: dict[str, str]) -> str:
    """What a kept cluster's record finds under its name: `mine` (its uid, with the proof),
    `gone` (nothing, or it is being deleted), `replaced` (another object: another uid),
    `unproven` (its uid, without a valid proof), `unrecorded` (the record holds no uid: kept by a
    rayflow before proofs)."""
    if current is None:
        return "gone"
    meta = current.get("metadata") or {}
    if not where.get("uid"):
        return "unrecorded"
    if meta.get("uid") != where["uid"]:
        return "replaced"
    if meta.get("deletionTimestamp"):
        return "gone"
    return "mine" if carries_proof(current) else "unproven"


def not_reached(what: str, verdict: str, delete: str) -> str:
    """Why a kept cluster's record does not reach or delete what is under its name, and how to
    finish by hand."""
    return {
        "replaced": f"{what} is not the cluster you kept: yours is gone, and this one (another "
        "uid) was made since, by someone else or by hand; rayflow leaves it alone (`rayflow "
        "status` forgets yours)",
        "unproven": f"{what} has the uid you kept but not rayflow's proof that your run made it "
        f"(annotation {ANNOTATION} removed or changed): rayflow neither reaches nor deletes it; "
        f"if it is yours, delete it yourself ({delete})",
        "unrecorded": f"{what} was kept by an earlier rayflow, which recorded no uid: rayflow "
        f"neither reaches nor deletes it by name; delete it yourself ({delete}), then `rayflow "
        "status` forgets it",
    }[verdict]


def refusal(section: Any, backend: str, existing: dict[str, Any], where: str) -> str | None:
    """The one line that refuses to run on `existing` (a RayCluster found under the run's name),
    or None where the run may join it: its own kept cluster (proven) with keep_cluster=true, or
    the one whose uid backend.join_uid names."""
    meta = existing["metadata"]
    labels = meta.get("labels") or {}
    kind, name, namespace = str(existing["kind"]), str(meta["name"]), str(meta["namespace"])
    record = kept_record(backend, existing)
    mine = record is not None and carries_proof(existing)
    join_uid = section.get("join_uid")
    if join_uid and join_uid != meta.get("uid"):
        raise ConfigError(
            "backend.join_uid",
            f"{where} has another uid than {join_uid}: it was deleted and made again since you "
            f"read its uid; read it again (kubectl get {kind.lower()} {name} -n {namespace} -o "
            "jsonpath='{.metadata.uid}') and check whose it is",
        )
    if section.keep_cluster and (mine or join_uid):
        return None
    if mine:
        return (
            f"{where} is a cluster you kept (rayflow status), and this run would delete its "
            "cluster at its end (backend.keep_cluster=false): set backend.keep_cluster=true to run "
            "on it and leave it running, or choose another backend.cluster_name"
        )
    delete = f"kubectl delete {kind.lower()} {name} -n {namespace}"
    if labels.get(MANAGED_BY) == "rayflow" and labels.get(KEPT_LABEL) != "true":
        return (
            f"{where} belongs to another rayflow run ({RUN_LABEL}={labels.get(RUN_LABEL, '?')}), "
            "which deletes it when it ends: choose another backend.cluster_name (if that run is "
            f"gone: {delete})"
        )
    return f"{where} already exists and {_not_yours(backend, record, existing)}; {_ways(existing)}"


def _not_yours(backend: str, record: KeptCluster | None, existing: dict[str, Any]) -> str:
    meta = existing["metadata"]
    if record is not None:
        return (
            "has the uid you kept but not rayflow's proof that your run made it (annotation "
            f"{ANNOTATION} removed or changed)"
        )
    if any(
        r.backend == backend and r.where.get("namespace") == meta["namespace"]
        for r in registry.named(str(meta["name"]))
    ):
        return "is not the cluster you kept: yours is gone, and this one was made since"
    return "no run of yours made and kept it"


def _ways(existing: dict[str, Any]) -> str:
    meta = existing["metadata"]
    kind, name, namespace = str(existing["kind"]), str(meta["name"]), str(meta["namespace"])
    return (
        "rayflow never runs on a cluster by its name: choose another backend.cluster_name, or "
        "to run on it as it is, trust it by its uid: backend.keep_cluster=true "
        f"backend.join_uid=<kubectl get {kind.lower()} {name} -n {namespace} -o "
        "jsonpath='{.metadata.uid}'>"
    )


def owned_by(obj: dict[str, Any], uid: str | None) -> bool:
    """`obj` names the object of `uid` among its owners (ownerReferences)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(isinstance(r, dict) and r.get("uid") == uid for r in refs)


def head_service_refusal(
    service: dict[str, Any], cluster_uid: str, namespace: str, cluster: str
) -> str | None:
    """Why the head Service found under KubeRay's name for it is not the RayCluster's own
    (KubeRay makes it owned by the RayCluster), or None: someone who made a Service of that name
    first would receive the Ray token and the job."""
    if owned_by(service, cluster_uid):
        return None
    return (
        f"Service {namespace}/{service['metadata']['name']} is not RayCluster {namespace}/"
        f"{cluster}'s (KubeRay makes its head service owned by it): someone else made it under "
        "that name, so rayflow sends nothing to it; delete it (then KubeRay makes the cluster's "
        "own), or choose another backend.cluster_name"
    )


__all__ = ["ANNOTATION", "carries_proof", "proof_patch", "refusal", "state", "not_reached"]
