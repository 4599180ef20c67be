"""What Ray would pack of a submitted job's folder, and the size of that zip against Ray's limit.

`upload_entries` walks what Ray would pack with Ray's own traversal and exclude matching
(ray/_private/runtime_env/packaging.py: `_dir_travel`, `_get_excludes`, the per-folder
`.gitignore`/`.rayignore` files), once, without reading or packing a file, and adds up the zip
Ray would build (stored, uncompressed: `ZipFile(..., "w")`), header by header; `check_size`
refuses a package at Ray's limit or over it, naming its biggest entries. Kept apart from the
preflight's other checks of the job's files (rayflow.orchestrator.upload_check) as the one place
that mirrors Ray's packaging.
"""

from __future__ import annotations

import errno
import logging
import os
import zipfile
from pathlib import Path

from rayflow.errors import ConfigError
from rayflow.runtime import ray_internals

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
_quiet = logging.Logger("rayflow.orchestrator.upload_size.quiet", level=logging.CRITICAL)


def upload_limit() -> int:
    """The largest package Ray takes with a submitted job (bytes): the dashboard's request limit
    or the GCS's, whichever is lower."""
    return min(
        ray_internals.dashboard_body_limit(DASHBOARD_BODY_LIMIT),
        ray_internals.gcs_package_limit(),
    )


def upload_entries(
    path: Path, patterns: list[str], include_parent_dir: bool = False, stop_at: int | None = None
) -> tuple[list[tuple[str, int]], int, bool]:
    """What Ray packs of `path` (a folder, or one .py file) with these excludes and this side's
    .gitignore setting: ([(name in the zip, bytes the entry takes in the zip)], the zip's size,
    whether counting stopped at `stop_at` bytes). Ray's own traversal decides what goes in."""
    # as the Jobs client reads it
    include_gitignore = os.environ.get(ray_internals.ignore_gitignore_env_var(), "0") != "1"
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
        ray_internals.walk_package(
            root, list(patterns), handler, include_gitignore=include_gitignore, logger=_quiet
        )
    except _Enough:
        stopped = True
    if len(entries) > 0xFFFF:
        total += _ZIP64_END
    return entries, total, stopped


def shipped(path: Path, patterns: list[str], include_parent_dir: bool = False) -> list[str]:
    """The names in the zip Ray would build of `path` (for tests and for looking)."""
    return [name for name, _ in upload_entries(path, patterns, include_parent_dir)[0]]


def check_size(
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
