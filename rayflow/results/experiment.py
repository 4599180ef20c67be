"""An experiment's folder: where `resume` finds it, made and held while a run uses it, and the state
rayflow keeps beside Tune's (its MLflow parent run, the choices and keys a resume composes again).

The folder is a local one (`storage_path` a path: this machine's, or one every node mounts) or one
under an object store (`storage_path=s3://...`, rayflow.results.storage). Tune and Train write to
its `location` either way; rayflow reads what they wrote, and writes its own files, in `dir`: the
folder itself, or for an object store a private local mirror of it, pulled (checkpoints left out)
when a run claims it and after the run, and pushed to as rayflow writes.

A local folder is made atomically (mkdir) and held with an flock; an object store has neither, so
a run there holds a signed lease (rayflow.results.lease).

Every experiment is signed by the run that holds it (rayflow.results.signing), and a resume reads
nothing of one before it is verified (rayflow.results.verification): `locate` finds only
experiments signed by a trusted key (this user's, or one in `trusted_signers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayflow.errors import ConfigError
from rayflow.results import lease, signing, storage, verification
from rayflow.results.signing import LOCK_FILE, is_checkpoint_file
from rayflow.security.auth import cache_dir
from rayflow.security.printable import printable_line

STATE_FILE = "rayflow.json"  # next to Tune's own state: the MLflow parent run, for resume
STATE_MAX = 8 * 2**20  # bytes of a STATE_FILE rayflow reads
# LOCK_FILE: held (flock) by the run that uses the experiment folder, for as long as it runs: a
# resume of it meanwhile is refused, and `resume=true` passes it by. The OS lets go of it when the
# run's process ends, however it ends, so a crashed run leaves no stale lock. On an object store:
# the lease object (rayflow.results.lease).
SUFFIXES_MAX = 1000  # `-1` ... `-999` after an experiment_name whose folder exists
# What the mirror of an experiment (its files but its checkpoints') may hold
MIRROR_FILES_MAX, MIRROR_BYTES_MAX = 100_000, 4 * 2**30
__all__ = ["LOCK_FILE", "STATE_FILE", "Experiment", "Resumed"]


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

    def pull(self, key: str = "resume") -> Path:
        """The mirror made afresh from the store (checkpoint folders without their files); past
        its caps, one ConfigError naming `key` (the setting that named the experiment)."""
        if self.remote:
            root = self.dir.parent
            root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True)
            try:
                storage.pull(
                    self.location,
                    self.dir,
                    skip=is_checkpoint_file,
                    max_files=MIRROR_FILES_MAX,
                    max_bytes=MIRROR_BYTES_MAX,
                )
            except storage.ReadRefused as err:
                raise ConfigError(key, str(err)) from None
        return self.dir

    def push(self, relative: str) -> None:
        """A file or folder rayflow wrote in the mirror, to the store."""
        if self.remote and (self.dir / relative).exists():
            storage.push(self.dir / relative, storage.join(self.location, relative))

    def has(self, relative: str) -> bool:
        if self.remote:
            return storage.modified(storage.join(self.location, relative)) is not None
        return (self.dir / relative).exists()


@dataclass(frozen=True)
class Resumed:
    """The experiment a resume goes on with, as the preflight found it: located (checked and
    verified) and its state read, once (each a network call on an object store). The run takes
    both from its Plan rather than finding and reading them again."""

    experiment: Experiment
    state: Mapping[str, Any]  # its STATE_FILE as read_state read it
    workload: str | None  # the workload its signature names (None: it names none)
    # STATE_FILE's entry in the verification `state` was read under: held_state reads the state
    # again only where the run's own verification, once it holds the experiment, differs
    read_under: dict | None = None


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
    """The folders under `base` that may be experiments of `workload` (`<workload>-*`, with a
    STATE_FILE or a manifest)."""
    if not storage.is_uri(base):
        return sorted(
            {
                p.parent.name
                for f in (STATE_FILE, signing.MANIFEST)
                for p in Path(base).glob(f"{workload}-*/{f}")
            }
        )
    return [
        n
        for n in storage.children(base)
        if n.startswith(f"{workload}-")
        and any(storage.modified(storage.join(base, n, f)) for f in (STATE_FILE, signing.MANIFEST))
    ]


def trusted_signers(cfg) -> tuple[str, ...]:
    """The keys besides this user's whose experiments a resume believes (`trusted_signers`)."""
    return tuple(str(k) for k in (cfg.get("trusted_signers") or ()))


def locate(cfg) -> Experiment:
    """The experiment of this invocation: the one `resume` names (checked: a rayflow experiment
    of this workload, signed by a trusted key, that no run holds now), or, for a new one, where it
    would go (claimed_experiment makes it, with a suffix if another run took the name meanwhile).

    Every rayflow experiment folder has its STATE_FILE, written before the workload starts, and
    its manifest, signed from then on.
    """
    base = _storage(cfg)
    if cfg.resume is False:
        return Experiment(_join(base, str(cfg.experiment_name)))
    if cfg.resume is True:
        return _verified(cfg, _latest(cfg, base))
    found, saved = _named(cfg)
    _check_workload(found, saved, str(cfg.workload.name))
    return _verified(cfg, found)


def _check_workload(found: Experiment, saved: str | None, name: str) -> None:
    """An experiment of workload `saved` (its signature's) is resumed by a job of that workload."""
    if saved not in (None, name):  # its config would be merged into another workload's keys
        raise ConfigError(
            "resume",
            f"{found} is an experiment of workload {saved}, not {name}; resume it with "
            f"workload={saved}",
        )


def _verified(cfg, found: Experiment) -> Experiment:
    """`found`, its files verified (once: later reads check against what was verified)."""
    if verification.baseline(found.location) is None:
        verification.verify(found.location, trusted_signers(cfg))
    return found


def _latest(cfg, base: str) -> Experiment:
    """resume=true: the latest experiment of the workload under `base` that a trusted key signed
    (by its signature's time) and no run holds; the others are passed by, and counted."""
    name = str(cfg.workload.name)
    passed = {"unsigned": 0, "untrusted": 0}
    candidates = []
    for folder in _state_names(base, name):
        experiment = Experiment(_join(base, folder))
        status, found = verification.signature(experiment.location, trusted_signers(cfg))
        if status != "signed":
            passed[status] += 1
        elif found.get("workload") == name:
            candidates.append((float(found.get("signed_at") or 0.0), experiment))
    if not candidates:
        raise ConfigError("resume", f"no {name} experiment under {base} to resume{_passed(passed)}")
    idle = [(at, e) for at, e in candidates if not is_running(e, trusted_signers(cfg))]
    if not idle:
        raise ConfigError(
            "resume",
            f"every {name} experiment under {base} is running now (resume=true passes "
            "running ones by); give resume=PATH once its run has ended",
        )
    return _of_this_project(name, base, idle)


SHOWN_OTHERS = 3  # experiments of other folders a resume names


def _project_of(experiment: Experiment) -> str | None:
    """The folder the experiment's run was started from (its state's `project`), as one printable
    line; None where the state records none (written before rayflow recorded it)."""
    project = read_state(experiment).get("project")
    return printable_line(project) if isinstance(project, str) else None


def _of_this_project(name: str, base: str, idle: list[tuple[float, Experiment]]) -> Experiment:
    """The latest of `idle` that was run from this folder (its state's `project`; one from before
    rayflow recorded it counts as this folder's), said in one line with where it was found and the
    experiments of other folders it passed over. A store several projects share must not hand one
    project's experiment to another's resume."""
    here = str(Path.cwd())
    # read before the experiment is verified (only the chosen one will be): data to compare and
    # show, each shown as one printable line (a shared store's files are anyone's text)
    projects = {e.location: _project_of(e) for _, e in idle}
    ours = [(at, e) for at, e in idle if projects[e.location] in (None, here)]
    others = sorted(
        ((at, e) for at, e in idle if projects[e.location] not in (None, here)),
        key=lambda pair: -pair[0],
    )
    named = ", ".join(
        f"{printable_line(e.name)} ({projects[e.location]})" for _, e in others[:SHOWN_OTHERS]
    )
    more = f" and {len(others) - SHOWN_OTHERS} more" if len(others) > SHOWN_OTHERS else ""
    passed = f"{len(others)} of other folders: {named}{more}" if others else ""
    if not ours:
        raise ConfigError(
            "resume",
            f"no {name} experiment of this folder ({here}) under {base}; passed over {passed}. "
            "Run from the folder that started it, or give resume=PATH",
        )
    chosen = max(ours, key=lambda pair: pair[0])[1]
    print(
        f"[rayflow] resume: continuing {printable_line(chosen.name)} "
        f"({printable_line(chosen.location)}), the latest {name} "
        f"experiment of this folder under {base}" + (f" (passed over {passed})" if passed else ""),
        flush=True,
    )
    return chosen


def _passed(passed: dict[str, int]) -> str:
    said = [
        f"{passed['unsigned']} unsigned" if passed["unsigned"] else "",
        f"{passed['untrusted']} signed by a key not trusted" if passed["untrusted"] else "",
    ]
    said = [s for s in said if s]
    return f" (passed by: {' and '.join(said)}; trusted_signers names other keys)" if said else ""


def experiment_dir(cfg) -> Path:
    """Where rayflow reads this invocation's experiment (locate; an object store's: its mirror)."""
    return locate(cfg).dir


def resumed_folder(cfg) -> Resumed:
    """The experiment `resume` names, whatever its workload (the resume composes its config from
    it: rayflow.orchestrator.resume.resumed), verified, with its state. resume=true: the latest of
    the workload the command line composes to."""
    return _resumed(locate(cfg) if cfg.resume is True else _verified(cfg, _named(cfg)[0]))


def located(cfg, found: Resumed | None = None) -> Resumed:
    """The experiment a resume's job goes on with, checked against the job's workload: `found`
    (composing the resume located it), else located and its state read now (a config given whole:
    rayflow.dry_run's, the Hydra sweeper's)."""
    if found is None:
        return _resumed(locate(cfg))
    _check_workload(found.experiment, found.workload, str(cfg.workload.name))
    return found


def _resumed(experiment: Experiment) -> Resumed:
    """`experiment`, verified, with its state: the one read of it a resume makes."""
    state = read_state(experiment)
    # after the read: a state signed again since is read under a verification made afresh
    verified = verification.baseline(experiment.location)
    if verified is None:
        return Resumed(experiment, state, None)
    return Resumed(experiment, state, verified.workload, verified.files.get(STATE_FILE))


def held_state(found: Resumed) -> dict:
    """The state a resumed run goes on from, now that it holds the experiment (claimed_experiment
    verified it again): as the preflight read it, where the state is still that; else read again,
    as it was changed meanwhile by another run (an earlier job of this sweep, another process)."""
    held = verification.baseline(found.experiment.location)
    if held is not None and held.files.get(STATE_FILE) == found.read_under:
        return dict(found.state)
    return read_state(found.experiment)


def _named(cfg) -> tuple[Experiment, str | None]:
    """The experiment resume=PATH names, and its workload: a rayflow experiment folder, signed by
    a trusted key (its signature alone: `_verified` has its files verified), that no run holds
    now."""
    value = str(cfg.resume)
    found = Experiment(
        value.rstrip("/") if storage.is_uri(value) else str(Path(value).expanduser().resolve())
    )
    status, manifest = verification.signature(found.location, trusted_signers(cfg))
    if status == "unsigned" and not found.has(STATE_FILE):
        raise ConfigError(
            "resume", f"{found} is not a rayflow experiment folder (no {STATE_FILE} there)"
        )
    if status != "signed":  # its refusal, in words
        verification.verify(found.location, trusted_signers(cfg))
    _refuse_running(cfg, found)
    saved = manifest.get("workload")
    return found, str(saved) if saved else None


def _refuse_running(cfg, found: Experiment) -> None:
    if is_running(found, trusted_signers(cfg)):
        raise ConfigError(
            "resume",
            f"{found} is running now (another run holds {_join(found.location, LOCK_FILE)}); "
            "resume it once that run has ended",
        )


def is_running(experiment: Experiment | Path, trusted: tuple[str, ...] = ()) -> bool:
    """Whether a run holds the experiment now (its lock tried without waiting and let go at once;
    on an object store, a lease signed by a trusted key and renewed within LEASE_S: one not
    signed so is one warning, and no run's)."""
    from filelock import FileLock, Timeout

    if isinstance(experiment, Experiment) and experiment.remote:
        return lease.held(experiment.location, trusted)
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
def claimed_experiment(cfg, where: Experiment | None = None) -> Iterator[Experiment]:
    """The experiment of this run, held while the block runs, and signed (rayflow.results
    .signing): a new one (two runs started in the same second get two folders, the second with a
    suffix), or the one `resume` names (`where`: as the preflight located it; else located now),
    verified again once held. A new folder the run left empty (it failed before it began) goes
    again."""
    holder = _leased if on_object_store(cfg) else _locked
    with holder(cfg, where) as experiment:
        baseline = None
        if cfg.resume is not False:  # held now: what it holds is what the run goes on from
            baseline = verification.verify(experiment.location, trusted_signers(cfg))
        try:
            found = (baseline.files, baseline.listing) if baseline else None
            with signing.signed(experiment.location, str(cfg.workload.name), found):
                yield experiment
        finally:
            verification.forget(experiment.location)


@contextlib.contextmanager
def _locked(cfg, where: Experiment | None = None) -> Iterator[Experiment]:
    """A folder of this machine, held with its flock while the block runs."""
    from filelock import FileLock, Timeout

    path = _new_folder(cfg) if cfg.resume is False else Path((where or locate(cfg)).location)
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


@contextlib.contextmanager
def _leased(cfg, where: Experiment | None = None) -> Iterator[Experiment]:
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
    elif where is None:
        experiment = locate(cfg)
    else:
        # a store has no lock to take at once: whether a run holds it is asked again now, not
        # taken from the preflight (an earlier job of a sweep may have run for hours since)
        experiment = where
        _refuse_running(cfg, experiment)
    with lease.leased(experiment.location):
        experiment.pull("resume" if cfg.resume is not False else "storage_path")
        yield experiment


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
    """The experiment's STATE_FILE ({} where there is none, or it is not JSON), read at most
    STATE_MAX bytes, and, of an experiment a resume verified, only as it was verified."""
    if not isinstance(experiment, Experiment):
        experiment = Experiment(str(experiment))
    try:
        data = storage.read_capped(storage.join(experiment.location, STATE_FILE), STATE_MAX)
    except storage.ReadRefused as err:
        raise ConfigError("resume", str(err)) from None
    except OSError:
        return {}
    verification.check_read(experiment.location, STATE_FILE, data)
    try:
        state = json.loads(data or b"{}")
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def write_state(experiment: Experiment | Path, state: dict) -> None:
    """The experiment's STATE_FILE written (pushed to its store), and the experiment signed."""
    if not isinstance(experiment, Experiment):
        experiment = Experiment(str(experiment))
    experiment.dir.mkdir(parents=True, exist_ok=True)
    (experiment.dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    experiment.push(STATE_FILE)
    verification.note_own(experiment.location, STATE_FILE)
    signing.sign_now(experiment.location)
