"""Ray's token: where this driver finds it, keeping it private, and the one rule for auth off.

Ray 2.60 turns token auth on when `RAY_AUTH_MODE=token`; driver, head, workers and the Jobs
client must all hold the same token. rayflow never prints it or writes it into a spec.

The token file is a credential: 0600 in a 0700 folder, here and on every node (Ray writes it
0644 in a 0755 `~/.ray`). With `ray_auth_mode=disabled`, Ray's Jobs API and Ray Client run any
code for anyone who reaches them (ShadowRay, CVE-2023-48022), so auth off is refused wherever a
Ray port listens beyond loopback: `refuse_auth_off` is that rule, and every backend calls it.
Every cluster Ray 2.60 starts has such ports (measured: even `ray.init(_node_ip_address=
"127.0.0.1", dashboard_host="127.0.0.1")` leaves the GCS, raylet, dashboard agent, runtime-env
agent and workers on all interfaces or the host's address, and Ray has no setting to bind them
all to loopback), so in practice auth off is refused on every backend.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
from pathlib import Path

from rayflow.errors import ClusterError, ConfigError


def token_path() -> Path:
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def auth_token() -> str | None:
    """The token this driver authenticates with: RAY_AUTH_TOKEN, its file, or ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    try:
        return token_path().read_text().strip() or None
    except OSError:
        return None


def ray_default_token_path() -> Path:
    """Where Ray writes a token it generates (ray.init, `ray get-auth-token --generate`),
    whatever RAY_AUTH_TOKEN_PATH says."""
    return Path.home() / ".ray" / "auth_token"


def secure_token_file(path: Path | None = None) -> None:
    """The token file 0600 and its folder 0700, where this user owns them (Ray writes 0644 in a
    0755 folder). A file owned by someone else is left alone: it is theirs to fix. No `path`:
    the file this driver reads (its folder is the user's choice: only the file is tightened)
    and the one Ray generates into, in ~/.ray."""
    if path is not None:
        targets = [(path.parent, 0o700), (path, 0o600)]
    else:
        default = ray_default_token_path()
        targets = [(default.parent, 0o700), (default, 0o600), (token_path(), 0o600)]
    for target, mode in targets:
        try:
            info = target.lstat()  # a symlink is not followed: chmod would change its target
        except FileNotFoundError:
            continue
        if (
            not stat.S_ISLNK(info.st_mode)
            and info.st_uid == os.getuid()
            and stat.S_IMODE(info.st_mode) & 0o077
        ):
            target.chmod(mode)


def private_token_folder() -> None:
    """Ray's token folder (~/.ray) made 0700 before anything may write a token into it, so the
    0644 file Ray writes is never readable by others, even before it is made 0600."""
    ray_default_token_path().parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    secure_token_file()


def ensure_token() -> None:
    """Make a token (Ray's own `ray get-auth-token --generate`) if this driver has none, so every
    node the cluster starts gets the same one; either way the file is made private."""
    private_token_folder()
    if auth_token() is None:
        subprocess.run(
            [str(Path(sys.executable).parent / "ray"), "get-auth-token", "--generate"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
    secure_token_file()


def cache_dir() -> Path:
    """This user's cache of rayflow's (kept clusters, vm cluster names, experiment mirrors,
    locks): $XDG_CACHE_HOME/rayflow, else ~/.cache/rayflow. Each folder in it is made private by
    `private_folder` where it is used."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".cache") / "rayflow"


def private_folder(path: Path) -> Path:
    """`path` as a folder only this user can enter: made 0700 if missing, tightened if this
    user's and open, refused (ClusterError) if it is a symlink, not a folder, or another user's,
    since whoever owns it decides what its files are. For locks and state, never a shared /tmp."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ClusterError(
            f"{path} is a symlink, not a folder, or another user's: rayflow keeps private state "
            "there and trusts it only as a folder of this user's (remove it)"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o700)
    return path


def owned_privately(info: os.stat_result) -> bool:
    """Whether a file's stat says only this user can have written it: this user's, and neither
    group- nor world-writable."""
    return info.st_uid == os.getuid() and not stat.S_IMODE(info.st_mode) & 0o022


# The shell line that makes a node's token private once Ray's launcher has synced it there
# (rsync keeps this machine's mode, and Ray writes its own 0644).
NODE_TOKEN_MODES = (
    "mkdir -p ~/.ray && chmod 700 ~/.ray && (chmod 600 ~/.ray/auth_token 2>/dev/null || true)"
)


def is_loopback(host: str | None) -> bool:
    """Whether binding to `host` keeps a port on this machine: 127.0.0.0/8, ::1, localhost.
    Empty, 0.0.0.0, :: and any other address or name reach the network."""
    text = str(host or "").strip().strip("[]")
    if text.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


# What every Ray node serves, beyond loopback whatever the dashboard does (the refusal's line).
NODE_SERVERS = "GCS, raylets, object managers, dashboard agent, runtime-env agent and workers"
NO_LOOPBACK = "Ray has no setting that keeps them all on loopback"


def refuse_auth_off(
    auth_mode: str | None, listening: str, turned_off_by: str | None = None
) -> None:
    """The one rule for Ray's token auth, by exposure: off is refused in one line naming
    `ray_auth_mode`, wherever a Ray port listens beyond loopback. `listening` says what listens
    where for this backend; `turned_off_by` names the setting that turns auth off when it is not
    `ray_auth_mode=disabled` itself (backend.overrides, the user's file or manifest)."""
    if str(auth_mode or "token") != "disabled":
        return
    if turned_off_by:
        cause, fix = f"token auth is off ({turned_off_by})", "keep Ray's token auth on there"
    else:
        cause, fix = "disabled", "keep ray_auth_mode=token, the default"
    raise ConfigError(
        "ray_auth_mode",
        f"{cause}, but {listening}, and anyone who reaches them can run code on the cluster "
        f"through Ray's Jobs API or Ray Client (CVE-2023-48022); {fix} (rayflow makes the token "
        "and gives it to every node; docs/security.md)",
    )
