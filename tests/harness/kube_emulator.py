"""A Kubernetes API emulator on loopback HTTP, for driving the real `kubernetes` client in tests.

No API server can run here, so `KubeEmulator` serves a kmock `KubernetesEmulator` subclass on
127.0.0.1 from a thread with its own asyncio loop. kmock gives the HTTP server, request parsing,
discovery and Status-shaped errors; this subclass replaces its plain dict-merge storage with the
API-server semantics rayflow's KubeRay path relies on: server-side apply, merge and JSON patches,
resourceVersion/generation/uid, label and field selectors, finalizers, ownerReference garbage
collection, status subresources, watches, bearer-token auth and the services proxy (streamed, and
websockets bridged: tests/kube_proxy.py). The KubeRay operator's part is played by
tests/kube_operator.py.

Identities: the kubeconfig's token is an admin's, allowed everything; `service_account_token`
makes tokens of ServiceAccounts, whose requests RBAC authorizes on the namespace's Roles and
RoleBindings (tests/harness/kube_rbac.py: 403 Forbidden worded as the server's). `tls=True` also
serves the API over HTTPS with a throwaway CA (tests/harness/tls.py), as a pod's in-cluster
client reaches it; tests/harness/kube_head.py runs a Ray head in a mount namespace with the
service account's files where a pod has them. Deletes honour DeleteOptions' preconditions
(uid, resourceVersion: 409 Conflict).

Admission, as the API server runs it on every write that comes in over HTTP: RayClusters and
RayJobs are held to KubeRay's CRD (the structural schema, read as rayflow's validator reads the
v1.7.0 CRD, whose positive control is KubeRay's own samples; and the CEL rule on spec.managedBy,
which rayflow's offline checks do not evaluate), then to any `admission` hook a test adds (a
policy webhook). A refusal is the server's 422 Invalid or 403 Forbidden. `dryRun=All` on a create,
apply, patch, update or delete runs all of it and answers with the object the server would
store, storing nothing, bumping no resourceVersion and notifying no watch.

All state lives on the emulator loop; the sync accessors hop onto it, so tests and the operator
never race the HTTP handlers.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import os
import re
import secrets
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import aiohttp.web
import attrs
import kmock
import yaml
from kmock import KubernetesError

from tests.harness.kube_proxy import PROXY_PATH, ServicesProxy
from tests.harness.kube_rbac import (
    ServiceAccountUser,
    authorize,
    forbidden,
    invalid,
    request_attributes,
    unauthorized,
)
from tests.harness.kube_rbac import validation_errors as rbac_validation_errors
from tests.harness.tls import Pki, server_context, throwaway_pki

# plural -> (group, version, kind, namespaced, has a status subresource)
RESOURCES: dict[str, tuple[str, str, str, bool, bool]] = {
    "pods": ("", "v1", "Pod", True, True),
    "services": ("", "v1", "Service", True, True),
    "secrets": ("", "v1", "Secret", True, False),
    "events": ("", "v1", "Event", True, False),
    "namespaces": ("", "v1", "Namespace", False, True),
    "rayclusters": ("ray.io", "v1", "RayCluster", True, True),
    "rayjobs": ("ray.io", "v1", "RayJob", True, True),
    "serviceaccounts": ("", "v1", "ServiceAccount", True, False),
    "roles": ("rbac.authorization.k8s.io", "v1", "Role", True, False),
    "rolebindings": ("rbac.authorization.k8s.io", "v1", "RoleBinding", True, False),
}
# What a DELETE of an object that went at once answers with: a Success Status for these (their
# registries' default), the deleted object for the rest (pods, namespaces and serviceaccounts set
# ReturnDeletedObject; custom resources always return it).
STATUS_ON_DELETE = {"services", "secrets", "events", "roles", "rolebindings"}
CRD_GROUPS = {"ray.io"}  # custom resources: no strategic merge patch
ADMIN = "admin"  # the user of the kubeconfig's token, allowed everything
# RayCluster spec.managedBy's CEL rule
MANAGED_BY_VALUES = ("ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue")
# The field selectors the API server accepts beyond metadata.name/namespace; anything else is a 400.
FIELD_LABELS = {
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "type",
        "source",
    },
    "pods": {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
}


class SeenRequest(NamedTuple):
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    # ADMIN, a service account's `system:serviceaccount:NS:NAME`, or None (refused, 401)
    user: str | None = None


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_error(status: int, reason: str, message: str, **details: Any) -> KubernetesError:
    return KubernetesError(status=status, reason=reason, message=message, details=details or {})


def not_found(plural: str, name: str) -> KubernetesError:
    group = RESOURCES[plural][0]
    return api_error(
        404,
        "NotFound",
        f'{plural}{"." + group if group else ""} "{name}" not found',
        name=name,
        group=group,
        kind=plural,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/remove/replace/test (what clients send); a failed op is a 422 like the server's."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
        else:
            index = last
        kind = op["op"]
        if kind == "test" and node[index] != op["value"]:
            raise api_error(422, "Invalid", f"testing value {op['path']} failed")
        if kind in ("remove", "replace") and (
            index not in node if isinstance(node, dict) else index >= len(node)
        ):
            raise api_error(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: "
                f"missing value at {op['path']}",
            )
        if kind == "add" and isinstance(node, list):
            node.insert(index, op["value"])
        elif kind in ("add", "replace"):
            node[index] = op["value"]
        elif kind == "remove":
            del node[index]
    return doc


def prune_unapplied(live: Any, previous: Any, applied: Any) -> Any:
    """Server-side apply drops the fields this manager applied last time but not now."""
    if not (isinstance(live, dict) and isinstance(previous, dict)):
        return live
    live = dict(live)
    for key, old in previous.items():
        if key not in live:
            continue
        if not isinstance(applied, dict) or key not in applied:
            del live[key]
        elif isinstance(old, dict):
            live[key] = prune_unapplied(live[key], old, applied[key])
    return live


def _split_terms(selector: str) -> list[str]:
    return [t.strip() for t in re.split(r",(?![^()]*\))", selector) if t.strip()]


def labels_match(labels: dict[str, str], selector: str | None) -> bool:
    """Equality (=, ==, !=), set (in, notin) and existence (key, !key) terms, comma = AND."""
    for term in _split_terms(selector or ""):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            values = {v.strip() for v in m[3].split(",")}
            ok = (labels.get(m[1]) in values) if m[2] == "in" else (labels.get(m[1]) not in values)
        elif m := re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", term):
            ok = (labels.get(m[1]) == m[3]) if m[2] != "!=" else (labels.get(m[1]) != m[3])
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def fields_match(plural: str, obj: dict[str, Any], selector: str | None) -> bool:
    for term in _split_terms(selector or ""):
        m = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", term)
        if not m:
            raise api_error(400, "BadRequest", f"invalid field selector: {term!r}")
        path, op, wanted = m.groups()
        if path not in {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, set()):
            raise api_error(
                400,
                "BadRequest",
                f'"{path}" is not a known field selector: only '
                f'"metadata.name", "metadata.namespace"',
            )
        value: Any = obj
        for part in ("source.component" if path == "source" else path).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        value = "" if value is None else str(value)
        if (value == wanted) != (op != "!="):
            return False
    return True


@attrs.define(kw_only=True)
class EmulatorHandler(ServicesProxy, kmock.KubernetesEmulator):
    """The served app; every method here runs on the emulator loop."""

    token: str
    gc_delay_s: float = 0.0
    # bearer token -> the service account it authenticates (KubeEmulator.service_account_token)
    sa_tokens: dict[str, ServiceAccountUser] = attrs.field(factory=dict)
    store: dict[tuple[str, str | None, str], dict[str, Any]] = attrs.field(factory=dict)
    seen: list[SeenRequest] = attrs.field(factory=list)
    upstreams: dict[tuple[str, str, str | None], str] = attrs.field(factory=dict)
    listeners: list[Callable[[str, str, dict | None, dict | None], None]] = attrs.field(
        factory=list
    )
    _rv: int = 0
    # (key, manager) -> config
    _applied: dict[tuple[Any, ...], dict[str, Any]] = attrs.field(factory=dict)
    _history: list[tuple[int, str, dict | None, dict | None]] = attrs.field(factory=list)
    _watchers: list[tuple[str, asyncio.Queue]] = attrs.field(factory=list)
    _session: aiohttp.ClientSession | None = None
    # (plural, object) -> None, or raise api_error(...): a policy webhook's say on HTTP writes
    admission: list[Callable[[str, dict], None]] = attrs.field(factory=list)
    _dry_run: bool = False  # the write in progress is dryRun=All: nothing is stored
    _admitting: bool = False  # the write in progress came in over HTTP: admission runs

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for plural, (group, version, kind, namespaced, has_status) in RESOURCES.items():
            self.resources[f"{group}/{version}/{plural}" if group else f"v1/{plural}"] = (
                kmock.ResourceInfo(
                    kind=kind,
                    singular=kind.lower(),
                    namespaced=namespaced,
                    subresources={"status"} if has_status else set(),
                    verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
                )
            )

    # -- HTTP entry: auth, the request log and the proxy come before kmock buffers the body --------
    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        user = self._authenticate(raw)
        self.seen.append(
            SeenRequest(
                raw.method,
                raw.path,
                dict(raw.query),
                raw.headers.get("Content-Type"),
                None if user is None else user if user == ADMIN else user.username,
            )
        )
        if user is None:
            return aiohttp.web.json_response(unauthorized(), status=401)
        if m := PROXY_PATH.match(raw.path):
            try:
                self._authorize(
                    user, raw.method, "", "services", m[1], m[2], "proxy", dict(raw.query)
                )
                return await self._proxy(raw, m[1], m[2], m[3] or "/")
            except KubernetesError as e:
                return await self._render_error(e)
        return await super().__call__(raw)

    def _authenticate(self, raw: aiohttp.web.BaseRequest) -> ServiceAccountUser | str | None:
        """ADMIN for the kubeconfig's token; a service account for one of its tokens while the
        ServiceAccount exists (the server looks the account up); None: 401."""
        # apiserver's bearertoken authenticator: the scheme in any case (in-cluster clients send
        # "bearer"), then the token up to the next space
        parts = raw.headers.get("Authorization", "").strip().split(" ", 2)
        if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
            return None
        if parts[1] == self.token:
            return ADMIN
        account = self.sa_tokens.get(parts[1])
        if account is not None and ("serviceaccounts", *account) in self.store:
            return account
        return None

    def _authorize(
        self,
        user: ServiceAccountUser | str,
        method: str,
        group: str,
        plural: str,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
    ) -> None:
        """RBAC on a resource request (tests/harness/kube_rbac.py); the admin may do anything."""
        if user == ADMIN:
            return
        attrs = request_attributes(method, group, plural, ns, name, sub, query)
        allowed, reason = authorize(
            user,
            attrs,
            self.list("rolebindings", attrs.namespace) if attrs.namespace else [],
            lambda role: self.store.get(("roles", attrs.namespace, role)),
        )
        if not allowed:
            raise forbidden(user, attrs, reason)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        # discovery (/api, /apis/ray.io/v1, /version): kmock's
        if res is None or res.plural is None:
            return await kmock.RawHandler._handle(self, request)
        plural, ns, name, sub = res.plural, request.namespace, request.name, request.subresource
        user = self._authenticate(request._raw_request)
        self._authorize(user, request.method, res.group, plural, ns, name, sub, request.params)
        if plural not in RESOURCES or RESOURCES[plural][:2] != (res.group, res.version):
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        q, method = request.params, request.method
        # Go's ParseBool
        if method == "GET" and q.get("watch") in ("1", "t", "T", "TRUE", "true", "True"):
            return await self._watch(request._raw_request, plural, ns, q)
        # synchronous on the loop: the flags cover one write
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            if q.get("dryRun") not in (None, "All"):
                raise api_error(
                    400, "BadRequest", f"Invalid dry run value: {q['dryRun']!r} (only All)"
                )
            self._dry_run, self._admitting = q.get("dryRun") == "All", True
            try:
                return await self._write(request, plural, ns, name, sub, q, method)
            finally:
                self._dry_run, self._admitting = False, False
        if method == "GET" and name is None:
            items = self.list(plural, ns, q.get("labelSelector"), q.get("fieldSelector"))
            return aiohttp.web.json_response(
                {
                    "apiVersion": _api_version(plural),
                    "kind": RESOURCES[plural][2] + "List",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
            )
        if name is None:
            raise api_error(
                405, "MethodNotAllowed", f"the server does not allow this method on {plural}"
            )
        if method == "GET":
            return aiohttp.web.json_response(self.read(plural, ns, name))
        raise api_error(405, "MethodNotAllowed", f"{method} is not allowed")

    async def _write(
        self,
        request: kmock.Request,
        plural: str,
        ns: str | None,
        name: str | None,
        sub: str | None,
        q: dict,
        method: str,
    ) -> aiohttp.web.StreamResponse:
        if method == "POST" and name is None:
            return aiohttp.web.json_response(self.create(plural, ns, _body(request)), status=201)
        if name is None:
            raise api_error(
                405, "MethodNotAllowed", f"the server does not allow this method on {plural}"
            )
        if method == "PUT":
            return aiohttp.web.json_response(self.replace(plural, ns, name, _body(request), sub))
        if method == "PATCH":
            obj, created = self.patch(
                plural,
                ns,
                name,
                _body(request),
                request._raw_request.headers.get("Content-Type", ""),
                q.get("fieldManager"),
                sub,
            )
            return aiohttp.web.json_response(obj, status=201 if created else 200)
        if method == "DELETE":
            body = _body(request) if request.body else {}
            return aiohttp.web.json_response(
                self.delete(
                    plural,
                    ns,
                    name,
                    q.get("propagationPolicy") or body.get("propagationPolicy"),
                    body.get("preconditions"),
                )
            )
        raise api_error(405, "MethodNotAllowed", f"{method} is not allowed")

    # -- admission -------------------------------------------------------------------------------
    def _admit(self, plural: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        """The CRD's validation of a Ray object, then the test's hooks; refusals as the server words them."""
        if errors := rbac_validation_errors(plural, obj, old):
            kind, group = RESOURCES[plural][2], RESOURCES[plural][0]
            raise invalid(kind, group, obj["metadata"].get("name"), errors)
        if RESOURCES[plural][0] == "ray.io":
            from rayflow.backends.kuberay.crd import schema_errors

            kind, name = RESOURCES[plural][2], obj["metadata"].get("name")
            body = {
                k: v for k, v in obj.items() if k != "status"
            }  # status: the subresource's, not validated here
            body["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
            errors = schema_errors(body)
            managed_by = (obj.get("spec") or {}).get("managedBy")
            # the CRD's x-kubernetes-validations
            if managed_by is not None and managed_by not in MANAGED_BY_VALUES:
                errors.append(
                    'spec.managedBy: Invalid value: "string": the managedBy field value must be either '
                    "'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'"
                )
            if errors:
                raise api_error(
                    422,
                    "Invalid",
                    f'{kind}.ray.io "{name}" is invalid: {"; ".join(errors)}',
                    name=name,
                    group="ray.io",
                    kind=kind,
                )
        for hook in self.admission:
            hook(plural, copy.deepcopy(obj))

    # -- the store -------------------------------------------------------------------------------
    def read(self, plural: str, ns: str | None, name: str) -> dict[str, Any]:
        if (plural, ns, name) not in self.store:
            raise not_found(plural, name)
        return copy.deepcopy(self.store[plural, ns, name])

    def list(
        self, plural: str, ns: str | None, labels: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (p, n, _), o in self.store.items()
            if p == plural
            and (ns is None or n == ns)
            and labels_match(o["metadata"].get("labels", {}), labels)
            and fields_match(p, o, fields)
        ]

    def create(self, plural: str, ns: str | None, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _suffix()
        name = meta.get("name")
        if not name:
            raise api_error(
                422, "Invalid", f"{RESOURCES[plural][2]} is invalid: metadata.name: Required value"
            )
        ns = ns or meta.get("namespace") if RESOURCES[plural][3] else None
        if ns is not None and ("namespaces", None, ns) not in self.store:
            raise not_found("namespaces", ns)
        if (plural, ns, name) in self.store:
            raise api_error(409, "AlreadyExists", f'{plural} "{name}" already exists', name=name)
        body["apiVersion"], body["kind"] = _api_version(plural), RESOURCES[plural][2]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        meta.pop("deletionTimestamp", None)
        meta.pop("resourceVersion", None)
        if ns is not None:
            meta["namespace"] = ns
        return self._commit(plural, ns, name, None, body)

    def replace(
        self, plural: str, ns: str | None, name: str, body: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any]:
        old = self.read(plural, ns, name)
        rv = body.get("metadata", {}).get("resourceVersion")
        # optimistic concurrency, as the server does
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise api_error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural} "{name}": the object '
                f"has been modified; please apply your changes to the latest "
                f"version and try again",
                name=name,
            )
        return self._commit(plural, ns, name, old, self._scoped(plural, old, body, sub))

    def patch(
        self,
        plural: str,
        ns: str | None,
        name: str,
        body: Any,
        content_type: str,
        manager: str | None = None,
        sub: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        content_type = content_type.split(";")[0].strip()
        key = (plural, ns, name)
        if content_type == "application/apply-patch+yaml":
            if not manager:
                raise api_error(
                    400, "BadRequest", "PATCH requests with apply content type require fieldManager"
                )
            if body.get("metadata", {}).get("name") not in (None, name):
                raise api_error(
                    400, "BadRequest", "the name of the object does not match the name on the URL"
                )
            if key not in self.store:
                created = self.create(plural, ns, copy.deepcopy(body))
                if not self._dry_run:
                    self._applied[key, manager, sub] = copy.deepcopy(body)
                return created, True
            old = self.read(plural, ns, name)
            pruned = prune_unapplied(old, self._applied.get((key, manager, sub)), body)
            if not self._dry_run:
                self._applied[key, manager, sub] = copy.deepcopy(body)
            new = merge_patch(pruned, body)
        elif content_type == "application/merge-patch+json" or (
            content_type == "application/strategic-merge-patch+json"
            and RESOURCES[plural][0] not in CRD_GROUPS
        ):
            # Strategic merge is approximated as a merge patch (no list merge keys); CRDs reject it.
            old = self.read(plural, ns, name)
            new = merge_patch(old, body)
        elif content_type == "application/json-patch+json":
            old = self.read(plural, ns, name)
            new = json_patch(old, body)
        else:
            raise api_error(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json-patch+json, "
                "application/merge-patch+json, application/apply-patch+yaml",
            )
        return self.replace(plural, ns, name, new, sub), False

    def delete(
        self,
        plural: str,
        ns: str | None,
        name: str,
        propagation: str | None = None,
        preconditions: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        old = self.read(plural, ns, name)
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted = (preconditions or {}).get(field)
            if wanted is not None and wanted != old["metadata"].get(field):
                group = RESOURCES[plural][0]
                raise api_error(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {plural}{'.' + group if group else ''} "
                    f'"{name}": Precondition failed: {label} in precondition: {wanted}, '
                    f"{label} in object meta: {old['metadata'].get(field)}",
                    name=name,
                    group=group,
                    kind=plural,
                )
        if self._dry_run:  # what would be deleted, still there
            return old
        meta = old["metadata"]
        if propagation == "Foreground" and "foregroundDeletion" not in meta.get("finalizers", []):
            meta.setdefault("finalizers", []).append("foregroundDeletion")
        if meta.get("finalizers"):  # kept, marked, until whoever owns each finalizer removes it
            if not meta.get("deletionTimestamp"):
                new = copy.deepcopy(old)
                new["metadata"].update(
                    deletionTimestamp=now_iso(),
                    deletionGracePeriodSeconds=0,
                    finalizers=meta["finalizers"],
                )
                old = self._commit(
                    plural, ns, name, self.store[plural, ns, name], new, deleting=True
                )
            if propagation == "Foreground":
                asyncio.get_running_loop().create_task(
                    self._collect(old["metadata"]["uid"], foreground=(plural, ns, name))
                )
            return old
        gone = self._commit(plural, ns, name, old, None)
        if propagation != "Orphan":
            asyncio.get_running_loop().create_task(self._collect(meta["uid"]))
        if plural in STATUS_ON_DELETE:
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "kind": plural, "uid": meta["uid"]},
            }
        return gone

    async def _collect(
        self, owner_uid: str, foreground: tuple[str, str | None, str] | None = None
    ) -> None:
        """The garbage collector: dependents (by ownerReferences uid) go after their owner."""
        await asyncio.sleep(self.gc_delay_s)
        for (plural, ns, name), obj in list(self.store.items()):
            if any(r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences", [])):
                if (plural, ns, name) in self.store:
                    self.delete(plural, ns, name, "Background")
        if foreground and foreground in self.store:
            owner = self.read(*foreground)
            owner["metadata"]["finalizers"].remove("foregroundDeletion")
            self.replace(*foreground, owner)

    def _scoped(
        self, plural: str, old: dict[str, Any], body: dict[str, Any], sub: str | None
    ) -> dict[str, Any]:
        """The status subresource writes only status; the main resource ignores status changes."""
        if sub == "status":
            return {**old, "status": body.get("status", {})}
        if sub is not None:
            raise api_error(
                404, "NotFound", f"the server could not find the requested resource ({sub})"
            )
        if RESOURCES[plural][4]:
            body = (
                {**body, "status": old.get("status")}
                if "status" in old
                else {k: v for k, v in body.items() if k != "status"}
            )
        return body

    def _commit(
        self,
        plural: str,
        ns: str | None,
        name: str,
        old: dict | None,
        new: dict | None,
        deleting: bool = False,
    ) -> dict:
        """Store a change: bump resourceVersion/generation, finish released deletions, notify.

        Only the server sets deletionTimestamp (`deleting`); writers cannot change it or the identity.
        """
        key = (plural, ns, name)
        if self._admitting and new is not None and not deleting:
            self._admit(plural, new, old)
        if self._dry_run:  # validated and admitted: answered as stored, nothing kept or announced
            result = copy.deepcopy(new if new is not None else old)
            result["metadata"].setdefault(
                "resourceVersion",
                (old or {}).get("metadata", {}).get("resourceVersion", str(self._rv)),
            )
            return result
        if new is not None and old is not None:
            meta, was = new.setdefault("metadata", {}), old["metadata"]
            for immutable in ("uid", "creationTimestamp", "name", "namespace", "generation") + (
                () if deleting else ("deletionTimestamp", "deletionGracePeriodSeconds")
            ):
                if immutable in was:
                    meta[immutable] = was[immutable]
                else:
                    meta.pop(immutable, None)
            if was.get("deletionTimestamp") and set(meta.get("finalizers", [])) - set(
                was.get("finalizers", [])
            ):
                raise api_error(
                    422,
                    "Invalid",
                    f'{RESOURCES[plural][2]} "{name}" is invalid: metadata.finalizers: '
                    f"Forbidden: no new finalizers can be added if the object is being deleted",
                )
            meta["resourceVersion"] = was["resourceVersion"]
            if new == old:  # a no-op write changes nothing, not even resourceVersion
                return copy.deepcopy(old)
            strip = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}
            if strip(new) != strip(old):
                meta["generation"] = was.get("generation", 1) + 1
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._commit(plural, ns, name, new, None)
                asyncio.get_running_loop().create_task(self._collect(was["uid"]))
                return copy.deepcopy(new)
        self._rv += 1
        if new is None:
            event_type, result = "DELETED", copy.deepcopy(old)
            result["metadata"]["resourceVersion"] = str(self._rv)
            self.store.pop(key, None)
            for k in [k for k in self._applied if k[0] == key]:
                del self._applied[k]
        else:
            event_type, result = ("ADDED" if old is None else "MODIFIED"), new
            new["metadata"]["resourceVersion"] = str(self._rv)
            self.store[key] = copy.deepcopy(new)
        self._history.append((self._rv, plural, old, None if new is None else copy.deepcopy(new)))
        del self._history[:-1000]
        for watched, queue in self._watchers:
            if watched == plural:
                queue.put_nowait((self._rv, old, None if new is None else copy.deepcopy(new)))
        for listener in list(self.listeners):
            listener(event_type, plural, copy.deepcopy(old), copy.deepcopy(new))
        return copy.deepcopy(result)

    # -- watch -----------------------------------------------------------------------------------
    async def _watch(
        self, raw: aiohttp.web.BaseRequest, plural: str, ns: str | None, q: dict[str, str]
    ) -> aiohttp.web.StreamResponse:
        def matches(obj: dict | None) -> bool:
            return (
                obj is not None
                and (ns is None or obj["metadata"].get("namespace") == ns)
                and labels_match(obj["metadata"].get("labels", {}), q.get("labelSelector"))
                and fields_match(plural, obj, q.get("fieldSelector"))
            )

        def event(old: dict | None, new: dict | None, rv: int) -> dict | None:
            # Objects moving in or out of the selector show up as ADDED / DELETED, as the server does.
            if matches(new):
                return {"type": "MODIFIED" if matches(old) else "ADDED", "object": new}
            if matches(old):
                gone = copy.deepcopy(new or old)
                gone["metadata"]["resourceVersion"] = str(rv)
                return {"type": "DELETED", "object": gone}
            return None

        queue: asyncio.Queue = asyncio.Queue()
        since = q.get("resourceVersion") or "0"
        if since == "0":
            backlog = [{"type": "ADDED", "object": o} for o in self.list(plural, ns) if matches(o)]
        elif self._history and int(since) < self._history[0][0] - 1:
            backlog = [
                {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "code": 410,
                        "reason": "Expired",
                        "message": f"too old resource version: {since}",
                    },
                }
            ]
        else:
            backlog = [
                e
                for rv, p, old, new in self._history
                if p == plural and rv > int(since)
                if (e := event(old, new, rv))
            ]
        self._watchers.append((plural, queue))
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        try:
            for item in backlog:
                await response.write(json.dumps(item).encode() + b"\n")
            async with asyncio.timeout(float(q.get("timeoutSeconds", 1800))):
                while True:
                    rv, old, new = await queue.get()
                    if item := event(old, new, rv):
                        await response.write(json.dumps(item).encode() + b"\n")
        except TimeoutError:
            pass  # the server ends a watch at timeoutSeconds; clients re-watch from their resourceVersion
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.remove((plural, queue))
        await response.write_eof()
        return response


def _api_version(plural: str) -> str:
    group, version = RESOURCES[plural][:2]
    return f"{group}/{version}" if group else version


def _body(request: kmock.Request) -> Any:
    # JSON is YAML, so one parser covers application/json, merge/json patches and apply-patch+yaml.
    try:
        return yaml.safe_load(request.body or b"{}")
    except yaml.YAMLError as e:
        raise api_error(400, "BadRequest", f"error decoding YAML: {e}") from e


def _suffix(n: int = 5) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # the apimachinery rand alphabet (no vowels, no 0/1/3)
    return "".join(secrets.choice(alphabet) for _ in range(n))


class KubeEmulator:
    """Serves the emulator on 127.0.0.1:<free port> from a background thread; a context manager.

    Tests read `kubeconfig_path` into the real client; the accessors below run on the emulator
    loop (thread-safe) and emit watch events like any API write.

    `tls=True` also serves the same API over HTTPS on another loopback port (`https_url`,
    `https_port`), with a certificate for 127.0.0.1 signed by a throwaway CA (`ca_path`): what an
    in-cluster client reaches at KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT
    (`in_cluster_env()`). The kubeconfig stays plain HTTP; `write_kubeconfig` makes others.
    `service_account_token(ns, name)` gives a token that authenticates as that ServiceAccount
    (while it exists) and is authorized by the namespace's Roles and RoleBindings
    (tests/harness/kube_rbac.py); the kubeconfig's token stays allowed everything.
    """

    def __init__(
        self,
        *,
        namespaces: tuple[str, ...] = ("default",),
        gc_delay_s: float = 0.0,
        tls: bool = False,
    ):
        self.token = secrets.token_urlsafe(24)
        self.handler = EmulatorHandler(token=self.token, gc_delay_s=gc_delay_s)
        self._namespaces = namespaces
        self._tmp = tempfile.TemporaryDirectory(prefix="kube-emulator-")
        self.kubeconfig_path = str(Path(self._tmp.name) / "kubeconfig")
        self.tls = tls
        self._pki: Pki | None = None
        self.ca_path = ""  # the CA that signed the HTTPS certificate (tls=True)
        self.https_url = ""
        self.https_port = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._bugs: list[Exception] = []

    def __enter__(self) -> KubeEmulator:
        if self.tls:
            self._pki = throwaway_pki(self._tmp.name)
            self.ca_path = self._pki.ca_path
        self._thread = threading.Thread(target=self._serve, name="kube-emulator", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._failure is not None:
            raise self._failure
        for ns in self._namespaces:
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self.write_kubeconfig(self.kubeconfig_path)
        return self

    def write_kubeconfig(
        self,
        path: str | os.PathLike,
        *,
        token: str | None = None,
        https: bool = False,
        namespace: str | None = None,
    ) -> str:
        """A kubeconfig for this emulator: the admin's token (or `token`, e.g. a service
        account's), plain HTTP or HTTPS with `ca_path` as its certificate authority."""
        if https and not self.https_url:
            raise RuntimeError("KubeEmulator(tls=True) serves HTTPS; this one does not")
        cluster = (
            {"server": self.https_url, "certificate-authority": self.ca_path}
            if https
            else {"server": self.url}
        )
        Path(path).write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "emulator",
                    "clusters": [{"name": "emulator", "cluster": cluster}],
                    "users": [{"name": "tester", "user": {"token": token or self.token}}],
                    "contexts": [
                        {
                            "name": "emulator",
                            "context": {
                                "cluster": "emulator",
                                "user": "tester",
                                "namespace": namespace or self._namespaces[0],
                            },
                        }
                    ],
                }
            )
        )
        return str(path)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token for `system:serviceaccount:NAMESPACE:NAME`: authenticated while that
        ServiceAccount exists (401 before it is created and after it is deleted, as the server's
        account lookup answers), then authorized by RBAC on the namespace's Roles and
        RoleBindings. A fresh token on each call; earlier ones stay valid."""
        token = secrets.token_urlsafe(32)
        self.call(self.handler.sa_tokens.__setitem__, token, ServiceAccountUser(namespace, name))
        return token

    def in_cluster_env(self) -> dict[str, str]:
        """The environment variables a pod's client finds the API server by (tls=True)."""
        if not self.https_port:
            raise RuntimeError("KubeEmulator(tls=True) serves HTTPS; this one does not")
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.https_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.https_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{self.https_port}",
        }

    def __exit__(self, *exc_info: Any) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._tmp.cleanup()
        # server-side failures other than API errors are bugs
        if self._bugs and exc_info[0] is None:
            raise ExceptionGroup("the Kubernetes emulator failed while serving", self._bugs)

    def _serve(self) -> None:
        async def main() -> None:
            self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            try:
                async with self.handler, kmock.Server(self.handler) as server:
                    self.url = f"http://127.0.0.1:{server.port}"
                    tls_runner = await self._serve_tls() if self._pki is not None else None
                    self._started.set()
                    await self._stop.wait()
                    if tls_runner is not None:
                        await tls_runner.cleanup()
                    self._bugs = [
                        e for e in self.handler.errors if not isinstance(e, KubernetesError)
                    ]
                    if self.handler._session is not None:
                        await self.handler._session.close()
            except BaseException as e:
                self._failure = e
                self._started.set()
                raise

        asyncio.run(main())

    async def _serve_tls(self) -> aiohttp.web.ServerRunner:
        """The same handler behind an HTTPS listener on loopback (aiohttp's own server: kmock's
        test server takes no ssl context)."""
        runner = aiohttp.web.ServerRunner(
            aiohttp.web.Server(self.handler, handler_cancellation=True), shutdown_timeout=1.0
        )
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        site = aiohttp.web.SockSite(runner, sock, ssl_context=server_context(self._pki))
        await site.start()
        self.https_port = sock.getsockname()[1]
        self.https_url = f"https://127.0.0.1:{self.https_port}"
        return runner

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the emulator loop and return its result (or raise its error)."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.call(lambda: copy.deepcopy(self.handler.store.get((plural, namespace, name))))

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.call(self.handler.list, plural, namespace)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or wholly replace `obj`, status included (as a controller writing both would)."""
        plural = next(p for p, spec in RESOURCES.items() if spec[2] == obj["kind"])
        meta = obj["metadata"]
        ns = meta.get("namespace") if RESOURCES[plural][3] else None

        def put() -> dict[str, Any]:
            key = (plural, ns, meta["name"])
            if key not in self.handler.store:
                return self.handler.create(plural, ns, copy.deepcopy(obj))
            new = copy.deepcopy(obj)
            new["metadata"] = {**self.handler.store[key]["metadata"], **new["metadata"]}
            return self.handler._commit(plural, ns, meta["name"], self.handler.store[key], new)

        return self.call(put)

    def patch(
        self, plural: str, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """RFC 7386 merge patch of the object, status included."""

        def do() -> dict[str, Any]:
            old = self.handler.read(plural, namespace, name)
            return self.handler._commit(
                plural,
                namespace,
                name,
                self.handler.store[plural, namespace, name],
                merge_patch(old, patch),
            )

        return self.call(do)

    def delete(
        self, plural: str, namespace: str | None, name: str, propagation: str | None = None
    ) -> dict:
        return self.call(self.handler.delete, plural, namespace, name, propagation)

    @property
    def requests(self) -> list[SeenRequest]:
        return self.call(lambda: list(self.handler.seen))

    def proxy_to(self, namespace: str, service: str, url: str, port: str | None = None) -> None:
        """Where the services proxy sends traffic for this service (one port name, or all of them)."""
        self.call(self.handler.upstreams.__setitem__, (namespace, service, port), url)

    def add_listener(self, fn: Callable[[str, str, dict | None, dict | None], None]) -> None:
        """`fn(event_type, plural, old, new)` runs on the emulator loop after every change."""
        self.call(self.handler.listeners.append, fn)
