"""Every experiment rayflow writes is signed by the user who wrote it, and verified before a resume
reads any of it (rayflow.results.trust: whose signatures are believed).

The signature covers a manifest (MANIFEST, in the experiment folder): every file of the experiment
with its size and sha256 (rayflow's state, Tune's experiment state, tuner.pkl, the searcher's and
each trial's pickles and results), but inside checkpoint folders, whose files are listed with
their size, and a digest only where it is cheap (a small file). A run signs while
it holds the folder (`signed`): at once where something changed, every few seconds while it runs,
and when it ends however it ends, so a run killed outright leaves seconds unsigned. Each signing
reads only the files that changed since the last (by size and time).

A resume verifies the manifest first (`verify`): unsigned, signed by a key not trusted, or changed
since it was signed (a file's digest or size, a file added, one removed outside the checkpoint
folders) is one ConfigError naming `resume`. What it verified is this process's baseline for the
experiment: a read of rayflow's state, and Tune's or Train's restore, check against it again
(`check_read`, `check_unchanged`), so nothing changed between the check and the read is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rayflow.errors import ClusterError
from rayflow.results import storage, trust

MANIFEST = "rayflow.manifest.json"
LOCK_FILE = ".rayflow.lock"  # the run's lock or lease (rayflow.results.experiment): not signed
# The runs' log (rayflow.runtime.run_log), appended to by each run of the experiment until it
# ends: not signed, as rayflow never reads it back (it is for people, and opened O_NOFOLLOW)
RUN_LOG = "rayflow.log"
MANIFEST_MAX = 64 * 2**20  # bytes of a manifest rayflow reads
FILES_MAX = 200_000  # files of one experiment rayflow signs or verifies
# How often a run signs what changed: a folder's listing is a few stat calls, so often (a run
# killed outright leaves at most this much unsigned); a store's is a request, so less often.
SIGN_EVERY_S, SIGN_EVERY_S_STORE = 2.0, 10.0
# A checkpoint's file up to this size gets a digest: on this machine, and on a store (read back
# once after it is written: its metadata and small pickles, not its weights)
CHEAP_DIGEST, CHEAP_DIGEST_STORE = 4 * 2**20, 256 * 2**10
SHOWN = 5  # changed files a refusal names

# (size, last change, "file" | "link" | "other") of each file, by its path in the experiment
Listing = dict[str, tuple[int, float, str]]
# What a verification found: the signed manifest's files (their entries), and the folder's listing
Verified = tuple[dict[str, dict], Listing]


def is_checkpoint_file(relative: str) -> bool:
    """A file inside a checkpoint folder (Tune's and Train's `checkpoint_*`)."""
    return any(part.startswith("checkpoint_") for part in relative.split("/")[:-1])


def files_now(location: str) -> Listing:
    """The experiment's files now (but the manifest and the lock), in one listing."""
    if storage.is_uri(location):
        found = {rel: (size, at, "file") for rel, size, at in storage.files(location)}
    else:
        found = _local_listing(Path(location))
    if len(found) > FILES_MAX:
        raise storage.ReadRefused(location, len(found), FILES_MAX, "files")
    return {
        r: s
        for r, s in found.items()
        if r not in (LOCK_FILE, RUN_LOG) and not r.startswith(MANIFEST)
    }


def _local_listing(root: Path) -> Listing:
    found: Listing = {}
    for folder, dirs, names in os.walk(root):  # symlinks are not followed: listed as links
        for name in [*names, *(d for d in dirs if os.path.islink(os.path.join(folder, d)))]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            kind = "file" if stat.S_ISREG(info.st_mode) else "other"
            kind = "link" if stat.S_ISLNK(info.st_mode) else kind
            found[os.path.relpath(path, root).replace(os.sep, "/")] = (
                info.st_size,
                float(info.st_mtime_ns),
                kind,
            )
        if len(found) > FILES_MAX:
            break
    return found


def entry(location: str, relative: str, listed: tuple[int, float, str], digest: bool) -> dict:
    """What the manifest says of one file: its size, and its sha256 where `digest`."""
    size, _, kind = listed
    if kind == "link":
        return {"link": os.readlink(os.path.join(location, relative))}
    if kind == "other":
        return {"other": True}
    if not digest:
        return {"size": size}
    done, sha = _digest(location, relative, size)
    return {"size": done, "sha256": sha}


def digests(location: str, relative: str, size: int) -> bool:
    """Whether a file gets a digest: every one outside checkpoint folders; inside them, a small
    one (a store's large checkpoint files are not read back to sign them)."""
    if not is_checkpoint_file(relative):
        return True
    return size <= (CHEAP_DIGEST_STORE if storage.is_uri(location) else CHEAP_DIGEST)


def _digest(location: str, relative: str, size: int) -> tuple[int, str]:
    """(bytes read, their sha256): the file as it is now, read to its end (it may have grown
    since it was listed), at most its listed size and 64 MiB more."""
    limit, sha, done = size + storage.CHUNK * 16, hashlib.sha256(), 0
    if storage.is_uri(location):
        filesystem, path = storage.filesystem(storage.join(location, relative))
        stream = filesystem.open_input_stream(path)
    else:
        fd = os.open(os.path.join(location, relative), os.O_RDONLY | os.O_NOFOLLOW)
        stream = os.fdopen(fd, "rb")
    with stream:
        while chunk := stream.read(storage.CHUNK):
            done += len(chunk)
            if done > limit:
                raise storage.ReadRefused(storage.join(location, relative), done, limit)
            sha.update(chunk)
    return done, sha.hexdigest()


def _write(location: str, workload: str | None, files: dict[str, dict]) -> None:
    doc = {
        "rayflow_manifest": 1,
        "experiment": storage.name(location),
        "workload": workload,
        "signed_at": round(time.time(), 3),
        "files": files,
    }
    text = json.dumps(trust.seal("manifest", doc), sort_keys=True)
    if storage.is_uri(location):
        storage.write_text(storage.join(location, MANIFEST), text)
        return
    partial = Path(location) / f"{MANIFEST}.{os.getpid()}.partial"  # one rename: never half one
    partial.write_text(text)
    partial.replace(Path(location) / MANIFEST)


class Signer:
    """Signs one experiment: its manifest written again whenever its files changed, each file read
    again only where it changed (size, time) since the last signing."""

    def __init__(self, location: str, workload: str | None, verified: Verified | None = None):
        self.location, self.workload = location, workload
        self._known: dict[str, tuple[tuple[int, float, str], dict]] = {}
        self._signed: Listing | None = None
        if verified is not None:  # what a resume verified is signed already
            files, listing = verified
            self._known = {r: (listing[r], e) for r, e in files.items() if r in listing}
            self._signed = listing
        self._lock = threading.Lock()

    def sign_if_changed(self) -> bool:
        with self._lock:
            now = files_now(self.location)
            if not now or now == self._signed:
                return False
            files = {
                rel: self._known[rel][1]
                for rel, listed in now.items()
                if rel in self._known and self._known[rel][0] == listed
            }
            changed = [rel for rel in now if rel not in files]
            files.update(zip(changed, _entries(self.location, changed, now), strict=True))
            _write(self.location, self.workload, files)
            self._known = {rel: (now[rel], files[rel]) for rel in now}
            self._signed = now
            return True


def _entries(location: str, changed: list[str], now: Listing) -> list[dict]:
    """The manifest's entries of the files that changed: on a store, read a few at once (each
    read is a request: one after the other, a run's end waited half a second on them)."""

    def one(rel: str) -> dict:
        return entry(location, rel, now[rel], digests(location, rel, now[rel][0]))

    if not storage.is_uri(location) or len(changed) < 2:
        return [one(rel) for rel in changed]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="rayflow-sign") as pool:
        return list(pool.map(one, changed))


class _Holding:
    """The experiments this process holds (a run of its signs each while it runs: `signed`), by
    location, each with its signer. Process-wide: what asks whether one is held, or has it signed
    at once (a resume's reads, Tune's and Train's ends), shares no object with the run that holds
    it but the location; its one instance is `_HOLDING`."""

    def __init__(self) -> None:
        self.signers: dict[str, Signer] = {}


_HOLDING = _Holding()


def holds(location: str) -> bool:
    """Whether a run of this process holds (and signs) the experiment now."""
    return location in _HOLDING.signers


def sign_folder(location: str, workload: str | None) -> None:
    """Sign an experiment as it is now, once."""
    Signer(location, workload).sign_if_changed()


@contextlib.contextmanager
def signed(
    location: str, workload: str | None, verified: Verified | None = None
) -> Iterator[Signer]:
    """The experiment signed while the block runs: every few seconds where something changed, and
    at its end however it ends (`verified`: what a resume verified, signed already). A signing
    that fails is one warning; the next one tries again."""
    signer = Signer(location, workload, verified)
    _HOLDING.signers[location] = signer
    done, warned = threading.Event(), [False]

    def tick() -> None:
        try:
            signer.sign_if_changed()
        except (OSError, storage.StorageError, ClusterError) as err:
            if not warned[0]:
                warned[0] = True
                warn(f"{location}: not signed this time ({type(err).__name__}: {err})")

    every = SIGN_EVERY_S_STORE if storage.is_uri(location) else SIGN_EVERY_S

    def loop() -> None:
        while not done.wait(every):
            tick()

    thread = threading.Thread(target=loop, name="rayflow-experiment-signer", daemon=True)
    thread.start()
    try:
        yield signer
    finally:
        done.set()
        thread.join(60)  # a signing under way: its reads are bounded
        tick()
        _HOLDING.signers.pop(location, None)


def sign_now(location: str) -> None:
    """Sign at once where this process holds the experiment (rayflow wrote into it, Tune or Train
    ended); nothing elsewhere."""
    signer = _HOLDING.signers.get(location)
    if signer is not None:
        try:
            signer.sign_if_changed()
        except (OSError, storage.StorageError, ClusterError) as err:
            warn(f"{location}: not signed this time ({type(err).__name__}: {err})")


def warn(text: str) -> None:
    from rayflow.security.redaction import mask_text

    print(f"rayflow: warning: {mask_text(text)}", file=sys.stderr, flush=True)
