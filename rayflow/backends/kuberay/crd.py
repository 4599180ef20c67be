"""Validate a RayCluster / RayJob manifest against KubeRay's own CRD schema, the way the
Kubernetes API server would, without an API server.

The schemas are the openAPIV3Schema of version v1 of KubeRay v1.7.0's CRDs
(crds/README.md). Plain JSON-Schema validation would pass manifests the API server
silently changes, so this walker implements the structural-schema semantics itself:

* unknown fields: an object schema with `properties` keeps only those; anything else is pruned
  by the server (or refused under strict field validation) and is an error here. An object
  schema with neither `properties` nor `additionalProperties` keeps nothing, unless it says
  `x-kubernetes-preserve-unknown-fields: true`.
* a null on a field that is not `nullable` is pruned, then the field's `default` (deep-copied)
  fills every absent field, and only then is `required` checked: workerGroupSpecs[].minReplicas
  and maxReplicas are required yet may be left out, because they have defaults.
* `x-kubernetes-int-or-string`, types (a bool is not an integer, 1.5 is not either), `nullable`,
  `enum`, minimum/maximum (exclusive too), min/maxLength, min/maxItems, min/maxProperties,
  `format` int32/int64 ranges and date-time, `pattern` (Go RE2, translated so that Python's `re`
  matches the same strings), anyOf/oneOf/allOf, and the uniqueness that
  `x-kubernetes-list-type: map | set` demands.
* the root `metadata` is validated as Kubernetes validates ObjectMeta (the schema only says
  `type: object`): kuberay.metadata.
* embedded `metadata` (pod templates, headService, volumeClaimTemplate): KubeRay generates its
  CRDs with `generateEmbeddedObjectMeta=true`, so these are plain objects declaring only
  annotations, finalizers, labels, name, namespace. The API server treats them as ordinary
  fields: anything else there (generateName, creationTimestamp: null, ownerReferences, ...) is
  pruned, hence an error here; label syntax there is NOT checked by the API server for a
  custom resource (the Pod the operator creates from it is checked later), nor here.
* `status` is the operator's (status subresource: the server ignores it on create): an error.

NOT evaluated: the CEL rules (`x-kubernetes-validations`). In v1.7.0 they guard
spec.managedBy (immutable; 'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'),
gcsFaultToleranceOptions.backend (immutable), and RayJob's deletionStrategy (onSuccess and
onFailure together, or deletionRules, never both) and each deletionRules[].condition (jobStatus
or jobDeploymentStatus, exactly one). rayflow checks the operator's rules separately
(kuberay_checks). `x-kubernetes-map-type` and list types `atomic` change merging, not validity.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
import re
from importlib import resources
from typing import Any

from rayflow.backends.kuberay.metadata import describe, join_path, object_meta_errors

KUBERAY_VERSION = "v1.7.0"
API_VERSION = "ray.io/v1"
_SCHEMA_FILES = {"RayCluster": "raycluster.v1.json.gz", "RayJob": "rayjob.v1.json.gz"}

_TYPE_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
}
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})\Z")
_EMBEDDED_META = "annotations, finalizers, labels, name, namespace"


@functools.cache
def _schema(kind: str) -> dict:
    data = (resources.files("rayflow.backends.kuberay") / "crds" / _SCHEMA_FILES[kind]).read_bytes()
    return json.loads(gzip.decompress(data))


@functools.cache
def _python_regex(go_pattern: str) -> re.Pattern:
    """Compile a Go RE2 pattern so that `re` accepts exactly the strings Go's MatchString does.

    Differences that matter: Go's `$` (no multiline flag) matches only at the very end, Python's
    also before a final newline, so it becomes `\\Z`; RE2's \\d, \\w, \\s are ASCII (re.ASCII).
    RE2 constructs with no `re` equivalent are refused rather than silently misread.
    """
    out, i, in_class = [], 0, False
    while i < len(go_pattern):
        char = go_pattern[i]
        if char == "\\":
            if go_pattern[i + 1 : i + 2] in ("p", "P", "z", "Q", "E", "C"):
                raise ValueError(
                    f"RE2 pattern {go_pattern!r}: \\{go_pattern[i + 1]} has no Python equivalent"
                )
            out.append(go_pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if go_pattern.startswith("[:", i):
                raise ValueError(
                    f"RE2 pattern {go_pattern!r}: POSIX classes mean something else to Python"
                )
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # A `]` right after `[` or `[^` is a literal in both dialects, not the class's end.
            prefix = (
                "[^]"
                if go_pattern.startswith("[^]", i)
                else "[]"
                if go_pattern.startswith("[]", i)
                else ""
            )
            if prefix:
                out.append(prefix)
                i += len(prefix)
                continue
        elif char == "$":
            char = r"\Z"
        elif go_pattern.startswith("(?", i) and not go_pattern.startswith(("(?:", "(?P<"), i):
            raise ValueError(f"RE2 pattern {go_pattern!r}: inline flags are not translated")
        out.append(char)
        i += 1
    return re.compile("".join(out), re.ASCII)


def _is_type(value, type_name: str) -> bool:
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(
        value, {"string": str, "boolean": bool, "array": list, "object": dict}[type_name]
    )


def _same(a, b) -> bool:
    # enum membership by JSON value: True must not equal 1, nor 1 equal 1.0's bool cousin.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class _Walker:
    """Walks a value and its schema together, collecting errors and returning the defaulted copy.

    In an anyOf/oneOf/allOf branch (`in_branch`) the schema only adds value checks: it neither
    prunes unknown fields nor defaults (structural schemas forbid both there).
    """

    def __init__(self, kind: str, in_branch: bool = False):
        self.kind, self.in_branch = kind, in_branch
        self.errors: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def walk(self, value, schema: dict, path: str):
        if value is None:
            if not schema.get("nullable"):
                self.error(path, "must not be null")
            return None
        if not self._type_ok(value, schema, path):
            return copy.deepcopy(value)
        if isinstance(value, dict):
            value = self._object(value, schema, path)
        elif isinstance(value, list):
            value = self._array(value, schema, path)
        else:
            self._scalar(value, schema, path)
        if "enum" in schema and not any(_same(value, allowed) for allowed in schema["enum"]):
            self.error(path, f"{value!r} is not one of {', '.join(map(repr, schema['enum']))}")
        self._combinations(value, schema, path)
        return value

    def _type_ok(self, value, schema: dict, path: str) -> bool:
        if schema.get("x-kubernetes-int-or-string"):
            expected, ok = (
                "an integer or a string",
                _is_type(value, "integer") or isinstance(value, str),
            )
        elif "type" in schema:
            expected, ok = _TYPE_NAMES[schema["type"]], _is_type(value, schema["type"])
        else:
            return True
        if not ok:
            self.error(path, f"must be {expected}, got {describe(value)}")
        return ok

    def _object(self, obj: dict, schema: dict, path: str) -> dict:
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        out = {}
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if value is None and sub is not None and not sub.get("nullable") and not self.in_branch:
                continue  # the API server prunes a null a field may not hold (then defaults it)
            out[key] = value
        if not self.in_branch:
            for key, sub in props.items():
                if key not in out and "default" in sub:
                    out[key] = copy.deepcopy(sub["default"])
        for key in schema.get("required", []):
            if key not in out:
                self.error(join_path(path, key), "required field missing")
        keeps_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or self.in_branch
        for key in list(out):
            child = join_path(path, key)
            if key in props:
                out[key] = self.walk(out[key], props[key], child)
            elif isinstance(extra, dict):
                out[key] = self.walk(out[key], extra, child)
            elif not keeps_unknown:
                self.error(child, self._unknown_field_message(path))
                out[key] = copy.deepcopy(out[key])
            else:
                out[key] = copy.deepcopy(out[key])
        self._bounds(len(out), schema, "minProperties", "maxProperties", "fields", path)
        return out

    def _unknown_field_message(self, parent_path: str) -> str:
        if parent_path.endswith("metadata"):
            return (
                f"unknown field (embedded metadata in KubeRay {KUBERAY_VERSION}'s {self.kind} "
                f"keeps only {_EMBEDDED_META}; the API server would drop it)"
            )
        return f"unknown field (KubeRay {KUBERAY_VERSION}'s {self.kind} has no such field)"

    def _array(self, items: list, schema: dict, path: str) -> list:
        item_schema = schema.get("items", {})
        out = [self.walk(item, item_schema, f"{path}[{i}]") for i, item in enumerate(items)]
        self._bounds(len(out), schema, "minItems", "maxItems", "items", path)
        list_type = schema.get("x-kubernetes-list-type")
        if list_type in ("map", "set"):
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen: dict[str, int] = {}  # an entry's identity -> its first index
            for i, item in enumerate(out):
                if list_type == "map" and isinstance(item, dict):
                    identity = json.dumps([item.get(key) for key in keys])
                    what = ", ".join(f"{key}={item.get(key)!r}" for key in keys)
                else:
                    identity, what = json.dumps(item, sort_keys=True), repr(item)
                if identity in seen:
                    self.error(
                        f"{path}[{i}]", f"duplicate entry ({what}, as {path}[{seen[identity]}])"
                    )
                seen.setdefault(identity, i)
        return out

    def _scalar(self, value, schema: dict, path: str) -> None:
        if isinstance(value, str):
            pattern = schema.get("pattern")
            if pattern and not _python_regex(pattern).search(value):
                what = "a Kubernetes quantity" if pattern == _QUANTITY else f"matching {pattern}"
                self.error(path, f"{value!r} is not {what}")
            self._bounds(len(value), schema, "minLength", "maxLength", "characters", path)
            if schema.get("format") == "date-time" and not _DATE_TIME.match(value):
                self.error(path, f"{value!r} is not an RFC 3339 date-time")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            bounds = _INT_RANGES.get(str(schema.get("format")))
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                self.error(path, f"{value} is out of the {schema['format']} range")
            if "minimum" in schema and (
                value <= schema["minimum"]
                if schema.get("exclusiveMinimum")
                else value < schema["minimum"]
            ):
                self.error(path, f"{value} is below the minimum {schema['minimum']}")
            if "maximum" in schema and (
                value >= schema["maximum"]
                if schema.get("exclusiveMaximum")
                else value > schema["maximum"]
            ):
                self.error(path, f"{value} is above the maximum {schema['maximum']}")

    def _bounds(
        self, size: int, schema: dict, low_key: str, high_key: str, unit: str, path: str
    ) -> None:
        if low_key in schema and size < schema[low_key]:
            self.error(path, f"has {size} {unit}, fewer than {schema[low_key]}")
        if high_key in schema and size > schema[high_key]:
            self.error(path, f"has {size} {unit}, more than {schema[high_key]}")

    def _branch_errors(self, value, branch: dict, path: str) -> list[str]:
        walker = _Walker(self.kind, in_branch=True)
        walker.walk(value, branch, path)
        return walker.errors

    def _combinations(self, value, schema: dict, path: str) -> None:
        for branch in schema.get("allOf", []):
            self.errors += self._branch_errors(value, branch, path)
        if "anyOf" in schema:
            results = [self._branch_errors(value, branch, path) for branch in schema["anyOf"]]
            if all(results):
                self.error(
                    path, "matches none of the allowed forms: " + "; ".join(r[0] for r in results)
                )
        if "oneOf" in schema:
            matching = sum(
                not self._branch_errors(value, branch, path) for branch in schema["oneOf"]
            )
            if matching != 1:
                self.error(path, f"must match exactly one allowed form, matches {matching}")


def _kind_error(manifest) -> str | None:
    if not isinstance(manifest, dict):
        return f"<manifest>: must be an object, got {describe(manifest)}"
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    if api_version != API_VERSION or kind not in _SCHEMA_FILES:
        return (
            f"apiVersion/kind: expected apiVersion {API_VERSION} with kind RayCluster or RayJob, "
            f"got apiVersion {api_version!r} kind {kind!r}"
        )
    return None


def _walk_manifest(manifest: dict) -> tuple[dict, list[str]]:
    kind = manifest["kind"]
    walker = _Walker(kind)
    out, properties = {}, _schema(kind)["properties"]
    for key, value in manifest.items():
        if key == "metadata":
            walker.errors += object_meta_errors(value)
            out[key] = copy.deepcopy(value)
        elif key == "status":
            walker.error(
                "status", "set by the operator; the API server ignores it (status subresource)"
            )
            out[key] = copy.deepcopy(value)
        elif key in properties:
            out[key] = walker.walk(value, properties[key], key)
        else:
            walker.error(key, walker._unknown_field_message(""))
            out[key] = copy.deepcopy(value)
    return out, walker.errors


def schema_errors(manifest: Any) -> list[str]:
    """Every way the manifest breaks KubeRay's CRD schema, one "<path>: <message>" line each.

    Empty means the API server would store it as written (plus defaults). CEL rules are not
    evaluated (see the module docstring). The manifest is not modified.
    """
    kind_error = _kind_error(manifest)
    if kind_error:
        return [kind_error]
    return _walk_manifest(manifest)[1]


def with_defaults(manifest: dict) -> dict:
    """A copy of the manifest with the CRD schema's defaults applied, as the API server stores
    it (nulls on non-nullable fields pruned too). Unknown fields are left for schema_errors."""
    kind_error = _kind_error(manifest)
    if kind_error:
        raise ValueError(kind_error)
    return _walk_manifest(manifest)[0]
