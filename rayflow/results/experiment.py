"""An experiment's folder: where `resume` finds it, made and held while a run uses it, and the state
rayflow keeps beside Tune's (its MLflow parent run, the choices and keys a resume composes again).

The folder is a local one (`storage_path` a path: this machine's, or one every node mounts) or one
under an object store (`storage_path=s3://...`, rayflow.results.storage). Tune and Train write to
its `location` either way; rayflow reads what they wrote, and writes its own files, in `dir`: the
folder itself, or for an object store a private local mirror of it, pulled (checkpoints left out)
when a run claims it and after the run, and pushed to as rayflow writes.

A local folder is made atomically (mkdir) and held with an flock; an object store has neither, so
a run there holds a lease (LOCK_FILE, renewed while it runs): one not renewed for LEASE_S is a run
that ended without letting go (its machine, or its whole cluster, went).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rayflow.errors import ConfigError
from rayflow.results import storage
from rayflow.security.auth import cache_dir

STATE_FILE = "rayflow.json"  # next to Tune's own state: the MLflow parent run, for resume
# Held (flock) by the run that uses the experiment folder, for as long as it runs: a resume of it
# meanwhile is refused, and `resume=true` passes it by. The OS lets go of it when the run's
# process ends, however it ends, so a crashed run leaves no stale lock. On an object store: the
# lease object, renewed every LEASE_RENEW_S.
LOCK_FILE = ".rayflow.lock"
LEASE_S, LEASE_RENEW_S = 90.0, 20.0
SUFFIXES_MAX = 1000  # `-1` ... `-999` after an experiment_name whose folder exists


def _is_checkpoint_file(relative: str) -> bool:
    """A file inside a checkpoint folder: the mirror has the folder, not its files."""
    return any(part.startswith("checkpoint_") for part in relative.split("/")[:-1])


@dataclass(frozen=True)
class Experiment:
    """One experiment folder: `location`, what Tune and Train write to (an absolute path or an
    object-store URI); `dir`, where rayflow reads and writes (the folder, or its mirror)."""

    location: str

    @property
    def remote(self) -> bool:
        return storage.is_uri(self.location)

    @property
    def name(self) -> str:
        return storage.name(self.location)

    @property
    def dir(self) -> Path:
        if not self.remote:
            return Path(self.location)
        digest = hashlib.sha256(self.location.encode()).hexdigest()[:16]
        # object-store experiments' local mirrors, this user's only
        return cache_dir() / "mirror" / digest / self.name

    def __str__(self) -> str:
        return self.location

    def pull(self) -> Path:
        """The mirror made afresh from the store (checkpoint folders without their files)."""
        if self.remote:
            root = self.dir.parent
            root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True)
            storage.pull(self.location, self.dir, skip=_is_checkpoint_file)
        return self.dir

    def push(self, relative: str) -> None:
        """A file or folder rayflow wrote in the mirror, to the store."""
        if self.remote and (self.dir / relative).exists():
            storage.push(self.dir / relative, storage.join(self.location, relative))

    def has(self, relative: str) -> bool:
        if self.remote:
            return storage.modified(storage.join(self.location, relative)) is not None
        return (self.dir / relative).exists()


def where_kept(cfg) -> str:
    """Where this invocation's experiment lives or will: the experiment `resume=` names, else
    storage_path (as given)."""
    resume = cfg.resume
    return str(resume) if isinstance(resume, str) else str(cfg.storage_path)


def on_object_store(cfg) -> bool:
    return storage.is_uri(where_kept(cfg))


def _storage(cfg) -> str:
    """storage_path as a location: the URI, or the folder made absolute."""
    value = str(cfg.storage_path)
    return value.rstrip("/") if storage.is_uri(value) else str(Path(value).expanduser().resolve())


def _join(base: str, name: str) -> str:
    return storage.join(base, name) if storage.is_uri(base) else str(Path(base) / name)


def _state_names(base: str, workload: str) -> list[str]:
    """The experiments of `workload` under `base` (folders `<workload>-*` with a STATE_FILE)."""
    if not storage.is_uri(base):
        return [p.parent.name for p in Path(base).glob(f"{workload}-*/{STATE_FILE}")]
    return [
        n
        for n in storage.children(base)
        if n.startswith(f"{workload}-") and storage.modified(storage.join(base, n, STATE_FILE))
    ]


def _saved_at(experiment: Experiment) -> float:
    if experiment.remote:
        return storage.modified(storage.join(experiment.location, STATE_FILE)) or 0.0
    return (experiment.dir / STATE_FILE).stat().st_mtime


def locate(cfg) -> Experiment:
    """The experiment of this invocation: the one `resume` names (checked: a rayflow experiment
    of this workload that no run holds now), or, for a new one, where it would go
    (claimed_experiment makes it, with a suffix if another run took the name meanwhile).

    Every rayflow experiment folder has its STATE_FILE, written before the workload starts.
    """
    base = _storage(cfg)
    resume, name = cfg.resume, str(cfg.workload.name)
    if resume is False:
        return Experiment(_join(base, str(cfg.experiment_name)))
    if resume is True:
        candidates = [
            Experiment(_join(base, n))
            for n in _state_names(base, name)
            if _workload_of(Experiment(_join(base, n))) in (None, name)
        ]
        if not candidates:
            raise ConfigError("resume", f"no {name} experiment under {base} to resume")
        idle = [e for e in candidates if not is_running(e)]
        if not idle:
            raise ConfigError(
                "resume",
                f"every {name} experiment under {base} is running now (resume=true passes "
                "running ones by); give resume=PATH once its run has ended",
            )
        return max(idle, key=_saved_at)
    found = resumed_folder(cfg)
    saved = _workload_of(found)
    if saved not in (None, name):  # its config would be merged into another workload's keys
        raise ConfigError(
            "resume",
            f"{found} is an experiment of workload {saved}, not {name}; resume it with "
            f"workload={saved}",
        )
    return found


def experiment_dir(cfg) -> Path:
    """Where rayflow reads this invocation's experiment (locate; an object store's: its mirror)."""
    return locate(cfg).dir


def resumed_folder(cfg) -> Experiment:
    """The experiment `resume` names, whatever its workload (the resume composes its config
    from it: rayflow.orchestrator.compose.resumed): a rayflow experiment folder that no run holds
    now. resume=true: the latest of the workload the command line composes to (locate)."""
    if cfg.resume is True:
        return locate(cfg)
    value = str(cfg.resume)
    found = Experiment(
        value.rstrip("/") if storage.is_uri(value) else str(Path(value).expanduser().resolve())
    )
    if not read_state(found):
        raise ConfigError(
            "resume", f"{found} is not a rayflow experiment folder (no {STATE_FILE} there)"
        )
    if is_running(found):
        raise ConfigError(
            "resume",
            f"{found} is running now (another run holds {_join(found.location, LOCK_FILE)}); "
            "resume it once that run has ended",
        )
    return found


def _workload_of(experiment: Experiment) -> str | None:
    """The workload name an experiment ran, as its STATE_FILE says (None: it does not say)."""
    saved = read_state(experiment).get("config", {}).get("workload", {})
    return str(saved["name"]) if isinstance(saved, dict) and saved.get("name") else None


def is_running(experiment: Experiment | Path) -> bool:
    """Whether a run holds the experiment now (its lock tried without waiting and let go at once;
    on an object store, a lease renewed within LEASE_S)."""
    from filelock import FileLock, Timeout

    if isinstance(experiment, Experiment) and experiment.remote:
        at = storage.modified(storage.join(experiment.location, LOCK_FILE))
        return at is not None and time.time() - at < LEASE_S
    lock = FileLock(str(Path(str(experiment)) / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    except OSError:
        # a folder this user cannot write: no run of theirs holds it; claiming it says why
        return False
    lock.release()
    return False


@contextlib.contextmanager
def claimed_experiment(cfg) -> Iterator[Experiment]:
    """The experiment of this run, held while the block runs: a new one (two runs started in the
    same second get two folders, the second with a suffix), or the one `resume` names. A new
    folder the run left empty (it failed before it began) goes again."""
    if on_object_store(cfg):
        with _leased(cfg) as experiment:
            yield experiment
        return
    from filelock import FileLock, Timeout

    path = _new_folder(cfg) if cfg.resume is False else Path(locate(cfg).location)
    lock = FileLock(str(path / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except Timeout:  # the preflight found it free; another run took it since
        raise ConfigError(
            "resume",
            f"{path} is running now (another run holds {path / LOCK_FILE}); resume it once that "
            "run has ended",
        ) from None
    except OSError as err:
        raise ConfigError(
            "resume" if cfg.resume is not False else "storage_path",
            f"cannot lock {path / LOCK_FILE}: {err.strerror or err}",
        ) from None
    try:
        yield Experiment(str(path))
    finally:
        lock.release()
        if cfg.resume is False and {p.name for p in path.iterdir()} <= {LOCK_FILE}:
            (path / LOCK_FILE).unlink(missing_ok=True)
            path.rmdir()


def _lease_text() -> str:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})


@contextlib.contextmanager
def _leased(cfg) -> Iterator[Experiment]:
    """An object-store experiment held by a lease renewed in a thread while the block runs; the
    mirror pulled. A new experiment takes the first free name (no atomic create on a store: two
    runs naming one folder in the same instant is not guarded against)."""
    if cfg.resume is False:
        base, name = _storage(cfg), str(cfg.experiment_name)
        taken = set(storage.children(base))
        free = [
            n for n in (name, *(f"{name}-{k}" for k in range(1, SUFFIXES_MAX))) if n not in taken
        ]
        if not free:
            raise ConfigError("experiment_name", f"{base} holds {name} and its suffixes")
        experiment = Experiment(storage.join(base, free[0]))
    else:
        experiment = locate(cfg)
    lock = storage.join(experiment.location, LOCK_FILE)
    storage.write_text(lock, _lease_text())
    done = threading.Event()

    def renew() -> None:
        while not done.wait(LEASE_RENEW_S):
            with contextlib.suppress(OSError):  # a store that failed a moment: the next try
                storage.write_text(lock, _lease_text())

    thread = threading.Thread(target=renew, name="rayflow-experiment-lease", daemon=True)
    thread.start()
    try:
        experiment.pull()
        yield experiment
    finally:
        done.set()
        thread.join(5)
        with contextlib.suppress(OSError):
            storage.delete(lock)


def _new_folder(cfg) -> Path:
    base = Path(_storage(cfg))
    base.mkdir(parents=True, exist_ok=True)
    name = str(cfg.experiment_name)
    for n in range(SUFFIXES_MAX):
        path = base / (name if n == 0 else f"{name}-{n}")
        try:
            path.mkdir()  # atomic: exactly one run makes it
            return path
        except FileExistsError:
            continue
    raise ConfigError(
        "experiment_name",
        f"{base} holds {name} and {SUFFIXES_MAX - 1} suffixed folders of it; choose another "
        "experiment_name",
    )


def read_state(experiment: Experiment | Path) -> dict:
    """The experiment's STATE_FILE ({} where there is none, or it is not JSON)."""
    try:
        if isinstance(experiment, Experiment) and experiment.remote:
            text = storage.read_text(storage.join(experiment.location, STATE_FILE))
        else:
            text = (Path(str(experiment)) / STATE_FILE).read_text()
        return json.loads(text or "{}")
    except (OSError, ValueError):
        return {}


def write_state(experiment: Experiment | Path, state: dict) -> None:
    if not isinstance(experiment, Experiment):
        experiment = Experiment(str(experiment))
    experiment.dir.mkdir(parents=True, exist_ok=True)
    (experiment.dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    experiment.push(STATE_FILE)
