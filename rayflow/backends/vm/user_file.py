"""backend=vm with backend.cluster_yaml: the user's own Ray cluster YAML, read and held to what
`ray up` would accept, before anything starts.

`load` reads the file; `check_raw` refuses what only the file as written shows (keys of Ray 1
files, a provider rayflow does not launch); `check_final` holds the document rayflow will write
(the file with rayflow's additions, vm.user_additions) to Ray's own checks, as `ray up` runs them
(`prepare_config`: the provider's defaults; `validate_config`: ray-schema.json and the node type
rules; `check_legacy_fields`), and to what only the user can fill in: the placeholders of Ray's
examples and of rayflow's dry runs, a GCP project, the hosts of a local cluster, a key file that
is not there. Every refusal is one ConfigError naming backend.cluster_yaml, the file and the key
inside it.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rayflow.backends.vm import internals, providers
from rayflow.backends.vm.providers.base import refuse
from rayflow.backends.vm.rules import cluster_name_problem, ssh_target_problem
from rayflow.security.redaction import REDACTED

NOT_LAUNCHED = {
    "spark": (
        "Ray on Spark's own provider "
        "(ray.util.spark starts it inside a Spark application): use backend=spark"
    ),
    "kuberay": "KubeRay's (its operator starts the pods): use backend=kuberay",
    "readonly": "a read-only provider for a cluster that is already running: use backend=attach",
}
# Keys of Ray 1 cluster files, with what Ray 2 reads instead (a top-level min_workers is the
# local provider's own and stays).
LEGACY = {
    "head_node": (
        "available_node_types and head_node_type (Ray 2 replaced head_node with node types)"
    ),
    "worker_nodes": "available_node_types (Ray 2 replaced worker_nodes with node types)",
    "initial_workers": (
        "min_workers of a node type in available_node_types (Ray removed initial_workers)"
    ),
    "autoscaling_mode": (
        "nothing: Ray removed it, the autoscaler scales on pending demand (upscaling_speed)"
    ),
    "target_utilization_fraction": (
        "upscaling_speed (Ray removed it: the autoscaler scales on pending demand)"
    ),
    "min_workers": (
        "min_workers of a node type in available_node_types "
        "(Ray ignores a top-level min_workers but for provider local)"
    ),
}
# Placeholders as Ray's examples and guides write them (YOUR_HEAD_NODE_HOSTNAME,
# WORKER_NODE_1_HOSTNAME, `...` in a list, <project_id>), rayflow's own (<fill in: backend.KEY>) and
# what a dry run masks (***).
PLACEHOLDER = re.compile(
    r"YOUR_[A-Z0-9_]+|[A-Z0-9_]*HOSTNAME[A-Z0-9_]*|TYPICALLY_[A-Z0-9_]+|\.\.\.|<[^<>]+>|"
    + re.escape(REDACTED)
    + r"|TODO\b.*|CHANGE_?ME|REPLACE_?ME"
)


def load(path: str) -> dict:
    """The file as a mapping (YAML anchors resolved): one ConfigError when it is not there, not
    YAML, or not a mapping."""
    file = Path(os.path.expanduser(path))
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise refuse(path, "", "no such file (the Ray cluster YAML `ray up` would take)") from None
    except IsADirectoryError:
        raise refuse(path, "", "is a directory, not a Ray cluster YAML") from None
    except (OSError, UnicodeDecodeError) as err:
        raise refuse(path, "", f"cannot be read: {type(err).__name__}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise refuse(path, where, f"not YAML ({problem})") from None
    if not isinstance(doc, dict):
        raise refuse(
            path,
            "",
            "is not a Ray cluster YAML: a mapping of keys (cluster_name, provider, ...) "
            f"was expected, got {type(doc).__name__}",
        )
    return doc


def provider_type(doc: Mapping, path: str) -> str:
    provider = doc.get("provider")
    if not isinstance(provider, Mapping) or not isinstance(provider.get("type"), str):
        raise refuse(
            path,
            "provider",
            "missing or without a `type` (Ray requires it: aws, gcp, azure, local with head_ip and "
            "worker_ips, or fake_multinode)",
        )
    return provider["type"]


def check_raw(doc: Mapping, path: str) -> str:
    """The file as written: no key of Ray 1 files, a provider rayflow launches. Returns its
    type."""
    for key, replacement in LEGACY.items():
        if (
            key in doc
            and doc[key] not in (None, {}, [])
            and not (key == "min_workers" and _is_local(doc))
        ):
            raise refuse(
                path, key, f"is a key of outdated (Ray 1) cluster files; use {replacement}"
            )
    # it names files (state, Ray's /tmp/ray/cluster-NAME.*)
    problem = cluster_name_problem(doc["cluster_name"]) if "cluster_name" in doc else None
    if problem:
        raise refuse(path, "cluster_name", problem)
    kind = provider_type(doc, path)
    if kind not in providers.LAUNCHED:
        why = (
            NOT_LAUNCHED.get(kind)
            or "rayflow starts aws, gcp, azure, local and fake_multinode clusters from a file"
        )
        raise refuse(path, "provider.type", f"{kind!r} is not a provider rayflow launches: {why}")
    return kind


def _is_local(doc: Mapping) -> bool:
    """Whether the file's provider is your hosts (provider local): a top-level min_workers is its
    own."""
    section = doc.get("provider")
    return isinstance(section, Mapping) and providers.get(section.get("type")).hosts


def placeholders(doc: Mapping | list, prefix: str = "") -> list[str]:
    """Keys (dotted) whose value is a placeholder, outside the commands (shell text)."""
    found = []
    items = doc.items() if isinstance(doc, Mapping) else enumerate(doc)
    for key, value in items:
        where = (
            f"{prefix}.{key}"
            if prefix and isinstance(doc, Mapping)
            else (f"{prefix}[{key}]" if prefix else str(key))
        )
        if isinstance(key, str) and (key.endswith("_commands") or key == "metadata"):
            continue
        if isinstance(value, (Mapping, list)):
            found += placeholders(value, where)
        elif isinstance(value, str) and PLACEHOLDER.fullmatch(value.strip()):
            found.append(where)
    return found


def _unfilled(value: Any) -> bool:
    return value is None or (
        isinstance(value, str)
        and (
            not value.strip()
            or value.strip().lower() in ("null", "none")
            or PLACEHOLDER.fullmatch(value.strip()) is not None
        )
    )


def check_filled(doc: Mapping, path: str, kind: str) -> None:
    """What only the user can fill in: refused naming the first key left as a placeholder, the
    provider's own first (its `file_keys`, then its `check_file`)."""
    provider, section = providers.get(kind), doc["provider"]
    for key, what in provider.file_keys:
        if _unfilled(section.get(key)):
            raise refuse(path, f"provider.{key}", f"{_shown(section.get(key))}: {what}")
    provider.check_file(doc, path)
    for where in placeholders(doc):
        value = _at(doc, where)
        raise refuse(path, where, f"{value!r} is a placeholder: fill it in")


def _shown(value: Any) -> str:
    return "missing" if value is None else f"{value!r} is a placeholder"


def _at(doc: Any, where: str) -> Any:
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", where):
        doc = doc[int(part[1:-1])] if part.startswith("[") else doc[part]
    return doc


def check_final(doc: Mapping, path: str, kind: str) -> dict:
    """The document rayflow writes, held to Ray's checks as `ray up` runs them; returns it as
    Ray prepares it (its provider's defaults filled in). fake_multinode: `validate_config` on the
    document as written, which is what its autoscaler reads (Ray's prepare_config for it needs an
    example.yaml the wheel lacks)."""
    import click
    import jsonschema

    provider = providers.get(kind)
    check_filled(doc, path, kind)
    bad_target = ssh_target_problem(doc)  # hosts and user become ssh destinations
    if bad_target:
        raise refuse(path, *bad_target)
    try:
        with (
            _quiet(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            prepared = dict(doc) if provider.in_place else internals.prepare_config(dict(doc))
            internals.validate_config(_with_resources_left_to_ray_up(prepared, provider))
            if not provider.in_place:
                internals.check_legacy_fields(prepared)
    except (jsonschema.ValidationError, ValueError, RuntimeError, click.ClickException) as err:
        where, message = _ray_message(err)
        raise refuse(path, where, f"Ray refuses it: {message}") from None
    if provider.in_place:
        _check_in_place(doc, path, provider)
    else:
        key_file = (doc.get("auth") or {}).get("ssh_private_key")
        if isinstance(key_file, str) and not os.access(os.path.expanduser(key_file), os.R_OK):
            # the path stays out of the message: secret-named keys are masked everywhere
            raise refuse(
                path,
                "auth.ssh_private_key",
                "cannot be read: no such file, or no permission to read it",
            )
    return prepared


def _check_in_place(doc: Mapping, path: str, provider: providers.Provider) -> None:
    """What Ray's fake provider needs of the file: its head node type's name, no node updaters."""
    if doc.get("head_node_type") != provider.head_type:
        raise refuse(
            path,
            "head_node_type",
            f"must be {provider.head_type!r} with provider {provider.name} "
            "(Ray's fake provider names its head so)",
        )
    if doc["provider"].get("disable_node_updaters") is not True:
        raise refuse(
            path,
            "provider.disable_node_updaters",
            f"must be true with provider {provider.name} "
            "(its nodes are processes here, not SSH hosts)",
        )


def _with_resources_left_to_ray_up(prepared: dict, provider: providers.Provider) -> dict:
    """aws: `ray up` fills a node type's missing `resources` from EC2 before it validates (what
    rayflow.backends.vm.providers.aws could not fill here, the API not answering): validated as
    filled."""
    if not provider.fills_resources:
        return prepared
    checked = copy.deepcopy(prepared)
    for node_type in (checked.get("available_node_types") or {}).values():
        if isinstance(node_type, dict):
            node_type.setdefault("resources", {})
    return checked


@contextlib.contextmanager
def _quiet():
    """Ray's launcher logs what it fills in (INFO lines on stderr): a check prints nothing."""
    log = logging.getLogger("ray.autoscaler")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def _ray_message(err: BaseException) -> tuple[str, str]:
    message = (
        getattr(err, "message", None)
        or (err.format_message() if hasattr(err, "format_message") else None)
        or str(err)
        or type(err).__name__
    )
    path = getattr(err, "absolute_path", None)
    where = ".".join(str(p) for p in path) if path else ""
    text = " ".join(str(message).split())
    return where, text[:297] + "..." if len(text) > 300 else text
