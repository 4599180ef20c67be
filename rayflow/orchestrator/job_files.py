"""The user's files that go with a submitted run (backend=vm, kuberay): the runtime_env parts.

backend=local, attach and spark run the user's code from the directory rayflow runs from. A run
submitted as a Ray Job runs on the head instead, so its files go with the job, as the parts of
its runtime_env this module returns (`job_files`):

- `working_dir` (`workload.working_dir`: `.` in the workloads tune, train and rllib, the
  directory rayflow runs from; null, as in the presets, or no such key: nothing but rayflow)
  minus `DEFAULT_EXCLUDES`, `CREDENTIAL_EXCLUDES` (credential files: named on stderr when
  re-included), `workload.excludes`, the `.gitignore` and `.rayignore` files inside it, and Ray's
  own default excludes;
- `py_modules` (`workload.py_modules`): installed packages or modules, by import name, shipped
  from their source folders;
- `pip` (`workload.pip`): requirements the job installs on the cluster.

Where the job's code runs, read in Ray 2.60's code (ray/_private/runtime_env/working_dir.py,
WorkingDirPlugin.modify_context): a process started with a `working_dir` gets `cd <Ray's
unpacked copy> &&` as its command prefix and that copy at the head of PYTHONPATH. The Jobs API
starts a job's supervisor actor with the job's runtime_env (dashboard/modules/job/job_manager.py)
and the supervisor starts the entrypoint with `subprocess.Popen(shell=True, env=os.environ.copy())`
and no `cwd` (job_supervisor.py), so `python -m rayflow workload.trainable=train:objective` runs
in the copy and imports `train` from it; the driver passes the same runtime_env on to its tasks
and actors (the job's JobConfig), so the trial workers have the copy on their path too.

Reading these keys is kept apart from checking what they ship: the preflight's check is
rayflow.orchestrator.upload_check, the size of Ray's zip rayflow.orchestrator.upload_size; a
submission needs only the runtime_env, not Ray's packaging code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rayflow.errors import ConfigError

# Added to every submitted job's `excludes` (gitignore syntax, matched against paths relative to
# each package Ray packs: the working_dir and every py_modules folder). A name without a slash
# matches at any depth and, matching a folder, skips its whole tree without walking it (Ray tests
# a folder's path without a trailing slash, so `name/` would walk it and drop its files one by
# one). A leading `/` anchors a pattern to the package's top. `workload.excludes` comes after
# these, so it can re-include: `!wandb` and `!wandb/**` (the folder, then its files: Ray tests
# both, with its own copy of pathspec) ship a folder this list drops.
DEFAULT_EXCLUDES = (
    # version control: history, never code the job runs (Ray drops .git from a working_dir, not
    # from py_modules)
    ".git",
    ".hg",
    ".svn",
    # virtual environments and tool environments: the cluster has its own Python (`env` is left
    # alone: RL projects keep their environments' code there)
    ".venv",
    "venv",
    ".tox",
    ".nox",
    ".conda",
    # byte code and caches of tools and notebooks
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".ipynb_checkpoints",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".cache",
    "node_modules",
    # what packaging leaves: metadata (`build/` and `dist/` are left alone: excludes apply to
    # py_modules folders too, where they can be sub-packages; the size check names them if big)
    "*.egg-info",
    # what runs leave behind in the directory they ran from: Hydra's outputs, MLflow's stores
    # (sqlite:///mlflow.db and its journal files), Ray Tune's results, other trackers' logs
    "/outputs",
    "/multirun",
    "mlruns",
    "mlartifacts",
    "mlflow.db*",
    "ray_results",
    "wandb",
    "lightning_logs",
    # CIFAR-10 as rayflow's data step leaves it under a data.root inside the project: each node
    # fetches it itself (data.download)
    "cifar-10-batches-py",
    "cifar-10-python.tar.gz",
    # a checkout of rayflow at the top: rayflow ships itself (py_modules, its configs inside),
    # and a checkout first on the job's path would shadow it without its configs
    "/rayflow",
)

# Credential files: never shipped unless the user re-includes them (`!.env` in workload.excludes),
# and then named in one stderr line of the preflight (upload_check.check_upload). A job's package
# is readable by every job and node of the cluster (Ray keeps it in the GCS), and a folder run
# from a home directory or a project root often holds these. Names with "credentials" are matched
# as data files only (`credentials`, `*credentials*.json`, ...), so a code module or package named
# so ships.
CREDENTIAL_EXCLUDES = (
    ".env",
    ".env.*",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    "kubeconfig",
    "*.kubeconfig",
    ".docker",
    ".netrc",
    "_netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".vault-token",
    "*credentials",
    "*credentials*.json",
    "*credentials*.yaml",
    "*credentials*.yml",
    "*credentials*.ini",
    "*credentials*.csv",
    "*credentials*.txt",
    "*credentials*.toml",
    "*credentials*.cfg",
    "service-account*.json",
    "*-sa-key*.json",
)


def job_files(cfg: DictConfig, in_place: bool = False) -> dict[str, Any]:
    """The runtime_env parts for the job's own files: `working_dir` (absolute path), `excludes`
    (DEFAULT_EXCLUDES, then workload.excludes), `py_modules` (package folders or module files),
    `pip` (requirements); only the keys that apply.

    `in_place`: the cluster's nodes share this machine's files (fake_multinode). The folder is
    then the job's working_dir where it is (`local://`, which Ray neither uploads nor manages)
    and py_modules are importable as they are. Uploaded, every node would unpack the package into
    the same runtime_resources folder, replacing it (Ray's overwrite=True) under the job's driver,
    whose working directory would be gone."""
    workload = cfg.workload
    env: dict[str, Any] = {}
    working_dir = working_dir_path(cfg)
    if in_place:
        if working_dir is not None:
            env["working_dir"] = f"local://{working_dir}"
        pip = _strings(workload.get("pip"), "workload.pip")
        return {**env, **({"pip": pip} if pip else {})}
    if working_dir is not None:
        env["working_dir"] = str(working_dir)
    modules = [str(path) for _, path in py_module_paths(cfg)]
    if modules:
        env["py_modules"] = modules
    if working_dir is not None or modules:
        env["excludes"] = excludes(cfg)
    pip = _strings(workload.get("pip"), "workload.pip")
    if pip:
        env["pip"] = pip
    return env


def excludes(cfg: DictConfig) -> list[str]:
    """DEFAULT_EXCLUDES and CREDENTIAL_EXCLUDES, then the user's `workload.excludes` (which may
    re-include with `!`)."""
    return [
        *DEFAULT_EXCLUDES,
        *CREDENTIAL_EXCLUDES,
        *_strings(cfg.workload.get("excludes"), "workload.excludes"),
    ]


def merge_runtime_env(base: dict[str, Any] | None, files: dict[str, Any]) -> dict[str, Any]:
    """A backend's runtime_env (job_runtime_env) with the job's files: pip lists are concatenated
    (the backend's first), every other key of `files` is set."""
    merged = dict(base or {})
    for key, value in files.items():
        if key == "pip" and merged.get("pip"):
            pip = merged["pip"]
            merged["pip"] = (
                {**pip, "packages": [*pip.get("packages", []), *value]}
                if isinstance(pip, dict)
                else [*pip, *value]
            )
        else:
            merged[key] = value
    return merged


# --- the keys, read and checked ---------------------------------------------------------------


def _strings(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(key, f"must be a list of strings or null, got {value!r}")
    items = list(value)
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise ConfigError(key, f"must be a list of non-empty strings, got {items!r}")
    return items


def working_dir_path(cfg: DictConfig) -> Path | None:
    """The folder `workload.working_dir` names, absolute; None where the job ships none."""
    value = cfg.workload.get("working_dir")  # a config without the key ships nothing, as before
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("workload.working_dir", f"must be a folder path or null, got {value!r}")
    return Path(value).expanduser().absolute()  # relative: to the directory rayflow runs from


def py_module_paths(cfg: DictConfig) -> list[tuple[str, Path]]:
    """(name, source folder or .py file) of each `workload.py_modules` entry, as importlib finds it
    here: a package's folder, a module's .py file."""
    found = []
    for name in _strings(cfg.workload.get("py_modules"), "workload.py_modules"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as err:
            raise ConfigError(
                "workload.py_modules", f"{name} is not importable here: {err}"
            ) from None
        if spec is None:
            raise ConfigError(
                "workload.py_modules",
                f"{name} is not importable here (give installed packages or modules "
                "by import name, e.g. mylib)",
            )
        locations = list(spec.submodule_search_locations or [])
        if len(locations) > 1 or (locations and spec.origin is None):
            raise ConfigError(
                "workload.py_modules",
                f"{name} is a namespace package (in {len(locations)} folders); "
                "give its sub-packages instead",
            )
        if locations:
            found.append((name, Path(locations[0]).resolve()))
        elif spec.origin and spec.origin.endswith(".py") and Path(spec.origin).is_file():
            found.append((name, Path(spec.origin).resolve()))
        else:
            raise ConfigError(
                "workload.py_modules",
                f"{name} has no Python source to ship ({spec.origin}); "
                "install it on the cluster with workload.pip",
            )
    return found
