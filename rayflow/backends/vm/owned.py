"""backend=vm: the files and folders a cluster is acted on by, used only as this user's own.

A cluster YAML is code: `auth.ssh_proxy_command` runs as you whenever SSH is pointed at the head
(`rayflow status`, `logs`, Ray's teardown), and it names the hosts, keys and VMs a teardown acts
on; a teardown deletes the folder it lies in. So a cluster YAML, and the folder it lies in, is
read only when both are this user's and writable by no one else: the folder opened without
following a link (O_NOFOLLOW | O_DIRECTORY), the file opened relative to it (O_NOFOLLOW), each
checked by fstat of what was opened, so nothing can be swapped in between the check and the read.
A fake_multinode cluster's temp dir (in /tmp: Ray's socket paths in it must stay short) is
checked the same way, by lstat, before anything is stopped or removed by it; Ray's own temp dir,
which Ray makes 0777, is a folder inside it (RAY_TEMP), out of others' reach.

Where an SDK cluster's YAML lives (`cluster_file`): `~/.cache/rayflow/vm/NAME/NAME.yaml`, 0600 in a
0700 folder of this user's cache (rayflow.backends.vm.state), never /tmp, so that a reboot or a
tmp cleaner leaves what `rayflow status`, `down` and `logs` need to find a kept cluster's VMs.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import yaml

from rayflow.errors import ClusterError
from rayflow.security.auth import owned_privately, private_folder

MAX_BYTES = 4 * 1024 * 1024  # a cluster YAML is a few KiB; a bigger file is not one rayflow wrote
FAKE_PREFIX = "rf-vm-"  # tempfile.mkdtemp's prefix for a fake cluster's temp dir
# Ray's own temp dir inside a fake cluster's (`--temp-dir`): Ray makes it 0777 at every node's
# start, so it sits in the 0700 folder rayflow made, which no one else can enter
RAY_TEMP = "r"


def cluster_file(name: str) -> Path:
    """Where a run of cluster NAME writes its cluster YAML (the name is validated first)."""
    from rayflow.backends.vm.state import state_file

    return state_file(name).with_suffix("") / f"{name}.yaml"


def why_not_mine(info: os.stat_result, path: str | Path, folder: bool) -> str | None:
    """Why a stat (lstat, or fstat of what was opened) is not this user's private folder or file."""
    what = "folder" if folder else "file"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link, not a {what} of yours"
    if not (stat.S_ISDIR(info.st_mode) if folder else stat.S_ISREG(info.st_mode)):
        return f"{path} is not a {what}"
    if info.st_uid != os.getuid():
        return f"{path} is owned by uid {info.st_uid}, not by you"
    if not owned_privately(info):
        return f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def problem(path: str | Path, folder: bool) -> str | None:
    """Why `path` (not followed if a link) is not this user's private folder or file; None when
    it is, or when it does not exist."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return why_not_mine(info, path, folder)


def refused(why: str) -> ClusterError:
    return ClusterError(f"{why}: not read (rayflow reads and runs cluster YAMLs of yours only)")


def load(path: str | Path) -> dict[str, Any]:
    """The cluster YAML at `path`, once its folder and the file are found to be this user's and
    writable by no one else. FileNotFoundError when it (or its folder) is gone; ClusterError
    (one line) when it is not this user's to read."""
    path = Path(path)
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:  # a link (O_NOFOLLOW) or a file where the folder should be
        raise refused(
            problem(path.parent, folder=True) or f"{path.parent} is not a folder"
        ) from None
    try:
        why = why_not_mine(os.fstat(folder), path.parent, folder=True)
        if why:
            raise refused(why)
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise refused(problem(path, folder=False) or f"{path}: {err.strerror}") from None
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as file:
        why = why_not_mine(os.fstat(file.fileno()), path, folder=False)
        if why:
            raise refused(why)
        text = file.read(MAX_BYTES + 1)
    if len(text) > MAX_BYTES:
        raise refused(f"{path} is over {MAX_BYTES // 2**20} MiB, not a cluster YAML rayflow wrote")
    config = yaml.safe_load(text)
    if not isinstance(config, dict) or not isinstance(config.get("provider"), dict):
        raise refused(f"{path} is not a cluster YAML (no provider section)")
    return config


def write(path: str | Path, config: dict[str, Any]) -> None:
    """The cluster YAML, 0600, in a folder of this user's made private (0700); replaced whole
    (a link where the file was is replaced, never followed)."""
    path = Path(path)
    private_folder(path.parent)
    part = path.with_name(f".{path.name}.part")
    part.unlink(missing_ok=True)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(yaml.safe_dump(config))
    os.replace(part, path)


def folder_usable(path: str | Path) -> bool:
    """Whether the folder of `path` exists and is this user's private folder (a recorded cluster
    YAML may be written there again)."""
    folder = Path(path).parent
    return folder.is_dir() and problem(folder, folder=True) is None


def made_by_rayflow(config_file: str | Path) -> bool:
    """Whether a cluster YAML lies where rayflow writes them: its per-name cache folder, or a temp
    dir `rf-vm-*` (where runs before this version wrote them)."""
    from rayflow.backends.vm.rules import cluster_name_problem

    path = Path(config_file)
    if path.parent.name.startswith(FAKE_PREFIX):
        return True
    return cluster_name_problem(path.stem) is None and path == cluster_file(path.stem)


def remove_folder(config_file: str | Path) -> None:
    """The folder rayflow made for a cluster YAML, once the cluster is torn down: only that
    folder, and only while it is this user's (never followed if a link)."""
    folder = Path(config_file).parent
    if made_by_rayflow(config_file) and problem(folder, folder=True) is None:
        shutil.rmtree(folder, ignore_errors=True)


def fake_dir_problem(temp_dir: str | Path) -> str | None:
    """Why `temp_dir` is not a fake_multinode cluster's temp dir of this user's (`rf-vm-*`, with
    its autoscaling.yaml, both this user's and writable by no one else), or None."""
    folder = Path(temp_dir)
    made = folder / "autoscaling.yaml"
    if not folder.name.startswith(FAKE_PREFIX) or not os.path.lexists(folder):
        return f"{temp_dir} is not a fake_multinode cluster's temp dir of yours (rf-vm-*)"
    why = problem(folder, folder=True)
    if why is None and not os.path.lexists(made):
        return f"{temp_dir} holds no autoscaling.yaml: not a fake_multinode cluster's temp dir"
    return why or problem(made, folder=False)
