"""The lease that holds an experiment on an object store while its run runs (a store has no
flock): an object, LOCK_FILE in the experiment, renewed every LEASE_RENEW_S; one not renewed for
LEASE_S is a run that ended without letting go (its machine, or its whole cluster, went).

A bucket is a shared place: anyone who can write there can write that object. So a lease goes out
sealed (rayflow.results.trust: the experiment it is for, host, pid, time, signed by the run's key)
and holds the experiment only when a trusted key sealed it for that experiment and it is fresh;
anything else there is passed by, with one warning, and blocks no resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

from rayflow.results import signing, storage, trust
from rayflow.results.signing import LOCK_FILE

LEASE_S, LEASE_RENEW_S = 90.0, 20.0
LEASE_MAX = 64 * 2**10  # bytes of a lease object rayflow reads


class _PassedBy:
    """The leases this process said it passes by, each said once (a resume asks more than once).
    Process-wide: the warning is said to the process's user, whichever run or resume of it asks;
    its one instance is `_PASSED_BY`."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def first_time(self, uri: str) -> bool:
        """Whether `uri` is passed by for the first time here (from now on it is not)."""
        if uri in self.warned:
            return False
        self.warned.add(uri)
        return True


_PASSED_BY = _PassedBy()


def lease_text(location: str) -> str:
    """A lease on the experiment at `location`, sealed: who holds it, since when."""
    doc = {"experiment": location, "host": socket.gethostname(), "pid": os.getpid()}
    return json.dumps(trust.seal("lease", {**doc, "at": time.time()}))


def issuer(text: str | None, location: str) -> str | None:
    """Who sealed a lease on `location` (None: it is not one rayflow sealed for it)."""
    try:
        sealed = json.loads(text or "")
    except ValueError:
        return None
    who = trust.issuer(sealed, "lease", storage.name(location))
    return who if who and sealed["lease"].get("experiment") == location else None


def _age(text: str) -> float:
    """Seconds since a sealed lease was renewed, by its own signed time."""
    at = json.loads(text)["lease"].get("at")
    return time.time() - float(at) if isinstance(at, (int, float)) else float("inf")


def held(location: str, trusted: tuple[str, ...] = ()) -> bool:
    """Whether a run holds the experiment at `location` now: a lease a trusted key sealed for it,
    renewed within LEASE_S (by the store's clock and its own). One not sealed so: one warning."""
    uri = storage.join(location, LOCK_FILE)
    at = storage.modified(uri)
    if at is None or time.time() - at >= LEASE_S:
        return False
    try:
        text = storage.read_text(uri, LEASE_MAX)
    except (storage.ReadRefused, UnicodeDecodeError):
        text = None
    who = issuer(text, location)
    if text is None or who is None or who not in trust.trusted(trusted):
        if _PASSED_BY.first_time(uri):  # once: a resume asks more than once
            signing.warn(
                f"{uri} is not a lease signed by a trusted key: no run of this user's holds the "
                "experiment, and it is passed by"
            )
        return False
    return _age(text) < LEASE_S


@contextlib.contextmanager
def leased(location: str) -> Iterator[None]:
    """The experiment at `location` held while the block runs: its lease written, renewed in a
    thread, removed at the end."""
    uri = storage.join(location, LOCK_FILE)
    storage.write_text(uri, lease_text(location))
    done = threading.Event()

    def renew() -> None:
        while not done.wait(LEASE_RENEW_S):
            with contextlib.suppress(OSError):  # a store that failed a moment: the next try
                storage.write_text(uri, lease_text(location))

    thread = threading.Thread(target=renew, name="rayflow-experiment-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        with contextlib.suppress(OSError):
            storage.delete(uri)
