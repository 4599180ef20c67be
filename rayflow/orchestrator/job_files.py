"""The user's files that go with a submitted run (backend=vm, kuberay), and the check of their size.

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

The size check (`check_upload`) walks what Ray would pack with Ray's own traversal and exclude
matching (ray/_private/runtime_env/packaging.py: `_dir_travel`, `_get_excludes`, the per-folder
`.gitignore`/`.rayignore` files), once, without reading or packing a file, and adds up the zip
Ray would build (stored, uncompressed: `ZipFile(..., "w")`), header by header.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import sys
import zipfile
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
# and then named in one stderr line of the preflight (`check_upload`). A job's package is readable
# by every job and node of the cluster (Ray keeps it in the GCS), and a folder run from a home
# directory or a project root often holds these. Names with "credentials" are matched as data
# files only (`credentials`, `*credentials*.json`, ...), so a code module or package named so ships.
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

# A submitted job's packages go to the head in one HTTP request each, whose body the dashboard
# refuses above this (ray/_private/ray_constants.py DASHBOARD_CLIENT_MAX_SIZE, aiohttp's
# client_max_size of the dashboard's server); the GCS then refuses a package of
# GCS_STORAGE_MAX_SIZE or more (512 MiB in Ray 2.60). `upload_limit()` reads both from Ray.
DASHBOARD_BODY_LIMIT = 100 * 2**20
# Counting stops here (times the limit): a tree this far over needs no exact figure, and a
# working_dir of a home directory is not walked to its end.
STOP_FACTOR = 4
# The zip Ray writes: a local header (30 bytes) and a central directory record (46 bytes), each
# with the entry's name, per entry; the end record (22 bytes), and with more than 65535 entries
# the zip64 end record and locator (56 + 20 bytes).
_LOCAL_HEADER, _CENTRAL_RECORD, _END_RECORD, _ZIP64_END = 30, 46, 22, 56 + 20
_BIGGEST_SHOWN = 3

# Ray logs the ignore files it honours (at INFO): not during a check.
_quiet = logging.Logger("rayflow.orchestrator.job_files.quiet", level=logging.CRITICAL)


def upload_limit() -> int:
    """The largest package Ray takes with a submitted job (bytes): the dashboard's request limit
    or the GCS's, whichever is lower."""
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

    return min(
        int(getattr(ray_constants, "DASHBOARD_CLIENT_MAX_SIZE", DASHBOARD_BODY_LIMIT)),
        int(GCS_STORAGE_MAX_SIZE),
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
    working_dir = _working_dir(cfg)
    if in_place:
        if working_dir is not None:
            env["working_dir"] = f"local://{working_dir}"
        pip = _strings(workload.get("pip"), "workload.pip")
        return {**env, **({"pip": pip} if pip else {})}
    if working_dir is not None:
        env["working_dir"] = str(working_dir)
    modules = [str(path) for _, path in _py_modules(cfg)]
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


def credential_files(names: list[str]) -> list[str]:
    """The names (as in the zip: a/b/c) that CREDENTIAL_EXCLUDES would drop, a folder's tree
    included (`.aws/credentials` through `.aws`)."""
    from ray._private.thirdparty.pathspec import PathSpec  # Ray's own copy, as Ray matches

    spec = PathSpec.from_lines("gitwildmatch", CREDENTIAL_EXCLUDES)

    def matches(name: str) -> bool:
        parts = name.rstrip("/").split("/")
        return any(spec.match_file("/".join(parts[: i + 1])) for i in range(len(parts)))

    return [name for name in names if matches(name)]


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


def check_upload(cfg: DictConfig, limit: int | None = None, in_place: bool = False) -> None:
    """Preflight of a submitted run's files: ConfigError (one line naming `workload.working_dir`,
    `workload.py_modules` or `workload.excludes`) when the working_dir is not a directory, a
    module is not importable, an excluded pattern would drop rayflow's own files, or a package
    is `limit` bytes or more as Ray would upload it (default: `upload_limit()`). `in_place`: the
    nodes share this machine's files, nothing is uploaded (job_files): the folder must exist."""
    limit = upload_limit() if limit is None else int(limit)
    patterns = excludes(cfg)
    packages = []
    working_dir = _working_dir(cfg)
    if working_dir is not None:
        if not working_dir.is_dir():
            what = "does not exist" if not working_dir.exists() else "is not a directory"
            raise ConfigError(
                "workload.working_dir",
                f"{working_dir} {what} (the folder whose files go with the job; null ships none)",
            )
        if in_place:  # used where it is (job_files): nothing is uploaded
            return
        packages.append(
            (
                "workload.working_dir",
                str(working_dir),
                working_dir,
                _ray_default_excludes() + patterns,
                False,
            )
        )
    for name, path in _py_modules(cfg):
        packages.append(("workload.py_modules", f"{name} ({path})", path, patterns, path.is_dir()))
    if packages:
        _check_own_package(patterns)
    for key, shown, path, pattern_list, parent in packages:
        entries = _check_size(key, shown, path, pattern_list, parent, limit)
        _name_credentials(key, [name for name, _ in entries], parent, path)


_CREDENTIALS_SHOWN = 5


def _name_credentials(key: str, names: list[str], parent: bool, path: Path) -> None:
    """One stderr line naming the credential files that go with the job: only those the user
    re-included (the defaults leave them out), so it is said, not refused."""
    top = f"{Path(path).name}/" if parent else ""
    found = credential_files(
        [name[len(top) :] if top and name.startswith(top) else name for name in names]
    )
    if not found:
        return
    more = f" and {len(found) - _CREDENTIALS_SHOWN} more" if len(found) > _CREDENTIALS_SHOWN else ""
    print(
        f"rayflow: warning: {key}: ships credential files that workload.excludes re-includes: "
        f"{', '.join(found[:_CREDENTIALS_SHOWN])}{more} "
        "(every job on the cluster can read a job's files)",
        file=sys.stderr,
        flush=True,
    )


def upload_entries(
    path: Path, patterns: list[str], include_parent_dir: bool = False, stop_at: int | None = None
) -> tuple[list[tuple[str, int]], int, bool]:
    """What Ray packs of `path` (a folder, or one .py file) with these excludes and this side's
    .gitignore setting: ([(name in the zip, bytes the entry takes in the zip)], the zip's size,
    whether counting stopped at `stop_at` bytes). Ray's own traversal decides what goes in."""
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    # as the Jobs client reads it
    include_gitignore = os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    root = Path(path).absolute()
    base = root.parent if root.is_file() else root
    entries: list[tuple[str, int]] = []
    total = _END_RECORD

    class _Enough(Exception):
        pass

    def handler(p: Path) -> None:  # packaging._zip_files' handler: files and empty folders
        nonlocal total
        if p.is_dir() and next(p.iterdir(), None) is None or p.is_file():
            to_path = p.relative_to(base)
            if include_parent_dir:
                to_path = base.name / to_path
            info = zipfile.ZipInfo.from_file(p, to_path, strict_timestamps=False)
            try:
                name = info.filename.encode("ascii")
            except UnicodeEncodeError:
                name = info.filename.encode("utf-8")
            size = _LOCAL_HEADER + _CENTRAL_RECORD + 2 * len(name) + info.file_size
            if not info.is_dir() and not os.access(p, os.R_OK):  # Ray's zip would fail on it
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))
            entries.append((info.filename, size))
            total += size
            if stop_at is not None and total >= stop_at:
                raise _Enough

    stopped = False
    try:
        _dir_travel(
            root,
            [_get_excludes(root, list(patterns))],
            handler,
            include_gitignore=include_gitignore,
            logger=_quiet,
        )
    except _Enough:
        stopped = True
    if len(entries) > 0xFFFF:
        total += _ZIP64_END
    return entries, total, stopped


def shipped(path: Path, patterns: list[str], include_parent_dir: bool = False) -> list[str]:
    """The names in the zip Ray would build of `path` (for tests and for looking)."""
    return [name for name, _ in upload_entries(path, patterns, include_parent_dir)[0]]


# --- helpers -----------------------------------------------------------------------------------


def _strings(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(key, f"must be a list of strings or null, got {value!r}")
    items = list(value)
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise ConfigError(key, f"must be a list of non-empty strings, got {items!r}")
    return items


def _working_dir(cfg: DictConfig) -> Path | None:
    value = cfg.workload.get("working_dir")  # a config without the key ships nothing, as before
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("workload.working_dir", f"must be a folder path or null, got {value!r}")
    return Path(value).expanduser().absolute()  # relative: to the directory rayflow runs from


def _py_modules(cfg: DictConfig) -> list[tuple[str, Path]]:
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


def _ray_default_excludes() -> list[str]:
    """What Ray itself drops from a working_dir (.git, .venv, venv, __pycache__ in Ray 2.60)."""
    from ray._private import ray_constants

    get = getattr(ray_constants, "get_runtime_env_default_excludes", None)
    return list(get()) if get is not None else []


def _check_size(
    key: str, shown: str, path: Path, patterns: list[str], include_parent_dir: bool, limit: int
) -> list[tuple[str, int]]:
    try:
        entries, total, stopped = upload_entries(
            path, patterns, include_parent_dir, stop_at=STOP_FACTOR * limit
        )
    except OSError as err:  # an unreadable file or folder: Ray's packing would fail on it too
        raise ConfigError(
            key,
            f"{shown}: {err.filename or ''}: {err.strerror or err}; Ray could not pack it: "
            "add it to workload.excludes",
        ) from None
    if total < limit:
        return entries
    top = "/".join(Path(path).parts[-1:]) if include_parent_dir else ""
    biggest = ", ".join(f"{name} {_human(size)}" for name, size in _biggest(entries, top))
    size = f"more than {_human(total)}" if stopped else _human(total)
    fix = (
        "add them to workload.excludes or install the package on the cluster (workload.pip)"
        if key == "workload.py_modules"
        else "add them to workload.excludes or move them out"
    )
    raise ConfigError(
        key,
        f"{shown} is {size} after excludes, over Ray's {_human(limit)} limit for a job's files; "
        f"biggest: {biggest} — {fix}",
    )


def _biggest(entries: list[tuple[str, int]], top: str = "") -> list[tuple[str, int]]:
    """The entries to name: the biggest at the top level (a folder with its trailing /; up to
    three, each 5% of the total or more), each folder replaced by its one child that holds nine
    tenths of it, so `data/` becomes `data/raw/big.bin` when that is all it holds."""
    sizes: dict[str, int] = {}
    children: dict[str, set[str]] = {}
    prefix = f"{top}/" if top else ""
    for name, size in entries:
        parts = (
            name[len(prefix) :].rstrip("/").split("/")
            if name.startswith(prefix)
            else name.rstrip("/").split("/")
        )
        parent = ""
        for depth in range(len(parts)):
            node = "/".join(parts[: depth + 1]) + (
                "/" if depth < len(parts) - 1 or name.endswith("/") else ""
            )
            sizes[node] = sizes.get(node, 0) + size
            children.setdefault(parent, set()).add(node)
            parent = node
    shown = []
    ranked = sorted(children.get("", ()), key=lambda n: (-sizes[n], n))
    total = sum(sizes[n] for n in ranked)
    for node in [n for n in ranked if sizes[n] * 20 >= total][:_BIGGEST_SHOWN] or ranked[
        :1
    ]:  # 5% of it or more
        while node.endswith("/") and children.get(node):
            child = max(children[node], key=lambda n: (sizes[n], n))
            if sizes[child] * 10 < sizes[node] * 9:
                break
            node = child
        shown.append((node, sizes[node]))
    return shown


def _rayflow_files() -> list[str]:
    """rayflow's own package as rayflow.orchestrator.submission.stage_package ships it (its configs
    inside it), as paths relative to the package: what the job's excludes are matched against there.
    """
    source = Path(__file__).resolve().parents[1]  # rayflow/, above orchestrator/
    roots = [("", source)]
    for name, beside in (("conf", "conf"), ("cluster_defs", "backends")):
        if not (source / name).exists() and (source.parent / beside).is_dir():  # a source checkout
            roots.append((f"{name}/", source.parent / beside))
    return [
        prefix + p.relative_to(root).as_posix()
        for prefix, root in roots
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    ]


def _check_own_package(patterns: list[str]) -> None:
    """Ray applies a job's `excludes` to every package it packs, rayflow's own too: a pattern that
    drops a file of rayflow's (`*.yaml` would drop its configs) is refused."""
    # Ray's own copy: its negation differs from pathspec 1.x
    from ray._private.thirdparty.pathspec import PathSpec

    def dropped(
        spec: PathSpec, rel: str
    ) -> bool:  # as Ray walks: each folder on the way, then the file
        parts = rel.split("/")
        return any(spec.match_file("/".join(parts[: i + 1])) for i in range(len(parts)))

    spec = PathSpec.from_lines("gitwildmatch", patterns)
    for rel in _rayflow_files():
        if dropped(spec, rel):
            culprit = next(
                (
                    p
                    for p in patterns
                    if not p.startswith("!")
                    and dropped(PathSpec.from_lines("gitwildmatch", [p]), rel)
                ),
                patterns[-1],
            )
            raise ConfigError(
                "workload.excludes",
                f"{culprit!r} would also drop rayflow's own rayflow/{rel}: Ray applies "
                "excludes to every package of the job, rayflow's too; anchor the pattern "
                "to your project's top (/data/big) or name the file",
            )


def _human(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    if n >= 10 * 2**20:
        return f"{n / 2**20:.0f} MiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    if n >= 2**10:
        return f"{n / 2**10:.0f} KiB"
    return f"{n} bytes"
