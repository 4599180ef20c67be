"""The root `metadata` of a KubeRay manifest, checked the way the Kubernetes API server checks
ObjectMeta for every object (the CRD schema only says `type: object` and leaves it to the server):
known fields, name or generateName (DNS-1123 subdomain), namespace (DNS-1123 label), label keys
and values, annotation keys and total size, finalizers.

Also the two helpers every "<path>: <message>" line of kuberay_schema is written with
(`join_path`, `describe`), so that metadata errors read like the rest.
"""

from __future__ import annotations

import re
from typing import Any

from rayflow.backends.kuberay.keys import is_dns_label

# ObjectMeta of the root object: the CRD schema leaves it to the API server, which checks it
# as for every object (k8s.io/apimachinery validation: ValidateObjectMetaAccessor with
# NameIsDNSSubdomain for custom resources).
_OBJECT_META_FIELDS = {
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
}
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_ANNOTATIONS_MAX_BYTES = 256 * 1024


def join_path(path: str, key: str) -> str:
    # Keys such as label names hold dots and slashes: bracket them so the path stays readable.
    key_text = f"[{key}]" if re.search(r"[./\[\]\s]", key) else key
    if not path:
        return key_text
    return path + key_text if key_text.startswith("[") else f"{path}.{key_text}"


def describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _is_dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and bool(_DNS_SUBDOMAIN.match(text))


def _is_qualified_name(text: str) -> bool:
    prefix, _, name = text.rpartition("/")
    if "/" in text and not _is_dns_subdomain(prefix):
        return False
    return len(name) <= 63 and bool(_QUALIFIED_NAME_PART.match(name))


def _shape_errors(meta: dict) -> tuple[list[str], dict[str, dict]]:
    """ObjectMeta's fields and their types; with the labels and annotations that are mappings
    (a bad one read as empty)."""
    errors = [
        f"{join_path('metadata', key)}: unknown field (not a field of Kubernetes ObjectMeta)"
        for key in meta
        if key not in _OBJECT_META_FIELDS
    ]
    string_maps = {key: meta[key] for key in ("labels", "annotations") if key in meta}
    for key, value in [(k, meta[k]) for k in ("name", "generateName", "namespace") if k in meta]:
        if not isinstance(value, str):
            errors.append(f"metadata.{key}: must be a string, got {describe(value)}")
    for key, mapping in string_maps.items():
        if not isinstance(mapping, dict):
            errors.append(f"metadata.{key}: must be an object, got {describe(mapping)}")
            string_maps[key] = {}
            continue
        errors += [
            f"{join_path('metadata.' + key, k)}: must be a string, got {describe(v)}"
            for k, v in mapping.items()
            if not isinstance(v, str)
        ]
    return errors, string_maps


def _name_errors(meta: dict) -> list[str]:
    """The name (or generateName) and the namespace, as DNS-1123 names."""
    errors = []
    name, generate_name = meta.get("name"), meta.get("generateName")
    if not name and not generate_name:
        errors.append("metadata.name: required field missing (or set metadata.generateName)")
    if name and not _is_dns_subdomain(name):
        errors.append(
            f"metadata.name: {name!r} is not a DNS-1123 subdomain (lowercase a-z, 0-9, '-', '.')"
        )
    # The server appends random characters to generateName; a trailing '-' is fine.
    if generate_name and not _is_dns_subdomain(
        generate_name[:-1] + "a" if generate_name.endswith("-") else generate_name
    ):
        errors.append(
            f"metadata.generateName: {generate_name!r} is not a DNS-1123 subdomain prefix"
        )
    namespace = meta.get("namespace")
    if namespace and not is_dns_label(namespace):
        errors.append(f"metadata.namespace: {namespace!r} is not a DNS-1123 label")
    return errors


def _label_errors(labels: dict, annotations: dict) -> list[str]:
    """Label keys and values, annotation keys and their total size."""
    errors = []
    for key, value in labels.items():
        if not _is_qualified_name(key):
            errors.append(f"{join_path('metadata.labels', key)}: {key!r} is not a qualified name")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(
                f"{join_path('metadata.labels', key)}: {value!r} is not a label value (<= 63 of "
                "A-Za-z0-9-_.)"
            )
    errors += [
        f"{join_path('metadata.annotations', key)}: {key!r} is not a qualified name"
        for key in annotations
        if not _is_qualified_name(key.lower())
    ]
    if sum(len(k) + len(v) for k, v in annotations.items()) > _ANNOTATIONS_MAX_BYTES:
        errors.append(f"metadata.annotations: longer than {_ANNOTATIONS_MAX_BYTES} bytes in total")
    return errors


def object_meta_errors(meta: Any) -> list[str]:
    """Every way the root `metadata` breaks Kubernetes' ObjectMeta rules, one "<path>: <message>"
    each. The values are checked only once the fields and their types are right."""
    if not isinstance(meta, dict):
        return [f"metadata: must be an object, got {describe(meta)}"]
    errors, string_maps = _shape_errors(meta)
    if errors:
        return errors
    errors = _name_errors(meta)
    errors += _label_errors(string_maps.get("labels", {}), string_maps.get("annotations", {}))
    finalizers = meta.get("finalizers", [])
    if not isinstance(finalizers, list) or not all(
        isinstance(f, str) and _is_qualified_name(f) for f in finalizers
    ):
        errors.append("metadata.finalizers: must be a list of qualified names")
    return errors
