"""The preflight of a submitted run's files (backend=vm, kuberay), before anything starts.

`check_upload` refuses, in one line naming `workload.working_dir`, `workload.py_modules` or
`workload.excludes`, a working_dir that is not a folder, a module that is not importable, an
exclude that would drop rayflow's own files, and a package at Ray's size limit or over it
(rayflow.orchestrator.upload_size); it names on stderr the credential files the user re-included.
Kept apart from rayflow.orchestrator.job_files, which only reads the keys into a runtime_env:
these checks walk the files with Ray's packaging code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rayflow.errors import ConfigError
from rayflow.orchestrator.job_files import (
    CREDENTIAL_EXCLUDES,
    excludes,
    py_module_paths,
    working_dir_path,
)
from rayflow.orchestrator.upload_size import check_size, upload_limit
from rayflow.runtime import ray_internals


def check_upload(cfg: DictConfig, limit: int | None = None, in_place: bool = False) -> None:
    """Preflight of a submitted run's files: ConfigError (one line naming `workload.working_dir`,
    `workload.py_modules` or `workload.excludes`) when the working_dir is not a directory, a
    module is not importable, an excluded pattern would drop rayflow's own files, or a package
    is `limit` bytes or more as Ray would upload it (default: `upload_limit()`). `in_place`: the
    nodes share this machine's files, nothing is uploaded (job_files): the folder must exist."""
    limit = upload_limit() if limit is None else int(limit)
    patterns = excludes(cfg)
    packages = []
    working_dir = working_dir_path(cfg)
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
    for name, path in py_module_paths(cfg):
        packages.append(("workload.py_modules", f"{name} ({path})", path, patterns, path.is_dir()))
    if packages:
        _check_own_package(patterns)
    for key, shown, path, pattern_list, parent in packages:
        entries = check_size(key, shown, path, pattern_list, parent, limit)
        _name_credentials(key, [name for name, _ in entries], parent, path)


_CREDENTIALS_SHOWN = 5


def credential_files(names: list[str]) -> list[str]:
    """The names (as in the zip: a/b/c) that CREDENTIAL_EXCLUDES would drop, a folder's tree
    included (`.aws/credentials` through `.aws`)."""
    spec = ray_internals.ray_pathspec(CREDENTIAL_EXCLUDES)  # Ray's own copy, as Ray matches

    def matches(name: str) -> bool:
        parts = name.rstrip("/").split("/")
        return any(spec.match_file("/".join(parts[: i + 1])) for i in range(len(parts)))

    return [name for name in names if matches(name)]


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


def _ray_default_excludes() -> list[str]:
    """What Ray itself drops from a working_dir (.git, .venv, venv, __pycache__ in Ray 2.60)."""
    return ray_internals.default_excludes()


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

    # Ray's own copy of pathspec: its negation differs from pathspec 1.x
    def dropped(spec: Any, rel: str) -> bool:  # as Ray walks: each folder on the way, then the file
        parts = rel.split("/")
        return any(spec.match_file("/".join(parts[: i + 1])) for i in range(len(parts)))

    spec = ray_internals.ray_pathspec(patterns)
    for rel in _rayflow_files():
        if dropped(spec, rel):
            culprit = next(
                (
                    p
                    for p in patterns
                    if not p.startswith("!") and dropped(ray_internals.ray_pathspec([p]), rel)
                ),
                patterns[-1],
            )
            raise ConfigError(
                "workload.excludes",
                f"{culprit!r} would also drop rayflow's own rayflow/{rel}: Ray applies "
                "excludes to every package of the job, rayflow's too; anchor the pattern "
                "to your project's top (/data/big) or name the file",
            )
