"""backend=vm, offline half: the `backend:` section -> the cluster YAML of Ray's cluster launcher.

Pure functions, nothing started: `check` refuses bad keys before anything starts (naming the
key, and the replacement of keys from outdated guides), `placeholders` lists what only the
user can fill in, `render` builds the cluster config (`ray up` for local/aws/gcp; the
autoscaling config of `RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE` for
fake_multinode), `validate` runs Ray's own checks on it. Ray is imported inside functions only.

What the launcher needs besides the file (environment, head `ray start` arguments) comes from
`launcher_env` and `head_start_args`, and is noted in the rendered config under
`metadata.rayflow` (Ray keeps `metadata` and never reads it).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import shlex
import shutil
import sys
from importlib import resources
from typing import Any, Mapping

import yaml
from omegaconf import DictConfig, OmegaConf

from rayflow.config import ConfigError

PROVIDERS = ("fake_multinode", "local", "aws", "gcp")
CLOUDS = ("aws", "gcp")

# The fake provider names its head node type itself (FAKE_HEAD_NODE_TYPE in Ray's
# fake_multi_node/node_provider.py); GCP puts node type names into labels, which allow no dots.
FAKE_HEAD_TYPE = "ray.head.default"
HEAD_TYPE = "rayflow_head"
WORKER_TYPES = {"cpu": "rayflow_worker_cpu", "gpu": "rayflow_worker_gpu"}

PLACEHOLDER = "<fill in: {key}>"
PLACEHOLDER_PREFIX = "<fill in: "

# Provider defaults for keys left null in conf/backend/vm.yaml.
DEFAULT_REGION = {"aws": "us-west-2", "gcp": "us-west1"}
DEFAULT_GCP_ZONE = {"us-west1": "us-west1-a"}  # other regions: the zone is the user's choice
DEFAULT_INSTANCE = {
    "aws": {"head": "m5.large", "cpu": "m5.large", "gpu": "g4dn.xlarge"},  # g4dn.xlarge: 4 vCPU, 1 T4
    "gcp": {"head": "n1-standard-2", "cpu": "n1-standard-2", "gpu": "n1-standard-4"},
}
DEFAULT_GCP_ACCELERATOR = "nvidia-tesla-t4"
GCP_IMAGE = {  # Google's Deep Learning VM families (Ray's defaults use common-cpu)
    "cpu": "projects/deeplearning-platform-release/global/images/family/common-cpu",
    "gpu": "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-nvidia-550",
}
GCP_DISK_GB = 50

# rayflow's runtime dependencies, pinned on every cloud node to what this machine runs.
RUNTIME_PACKAGES = ("torch", "mlflow", "hydra-core", "omegaconf", "filelock", "numpy", "pyyaml")

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


# --- the shipped defaults, for the known keys ---------------------------------------------


@functools.lru_cache(maxsize=1)
def shipped_defaults() -> dict:
    """conf/backend/vm.yaml as shipped (rayflow.conf inside the wheel)."""
    text = resources.files("rayflow.conf").joinpath("backend", "vm.yaml").read_text()
    return yaml.safe_load(text)


def _plain(section: DictConfig | Mapping) -> dict:
    if isinstance(section, DictConfig):
        return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
    return copy.deepcopy(dict(section))


def _with_defaults(section: DictConfig | Mapping) -> dict:
    """The section over the shipped defaults (a section from a file may leave keys out)."""
    return _deep_merge(shipped_defaults(), _plain(section))


def _deep_merge(base: dict, top: Mapping) -> dict:
    """`top` over `base`: mappings merge key by key, anything else replaces; a null in
    `top` over a mapping-free key removes it (how `overrides` deletes a rendered key)."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _apply_overrides(config: dict, overrides: Mapping) -> dict:
    out = copy.deepcopy(config)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _apply_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- checks ---------------------------------------------------------------------------------


def _whole(value: Any, key: str, minimum: int = 0, allow_null: bool = False) -> int | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        null = " or null" if allow_null else ""
        why = " (Ray's cluster config takes whole CPUs, GPUs and bytes)" if isinstance(value, float) else ""
        raise ConfigError(key, f"must be a whole number >= {minimum}{null}{why}; got {value!r}")
    return value


def _number(value: Any, key: str, positive: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(key, f"must be a number {'> 0' if positive else '>= 0'}; got {value!r}")
    return float(value)


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


def _type_bounds(b: dict, kind: str, gpu: bool) -> tuple[int, int]:
    """min/max workers of a node type: explicit values, or the overall ones for the type the
    run uses (GPU type with compute=gpu, CPU type otherwise) and 0..max for the other."""
    t = b["worker"][kind]
    runs_on = "gpu" if gpu else "cpu"
    low = t.get("min_workers")
    high = t.get("max_workers")
    if low is None:
        low = b["min_worker_nodes"] if kind == runs_on else 0
    if high is None:
        high = b["max_worker_nodes"]
    return int(low), int(high)


def rendered_kinds(gpu: bool) -> tuple[str, ...]:
    return ("cpu", "gpu") if gpu else ("cpu",)


def check(section: DictConfig | Mapping, gpu: bool, auth_mode: str = "token") -> None:
    """Raise ConfigError naming the key for a bad `backend:` section of backend=vm.

    Starts nothing and reads no cloud credentials; for the providers `ray up` starts (local,
    aws, gcp) it looks for `ssh` and `rsync` on PATH and checks that a given SSH key file can
    be read. Placeholders pass (a dry run renders them); `require_filled` refuses them before
    a real start. auth_mode: the run's ray_auth_mode (an exposed dashboard needs `token`)."""
    raw = _plain(section)
    _check_keys(raw)
    b = _with_defaults(raw)
    provider = b.get("provider")
    if provider not in PROVIDERS:
        raise ConfigError("backend.provider", f"must be one of {', '.join(PROVIDERS)}; got {provider!r}")

    name = b.get("cluster_name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,39}", name):
        raise ConfigError("backend.cluster_name", f"must be 1-40 lowercase letters, digits and dashes, starting with a letter (cloud labels and instance names carry it); got {name!r}")
    _bool(b.get("keep_cluster"), "backend.keep_cluster")
    _bool(b.get("cache_stopped_nodes"), "backend.cache_stopped_nodes")
    _number(b.get("start_timeout_s"), "backend.start_timeout_s", positive=True)
    _number(b.get("autoscale_idle_timeout_minutes"), "backend.autoscale_idle_timeout_minutes", positive=False)
    _number(b.get("autoscale_upscaling_speed"), "backend.autoscale_upscaling_speed", positive=True)

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
        type_low, type_high = _type_bounds(b, kind, gpu)
        if type_low > type_high:
            if t.get("min_workers") is not None:
                raise ConfigError(f"{prefix}.min_workers", f"({type_low}) is greater than the type's max_workers ({type_high})")
            raise ConfigError(f"{prefix}.max_workers", f"({type_high}) is below the type's minimum, backend.min_worker_nodes ({type_low})")
    if gpu:
        gpus = b["worker"]["gpu"].get("num_gpus")
        if gpus is None or gpus < 1:
            raise ConfigError("backend.worker.gpu.num_gpus", f"must be >= 1 for the GPU node type with compute=gpu; got {gpus!r}")
    if provider != "local":
        mins = sum(_type_bounds(b, kind, gpu)[0] for kind in rendered_kinds(gpu))
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
        region, zones = _region(b), b.get("availability_zone")
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
    b = _with_defaults(section)
    keys = [f"backend.{key}" for key in USER_KEYS.get(b.get("provider"), ()) if b.get(key) in (None, "", [])]
    if b.get("provider") == "gcp" and _gcp_zone(b) is None:
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
        provider = _with_defaults(section).get("provider")
        raise ConfigError(keys[0], f"must be filled in before provider={provider} can start (see backends/vm/{provider}.yaml); still unset: {', '.join(keys)}")


def _placeholder(key: str) -> str:
    return PLACEHOLDER.format(key=f"backend.{key}")


# --- render -----------------------------------------------------------------------------------


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name).split("+")[0]  # torch 2.13.0+cpu -> 2.13.0: PyPI's build for the node


def runtime_requirements(ray_version: str) -> list[str]:
    """pip requirements pinning Ray and rayflow's runtime dependencies to this machine's versions."""
    pins = [f"ray[default,tune]=={ray_version}"]
    for package in RUNTIME_PACKAGES:
        try:
            pins.append(f"{package}=={_version(package)}")
        except Exception:  # not installed here: leave it to pip on the node
            pins.append(package)
    return pins


def _region(b: dict) -> str:
    if b.get("region"):
        return str(b["region"])
    zone = str(b.get("availability_zone") or "").split(",")[0].strip()
    if zone:
        return zone[:-1] if b["provider"] == "aws" else zone.rsplit("-", 1)[0]
    return DEFAULT_REGION[b["provider"]]


def _gcp_zone(b: dict) -> str | None:
    return b.get("availability_zone") or DEFAULT_GCP_ZONE.get(_region(b))


def _resources(t: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    if t.get("num_cpus") is not None:
        out["CPU"] = int(t["num_cpus"])
    if t.get("num_gpus") is not None:
        out["GPU"] = int(t["num_gpus"])
    if t.get("memory") is not None:
        out["memory"] = int(t["memory"])
    if t.get("object_store_memory") is not None:
        out["object_store_memory"] = int(t["object_store_memory"])
    return out


def _node_config(b: dict, kind: str) -> dict:
    """The provider's launch settings for the head ("head") or a worker type ("cpu", "gpu")."""
    provider = b["provider"]
    t = b["worker"].get(kind, {}) if kind != "head" else {}
    instance = (b.get("head_instance_type") if kind == "head" else t.get("instance_type")) or DEFAULT_INSTANCE.get(provider, {}).get(kind)
    if provider == "aws":
        config = {"InstanceType": instance}
        if b.get("ami"):
            config["ImageId"] = b["ami"]  # else Ray's Deep Learning AMI for the region (NVIDIA drivers included)
        return config
    if provider == "gcp":
        image = b.get("source_image") or GCP_IMAGE["gpu" if kind == "gpu" else "cpu"]
        config = {
            "machineType": instance,
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "initializeParams": {"diskSizeGb": GCP_DISK_GB, "sourceImage": image}}],
        }
        if kind == "gpu":
            config["guestAccelerators"] = [{"acceleratorType": t.get("accelerator_type") or DEFAULT_GCP_ACCELERATOR,
                                            "acceleratorCount": int(t["num_gpus"])}]
            config["scheduling"] = {"onHostMaintenance": "TERMINATE"}  # GPU VMs cannot live-migrate
            config["metadata"] = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}
        return config
    return {}


def _auth_env(auth_mode: str) -> str:
    # Every node exports the mode before `ray start`: a head finding a token file turns auth
    # on by itself, a worker does not, and the two must agree.
    return f"export RAY_AUTH_MODE={auth_mode};"


def _dashboard_host(b: dict, auth_mode: str) -> str:
    if b.get("dashboard_host"):
        return str(b["dashboard_host"])
    # Reachable from other machines only where it asks for the token; else `ray dashboard`
    # (an SSH tunnel) reaches it on the head's loopback.
    return "0.0.0.0" if auth_mode == "token" else "127.0.0.1"


def head_start_args(section: DictConfig | Mapping) -> list[str]:
    """The head's resources as `ray start` arguments: they must match the head node type of
    the rendered config (fake_multinode: the launcher runs `ray start --head` itself)."""
    b = _with_defaults(section)
    return [f"--num-cpus={int(b['num_cpus_head_node'])}", f"--num-gpus={int(b['num_gpus_head_node'])}"]


def _local_worker_args(b: dict, gpu: bool) -> list[str]:
    t = b["worker"]["gpu" if gpu else "cpu"]
    args = []
    for key, flag in (("num_cpus", "--num-cpus"), ("num_gpus", "--num-gpus"), ("memory", "--memory"),
                      ("object_store_memory", "--object-store-memory")):
        if t.get(key) is not None:
            args.append(f"{flag}={int(t[key])}")
    return args


def _start_commands(b: dict, gpu: bool, auth_mode: str) -> tuple[list[str], list[str]]:
    provider = b["provider"]
    env = _auth_env(auth_mode)
    head = ["ray start --head --port=6379 --object-manager-port=8076",
            "--autoscaling-config=~/ray_bootstrap_config.yaml", *head_start_args(b),
            f"--dashboard-host={_dashboard_host(b, auth_mode)}"]
    worker = ["ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076"]
    if provider == "local":
        # Without --node-ip-address Ray finds no route on such hosts and advertises 127.0.0.1.
        head.append(f"--node-ip-address={shlex.quote(str(b.get('head_ip') or _placeholder('head_ip')))}")
        worker += ["--node-ip-address=$(hostname -I | cut -d' ' -f1)", *_local_worker_args(b, gpu)]
        prefix = env  # hosts you run: no ulimit raise that may need privileges
    else:  # cloud: resources reach `ray start` from the node type (RAY_OVERRIDE_RESOURCES)
        prefix = f"{env} ulimit -n 65536;"
    return (["ray stop", f"{prefix} {' '.join(head)}"], ["ray stop", f"{prefix} {' '.join(worker)}"])


def _setup_commands(b: dict, ray_version: str) -> dict[str, list[str]]:
    provider = b["provider"]
    pins = " ".join(f'"{pin}"' for pin in runtime_requirements(ray_version))
    if provider in CLOUDS:
        # Ray's defaults put the image's conda env on PATH, then install a nightly wheel: keep
        # the first, replace the second with this machine's versions.
        path = {
            "aws": "(stat $HOME/anaconda3/envs/tensorflow2_p310/ &> /dev/null && echo 'export PATH=\"$HOME/anaconda3/envs/tensorflow2_p310/bin:$PATH\"' >> ~/.bashrc) || true",
            "gcp": "(stat /opt/conda/bin/ &> /dev/null && echo 'export PATH=\"/opt/conda/bin:$PATH\"' >> ~/.bashrc) || true",
        }[provider]
        sdk = {"aws": "pip install 'boto3>=1.4.8'", "gcp": "pip install google-api-python-client==1.7.8"}[provider]
        return {"setup_commands": [path, f"pip install -U {pins}"],
                "head_setup_commands": [sdk],  # the head's autoscaler talks to the cloud API
                "worker_setup_commands": []}
    if provider == "local":
        # Your hosts, maybe without internet: check the versions instead of installing.
        check = (f"test \"$(python -c 'import ray; print(ray.__version__)')\" = {ray_version} || "
                 f"{{ echo \"rayflow: this host needs ray {ray_version}, as the launcher: pip install -U \\\"ray[default,tune]=={ray_version}\\\"\" >&2; exit 1; }}")
        return {"setup_commands": [check], "head_setup_commands": [], "worker_setup_commands": []}
    return {"setup_commands": [], "head_setup_commands": [], "worker_setup_commands": []}  # this machine's venv


def launcher_env(section: DictConfig | Mapping, auth_mode: str, token_file: str | None = None) -> dict[str, str]:
    """Environment for the process that starts the cluster (`ray up`, or `ray start --head`
    for fake_multinode), on top of this process's own."""
    b = _with_defaults(section)
    env = {"RAY_AUTH_MODE": str(auth_mode)}
    if b["provider"] == "fake_multinode":
        env["RAY_FAKE_CLUSTER"] = "1"  # the head's monitor builds FakeMultiNodeProvider only then
        # v2 would run prepare_config, which needs Ray's example.yaml (not in the wheel)
        env["RAY_enable_autoscaler_v2"] = "0"
        if auth_mode == "token" and token_file:
            env["RAY_AUTH_TOKEN_PATH"] = str(token_file)  # worker processes start from the head's monitor
    if b["provider"] == "local":
        # Autoscaler v2 loses fresh local-provider hosts (Ray 2.60, ray#59905): `ray up` runs v1.
        env["RAY_UP_enable_autoscaler_v2"] = "0"
    return env


def render(section: DictConfig | Mapping, gpu: bool, auth_mode: str, ray_version: str | None = None,
           python_version: str | None = None, token_file: str | None = None, gcs_address: str | None = None) -> dict:
    """The cluster config for Ray's cluster launcher, as plain data (`yaml.safe_dump` it).

    gpu: the run uses GPUs (compute=gpu): the GPU worker type is rendered too. auth_mode:
    `token` or `disabled`, exported before every `ray start`. token_file: with token auth,
    mounted on every node as ~/.ray/auth_token (its path only; the token never enters the
    config). gcs_address: fake_multinode only, where the head's GCS listens when not on this
    machine's address at port 6379. Keys only the user can fill in render as `<fill in: ...>`.
    """
    b = _with_defaults(section)
    provider = b["provider"]
    ray_version = ray_version or _version("ray")
    python_version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    kinds = rendered_kinds(gpu)
    head_type = FAKE_HEAD_TYPE if provider == "fake_multinode" else HEAD_TYPE

    config: dict[str, Any] = {"cluster_name": str(b["cluster_name"]), "max_workers": int(b["max_worker_nodes"])}
    if provider == "local":
        config["min_workers"] = int(b["min_worker_nodes"])  # Ray moves it onto the local node type
    config["upscaling_speed"] = float(b["autoscale_upscaling_speed"])
    config["idle_timeout_minutes"] = float(b["autoscale_idle_timeout_minutes"])

    if provider == "fake_multinode":
        config["provider"] = {"type": "fake_multinode", "use_node_id_as_ip": True,
                              "disable_node_updaters": True, "disable_launch_config_check": True}
        if gcs_address:
            config["provider"]["gcs_address"] = gcs_address
        config["auth"] = {}
    elif provider == "local":
        config["provider"] = {"type": "local", "head_ip": b.get("head_ip") or _placeholder("head_ip"),
                              "worker_ips": list(b.get("worker_ips") or [_placeholder("worker_ips")])}
        config["auth"] = {"ssh_user": b.get("ssh_user") or _placeholder("ssh_user"),
                          "ssh_private_key": b.get("ssh_private_key") or _placeholder("ssh_private_key")}
    else:
        region = _region(b)
        config["provider"] = {"type": provider, "region": region}
        if provider == "aws" and b.get("availability_zone"):
            config["provider"]["availability_zone"] = str(b["availability_zone"])
        if provider == "gcp":
            config["provider"]["availability_zone"] = _gcp_zone(b) or _placeholder("availability_zone")
            config["provider"]["project_id"] = b.get("project_id") or _placeholder("project_id")
        # Stopped instances keep their disks, and the disks keep billing: terminate unless asked.
        config["provider"]["cache_stopped_nodes"] = bool(b["cache_stopped_nodes"])
        config["auth"] = {"ssh_user": b.get("ssh_user") or "ubuntu"}
        if b.get("ssh_private_key"):
            config["auth"]["ssh_private_key"] = str(b["ssh_private_key"])

    if provider != "local":  # Ray refuses node types for local: the hosts are its one type
        head = {"resources": {"CPU": int(b["num_cpus_head_node"]), "GPU": int(b["num_gpus_head_node"])},
                "node_config": _node_config(b, "head"), "min_workers": 0, "max_workers": 0}
        types = {head_type: head}
        for kind in kinds:
            low, high = _type_bounds(b, kind, gpu)
            types[WORKER_TYPES[kind]] = {"resources": _resources(b["worker"][kind]), "node_config": _node_config(b, kind),
                                         "min_workers": low, "max_workers": high}
        config["available_node_types"] = types
        config["head_node_type"] = head_type

    mounts = {}
    if auth_mode == "token" and token_file and provider != "fake_multinode":  # fake: one machine, one file
        mounts["~/.ray/auth_token"] = str(token_file)
    config["file_mounts"] = mounts
    config.update({"cluster_synced_files": [], "file_mounts_sync_continuously": False,
                   "rsync_exclude": [], "rsync_filter": [], "docker": {}, "initialization_commands": []})
    config.update(_setup_commands(b, ray_version))
    if provider == "fake_multinode":  # the launcher starts the head; the provider starts workers itself
        config["head_start_ray_commands"], config["worker_start_ray_commands"] = [], []
    else:
        config["head_start_ray_commands"], config["worker_start_ray_commands"] = _start_commands(b, gpu, auth_mode)

    config["metadata"] = {"rayflow": {
        "provider": provider,
        "ray_version": ray_version,
        "python_version": python_version,  # the launcher's; cloud images bring their own Python
        "autoscaler": "v1" if provider in ("local", "fake_multinode") else "v2",
        "launcher_env": launcher_env(b, auth_mode, token_file),
        "node_types": {kind: WORKER_TYPES[kind] for kind in kinds} if provider != "local" else {},
        "placeholders": placeholders(b),
    }}
    return _apply_overrides(config, b.get("overrides") or {})


# --- Ray's validation -----------------------------------------------------------------------


def validate(config: Mapping) -> None:
    """Ray's own checks of a rendered config: `prepare_config` (its provider's defaults
    merged in, as `ray up` does) then `validate_config` (ray-schema.json and the node type
    rules). fake_multinode: `validate_config` on the config as written, which is what its
    autoscaler reads; Ray's prepare_config for it needs an example.yaml the wheel lacks.
    Raises ConfigError("backend", Ray's message on one line)."""
    import contextlib
    import io

    from ray.autoscaler._private.util import prepare_config, validate_config

    config = copy.deepcopy(dict(config))
    provider = (config.get("provider") or {}).get("type") if isinstance(config.get("provider"), Mapping) else None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            prepared = config if provider == "fake_multinode" else prepare_config(config)
            validate_config(prepared)
    except Exception as err:  # jsonschema.ValidationError, ValueError, click's abort, ...
        raise ConfigError("backend", f"Ray refuses the rendered cluster config: {_ray_message(err)}") from None


def _ray_message(err: Exception) -> str:
    message = getattr(err, "message", None) or str(err) or type(err).__name__
    path = getattr(err, "absolute_path", None)
    where = ".".join(str(p) for p in path) if path else ""
    text = " ".join(str(message).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{where}: {text}" if where else text
