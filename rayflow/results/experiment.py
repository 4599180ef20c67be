"""An experiment's folder: where `resume` finds it, made atomically and locked while a run uses it,
and the state rayflow keeps beside Tune's (its MLflow parent run, the choices and keys a resume
composes again)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from rayflow.errors import ConfigError

STATE_FILE = "rayflow.json"  # next to Tune's own state: the MLflow parent run, for resume
# Held (flock) by the run that uses the experiment folder, for as long as it runs: a resume of it
# meanwhile is refused, and `resume=true` passes it by. The OS lets go of it when the run's
# process ends, however it ends, so a crashed run leaves no stale lock.
LOCK_FILE = ".rayflow.lock"
SUFFIXES_MAX = 1000  # `-1` ... `-999` after an experiment_name whose folder exists


def experiment_dir(cfg) -> Path:
    """The folder of this invocation's experiment: the one `resume` names (checked: a rayflow
    experiment of this workload that no run holds now), or, for a new one, where it would go
    (claimed_experiment makes it, with a suffix if another run took the name meanwhile).

    Every rayflow experiment folder has its STATE_FILE, written before the workload starts.
    """
    storage = Path(str(cfg.storage_path)).expanduser().resolve()
    resume, name = cfg.resume, str(cfg.workload.name)
    if resume is False:
        return storage / str(cfg.experiment_name)
    if resume is True:
        candidates = [
            p.parent
            for p in storage.glob(f"{name}-*/{STATE_FILE}")
            if _workload_of(p.parent) in (None, name)
        ]
        if not candidates:
            raise ConfigError("resume", f"no {name} experiment under {storage} to resume")
        idle = [p for p in candidates if not is_running(p)]
        if not idle:
            raise ConfigError(
                "resume",
                f"every {name} experiment under {storage} is running now (resume=true passes "
                "running ones by); give resume=PATH once its run has ended",
            )
        return max(idle, key=lambda p: (p / STATE_FILE).stat().st_mtime)
    path = resumed_folder(cfg)
    saved = _workload_of(path)
    if saved not in (None, name):  # its config would be merged into another workload's keys
        raise ConfigError(
            "resume",
            f"{path} is an experiment of workload {saved}, not {name}; resume it with "
            f"workload={saved}",
        )
    return path


def resumed_folder(cfg) -> Path:
    """The experiment `resume` names, whatever its workload (the resume composes its config
    from it: rayflow.orchestrator.compose.resumed): a rayflow experiment folder that no run holds
    now. resume=true: the latest of the workload the command line composes to (experiment_dir)."""
    if cfg.resume is True:
        return experiment_dir(cfg)
    path = Path(str(cfg.resume)).expanduser().resolve()
    if not (path / STATE_FILE).is_file():
        raise ConfigError("resume", f"{path} is not a rayflow experiment folder (no {STATE_FILE})")
    if is_running(path):
        raise ConfigError(
            "resume",
            f"{path} is running now (another run holds {path / LOCK_FILE}); resume it once that "
            "run has ended",
        )
    return path


def _workload_of(path: Path) -> str | None:
    """The workload name an experiment ran, as its STATE_FILE says (None: it does not say)."""
    saved = read_state(path).get("config", {}).get("workload", {})
    return str(saved["name"]) if isinstance(saved, dict) and saved.get("name") else None


def is_running(path: Path) -> bool:
    """Whether a run holds the experiment's lock now (tried without waiting, let go at once)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path / LOCK_FILE))
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
def claimed_experiment(cfg) -> Iterator[Path]:
    """The experiment folder of this run, locked while the block runs: a new one made with
    os.mkdir (two runs started in the same second get two folders, the second with a suffix), or
    the one `resume` names. A new folder the run left empty (it failed before it began) goes
    again."""
    from filelock import FileLock, Timeout

    path = _new_folder(cfg) if cfg.resume is False else experiment_dir(cfg)
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
        yield path
    finally:
        lock.release()
        if cfg.resume is False and {p.name for p in path.iterdir()} <= {LOCK_FILE}:
            (path / LOCK_FILE).unlink(missing_ok=True)
            path.rmdir()


def _new_folder(cfg) -> Path:
    storage = Path(str(cfg.storage_path)).expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    name = str(cfg.experiment_name)
    for n in range(SUFFIXES_MAX):
        path = storage / (name if n == 0 else f"{name}-{n}")
        try:
            path.mkdir()  # atomic: exactly one run makes it
            return path
        except FileExistsError:
            continue
    raise ConfigError(
        "experiment_name",
        f"{storage} holds {name} and {SUFFIXES_MAX - 1} suffixed folders of it; choose another "
        "experiment_name",
    )


def read_state(path: Path) -> dict:
    try:
        return json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def write_state(path: Path, state: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / STATE_FILE).write_text(json.dumps(state, indent=2))
