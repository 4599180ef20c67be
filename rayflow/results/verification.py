"""A resume reads nothing of an experiment before it is verified (rayflow.results.signing writes
what is verified here): its manifest signed by a trusted key (rayflow.results.trust), and every
file as the manifest says. What a verification found is this process's baseline for the
experiment, so the reads that follow are checked against it, not against what the store holds by
then: rayflow's state as it is read (`check_read`), the whole folder again right before Tune or
Train restores from it (`check_unchanged`). What this process writes into the experiment itself
(`note_own`) is left out of those checks.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from rayflow.errors import ConfigError
from rayflow.results import signing, storage, trust
from rayflow.results.signing import (
    MANIFEST,
    MANIFEST_MAX,
    SHOWN,
    Listing,
    entry,
    files_now,
    is_checkpoint_file,
)


@dataclass(frozen=True)
class Verified:
    """An experiment as its verification found it."""

    location: str
    issuer: str
    signed_at: float
    workload: str | None
    files: dict[str, dict]  # the signed manifest's files
    listing: Listing  # the folder when it was verified
    trusted: tuple[str, ...] = ()  # the trusted_signers it was verified with


class _Baselines:
    """What this process verified of each experiment it read (by location), and what it wrote
    into one since. Process-wide: a resume's verification and the reads and restores checked
    against it happen in different layers of the same process (the experiment's state, Tune's and
    Train's restore), which share no object but the location; its one instance is `_BASELINES`."""

    def __init__(self) -> None:
        self.verified: dict[str, Verified] = {}
        self.own: dict[str, set[str]] = {}  # written into it since it was verified

    def start(self, verified: Verified) -> None:
        self.verified[verified.location] = verified
        self.own.pop(verified.location, None)

    def forget(self, location: str) -> None:
        self.verified.pop(location, None)
        self.own.pop(location, None)


_BASELINES = _Baselines()


def manifest(location: str, key: str = "resume") -> dict | None:
    """The sealed manifest of an experiment (None: there is none, or it is not JSON)."""
    try:
        data = storage.read_capped(storage.join(location, MANIFEST), MANIFEST_MAX)
        found = json.loads(data) if data else None
    except storage.ReadRefused as err:
        raise ConfigError(key, str(err)) from None
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def signature(location: str, extra: Any = (), key: str = "resume") -> tuple[str, dict]:
    """("signed", the manifest) for an experiment signed by a trusted key, else ("unsigned" |
    "untrusted", what there is), from the manifest alone (resume=true looks at every candidate);
    the manifest's `issuer` is who signed it."""
    sealed = manifest(location, key)
    who = trust.issuer(sealed, "manifest", storage.name(location)) if sealed else None
    if who is None or sealed is None:
        return "unsigned", {}
    found = {**sealed["manifest"], "issuer": who}
    return ("signed" if who in trust.trusted(extra) else "untrusted"), found


def _when(at: Any) -> str:
    seconds = float(at) if isinstance(at, (int, float)) else 0.0
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def verify(location: str, extra: Any = (), key: str = "resume") -> Verified:
    """The experiment at `location` verified whole (ConfigError naming `key`, one line, for one
    that is unsigned, signed by a key not trusted, or changed since it was signed); it becomes this
    process's baseline for it."""
    status, found = signature(location, extra, key)
    if status == "unsigned":
        raise ConfigError(
            key,
            f"{location} is not signed ({MANIFEST} missing or not a valid signature): rayflow "
            "reads back only experiments signed by this user's key or one in trusted_signers",
        )
    if status == "untrusted":
        raise ConfigError(
            key,
            f"{location} is signed by {found['issuer']}, a key this user does not trust (this "
            f"user's is {trust.own_id()}); list it in trusted_signers to resume it",
        )
    listed = found.get("files")
    signed: dict[str, dict] = listed if isinstance(listed, dict) else {}
    try:
        now = files_now(location)
    except storage.ReadRefused as err:
        raise ConfigError(key, str(err)) from None
    changed = differences(location, signed, now)
    if changed:
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        # this user's own signature: most likely a run of theirs killed before it could sign
        # what it wrote last; only they can say so, having looked (never suggested for others')
        mine = found["issuer"] == trust.own_id()
        adopt = (
            "; if a run of yours wrote them (one killed before it signed them), look at them, "
            f"then sign the experiment as yours: rayflow sign {location}"
            if mine
            else ""
        )
        raise ConfigError(
            key,
            f"{location} changed since it was signed ({_when(found.get('signed_at'))}): "
            f"{', '.join(changed[:SHOWN])}{more}; it is not resumed{adopt}",
        )
    workload = found.get("workload")
    verified = Verified(
        location,
        found["issuer"],
        float(found.get("signed_at") or 0.0),
        str(workload) if workload else None,
        signed,
        now,
        tuple(str(e) for e in extra or ()),
    )
    _BASELINES.start(verified)
    return verified


def differences(location: str, signed: dict[str, Any], now: Listing) -> list[str]:
    """The files of the folder that are not as `signed` says: changed, added, or removed (but
    a checkpoint's: Tune removes old ones), each with what happened."""
    found = []
    for rel in sorted(set(signed) | set(now)):
        want, listed = signed.get(rel), now.get(rel)
        if listed is None:
            if not is_checkpoint_file(rel):
                found.append(f"{rel} (removed)")
        elif want is None:
            found.append(f"{rel} (added)")
        elif not _same(location, rel, listed, want):
            found.append(f"{rel} (changed)")
    return found


def _same(location: str, rel: str, listed: tuple[int, float, str], want: Any) -> bool:
    try:
        if not isinstance(want, dict):
            return False
        if "link" in want or "other" in want or listed[2] != "file":
            return entry(location, rel, listed, False) == want
        if listed[0] != want.get("size"):
            return False
        return "sha256" not in want or entry(location, rel, listed, True) == want
    except storage.ReadRefused:  # it grew past its listed size as it was read: not as signed
        return False


def baseline(location: str) -> Verified | None:
    return _BASELINES.verified.get(location)


def forget(location: str) -> None:
    """The run that held the experiment let go of it: a later resume verifies it afresh."""
    _BASELINES.forget(location)


def note_own(location: str, relative: str) -> None:
    """This process wrote `relative` into the experiment (its checks pass it by from now on)."""
    _BASELINES.own.setdefault(location, set()).add(relative)


def check_read(location: str, relative: str, data: bytes | None, key: str = "resume") -> None:
    """`data`, just read from `relative` of a verified experiment, is what was verified (or this
    process wrote it since); ConfigError otherwise. Nothing to check where none was verified.
    Where no run of this process holds the experiment, it may have been signed again since (a run
    on a cluster went on with it): verified afresh, `data` is checked against that."""
    verified = _BASELINES.verified.get(location)
    if verified is None or relative in _BASELINES.own.get(location, ()):
        return
    same = _matches(verified, relative, data)
    if not same and not signing.holds(location):
        same = _matches(verify(location, verified.trusted, key), relative, data)
    if not same:
        raise ConfigError(
            key,
            f"{storage.join(location, relative)} changed since the experiment was verified "
            f"({_when(time.time())}); it is not read",
        )


def _matches(verified: Verified, relative: str, data: bytes | None) -> bool:
    want = verified.files.get(relative)
    return (data is None and want is None) or (
        data is not None
        and isinstance(want, dict)
        and want.get("size") == len(data)
        and want.get("sha256") == hashlib.sha256(data).hexdigest()
    )


def check_unchanged(location: str, key: str = "resume") -> None:
    """Right before Tune or Train restores from the experiment: every file as it was verified
    (but what this process wrote since). ConfigError naming `key`, one line, otherwise; and for
    an experiment this process did not verify."""
    verified = _BASELINES.verified.get(location)
    if verified is None:
        raise ConfigError(key, f"{location} was not verified before its restore; it is not read")
    own = _BASELINES.own.get(location, set())
    try:
        now = {r: v for r, v in files_now(location).items() if r not in own}
    except storage.ReadRefused as err:
        raise ConfigError(key, str(err)) from None
    signed = {r: v for r, v in verified.files.items() if r not in own}
    changed = differences(location, signed, now)
    if changed:
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        raise ConfigError(
            key,
            f"{location} changed since it was verified ({_when(verified.signed_at)} signature): "
            f"{', '.join(changed[:SHOWN])}{more}; it is not restored",
        )


def adopt(location: str) -> str:
    """`rayflow sign PATH`: the experiment signed by this user as it is now, on their word that
    what it holds is theirs (a run killed before it signed what it wrote last). Returns what it
    was before, in words: whose signature, and what had changed since."""
    status, found = signature(location, key="path")
    if status == "unsigned":
        before = "it was not signed"
    else:
        listed = found.get("files")
        changed = differences(
            location, listed if isinstance(listed, dict) else {}, files_now(location)
        )
        who = "yours" if found["issuer"] == trust.own_id() else f"{found['issuer']}'s"
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        since = f"; changed since: {', '.join(changed[:SHOWN])}{more}" if changed else ""
        before = f"its signature was {who} ({_when(found.get('signed_at'))}){since}"
    workload = found.get("workload") if status != "unsigned" else _workload_of(location)
    signing.sign_folder(location, str(workload) if workload else None)
    return before


def _workload_of(location: str) -> str | None:
    """The workload an unsigned experiment's state names (None where it says none)."""
    try:
        data = storage.read_capped(storage.join(location, "rayflow.json"), MANIFEST_MAX)
        saved = json.loads(data or b"{}").get("config", {}).get("workload", {})
    except (OSError, ValueError, AttributeError, storage.ReadRefused):
        return None
    return str(saved["name"]) if isinstance(saved, dict) and saved.get("name") else None
