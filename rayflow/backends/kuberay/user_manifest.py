"""backend=kuberay backend.manifest=PATH: the user's own RayCluster or RayJob file, read.

`read` loads every YAML document of the file (`yaml.safe_load_all`: anchors and aliases are
resolved, tags that build Python objects are refused), keeps the one RayCluster or RayJob and
names the others (ConfigMaps, Secrets, Services, ... as KubeRay's samples hold them): rayflow
applies exactly one object, and what it did not apply it must not delete, so the rest is the
user's to `kubectl apply`. Each refusal is one ConfigError of `backend.manifest` naming the file
and the document or field. Pure: no `kubernetes` import, nothing applied.

`ray.io/v1alpha1`: KubeRay v1.7.0's CRDs still serve it (served: true, storage: false, no
conversion webhook), so the API server itself would store such a document as ray.io/v1 by
rewriting its apiVersion; rayflow does the same and says so in a note, then validates it
against the v1 schema like any other manifest.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from rayflow.errors import ConfigError

KEY = "backend.manifest"
RAY_KINDS = ("RayCluster", "RayJob")
API_VERSION, V1ALPHA1 = "ray.io/v1", "ray.io/v1alpha1"
# Text a template leaves for someone to fill in: ${var} (envsubst, Terraform; Kubernetes itself
# expands only $(VAR) in env values), <your-value>, CHANGE_ME. Shell scripts use ${VAR} and <<EOF
# for real, so what a container or the job runs (command, args, entrypoint, ...) is not searched.
PLACEHOLDER = re.compile(
    r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|<[a-z][a-z0-9 _.-]*>|\b(?:CHANGE_?ME|REPLACE_?ME|FILL_?ME_?IN)\b"
)
SCRIPT_FIELDS = frozenset({"command", "args", "entrypoint", "runtimeEnvYAML", "script"})


class UserManifest(NamedTuple):
    path: str
    document: dict  # the RayCluster or RayJob, as read (a v1alpha1 apiVersion rewritten)
    left_out: tuple[str, ...]  # "Kind/name" of every other document, in file order
    notes: tuple[str, ...]

    @property
    def what(self) -> str:
        return describe(self.document)


def describe(doc: Any) -> str:
    if not isinstance(doc, dict):
        return f"a {type(doc).__name__}"
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = meta.get("name") or (
        f"{meta['generateName']}*" if meta.get("generateName") else "<no name>"
    )
    return f"{doc.get('kind') or '<no kind>'}/{name}"


def refuse(path: str, message: str) -> ConfigError:
    return ConfigError(KEY, f"{path}: {message}")


def read(path: str) -> UserManifest:
    """The file's one RayCluster/RayJob and what else it holds; ConfigError (one line) when it
    cannot be used. Cached by the file's path, size and modification time (check, render and
    start each ask): a copy is returned, so callers may change it."""
    expanded = os.path.expanduser(str(path))
    try:
        stat = os.stat(expanded)
    except FileNotFoundError:
        raise refuse(path, "no such file (the RayCluster or RayJob manifest to apply)") from None
    except OSError as err:
        raise refuse(path, f"cannot be read: {err.strerror}") from None
    cached = _read(expanded, stat.st_size, stat.st_mtime_ns, str(path))
    return cached._replace(document=copy.deepcopy(cached.document))


def _documents(expanded: str, shown: str) -> list[dict]:
    """The file's YAML documents (empty ones dropped), each a Kubernetes object."""
    try:
        text = Path(expanded).read_text()
    except IsADirectoryError:
        raise refuse(shown, "is a folder, not a manifest file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise refuse(shown, f"cannot be read: {getattr(err, 'strerror', None) or err}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise refuse(shown, f"is not YAML: {problem}{where}") from None
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict):
            raise refuse(
                shown,
                f"document {index + 1} is {describe(doc)}, not a Kubernetes object (kind, "
                "metadata, ...)",
            )
    return documents


def _ray_document(documents: list[dict], shown: str) -> dict:
    """The one RayCluster or RayJob among the documents."""
    ray = [d for d in documents if d.get("kind") in RAY_KINDS]
    if not ray:
        found = ", ".join(describe(d) for d in documents) or "nothing"
        raise refuse(shown, f"holds no RayCluster or RayJob document (found: {found})")
    if len(ray) > 1:
        raise refuse(
            shown,
            f"holds {len(ray)} RayCluster/RayJob documents "
            f"({', '.join(describe(d) for d in ray)}): rayflow applies exactly one; keep the one "
            "to run in a file of its own",
        )
    return ray[0]


def _api_version(document: dict, shown: str) -> list[str]:
    """ray.io/v1, v1alpha1 rewritten to it (with a note); any other refused."""
    api_version = document.get("apiVersion")
    if api_version == V1ALPHA1:
        document["apiVersion"] = API_VERSION
        return [
            f"backend.manifest: {describe(document)} is apiVersion {V1ALPHA1}; applied as "
            f"{API_VERSION}, as KubeRay v1.7.0's API server stores it (same fields; set "
            "apiVersion: ray.io/v1 in the file to drop this note)"
        ]
    if api_version != API_VERSION:
        raise refuse(
            shown,
            f"{describe(document)}: apiVersion {api_version!r} is not one KubeRay v1.7.0 serves "
            f"(use {API_VERSION}; {V1ALPHA1} is converted)",
        )
    return []


@functools.lru_cache(maxsize=16)
def _read(expanded: str, size: int, mtime: int, shown: str) -> UserManifest:
    documents = _documents(expanded, shown)
    document, notes = _ray_document(documents, shown), []
    left_out = tuple(describe(d) for d in documents if d is not document)
    if left_out:
        notes.append(
            f"backend.manifest: rayflow applies only {describe(document)} of {shown}; it leaves "
            f"{', '.join(left_out)} to you: kubectl apply them first (rayflow neither applies nor "
            "deletes them)"
        )
    notes += _api_version(document, shown)
    for where, value, found in placeholders(document):
        raise refuse(
            shown,
            f"{describe(document)}: {where}: {value!r} holds the placeholder {found}: fill it in "
            "(rayflow applies the manifest as it is)",
        )
    return UserManifest(shown, document, left_out, tuple(notes))


def placeholders(value: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(field path, value, placeholder) for each string still holding template placeholders."""
    out: list[tuple[str, str, str]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            if key not in SCRIPT_FIELDS:
                out += placeholders(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            name = child.get("name") if isinstance(child, dict) else None
            out += placeholders(child, f"{path}[{name if isinstance(name, str) else index}]")
    elif isinstance(value, str) and (match := PLACEHOLDER.search(value)):
        out.append((path, value, match.group(0)))
    return out
