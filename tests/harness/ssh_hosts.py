"""Real SSH hosts on this machine, for testing `ray up` with the `local` provider.

CI and dev machines reach no other machine, so a "host" here is a Linux network namespace on a
private bridge, running its own sshd in its own PID, mount and UTS namespaces
(spec: /work/shared/notes/ssh-hosts-on-one-machine.md):

- network: a bridge `<prefix>-br` in the root namespace holding the subnet's .1 (10.213.0.1/24 by
  default) and one namespace `<prefix>-<i>` per host with a veth to it (10.213.0.11, .12, ...).
  No default route, no forwarding, no NAT, IPv6 off on these links: a host reaches only the other
  hosts and the bridge address. DNS is off in the hosts (own /etc/hosts and an empty resolv.conf).
- each host is `ip netns exec NS unshare --pid --fork --kill-child=SIGKILL --mount-proc --mount
  --uts --propagation private tini -s -g -- bash -c SCRIPT`, started in a session of its own and
  its PID recorded. SCRIPT makes the host's private mounts and execs `sshd -D -e`:
  a tmpfs on /run (sshd's /run/sshd, the host's config bound at /run/rfssh), a tmpfs on /dev/shm,
  a per-host directory on /tmp (Ray keeps /tmp/ray/session_* there) and on /home (the user's home),
  its own /etc/hosts and /etc/resolv.conf, and its hostname (= the namespace name).
  SIGKILL of the recorded `unshare` kills the host's PID 1 (tini) and with it every process in it.
- one user (`rayhost`) for all hosts, with a per-host HOME (/home/rayhost inside each host, which
  does not exist on the machine itself): Ray's cluster config has one `auth.ssh_user` for every
  node, so one name is what a real cluster looks like, and per-host homes keep the hosts' `~/.ray`,
  `~/ray_bootstrap_config.yaml` apart. The user exists only inside the hosts: each host binds its
  own copies of the machine's /etc/passwd, group, shadow (and gshadow) with the user added (a
  uid/gid free on the machine, password field `*`: not locked, no password login), so there is
  no useradd/userdel on the machine, nothing to clean there, and no clash with a user of that name.
  `~/.bashrc` (and `~/.profile`, which sources it) puts the venv's bin first on PATH and sets
  RAY_USAGE_STATS_ENABLED=0.
- the venv must be usable by that user. Directories on the way to it (the venv, the real
  interpreter, the base prefix, every sys.path entry) that others cannot enter, e.g. /root (0700)
  on the way to /root/.pyenv, are handled inside each host's mount namespace only: a 0755 tmpfs is
  mounted over the blocked directory and just the needed entry below it bound back, so nothing on
  the machine changes (expose_blocked=False refuses instead). A needed file or directory that is
  itself unreadable, or that lies under /tmp, /home, /run or /dev/shm (hidden by the hosts' own
  mounts), is refused up front with the path and its mode. After start, each host runs the venv's
  python through `bash --login -c -i 'source ~/.bashrc; ...'` and must report the venv's prefix.

Machine-wide names (bridge, namespaces, subnet) make this one-at-a-time: a lock (an abstract unix
socket, released by the kernel when its process dies) serialises SshHosts across processes. Holding
it, a new SshHosts first sweeps what a killed earlier run left (namespaces and their processes,
links, its temp dirs): `python -m tests.harness.ssh_hosts sweep` does the same by hand.

Cleanup is an undo stack (each step registers its undo as soon as it succeeded), run by close()
in __exit__, also when start() fails halfway; close() is idempotent, goes on past a failing undo,
then checks leftovers() and raises SshHostsError naming anything left.

Usage:
    from tests.harness.ssh_hosts import SshHosts, ssh_hosts_fixture
    with SshHosts(2, venv_bin) as hosts:          # venv_bin default: the running interpreter's bin
        hosts.ips, hosts.user, hosts.key_path, hosts.bridge_ip
        hosts.ssh(hosts.ips[0], "hostname -I", timeout=10)             # CompletedProcess (text)
        hosts.ssh(ip, "ray --version", login=True)    # as Ray runs it: bash --login -c -i 'source ~/.bashrc; ...'
        hosts.pids_in_host(0)                          # {pid: cmdline} of the processes in host 0
        env = hosts.launcher_env()                     # for the process that runs `ray up`
    ssh_hosts = ssh_hosts_fixture(n=2)                 # in a test module: a pytest fixture
"""

from __future__ import annotations

import contextlib
import errno
import grp
import ipaddress
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from scripts.kube_local import net

MARKER = "rayflow test ssh host (tests/ssh_hosts.py)"  # the user's GECOS in the hosts
LOCK_NAME = b"\0rayflow-ssh-hosts"  # abstract unix socket: one SshHosts at a time on this machine
WORKDIR_PREFIX = "rayflow-ssh-hosts-"
SSHD = "/usr/sbin/sshd"
_HELD_HERE: list = []  # the SshHosts of this process holding the lock
# Paths each host mounts its own over: a venv (or its interpreter) below them would vanish in a host.
HOST_PRIVATE = ("/tmp", "/home", "/run", "/dev/shm")
# Of those, where a venv may still live (a CI checkout under /tmp, a user's home): its top folder
# there is bound into each host at the same path, over the host's own /tmp or /home.
HOST_CARRIED = ("/tmp", "/home")
HOST_SCRIPT = r"""
set -eu
hostdir=$1 name=$2
mount -t tmpfs -o mode=0755,nosuid,nodev,size=16m rfssh-run /run
mkdir -m 0755 /run/sshd /run/rfssh /run/rfssh-stage
mount --bind "$hostdir/etc" /run/rfssh
mount --bind "$hostdir/etc/hosts" /etc/hosts
mount --bind "$hostdir/etc/resolv.conf" /etc/resolv.conf
for f in passwd group shadow gshadow; do
  if [ -e "$hostdir/etc/$f" ]; then mount --bind "$hostdir/etc/$f" /etc/$f; fi
done
mount -t tmpfs -o mode=1777,nosuid,nodev rfssh-shm /dev/shm
{expose}
{carry_stage}
mount --bind "$hostdir/home" /home
mount --bind "$hostdir/tmp" /tmp
{carry_move}
hostname "$name"
exec {sshd} -D -e -f /run/rfssh/sshd_config
"""


class SshHostsError(net.NetError):
    pass


def unavailable_reason() -> str | None:
    """Why SshHosts cannot run here (for pytest.skip), or None."""
    if os.geteuid() != 0:
        return "SSH test hosts need root (network namespaces, mounts)"
    missing = [
        c
        for c in ("ip", "unshare", "tini", "ssh", "ssh-keygen", "rsync", "mount", "umount")
        if shutil.which(c) is None
    ]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return f"SSH test hosts need {', '.join(missing)} (scripts/setup.sh installs openssh-server, rsync, tini as root)"
    return None


def _run(
    argv: list[str], timeout: float = 30, check: bool = True, what: str | None = None
) -> subprocess.CompletedProcess:
    try:
        return net.run(argv, timeout, check, what)
    except net.NetError as err:
        raise SshHostsError(str(err)) from None


def access_plan(paths: list[str | Path]) -> tuple[dict[Path, set[str]], list[str]]:
    """What an unprivileged user (outside the owners' groups) needs to reach `paths`.

    Returns ({blocked directory: names of the entries below it on the way to a path}, problems):
    a blocked directory lacks o+x; problems are paths the user cannot read even once their
    directories are passable, or paths a host hides under its own mounts (HOST_PRIVATE)."""
    blocked: dict[Path, set[str]] = {}
    problems: list[str] = []
    for raw in paths:
        path = Path(os.path.realpath(raw))
        for private in HOST_PRIVATE:
            if (path == Path(private) or Path(private) in path.parents) and not carried_dir(path):
                problems.append(
                    f"{path} lies under {private}, which each host mounts its own: put the venv elsewhere"
                )
        chain = [*reversed(path.parents), path]
        for parent, entry in zip(chain, chain[1:]):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                blocked.setdefault(parent, set()).add(entry.name)
        st = os.stat(path)
        need = stat.S_IROTH | (
            stat.S_IXOTH if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR else 0
        )
        if st.st_mode & need != need:
            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = str(st.st_uid)
            problems.append(
                f"{path} is {stat.filemode(st.st_mode)} (owner {owner}): others cannot "
                f"{'enter and read' if stat.S_ISDIR(st.st_mode) else 'read'} it"
            )
    return blocked, problems


def carried_dir(path: Path) -> Path | None:
    """The top folder of `path` under /tmp or /home (HOST_CARRIED), bound into the hosts; else None."""
    for private in HOST_CARRIED:
        root = Path(private)
        if root in path.parents:
            return root / path.relative_to(root).parts[0]
    return None


def _link_chain(path: Path) -> list[Path]:
    """`path`, each symlink it goes through and where it ends (absolute)."""
    chain, seen = [], set()
    current = Path(os.path.abspath(path))
    while current not in seen:
        seen.add(current)
        chain.append(current)
        if not current.is_symlink():
            break
        current = Path(os.path.abspath(current.parent / os.readlink(current)))
    chain.append(Path(os.path.realpath(path)))
    return chain


def carry_scripts(paths: list[str | Path]) -> tuple[str, str]:
    """Shell lines for a host's mount namespace: stage each carried folder before the host's own
    /tmp and /home hide it, then move it back in at the same path."""
    hops = [
        hop for p in paths for hop in _link_chain(Path(p))
    ]  # a symlinked python's every hop must resolve
    folders = sorted({d for d in (carried_dir(hop) for hop in hops) if d})
    stage, move = [], []
    for k, folder in enumerate(folders):
        staged, src = f"/run/rfssh-stage/carried{k}", shlex.quote(str(folder))
        stage += [f"mkdir {staged}", f"mount --rbind {src} {staged}"]
        move += [f"mkdir -p {src}", f"mount --move {staged} {src}"]
    return "\n".join(stage), "\n".join(move)


def expose_script(blocked: dict[Path, set[str]]) -> str:
    """Shell lines, run in a host's mount namespace, hiding each blocked directory behind a 0755
    tmpfs with only the needed entries bound back; top-down, so nested blocked directories work."""
    lines, k = [], 0
    for directory in sorted(blocked, key=lambda d: len(d.parts)):
        moves = []
        for name in sorted(blocked[directory]):
            src, stage = directory / name, f"/run/rfssh-stage/{k}"
            k += 1
            make = "mkdir" if src.is_dir() else "touch"
            lines += [f"{make} {stage}", f"mount --rbind {shlex.quote(str(src))} {stage}"]
            moves += [
                f"{make} {shlex.quote(str(src))}",
                f"mount --move {stage} {shlex.quote(str(src))}",
            ]
        lines.append(
            f"mount -t tmpfs -o mode=0755,size=1m rfssh-hide {shlex.quote(str(directory))}"
        )
        lines += moves
    return "\n".join(lines)


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _pids_in_pid_ns(ns: str) -> dict[int, str]:
    """Live processes in a PID namespace, with their command lines. Zombies are left out: a host's
    PID 1, reparented to the machine's init when its unshare dies, may stay a zombie until that
    init reaps it; it has released its namespaces and holds nothing but its PID. (psutil lists
    the processes; which PID namespace one is in is only in /proc/PID/ns/pid.)"""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD, None):
            continue
        if _pid_ns(proc.pid) == ns:
            found[proc.pid] = " ".join(proc.info["cmdline"] or [])
    return found


class SshHosts:
    """n SSH hosts on this machine; a context manager (see the module's docstring).

    Attributes once started: ips, user, uid/gid (the user's, inside the hosts), key_path,
    bridge_ip, names (namespace = hostname per host), workdir, venv_bin, pids (the recorded
    `unshare` PIDs), timings (seconds of start/close)."""

    def __init__(
        self,
        n: int = 2,
        venv_bin: str | Path | None = None,
        *,
        user: str = "rayhost",
        prefix: str = "rfssh",
        subnet: str = "10.213.0.0/24",
        ready_timeout: float = 30,
        lock_timeout: float = 300,
        expose_blocked: bool = True,
    ):
        if not 1 <= n <= 200:
            raise ValueError(f"n must be 1..200, not {n}")
        self.n = n
        self.venv_bin = Path(
            venv_bin if venv_bin is not None else Path(sys.executable).parent
        ).absolute()
        self.user, self.prefix = user, prefix
        self.network = ipaddress.ip_network(subnet)
        if self.network.prefixlen > 24:
            raise ValueError(f"subnet {subnet}: want a /24 or larger")
        self.bridge_ip = str(self.network[1])
        self.ips = [str(self.network[11 + i]) for i in range(n)]
        self.names = [f"{prefix}-{i}" for i in range(n)]
        self.bridge = f"{prefix}-br"
        self.veths = [f"{prefix}-v{i}" for i in range(n)]
        if len(self.veths[-1]) > 15:
            raise ValueError(f"prefix {prefix!r} too long for interface names (15 characters)")
        self.ready_timeout, self.lock_timeout, self.expose_blocked = (
            ready_timeout,
            lock_timeout,
            expose_blocked,
        )
        self.workdir: Path | None = None
        self.uid = self.gid = None
        self.key_path: Path | None = None
        self.pids: list[int] = []
        self.timings: dict[str, float] = {}
        self._procs: list[subprocess.Popen] = []
        self._pid_namespaces: list[str | None] = []
        self._stack: contextlib.ExitStack | None = None
        self._undo_errors: list[str] = []
        self._made_netns_dir = False
        self._started = self._closed = False

    # ---- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> SshHosts:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> SshHosts:
        if self._started:
            raise SshHostsError("SshHosts.start() called twice")
        self._started = True
        t0 = time.monotonic()
        reason = unavailable_reason()
        if reason:
            raise SshHostsError(reason)
        self._stack = contextlib.ExitStack()
        try:
            self._start()
        except BaseException as e:
            try:
                self.close(check=False)
            except SshHostsError as cleanup:
                if hasattr(e, "add_note"):
                    e.add_note(f"and the cleanup after it: {cleanup}")
            raise
        self.timings["start_s"] = round(time.monotonic() - t0, 2)
        return self

    def close(self, check: bool = True) -> None:
        """Undo everything start() did, newest first; idempotent. Raises SshHostsError after the
        whole stack ran if an undo step failed or (check=True) something is left (leftovers())."""
        if self._closed:
            return
        self._closed = True
        if self._stack is None:
            return
        t0 = time.monotonic()
        stack, self._stack = self._stack, None
        try:
            stack.close()  # every step is wrapped by _undo: a failing one does not stop the rest
        except BaseException as e:  # noqa: BLE001 - e.g. the lock's release; keep going to the report
            self._undo_errors.append(f"{type(e).__name__}: {e}")
        errors, self._undo_errors = self._undo_errors, []
        if check:
            errors += [f"left behind: {x}" for x in self.leftovers()]
        self.timings["close_s"] = round(time.monotonic() - t0, 2)
        if errors:
            raise SshHostsError("SshHosts cleanup: " + "; ".join(errors))

    def _undo(self, fn, *args, what: str) -> None:
        """Register an undo step that never stops the ones after it (its error is reported)."""

        def step():
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001
                self._undo_errors.append(f"{what}: {e}")

        self._stack.callback(step)

    def _start(self) -> None:
        self._stack.enter_context(self._lock())
        self._sweep_stale()
        self._check_subnet_free()

        plan_paths = self._venv_paths()
        blocked, problems = access_plan(plan_paths)
        if blocked and not self.expose_blocked:
            problems += [
                f"{d} is {stat.filemode(os.stat(d).st_mode)}: user {self.user} cannot pass it "
                "(expose_blocked=True hides it in the hosts instead; or chmod o+x it yourself)"
                for d in sorted(blocked)
            ]
        if problems:
            raise SshHostsError(
                f"the venv {self.venv_bin} is not usable by the hosts' user: " + "; ".join(problems)
            )
        expose = expose_script(blocked)
        self._carry = carry_scripts([*plan_paths, self.venv_bin / "python"])

        self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self._undo(shutil.rmtree, self.workdir, what=f"remove {self.workdir}")
        self.key_path = self.workdir / "id_ed25519"
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "rayflow-ssh-hosts",
                "-f",
                str(self.key_path),
            ]
        )
        host_key = self.workdir / "ssh_host_ed25519_key"
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "rayflow-ssh-hosts-host",
                "-f",
                str(host_key),
            ]
        )
        (self.workdir / "launcher" / "home").mkdir(parents=True)
        (self.workdir / "launcher" / "tmp").mkdir()

        self.uid = self.gid = _free_id()
        self._add_bridge()
        for i in range(self.n):
            self._prepare_host_dir(i, host_key)
            self._add_netns(i)
            self._start_host(i, expose)
        for i in range(self.n):
            self._wait_ready(i)
        for i in range(self.n):
            self._check_venv(i)

    @contextlib.contextmanager
    def _lock(self):
        if _HELD_HERE:
            raise SshHostsError(
                "this process already runs an SshHosts (one at a time per machine: "
                "close it first, e.g. mind the scope of a shared fixture)"
            )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by children
        deadline = time.monotonic() + self.lock_timeout
        try:
            while True:
                try:
                    sock.bind(LOCK_NAME)
                    break
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise
                    if time.monotonic() >= deadline:
                        raise SshHostsError(
                            f"another SshHosts (this process or another) held the machine-wide lock "
                            f"(abstract unix socket @{LOCK_NAME[1:].decode()}) for {self.lock_timeout:g} s"
                        ) from None
                    time.sleep(0.5)
            self._lock_socket = sock
            _HELD_HERE.append(self)
            yield
        finally:
            if self in _HELD_HERE:
                _HELD_HERE.remove(self)
            sock.close()

    # ---- steps ---------------------------------------------------------------------------
    def _sweep_stale(self) -> None:
        """Holding the lock, whatever carries our names is left from a killed run: remove it."""
        net.sweep(self.prefix)  # the hosts' namespaces, their veths and the bridge
        for old in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
            shutil.rmtree(old, ignore_errors=True)

    def _check_subnet_free(self) -> None:
        taken = []
        for line in _run(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines():
            fields = line.split()
            if "inet" in fields:
                cidr = fields[fields.index("inet") + 1]
                if ipaddress.ip_interface(cidr).network.overlaps(self.network):
                    taken.append(f"address {cidr} on {fields[1]}")
        for line in _run(["ip", "-4", "-o", "route", "show", "table", "all"]).stdout.splitlines():
            fields = line.split()
            dest = (
                fields[1]
                if fields[0]
                in (
                    "local",
                    "broadcast",
                    "unicast",
                    "multicast",
                    "unreachable",
                    "blackhole",
                    "prohibit",
                    "throw",
                    "anycast",
                    "nat",
                )
                else fields[0]
            )
            if dest == "default":
                continue
            try:
                if ipaddress.ip_network(dest, strict=False).overlaps(self.network):
                    taken.append(f"route {line.strip()}")
            except ValueError:
                continue
        if taken:
            raise SshHostsError(
                f"subnet {self.network} is already used on this machine ({'; '.join(taken)}): pass another subnet="
            )

    def _venv_paths(self) -> list[str]:
        python = self.venv_bin / "python"
        if not os.access(python, os.X_OK):
            raise SshHostsError(f"no python in venv_bin {self.venv_bin}")
        probe = (
            "import os, sys; print(os.path.realpath(sys.executable)); print(sys.prefix); print(sys.base_prefix);"
            "[print(p) for p in sys.path if p and os.path.exists(p)]"
        )
        out = _run(
            [str(python), "-s", "-c", probe], what=f"{python} (probing its paths)"
        ).stdout.split("\n")
        self._venv_prefix = out[1]
        paths = [str(self.venv_bin), str(python), *[p for p in out if p]]
        return list(dict.fromkeys(os.path.realpath(p) for p in paths))

    def _add_bridge(self) -> None:
        net.add_bridge(self.bridge, self.bridge_ip, self.network.prefixlen)
        self._undo(net.del_link, self.bridge, what=f"delete bridge {self.bridge}")

    def _user_files(self, etc: Path) -> None:
        """The machine's passwd/group/shadow/gshadow plus the hosts' user (replacing any of its name)."""
        days = int(time.time() // 86400)
        extra = {
            "passwd": f"{self.user}:x:{self.uid}:{self.gid}:{MARKER}:/home/{self.user}:/bin/bash",
            "group": f"{self.user}:x:{self.gid}:",
            "shadow": f"{self.user}:*:{days}:0:99999:7:::",
            "gshadow": f"{self.user}:!::",
        }
        for name, line in extra.items():
            src = Path("/etc") / name
            if not src.exists():
                continue
            kept = [x for x in src.read_text().splitlines() if x.split(":", 1)[0] != self.user]
            (etc / name).write_text("\n".join([*kept, line]) + "\n")
            st = src.stat()
            os.chown(etc / name, st.st_uid, st.st_gid)
            (etc / name).chmod(stat.S_IMODE(st.st_mode))

    def _prepare_host_dir(self, i: int, host_key: Path) -> None:
        d = self.workdir / "hosts" / str(i)
        (d / "etc").mkdir(parents=True)
        (d / "tmp").mkdir()
        (d / "tmp").chmod(0o1777)
        home = d / "home" / self.user
        (home / ".ssh").mkdir(parents=True)
        (d / "home").chmod(0o755)
        pub = Path(f"{self.key_path}.pub").read_text()
        (home / ".ssh" / "authorized_keys").write_text(pub)
        (home / ".bashrc").write_text(
            "# written by tests/ssh_hosts.py: the venv the hosts run Ray from\n"
            f"export PATH={shlex.quote(str(self.venv_bin))}:$PATH\n"
            "export RAY_USAGE_STATS_ENABLED=0\n"
        )
        (home / ".profile").write_text("[ -f ~/.bashrc ] && . ~/.bashrc\n")
        for p in (
            home,
            home / ".ssh",
            home / ".ssh" / "authorized_keys",
            home / ".bashrc",
            home / ".profile",
        ):
            os.chown(p, self.uid, self.gid)
        home.chmod(0o755)
        (home / ".ssh").chmod(0o700)
        (home / ".ssh" / "authorized_keys").chmod(0o600)
        shutil.copy(host_key, d / "etc" / "ssh_host_ed25519_key")
        (d / "etc" / "ssh_host_ed25519_key").chmod(0o600)
        (d / "etc" / "hosts").write_text(
            "127.0.0.1\tlocalhost\n"
            + "".join(f"{ip}\t{name}\n" for ip, name in zip(self.ips, self.names))
        )
        (d / "etc" / "resolv.conf").write_text("# no DNS on rayflow's test hosts\n")
        self._user_files(d / "etc")
        (d / "etc" / "sshd_config").write_text(f"""\
ListenAddress {self.ips[i]}
Port 22
HostKey /run/rfssh/ssh_host_ed25519_key
PidFile none
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PermitRootLogin no
AllowUsers {self.user}
PrintMotd no
X11Forwarding no
MaxSessions 64
MaxStartups 64:30:128
LogLevel INFO
""")

    def _add_netns(self, i: int) -> None:
        ns, veth = self.names[i], self.veths[i]
        if not os.path.isdir(net.NETNS_DIR):  # `ip netns add` makes it: taken away again after
            self._made_netns_dir = True
            self._undo(net.remove_netns_dir_if_empty, what=f"remove {net.NETNS_DIR}")
        net.add_netns(ns, veth, self.bridge, self.ips[i], self.network.prefixlen)
        self._undo(net.del_netns, ns, what=f"delete namespace {ns}")
        self._undo(net.del_link, veth, what=f"delete link {veth}")

    def _start_host(self, i: int, expose: str) -> None:
        d = self.workdir / "hosts" / str(i)
        carry_stage, carry_move = getattr(self, "_carry", ("", ""))
        script = HOST_SCRIPT.format(
            expose=expose, sshd=SSHD, carry_stage=carry_stage, carry_move=carry_move
        )
        argv = [
            "ip",
            "netns",
            "exec",
            self.names[i],
            "unshare",
            "--pid",
            "--fork",
            "--kill-child=SIGKILL",
            "--mount-proc",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "tini",
            "-s",
            "-g",
            "--",
            "bash",
            "-c",
            script,
            "host",
            str(d),
            self.names[i],
        ]
        with open(d / "sshd.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._procs.append(proc)
        self.pids.append(proc.pid)
        self._pid_namespaces.append(None)
        self._undo(self._stop_host, i, what=f"stop host {self.names[i]} (unshare PID {proc.pid})")

        # The host's PID namespace is its PID 1's (tini, the child of unshare).
        def child_ns():
            if proc.poll() is not None:
                return "exited"
            ns = _pid_ns(proc.pid)
            for pid in _children(proc.pid):
                child = _pid_ns(pid)
                if child and child != ns:
                    return child
            return None

        ns = net.wait(child_ns, timeout=10)
        if ns in (None, "exited"):
            raise SshHostsError(
                f"host {self.names[i]}: its PID 1 did not appear within 10 s"
                f"{' (unshare exited ' + str(proc.returncode) + ')' if ns == 'exited' else ''}; "
                f"log: {self._log_tail(i)}"
            )
        self._pid_namespaces[i] = ns

    def _stop_host(self, i: int) -> None:
        proc = self._procs[i]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise SshHostsError(
                    f"unshare PID {proc.pid} still alive 10 s after SIGKILL"
                ) from None
        ns = self._pid_namespaces[i]
        if ns is None:
            return
        left = net.wait(lambda: not _pids_in_pid_ns(ns), timeout=10) or _pids_in_pid_ns(ns)
        if left is not True:
            for pid in left:  # not expected: the kernel kills a PID namespace with its PID 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise SshHostsError(
                f"processes alive in host {self.names[i]} 10 s after its PID 1 died: {left}"
            )

    def _wait_ready(self, i: int) -> None:
        ip, proc = self.ips[i], self._procs[i]

        def listening():
            if proc.poll() is not None:
                return "exited"
            with socket.socket() as s:
                s.settimeout(1)
                try:
                    s.connect((ip, 22))
                    return "up"
                except OSError:
                    return None

        state = net.wait(listening, timeout=self.ready_timeout, interval=0.05)
        if state != "up":
            why = (
                f"the host exited ({proc.returncode})"
                if state == "exited"
                else f"nothing listened within {self.ready_timeout:g} s"
            )
            raise SshHostsError(
                f"host {self.names[i]}: waited for sshd on {ip}:22, {why}; log: {self._log_tail(i)}"
            )

    def _check_venv(self, i: int) -> None:
        done = self.ssh(
            self.ips[i], 'python -c "import sys; print(sys.prefix)"', timeout=30, login=True
        )
        got = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        if done.returncode != 0 or got != [self._venv_prefix]:
            raise SshHostsError(
                f"host {self.names[i]}: the venv's python does not run as {self.user} through "
                f"`bash --login -c -i 'source ~/.bashrc; ...'` (exit {done.returncode}, prefix {got}, "
                f"want {self._venv_prefix}): {done.stderr.strip()[-800:]}"
            )

    def _log_tail(self, i: int) -> str:
        try:
            return (self.workdir / "hosts" / str(i) / "sshd.log").read_text(errors="replace")[
                -1500:
            ].strip() or "(empty)"
        except OSError as e:
            return f"(unreadable: {e})"

    # ---- use -----------------------------------------------------------------------------
    def _ip(self, host: str | int) -> str:
        return self.ips[host] if isinstance(host, int) else host

    def ssh_argv(self, host: str | int) -> list[str]:
        """The ssh command line (no remote command) for a host, by IP or index."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
            f"{self.user}@{self._ip(host)}",
        ]

    def ssh(
        self,
        host: str | int,
        command: str,
        timeout: float = 30,
        *,
        login: bool = False,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        """Run `command` on a host (IP or index) as the user; text output. login=True wraps it the
        way Ray's command runner does: bash --login -c -i 'source ~/.bashrc; ...'. Raises
        subprocess.TimeoutExpired after `timeout` s (ssh is killed; what it started stays in the host
        until close()), CalledProcessError with check=True."""
        if login:
            command = "bash --login -c -i " + shlex.quote(f"source ~/.bashrc; {command}")
        return subprocess.run(
            [*self.ssh_argv(host), command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def pids_in_host(self, i: int) -> dict[int, str]:
        """{PID on this machine: command line} of every process in host i (its PID namespace),
        tini (its PID 1) and sshd included. Empty once the host is gone."""
        ns = self._pid_namespaces[i] if i < len(self._pid_namespaces) else None
        return _pids_in_pid_ns(ns) if ns else {}

    def launcher_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for the launcher (the process that runs `ray up`/`ray down` against the
        hosts): `base` (default os.environ) with HOME, TMPDIR and RAY_TMPDIR set to directories of
        this SshHosts, so the machine's ~/.ray (auth token) and /tmp/ray state (ray_current_cluster,
        the local provider's cluster-<name>.state/.lock) stay out of the test. Not covered: Ray's
        ssh ControlPath is hard-wired to /tmp/ray_ssh_<hash of user>/<hash of cluster name>, so
        give each concurrently running cluster its own cluster_name."""
        env = dict(os.environ if base is None else base)
        env["HOME"] = str(self.workdir / "launcher" / "home")
        env.pop("XDG_CACHE_HOME", None)  # rayflow's records under that HOME, not a caller's cache
        env["TMPDIR"] = env["RAY_TMPDIR"] = str(self.workdir / "launcher" / "tmp")
        return env

    def leftovers(self) -> list[str]:
        """What of this SshHosts is still on the machine: [] after a clean close()."""
        left = []
        for i, proc in enumerate(self._procs):
            if proc.poll() is None:
                left.append(f"unshare PID {proc.pid} of host {self.names[i]}")
            ns = self._pid_namespaces[i]
            if ns and _pids_in_pid_ns(ns):
                left.append(f"processes in host {self.names[i]}: {_pids_in_pid_ns(ns)}")
        left += [f"namespace {ns}" for ns in net.netns_names() if ns in self.names]
        left += [
            f"link {link}" for link in net.link_names() if link == self.bridge or link in self.veths
        ]
        if self._made_netns_dir and os.path.isdir("/run/netns") and not os.listdir("/run/netns"):
            left.append("directory /run/netns (made by ip netns add)")
        if self.workdir is not None and self.workdir.exists():
            left.append(f"directory {self.workdir}")
        return left


def _children(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def _free_id(first: int = 60100, last: int = 60999) -> int:
    """A number that is neither a uid nor a gid on this machine, nor the uid of a running process."""
    running = {
        proc.info["uids"].real for proc in psutil.process_iter(["uids"]) if proc.info["uids"]
    }
    for n in range(first, last + 1):
        if n in running:
            continue
        try:
            pwd.getpwuid(n)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(n)
            continue
        except KeyError:
            return n
    raise SshHostsError(f"no free uid/gid in {first}..{last}")


def sweep(prefix: str = "rfssh", lock_timeout: float = 60) -> None:
    """Remove what a killed SshHosts run left (every SshHosts.start() does this first, too):
    python -m tests.harness.ssh_hosts sweep"""
    hosts = SshHosts(1, prefix=prefix, lock_timeout=lock_timeout)
    with hosts._lock():
        hosts._sweep_stale()


def ssh_hosts_fixture(n: int = 2, *, scope: str = "function", **kwargs):
    """A pytest fixture giving a started SshHosts(n, **kwargs), closed after its scope; skips with
    the reason when this machine cannot make hosts (unavailable_reason()). In a test module:
        ssh_hosts = ssh_hosts_fixture(n=2)
        def test_x(ssh_hosts): ..."""
    import pytest

    @pytest.fixture(scope=scope)
    def _ssh_hosts():
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        with SshHosts(n, **kwargs) as hosts:
            yield hosts

    return _ssh_hosts


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="SSH test hosts from network namespaces (tests/ssh_hosts.py)"
    )
    parser.add_argument("action", choices=["sweep"], help="sweep: remove what a killed run left")
    parser.add_argument("--prefix", default="rfssh")
    args = parser.parse_args()
    sweep(prefix=args.prefix)
