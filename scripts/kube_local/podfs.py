"""A pod's own disk, and the command line that runs one of its containers in it.

Every pod has a folder of the kubelet's (0700): `tmp/` (the pod's `/tmp`), `work/` (its
containers' working folder, `/home/ray` unless the container names another `workingDir`: the Ray
image's), `hosts` (its `/etc/hosts`, rewritten in place as Services change), `resolv.conf` (no
name server: names come from `hosts`), `volumes/NAME/` and `logs/CONTAINER.log`.

A container is a process tree in the pod's network namespace and in namespaces of its own:

- a PID namespace (`unshare --pid --fork --mount-proc`), whose PID 1 is `tini -g`, so a SIGTERM to
  it reaches the container's whole process group and a SIGKILL ends everything in it;
- a mount namespace, where SETUP (below) binds the pod's `tmp/` on `/tmp`, a private tmpfs on
  `/dev/shm`, `hosts` and `resolv.conf` on `/etc`, the working folder, and each volumeMount
  (read-only where asked). A mount path whose folder does not exist on this machine is made in an
  overlay of its nearest existing parent (the upper layer on a tmpfs of the namespace), so
  nothing of a pod is ever written outside its folder; a UTS namespace with the pod's hostname.

Everything else of the machine is seen as it is (there is no image: the container's command runs
with this machine's Ray first on PATH).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

DEFAULT_WORKDIR = "/home/ray"  # the Ray image's WORKDIR and HOME
SETUP = r"""
set -eu
exec 3<"$1"  # the pod's folder, reached through this descriptor once /tmp is the pod's own
pod=/proc/self/fd/3 host=$2 workdir=$3
shift 3
hostname "$host"
mount -t tmpfs -o mode=0700,nosuid,nodev,size=4m rf-pod-scratch "$pod/scratch"
n=0 rooms=""
in_room() {  # $1 is in an overlay made before: writable, and the mounts made in it stay seen
  for r in $rooms; do case "$1" in "$r"|"$r"/*) return 0 ;; esac; done
  return 1
}
room() {  # make the folder (or file, $2=file) $1, in an overlay of its nearest existing parent
  [ -e "$1" ] && return 0
  parent=$(dirname "$1")
  while [ ! -e "$parent" ]; do parent=$(dirname "$parent"); done
  case "$parent" in
    /tmp|/tmp/*|"$workdir"|"$workdir"/*) ;;  # the pod's own
    *)
      # A second overlay on a folder of the first would hide what was bound in it before
      # (two volumes under /var/run/secrets: a Ray token's and the API access's).
      if ! in_room "$parent"; then
        n=$((n + 1)); mkdir "$pod/scratch/u$n" "$pod/scratch/w$n"
        mount -t overlay rf-pod-room \
          -o "lowerdir=$parent,upperdir=$pod/scratch/u$n,workdir=$pod/scratch/w$n" "$parent"
        rooms="$rooms $parent"
      fi ;;
  esac
  if [ "${2:-dir}" = file ]; then mkdir -p "$(dirname "$1")"; : > "$1"; else mkdir -p "$1"; fi
}
bind() {  # bind $1 on $2, read-only if $3 = ro
  if [ -d "$1" ]; then room "$2"; else room "$2" file; fi
  mount --bind "$1" "$2"
  if [ "${3:-rw}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}
mount --bind "$pod/tmp" /tmp
mount -t tmpfs -o mode=1777,nosuid,nodev rf-pod-shm /dev/shm
bind "$pod/hosts" /etc/hosts ro
bind "$pod/resolv.conf" /etc/resolv.conf ro
bind "$pod/work" "$workdir"
while [ "$1" != -- ]; do bind "$pod/$1" "$2" "$3"; shift 3; done  # $1: in the pod's folder
shift
cd "$workdir"
exec 3<&-
exec tini -g -- "$@"
"""


@dataclass(frozen=True)
class Mount:
    source: Path  # in the pod's folder (nothing else of the machine is mounted)
    target: str  # inside the container
    read_only: bool = False


class PodFolder:
    """The folder of one pod (its uid), made on creation; remove() takes it away."""

    def __init__(self, root: Path, uid: str):
        self.path = root / uid
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("work", "scratch", "volumes", "logs"):
            (self.path / sub).mkdir(exist_ok=True)
        (self.path / "tmp").mkdir(exist_ok=True)
        (self.path / "tmp").chmod(0o1777)
        (self.path / "resolv.conf").write_text("# no name server: names are in /etc/hosts\n")
        if not (self.path / "hosts").exists():
            (self.path / "hosts").write_text("127.0.0.1\tlocalhost\n")

    def volume(self, name: str) -> Path:
        folder = self.path / "volumes" / name
        folder.mkdir(exist_ok=True)
        return folder

    def log(self, container: str) -> Path:
        return self.path / "logs" / f"{container}.log"

    def write_hosts(self, text: str) -> None:
        """In place (a bind mount of the file keeps its inode): running containers see it."""
        with open(self.path / "hosts", "r+" if (self.path / "hosts").exists() else "w") as f:
            f.write(text)
            f.truncate()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def container_argv(
    netns: str,
    folder: PodFolder,
    hostname: str,
    workdir: str,
    mounts: list[Mount],
    command: list[str],
) -> list[str]:
    """The command line that runs `command` as a container of the pod (see the module's doc)."""
    binds = [
        str(a)
        for m in mounts
        for a in (m.source.relative_to(folder.path), m.target, "ro" if m.read_only else "rw")
    ]
    return [
        "nsenter",
        f"--net=/run/netns/{netns}",
        "--",
        "unshare",
        "--mount",
        "--uts",
        "--pid",
        "--fork",
        "--kill-child=SIGKILL",
        "--mount-proc",
        "--propagation",
        "private",
        "--",
        "bash",
        "-c",
        SETUP,
        "rf-pod",
        str(folder.path),
        hostname,
        workdir,
        *binds,
        "--",
        *command,
    ]


def enter_argv(pid: int, command: list[str]) -> list[str]:
    """`command` run in the namespaces of the container whose PID 1 is `pid` (an exec probe)."""
    return ["nsenter", f"--target={pid}", "--mount", "--pid", "--net", "--uts", "--", *command]


def machine_path(venv_bin: Path, path: str | None = None) -> str:
    """PATH for a container: this machine's Ray (the venv's bin) first."""
    return os.pathsep.join([str(venv_bin), path or os.environ.get("PATH", "/usr/bin:/bin")])
