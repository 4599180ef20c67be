"""backend=vm: the checks of the `backend:` section, before anything starts.

`check` refuses bad keys and values, naming the key (and, for keys of outdated guides, what
replaced them: `removed_key_error`); `placeholders` lists what only the user can fill in,
`placeholder_note` is the line a dry run prints about them, and `require_filled` refuses them
before a real start. Pure functions: nothing started, no cloud credentials read.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Mapping

from omegaconf import DictConfig

from rayflow.backends.vm.defaults import (
    CLOUDS,
    PROVIDERS,
    cloud_region,
    gcp_zone,
    node_type_bounds,
    plain_section,
    rendered_kinds,
    shipped_defaults,
    with_defaults,
)
from rayflow.config import checked_number
from rayflow.errors import ConfigError

# Keys of cluster YAMLs from older guides and Ray versions, and what replaced them.
REMOVED = {
    "initial_workers": "backend.min_worker_nodes (Ray removed initial_workers: a cluster starts with its node types' min_workers)",
    "instance_type": "backend.head_instance_type and backend.worker.cpu.instance_type / backend.worker.gpu.instance_type (one per node type)",
    "autoscaling_mode": "nothing: Ray removed it, the autoscaler scales on pending resource demand; tune backend.autoscale_upscaling_speed",
    "target_utilization_fraction": "backend.autoscale_upscaling_speed (Ray removed it: the autoscaler scales on pending resource demand, not utilization)",
    "min_workers": "backend.min_worker_nodes (overall) and backend.worker.cpu.min_workers / backend.worker.gpu.min_workers (per node type)",
    "max_workers": "backend.max_worker_nodes (overall) and backend.worker.cpu.max_workers / backend.worker.gpu.max_workers (per node type)",
    "idle_timeout_minutes": "backend.autoscale_idle_timeout_minutes",
    "upscaling_max_idle_time": "backend.autoscale_idle_timeout_minutes",
    "upscaling_speed": "backend.autoscale_upscaling_speed",
    "zone": "backend.availability_zone",
    "image_id": "backend.ami (aws) or backend.source_image (gcp)",
    "image": "backend.ami (aws) or backend.source_image (gcp)",
    "head_node": "backend.head_instance_type and backend.num_cpus_head_node (Ray replaced head_node with available_node_types)",
    "worker_nodes": "backend.worker.cpu / backend.worker.gpu (Ray replaced worker_nodes with available_node_types)",
    "gcp_service_account_key": "Application Default Credentials: export GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json (or gcloud auth application-default login)",
    "num_worker_nodes": "backend.max_worker_nodes and backend.min_worker_nodes",
}

# Keys that apply to some providers only: set on another they would silently do nothing.
ONLY_FOR = {
    "region": CLOUDS, "availability_zone": CLOUDS, "head_instance_type": CLOUDS,
    "cache_stopped_nodes": CLOUDS, "ami": ("aws",), "project_id": ("gcp",), "source_image": ("gcp",),
    "head_ip": ("local",), "worker_ips": ("local",),
    "ssh_user": ("local", "aws", "gcp"), "ssh_private_key": ("local", "aws", "gcp"),
}
TYPE_ONLY_FOR = {"instance_type": CLOUDS, "accelerator_type": ("gcp",),
                 "min_workers": ("fake_multinode", "aws", "gcp"), "max_workers": ("fake_multinode", "aws", "gcp")}

# What only the user can fill in, per provider.
USER_KEYS = {"gcp": ("project_id",), "local": ("head_ip", "worker_ips", "ssh_user", "ssh_private_key")}


# --- checks ---------------------------------------------------------------------------------


def _whole(value: Any, key: str, minimum: int = 0, allow_null: bool = False) -> int | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        null = " or null" if allow_null else ""
        why = " (Ray's cluster config takes whole CPUs, GPUs and bytes)" if isinstance(value, float) else ""
        raise ConfigError(key, f"must be a whole number >= {minimum}{null}{why}; got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value


def removed_key_error(key: str) -> ConfigError | None:
    """The error for a key of an outdated guide (`+backend.initial_workers=2`), naming what replaced it."""
    leaf = key.removeprefix("backend.")
    if leaf in REMOVED:
        return ConfigError(key, f"is not a backend=vm key (it comes from an outdated cluster YAML); use {REMOVED[leaf]}")
    return None


def _check_keys(b: dict) -> None:
    known = shipped_defaults()
    for key in b:
        error = removed_key_error(f"backend.{key}")
        if error:
            raise error
        if key not in known:
            raise ConfigError(f"backend.{key}", "is not a backend=vm key; Ray cluster-YAML settings go under backend.overrides (deep-merged into the rendered config)")
    worker = b.get("worker", {})  # a section from a file may leave keys out: the shipped defaults fill them
    if not isinstance(worker, Mapping):
        raise ConfigError("backend.worker", f"must be a mapping with the node types cpu and gpu; got {worker!r}")
    for name, node_type in worker.items():
        if name not in known["worker"]:
            raise ConfigError(f"backend.worker.{name}", "is not a node type of backend=vm; use backend.worker.cpu or backend.worker.gpu")
        if not isinstance(node_type, Mapping):
            raise ConfigError(f"backend.worker.{name}", f"must be a mapping; got {node_type!r}")
        for key in node_type:
            if key not in known["worker"][name]:
                raise ConfigError(f"backend.worker.{name}.{key}", f"is not a key of a node type; use one of {', '.join(known['worker'][name])}")
    if not isinstance(b.get("overrides", {}), Mapping):
        raise ConfigError("backend.overrides", f"must be a mapping (deep-merged into the rendered cluster config); got {b.get('overrides')!r}")


def check(section: DictConfig | Mapping, gpu: bool, auth_mode: str = "token") -> None:
    """Raise ConfigError naming the key for a bad `backend:` section of backend=vm.

    Starts nothing and reads no cloud credentials; for the providers `ray up` starts (local,
    aws, gcp) it looks for `ssh` and `rsync` on PATH and checks that a given SSH key file can
    be read. Placeholders pass (a dry run renders them); `require_filled` refuses them before
    a real start. auth_mode: the run's ray_auth_mode (an exposed dashboard needs `token`)."""
    raw = plain_section(section)
    _check_keys(raw)
    b = with_defaults(raw)
    provider = b.get("provider")
    if provider not in PROVIDERS:
        raise ConfigError("backend.provider", f"must be one of {', '.join(PROVIDERS)}; got {provider!r}")

    name = b.get("cluster_name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,39}", name):
        raise ConfigError("backend.cluster_name", f"must be 1-40 lowercase letters, digits and dashes, starting with a letter (cloud labels and instance names carry it); got {name!r}")
    _bool(b.get("keep_cluster"), "backend.keep_cluster")
    _bool(b.get("cache_stopped_nodes"), "backend.cache_stopped_nodes")
    checked_number(b.get("start_timeout_s"), "backend.start_timeout_s", positive=True)
    checked_number(b.get("autoscale_idle_timeout_minutes"), "backend.autoscale_idle_timeout_minutes", positive=False)
    checked_number(b.get("autoscale_upscaling_speed"), "backend.autoscale_upscaling_speed", positive=True)

    high = _whole(b.get("max_worker_nodes"), "backend.max_worker_nodes", minimum=0)
    low = _whole(b.get("min_worker_nodes"), "backend.min_worker_nodes", minimum=0)
    if low > high:
        raise ConfigError("backend.min_worker_nodes", f"({low}) is greater than backend.max_worker_nodes ({high})")
    _whole(b.get("num_cpus_head_node"), "backend.num_cpus_head_node", minimum=0)
    _whole(b.get("num_gpus_head_node"), "backend.num_gpus_head_node", minimum=0)

    for kind in ("cpu", "gpu"):
        t, prefix = b["worker"][kind], f"backend.worker.{kind}"
        cpus = _whole(t.get("num_cpus"), f"{prefix}.num_cpus", minimum=1 if kind == "gpu" else 0, allow_null=True)
        if cpus is None and provider == "fake_multinode":
            raise ConfigError(f"{prefix}.num_cpus", "must be set with provider=fake_multinode (its worker nodes are processes here: nothing to detect)")
        _whole(t.get("num_gpus"), f"{prefix}.num_gpus", minimum=0, allow_null=kind == "cpu")
        _whole(t.get("memory"), f"{prefix}.memory", minimum=1, allow_null=True)
        _whole(t.get("object_store_memory"), f"{prefix}.object_store_memory", minimum=78643200, allow_null=True)
        for key in ("min_workers", "max_workers"):
            _whole(t.get(key), f"{prefix}.{key}", minimum=0, allow_null=True)
        for key in ("instance_type", "accelerator_type"):
            if key in t and t[key] is not None and (not isinstance(t[key], str) or not t[key].strip()):
                raise ConfigError(f"{prefix}.{key}", f"must be a non-empty string or null; got {t[key]!r}")
        for key, providers in TYPE_ONLY_FOR.items():
            if t.get(key) is not None and provider not in providers:
                raise ConfigError(f"{prefix}.{key}", f"has no effect with provider={provider} (it applies to {', '.join(providers)})"
                                  + ("; the hosts are the node type: use backend.min_worker_nodes / max_worker_nodes" if provider == "local" and "workers" in key else ""))
        type_low, type_high = node_type_bounds(b, kind, gpu)
        if type_low > type_high:
            if t.get("min_workers") is not None:
                raise ConfigError(f"{prefix}.min_workers", f"({type_low}) is greater than the type's max_workers ({type_high})")
            raise ConfigError(f"{prefix}.max_workers", f"({type_high}) is below the type's minimum, backend.min_worker_nodes ({type_low})")
    if gpu:
        gpus = b["worker"]["gpu"].get("num_gpus")
        if gpus is None or gpus < 1:
            raise ConfigError("backend.worker.gpu.num_gpus", f"must be >= 1 for the GPU node type with compute=gpu; got {gpus!r}")
    if provider != "local":
        mins = sum(node_type_bounds(b, kind, gpu)[0] for kind in rendered_kinds(gpu))
        if mins > high:
            raise ConfigError("backend.max_worker_nodes", f"({high}) is smaller than the node types' min_workers add up to ({mins})")
        if mins < low:
            raise ConfigError("backend.min_worker_nodes", f"({low}) is more than the node types' min_workers add up to ({mins}); raise backend.worker.{'gpu' if gpu else 'cpu'}.min_workers or lower backend.min_worker_nodes")

    defaults = shipped_defaults()
    for key, providers in ONLY_FOR.items():
        if b.get(key) not in (None, defaults.get(key)) and provider not in providers:
            raise ConfigError(f"backend.{key}", f"has no effect with provider={provider} (it applies to {', '.join(providers)})")
    for key in ("region", "availability_zone", "head_instance_type", "ami", "project_id", "source_image", "ssh_user", "head_ip", "dashboard_host"):
        value = b.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"backend.{key}", f"must be a non-empty string or null; got {value!r}")
    dashboard = b.get("dashboard_host")
    if dashboard not in (None, "127.0.0.1", "localhost") and auth_mode != "token":
        raise ConfigError("backend.dashboard_host", f"is {dashboard!r} but ray_auth_mode={auth_mode}: the dashboard (and its job API) would answer anyone who reaches it; use ray_auth_mode=token or leave it null (127.0.0.1)")

    if provider in CLOUDS:
        region, zones = cloud_region(b), b.get("availability_zone")
        for zone in str(zones or "").split(","):
            if zone.strip() and not zone.strip().startswith(region if provider == "aws" else f"{region}-"):
                raise ConfigError("backend.availability_zone", f"{zone.strip()!r} is not in backend.region {region!r}")
    if provider == "local":
        _check_local(b)
    if provider != "fake_multinode":
        _check_launcher(b)


def _check_launcher(b: dict) -> None:
    """What `ray up` needs on this machine: it reaches every node with ssh and syncs files
    (its own config on the head, the token) with rsync; and the SSH key, when one is given."""
    key_file = b.get("ssh_private_key")
    if key_file is not None:
        if not isinstance(key_file, str) or not key_file.strip():
            raise ConfigError("backend.ssh_private_key", "must be the path of a private key file or null")
        path = os.path.expanduser(key_file)
        # The path itself stays out of the message: secret-named keys are masked everywhere.
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError("backend.ssh_private_key", "cannot be read: no such file, not a file, or no permission to read it")
    for tool, package in (("ssh", "openssh-client"), ("rsync", "rsync")):
        if shutil.which(tool) is None:
            raise ConfigError("backend.provider", f"provider={b['provider']} runs `{tool}` from this machine (ray up), and it is not on PATH: apt-get install {package}")


def _check_local(b: dict) -> None:
    ips = b.get("worker_ips")
    if ips is not None:
        if not isinstance(ips, list) or not all(isinstance(ip, str) and ip.strip() for ip in ips):
            raise ConfigError("backend.worker_ips", f"must be a list of host names or addresses; got {ips!r}")
        if len(set(ips)) != len(ips):
            raise ConfigError("backend.worker_ips", "lists a host twice")
        if b.get("head_ip") in ips:
            raise ConfigError("backend.worker_ips", "lists the head (backend.head_ip) as a worker")
        if ips and b["max_worker_nodes"] > len(ips):
            raise ConfigError("backend.max_worker_nodes", f"({b['max_worker_nodes']}) is more than the {len(ips)} hosts in backend.worker_ips")


# --- placeholders ---------------------------------------------------------------------------


def placeholders(section: DictConfig | Mapping) -> list[str]:
    """The keys only the user can fill in that are still unset (`backend.project_id`, ...),
    in the order they should be filled in."""
    b = with_defaults(section)
    keys = [f"backend.{key}" for key in USER_KEYS.get(b.get("provider"), ()) if b.get(key) in (None, "", [])]
    if b.get("provider") == "gcp" and gcp_zone(b) is None:
        keys.append("backend.availability_zone")
    return keys


def placeholder_note(section: DictConfig | Mapping) -> str | None:
    """The one line a dry run prints when placeholders are left, or None."""
    keys = placeholders(section)
    if not keys:
        return None
    return f"rayflow: dry run: fill in {', '.join(keys)} before a real start (the printed config shows <fill in: ...> there)"


def require_filled(section: DictConfig | Mapping) -> None:
    """Refuse a real start while a placeholder is left: ConfigError naming the first key."""
    keys = placeholders(section)
    if keys:
        provider = with_defaults(section).get("provider")
        raise ConfigError(keys[0], f"must be filled in before provider={provider} can start (see backends/vm/{provider}.yaml); still unset: {', '.join(keys)}")
