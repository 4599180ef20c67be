"""The clusters rayflow started and kept (`backend.keep_cluster=true`): this user's registry.

A kept cluster outlives the run that started it, so what a later command (`rayflow status`, `down`,
`logs`, a run that names it) needs of it is written down when it is kept: a `KeptCluster`, plain
fields built from the run's `ClusterHandle.record()`, one JSON file per cluster in this user's own
folder (`~/.cache/rayflow/clusters`, $XDG_CACHE_HOME's where set; 0700, refused when it is not this
user's). Every read-modify-write holds the folder's lock (filelock, a bounded wait). A record says
what was kept, not that it still runs: `rayflow status` asks the cluster
(rayflow.orchestrator.clusters), and a cluster found gone is moved to `gone/`, where `rayflow logs`
still finds its last job's log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayflow.errors import ClusterError
from rayflow.security.auth import cache_dir, private_folder
from rayflow.security.redaction import redact

KEPT_DEFAULT_MINUTES = 60.0  # a kept cluster's autostop unless the run says otherwise
LOCK_TIMEOUT_S = 30.0  # a registry write is a read and a write: another command holds it briefly
# a record's file name is built from these only (a kept cluster's names are validated by its
# backend; this keeps a hand-edited record from naming a path)
_SAFE = re.compile(r"[a-z0-9][a-z0-9.-]{0,99}")


def idle_minutes(minutes: float) -> str:
    """`1 idle minute`, `2.5 idle minutes`: how long a kept cluster may sit idle, in words."""
    return f"{minutes:g} idle minute{'' if minutes == 1 else 's'}"


@dataclass
class KeptCluster:
    """One kept cluster: what rayflow needs to reach it, stop it and report on it again once the
    run that kept it has ended. Plain data; no secret (the backend section is redacted, a token
    is read again from where the run read it)."""

    backend: str  # the backend's config name
    name: str  # the cluster's own name (a vm cluster name, a RayCluster)
    owner_run: str  # the run that started it: only that run's objects are ever torn down
    section: dict[str, Any]  # the `backend:` section it was started with (rebuilds the backend)
    auth_mode: str = "token"
    address: str = ""  # its dashboard, as the run reached it (informational)
    started_at: float = field(default_factory=time.time)
    kept_since: float = field(default_factory=time.time)
    # tear it down after this many idle minutes (None: never), by a watcher on the cluster
    autostop_idle_minutes: float | None = None
    # what the backend's `reach` and `down` need of it: paths, object names (never a secret)
    where: dict[str, str] = field(default_factory=dict)
    # the last job a run of rayflow ran on it: {"job_id", "tracking_uri", "run_id"}
    last_job: dict[str, str] = field(default_factory=dict)
    gone_at: float | None = None  # when a command found it gone (records under gone/)

    @property
    def key(self) -> str:
        return f"{self.backend}.{self.name}"

    def to_json(self) -> str:
        return json.dumps(redact(dataclasses.asdict(self)), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KeptCluster:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def autostop_minutes(section: Any, kept: bool) -> float | None:
    """The autostop a cluster of this `backend:` section gets (backend.autostop_idle_minutes):
    minutes, or None (never). Null means KEPT_DEFAULT_MINUTES for a kept cluster and never for
    one its run tears down itself (a watcher there only matters should the run's process die
    first, which setting it asks for); 0 means never."""
    minutes = section.get("autostop_idle_minutes")
    if minutes is None:
        return KEPT_DEFAULT_MINUTES if kept else None
    return float(minutes) or None


def folder() -> Path:
    return private_folder(cache_dir() / "clusters")


def _path(key: str, gone: bool = False) -> Path:
    if not _SAFE.fullmatch(key):
        raise ClusterError(f"not a kept cluster's name: {key!r}")
    base = folder()
    return (private_folder(base / "gone") if gone else base) / f"{key}.json"


def record_path(record: KeptCluster) -> Path:
    """Where a kept cluster's record is (a user who stopped it by hand may remove it)."""
    return _path(record.key)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """The registry's lock, for a read-modify-write."""
    import filelock

    lock = filelock.FileLock(str(folder() / "registry.lock"), timeout=LOCK_TIMEOUT_S, mode=0o600)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise ClusterError(
            f"another rayflow command held the lock of {folder()} for more than "
            f"{LOCK_TIMEOUT_S:g} s"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _write(path: Path, record: KeptCluster) -> None:
    part = path.with_suffix(".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(record.to_json())
    os.replace(part, path)


def _read(path: Path) -> KeptCluster | None:
    try:
        return KeptCluster.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None  # half-written by a hand, or another version's: not a record of ours


def keep(record: KeptCluster) -> None:
    """Record a kept cluster (a run that joins it again keeps its first start and owner)."""
    with locked():
        path = _path(record.key)
        earlier = _read(path)
        if earlier is not None and earlier.owner_run == record.owner_run:
            record.started_at, record.kept_since = earlier.started_at, earlier.kept_since
            record.last_job = record.last_job or earlier.last_job
        _write(path, record)


def note(key: str, **fields: Any) -> None:
    """Add what a later run learnt (its last job) to a kept cluster's record, if it has one."""
    with locked():
        path = _path(key)
        record = _read(path)
        if record is not None:
            _write(path, dataclasses.replace(record, **fields))


def records() -> list[KeptCluster]:
    """Every kept cluster recorded, oldest first."""
    found = [_read(path) for path in folder().glob("*.json")]
    return sorted((r for r in found if r is not None), key=lambda r: r.started_at)


def named(name: str, gone: bool = False) -> list[KeptCluster]:
    """The records a user's NAME means: `NAME` or `BACKEND/NAME`."""
    backend, _, bare = name.rpartition("/")
    pool = records() if not gone else _gone_records()
    return [r for r in pool if r.name == bare and backend in ("", r.backend)]


def _gone_records() -> list[KeptCluster]:
    found = [_read(path) for path in (folder() / "gone").glob("*.json")]
    return sorted((r for r in found if r is not None), key=lambda r: r.gone_at or 0)


def forget(record: KeptCluster) -> None:
    """The cluster is gone (torn down, stopped by its autostop, lost): its record moves to gone/,
    where `rayflow logs` still finds its last job, and leaves `rayflow status`."""
    with locked():
        path = _path(record.key)
        current = _read(path)
        if current is None or current.owner_run != record.owner_run:
            return  # already forgotten, or a newer cluster of this name: not this one's to drop
        _write(_path(record.key, gone=True), dataclasses.replace(current, gone_at=time.time()))
        path.unlink(missing_ok=True)
