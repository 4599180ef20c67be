"""Service-account identities and the RBAC authorizer, for tests/harness/kube_emulator.py.

What the API server does for a request that carries a service account's token, as far as
namespaced Roles go (no ClusterRoles or ClusterRoleBindings are emulated):

- authentication: the token names `system:serviceaccount:NS:NAME`, in the groups
  `system:serviceaccounts`, `system:serviceaccounts:NS` and `system:authenticated`; a token whose
  ServiceAccount no longer exists is refused (401), as the server's lookup of the account does.
- request attributes, as apiserver's RequestInfoFactory derives them: the verb from the method
  (GET: get with a name, list without, watch with `?watch=true`; POST create; PUT update; PATCH
  patch; DELETE: delete with a name, deletecollection without), the API group, the resource
  (plural) and its subresource, the namespace (a Namespace's own name for /api/v1/namespaces/NAME)
  and the object's name (a list or a watch with `fieldSelector=metadata.name=NAME` names NAME).
- discovery (/api, /apis, /apis/GROUP/VERSION, /version, ...) is every authenticated user's
  (system:discovery, system:public-info-viewer); every other request needs a rule.
- authorization (rbac/v1's helpers): allowed when a RoleBinding in the request's namespace has a
  subject that is the user (a ServiceAccount subject's namespace defaults to the binding's, as the
  authorizer defaults it) or one of its groups, and its roleRef names a Role in that namespace with
  a rule matching the verb ("*" or listed), the API group ("*" or listed), the resource ("*",
  `plural`, `plural/sub`, or `*/sub`) and, when the rule lists resourceNames, the object's name
  (so a create, a deletecollection, or a list or watch without that field selector, which name
  none, never matches such a rule).
- refusal: 403 Forbidden, a Status worded as apiserver's responsewriters.Forbidden words it; when
  a binding points at a Role that is not there, the RBAC authorizer's reason follows
  (`RBAC: role.rbac.authorization.k8s.io "X" not found`).
- validation of Role and RoleBinding writes (rbac validation.go): rules need verbs, apiGroups and
  resources; a roleRef needs apiGroup rbac.authorization.k8s.io, kind Role or ClusterRole and a
  name, and cannot change on update; subjects need a name and a known kind.

Not emulated: ClusterRoles/ClusterRoleBindings, RBAC's escalation check on Role writes (the
emulator lets a service account that may create Roles write any rules), non-resource URL rules,
impersonation, token expiry and audiences.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from kmock import KubernetesError

RBAC_GROUP = "rbac.authorization.k8s.io"
ROLE_KINDS = ("Role", "ClusterRole")
SUBJECT_KINDS = ("ServiceAccount", "User", "Group")
TRUE_VALUES = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool


class ServiceAccountUser(NamedTuple):
    namespace: str
    name: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def groups(self) -> tuple[str, ...]:
        return (
            "system:serviceaccounts",
            f"system:serviceaccounts:{self.namespace}",
            "system:authenticated",
        )


class Attributes(NamedTuple):
    """authorizer.Attributes of a resource request."""

    verb: str
    api_group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None


def request_attributes(
    method: str,
    group: str,
    plural: str,
    namespace: str | None,
    name: str | None,
    subresource: str | None,
    query: dict[str, str],
) -> Attributes:
    method = method.upper()
    if method in ("GET", "HEAD"):
        verb = "watch" if query.get("watch") in TRUE_VALUES else ("get" if name else "list")
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = method.lower()
    if plural == "namespaces" and name and not namespace:
        namespace = name  # RequestInfoFactory: /api/v1/namespaces/NAME is in namespace NAME
    if verb in ("list", "watch") and not name:
        # RequestInfoFactory: a list or watch of one object by fieldSelector names it
        for term in (query.get("fieldSelector") or "").split(","):
            field, op, value = term.strip().partition("==" if "==" in term else "=")
            if field == "metadata.name" and op and value:  # (`metadata.name!=` is not one)
                name = value
    return Attributes(verb, group, plural, subresource or None, namespace or None, name or None)


def _resource_matches(rule: dict[str, Any], attrs: Attributes) -> bool:
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    for resource in rule.get("resources") or []:
        if resource in ("*", combined):
            return True
        if attrs.subresource and resource == f"*/{attrs.subresource}":
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: Attributes) -> bool:
    verbs, groups = rule.get("verbs") or [], rule.get("apiGroups") or []
    names = rule.get("resourceNames") or []
    return (
        ("*" in verbs or attrs.verb in verbs)
        and ("*" in groups or attrs.api_group in groups)
        and _resource_matches(rule, attrs)
        and (not names or (attrs.name is not None and attrs.name in names))
    )


def _subject_is(subject: dict[str, Any], user: ServiceAccountUser, binding_ns: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        return (subject.get("namespace") or binding_ns) == user.namespace and subject.get(
            "name"
        ) == user.name
    if kind == "User":
        return subject.get("name") == user.username
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


def authorize(
    user: ServiceAccountUser,
    attrs: Attributes,
    rolebindings: Iterable[dict[str, Any]],
    role: Any,
) -> tuple[bool, str]:
    """(allowed, the RBAC authorizer's reason). `rolebindings`: those of attrs.namespace;
    `role(name)`: that namespace's Role of that name, or None."""
    if attrs.namespace is None:  # cluster scope: only ClusterRoleBindings would apply
        return False, ""
    errors: list[str] = []
    for binding in rolebindings:
        if not any(_subject_is(s, user, attrs.namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        if ref.get("kind") != "Role":
            errors.append(f'clusterrole.{RBAC_GROUP} "{ref.get("name")}" not found')
            continue
        found = role(ref.get("name"))
        if found is None:
            errors.append(f'role.{RBAC_GROUP} "{ref.get("name")}" not found')
            continue
        if any(rule_allows(rule, attrs) for rule in found.get("rules") or []):
            return True, ""
    if not errors:
        return False, ""
    return False, "RBAC: " + (errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")


def forbidden(user: ServiceAccountUser, attrs: Attributes, reason: str = "") -> KubernetesError:
    """The Status apiserver answers a refused request with (responsewriters.Forbidden)."""
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    msg = (
        f'User "{user.username}" cannot {attrs.verb} resource "{resource}" '
        f'in API group "{attrs.api_group}" {where}'
    )
    if reason:
        msg = f"{msg}: {reason}"
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    message = (
        f'{qualified} "{attrs.name}" is forbidden: {msg}'
        if attrs.name
        else f"{qualified} is forbidden: {msg}"
    )
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.api_group:
        details["group"] = attrs.api_group
    if attrs.name:
        details["name"] = attrs.name
    return KubernetesError(status=403, reason="Forbidden", message=message, details=details)


def unauthorized() -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


# -- validation of RBAC objects (pkg/apis/rbac/validation) -------------------------------------------
def validation_errors(plural: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    if plural == "roles":
        return [
            e
            for i, rule in enumerate(obj.get("rules") or [])
            for e in _rule_errors(rule, f"rules[{i}]")
        ]
    if plural != "rolebindings":
        return []
    errors: list[str] = []
    ref = obj.get("roleRef") or {}
    if ref.get("apiGroup") != RBAC_GROUP:
        errors.append(
            f'roleRef.apiGroup: Unsupported value: "{ref.get("apiGroup", "")}": '
            f'supported values: "{RBAC_GROUP}"'
        )
    if ref.get("kind") not in ROLE_KINDS:
        errors.append(
            f'roleRef.kind: Unsupported value: "{ref.get("kind", "")}": '
            f'supported values: "Role", "ClusterRole"'
        )
    if not ref.get("name"):
        errors.append("roleRef.name: Required value")
    for i, subject in enumerate(obj.get("subjects") or []):
        path = f"subjects[{i}]"
        if not subject.get("name"):
            errors.append(f"{path}.name: Required value")
        kind = subject.get("kind")
        if kind == "ServiceAccount" and subject.get("apiGroup"):
            errors.append(
                f'{path}.apiGroup: Unsupported value: "{subject["apiGroup"]}": supported values: ""'
            )
        elif kind in ("User", "Group") and subject.get("apiGroup") not in (None, "", RBAC_GROUP):
            errors.append(
                f'{path}.apiGroup: Unsupported value: "{subject["apiGroup"]}": '
                f'supported values: "{RBAC_GROUP}"'
            )
        elif kind not in SUBJECT_KINDS:
            errors.append(
                f'{path}.kind: Unsupported value: "{kind or ""}": '
                f'supported values: "ServiceAccount", "User", "Group"'
            )
    if old is not None and (old.get("roleRef") or {}) != ref:
        go = ", ".join(
            f'{k}:"{ref.get(key, "")}"'
            for k, key in (("APIGroup", "apiGroup"), ("Kind", "kind"), ("Name", "name"))
        )
        errors.append(f"roleRef: Invalid value: rbac.RoleRef{{{go}}}: cannot change roleRef")
    return errors


def _rule_errors(rule: dict[str, Any], path: str) -> list[str]:
    errors = []
    if not rule.get("verbs"):
        errors.append(f"{path}.verbs: Required value: verbs must contain at least one value")
    if rule.get("nonResourceURLs"):
        errors.append(
            f"{path}.nonResourceURLs: Invalid value: {rule['nonResourceURLs']!r}: "
            "namespaced rules cannot apply to non-resource URLs"
        )
        return errors
    if not rule.get("apiGroups"):
        errors.append(
            f"{path}.apiGroups: Required value: resource rules must supply at least one api group"
        )
    if not rule.get("resources"):
        errors.append(
            f"{path}.resources: Required value: resource rules must supply at least one resource"
        )
    return errors


def invalid(kind: str, group: str, name: str, errors: list[str]) -> KubernetesError:
    """422 Invalid, worded as apimachinery's NewInvalid words a field.ErrorList."""
    joined = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    return KubernetesError(
        status=422,
        reason="Invalid",
        message=f'{kind}.{group} "{name}" is invalid: {joined}',
        details={"name": name, "group": group, "kind": kind},
    )
