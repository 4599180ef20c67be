"""The config reference (docs/reference/config.md), from the schema and the shipped YAML defaults:
one table a model, every model from where it is registered (the root's from rayflow.schema, each
backend's and workload's from its registry, the launcher's from rayflow.launcher.keys). Apart
from the architecture page's blocks (rayflow.reference.architecture): a wheel can print it."""

from __future__ import annotations

import typing
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel

from rayflow.backends import REGISTRY as BACKENDS
from rayflow.backends import backend_keys
from rayflow.launcher.keys import Launcher
from rayflow.schema.kinds import Kind
from rayflow.schema.root import Compute, Mlflow, NoTracking, Root
from rayflow.workloads import REGISTRY as WORKLOADS
from rayflow.workloads import workload_keys
from rayflow.workloads.keys import Shipped

GROUPS_TABLE = (
    ("`backend`", "`local` (default), `attach`, `spark`, `vm`, `kuberay`", "where Ray runs"),
    (
        "`workload`",
        "`cifar` (default), `ddp`, `ppo`; `tune`, `train`, `rllib`",
        "what runs: a preset, or your own code ([Your own workload](../workloads/tune.md)); "
        "`cifar` and `ddp` also bring the [`data`](#data) section",
    ),
    (
        "`compute`",
        "`cpu` (default), `gpu`, `auto`",
        "the device trials use; `gpu` is refused without a CUDA device, `auto` uses GPUs when "
        "the cluster has them",
    ),
    ("`tracking`", "`mlflow` (default), `none`", "where results go"),
)

HEADER = (
    """# Config reference

Generated from the schema (pydantic models: each key's kind, range and meaning, the rules between
keys as validators beside them; the root's in `rayflow/schema/`, each backend's and workload's
beside its code) and the shipped defaults (`conf/`):
`python -m rayflow.reference > docs/reference/config.md`. Hydra composes `conf/config.yaml`
from four groups; every key can be set on the command line (`key=value`), and a value that is not
of its key's kind, or breaks a rule, is refused before anything starts with one line naming the
key ([Everyday use](../usage.md#bad-input)).

| group | options | what it chooses |
| --- | --- | --- |
"""
    + "".join(f"| {group} | {options} | {what} |\n" for group, options, what in GROUPS_TABLE)
    + """
The last table is not rayflow's own config: it is `hydra/launcher=rayflow`, the launcher any Hydra
application can use for its sweeps ([Hydra launcher](../launcher.md)).
"""
)


# What a backend's table alone does not say: where the rest of its checks happen.
NOTES = {
    "vm": (
        "The cluster YAML rendered from these keys is checked with Ray's own validation, and "
        "`ssh`, `rsync` and the key file with provider=local, aws or gcp; keys of outdated "
        "cluster YAMLs (`initial_workers`, a top-level `instance_type`, ...) are refused naming "
        "what replaced them ([its page](../backends/vm.md#keys)). With `backend.cluster_yaml` "
        "your own file is the cluster: the keys that only render one are refused beside it, and "
        "the others apply over it where they differ from their default ([your own cluster "
        "YAML](../backends/vm.md))."
    ),
    "kuberay": (
        "`+backend.worker_groups.NAME={cpu: ..., memory: ...}` adds a worker group, with the keys "
        "of `backend.worker_groups.cpu` (the others may be left out). The manifest rendered from "
        "these keys, `backend.overrides` included, is checked with KubeRay's CRD schema and the "
        "operator's own rules ([its page](../backends/kuberay.md#keys)). With `backend.manifest` "
        "your own RayCluster or RayJob is the cluster, checked the same way; the keys apply over "
        "it where they differ from their default ([your own manifest](../backends/kuberay.md))."
    ),
}

LAUNCHER_NOTE = (
    "Set in a Hydra application's sweep as `hydra.launcher.KEY=value` "
    "(`hydra_plugins/rayflow_launcher/rayflow.yaml`). Every key of the chosen backend goes beside "
    "`backend`, without its `backend.` prefix: `hydra.launcher.backend=spark "
    "hydra.launcher.max_worker_nodes=4` is the cluster of `backend=spark "
    "backend.max_worker_nodes=4` (the tables above); left null, a key keeps that backend's "
    "default, and a key of another backend is refused naming whose it is. A job's own config may "
    "override `resources` under the section `job_resources_key` names ([per-job "
    "resources](../launcher.md#per-job-resources))."
)


def _kind_words(field) -> str:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a section"
    for meta in field.metadata:
        if isinstance(meta, Kind):
            return meta.words
    return getattr(annotation, "__name__", str(annotation))


def _show(value: Any) -> str:
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, (dict, list)):
        return "`" + yaml.safe_dump(value, default_flow_style=True, width=1000).strip() + "`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _section(annotation: Any) -> Any:
    """The model of a section key (`Model`, or `Model | None` for a section that may be dropped),
    or None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def rows(model: type[BaseModel], defaults: dict, prefix: str) -> list[str]:
    out = []
    # what a job takes to a remote cluster (Shipped's keys) last, after the workload's own
    fields = sorted(
        model.model_fields.items(),
        key=lambda item: item[0] in Shipped.model_fields and model is not Shipped,
    )
    for name, field in fields:
        key = f"{prefix}.{name}" if prefix else name
        value = (defaults or {}).get(name)
        annotation = _section(field.annotation)
        if annotation is not None:
            out.extend(rows(annotation, value or {}, key))
            continue
        meaning = (field.description or "").replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{key}` | {_kind_words(field)} | {_show(value)} | {meaning} |")
    return out


def _table(title: str, model: type[BaseModel], defaults: dict, prefix: str, note: str = "") -> str:
    head = f"\n## {title}\n\n" + (note + "\n\n" if note else "")
    return (
        head
        + "| key | kind | default | meaning |\n| --- | --- | --- | --- |\n"
        + "\n".join(rows(model, defaults, prefix))
        + "\n"
    )


def _yaml(*parts: str) -> dict:
    node = resources.files("rayflow.conf")
    for part in parts:
        node = node.joinpath(part)
    return yaml.safe_load(node.read_text()) or {}


def _option(workload: str, section: str) -> str:
    """The file of `section` a workload's defaults list names
    (`- /workload/data@_global_.data: cifar10`)."""
    for entry in _yaml("workload", f"{workload}.yaml").get("defaults", []):
        if isinstance(entry, dict):
            for key, option in entry.items():
                if key.split("@")[0].strip("/") == f"workload/{section}":
                    return f"{option}.yaml"
    raise LookupError(f"workload={workload} names no {section} option in its defaults list")


def _launcher_defaults() -> dict:
    return (
        yaml.safe_load(
            resources.files("hydra_plugins.rayflow_launcher").joinpath("rayflow.yaml").read_text()
        )
        or {}
    )


def markdown() -> str:
    root = _yaml("config.yaml")
    text = HEADER
    text += _table("The root config", Root, root, "")
    for option in ("cpu", "gpu", "auto"):
        text += _table(
            f"`compute={option}`", Compute, _yaml("compute", f"{option}.yaml"), "compute"
        )
    text += _table("`tracking=mlflow`", Mlflow, _yaml("tracking", "mlflow.yaml"), "tracking")
    text += _table("`tracking=none`", NoTracking, _yaml("tracking", "none.yaml"), "tracking")
    sections: dict[str, list[str]] = {}
    for name in (n for n, entry in WORKLOADS.items() if entry.chosen):
        model = workload_keys(name)
        text += _table(f"`workload={name}`", model, _yaml("workload", f"{name}.yaml"), "workload")
        for section in getattr(model, "sections", {}):
            sections.setdefault(section, []).append(name)
    # what presets bring at the root (`data`, conf/workload/data/)
    for section, users in sections.items():
        model = workload_keys(users[0]).sections[section]
        brought = " and ".join(f"`workload={u}`" for u in users)
        note = (
            f"Brought by {brought} (`conf/workload/{section}/`), at the root: "
            f"`{section}.KEY=value`."
        )
        text += _table(
            f"`{section}`",
            model,
            _yaml("workload", section, _option(users[0], section)),
            section,
            note,
        )
    # rayflow's own backends: the reference is rayflow's page, the same whatever is installed (a
    # plugin's keys are documented by its own package)
    for name in BACKENDS:
        text += _table(
            f"`backend={name}`",
            backend_keys(name),
            _yaml("backend", f"{name}.yaml"),
            "backend",
            NOTES.get(name, ""),
        )
    text += _table(
        "`hydra/launcher=rayflow`", Launcher, _launcher_defaults(), "hydra.launcher", LAUNCHER_NOTE
    )
    return text
