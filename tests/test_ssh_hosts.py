"""The SSH-host fixture (tests/ssh_hosts.py): real sshd hosts from network namespaces, for the
backend=vm provider=local tests. The slow tests need root, ip, unshare, sshd, tini, rsync
(scripts/setup.sh installs the packages) and skip with the reason otherwise."""

from __future__ import annotations

import importlib.metadata
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.ssh_hosts import (
    SshHosts,
    SshHostsError,
    access_plan,
    carry_scripts,
    expose_script,
    ssh_hosts_fixture,
    unavailable_reason,
)

needs_hosts = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
# Shared by the tests of TestTwoHosts (one up/down cycle for both), gone before the tests below
# make their own: one SshHosts at a time on a machine.
ssh_hosts = ssh_hosts_fixture(n=2, scope="class")


def alive(pid: int) -> bool:
    """A zombie is not alive: a host's PID 1 may wait a moment for the machine's init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def assert_gone(hosts: SshHosts) -> None:
    assert hosts.leftovers() == []
    assert not any(alive(pid) for pid in hosts.pids)
    assert all(hosts.pids_in_host(i) == {} for i in range(hosts.n))
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(line.startswith(f"{hosts.prefix}-") for line in netns.splitlines()), netns
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"{hosts.prefix}-" not in links, links
    assert subprocess.run(["id", hosts.user], capture_output=True).returncode != 0
    assert not hosts.workdir.exists()


# ---- no root needed ---------------------------------------------------------------------------
def test_access_plan_hides_blocked_directories_and_refuses_unreadable(tmp_path):
    outer = tmp_path / "home0700"
    (outer / "pyenv" / "bin").mkdir(parents=True)
    python = outer / "pyenv" / "bin" / "python"
    python.write_text("")
    python.chmod(0o755)
    (outer / "other").mkdir()
    for d in (tmp_path, outer / "pyenv", outer / "pyenv" / "bin"):
        d.chmod(0o755)
    outer.chmod(0o700)
    blocked, problems = access_plan([python])
    assert blocked[outer] == {"pyenv"}
    # Under /tmp, which every host mounts its own, its top folder is carried into the hosts instead.
    assert not any("each host mounts its own" in p for p in problems)
    if str(tmp_path).startswith("/tmp/"):
        stage, move = carry_scripts([python])
        top = Path("/tmp") / tmp_path.relative_to("/tmp").parts[0]
        assert (
            f"mount --rbind {top} /run/rfssh-stage/carried0" in stage
            and f"mount --move /run/rfssh-stage/carried0 {top}" in move
        )
    script = expose_script(blocked)
    assert f"mount -t tmpfs -o mode=0755,size=1m rfssh-hide {outer}" in script
    assert re.search(
        rf"^mount --move /run/rfssh-stage/\d+ {re.escape(str(outer / 'pyenv'))}$", script, re.M
    ), script
    python.chmod(0o700)
    _, problems = access_plan([python])
    assert any("-rwx------" in p and "others cannot read it" in p for p in problems), problems


# ---- real hosts -------------------------------------------------------------------------------
@pytest.mark.slow
@needs_hosts
class TestTwoHosts:
    def test_two_hosts_answer_over_ssh_and_run_the_venv(self, ssh_hosts):
        assert len(ssh_hosts.ips) == 2 and ssh_hosts.bridge_ip == "10.213.0.1"
        assert stat.S_IMODE(os.stat(ssh_hosts.key_path).st_mode) == 0o600
        ray_version = importlib.metadata.version("ray")
        for i, ip in enumerate(ssh_hosts.ips):
            done = ssh_hosts.ssh(
                ip, "hostname -I; hostname; whoami; echo $HOME", timeout=20, check=True
            )
            assert done.stdout.split() == [
                ip,
                ssh_hosts.names[i],
                ssh_hosts.user,
                f"/home/{ssh_hosts.user}",
            ]
            # The way Ray's command runner runs every command.
            done = ssh_hosts.ssh(
                ip,
                'command -v python; python -c "import ray; print(ray.__version__)"',
                timeout=60,
                login=True,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.split()[-2:] == [str(ssh_hosts.venv_bin / "python"), ray_version]
            # Ray's launcher syncs files with it
            assert ssh_hosts.ssh(ip, "command -v rsync", timeout=20).returncode == 0
            # No way out: no default route, no DNS server.
            routes = ssh_hosts.ssh(ip, "ip -4 route; cat /etc/resolv.conf", timeout=20).stdout
            assert "default" not in routes and "nameserver" not in routes
        a, b = ssh_hosts.ips
        assert (
            ssh_hosts.ssh(
                a, f"timeout 5 bash -c '</dev/tcp/{b}/22' && echo reached", timeout=20
            ).stdout.strip()
            == "reached"
        )
        env = ssh_hosts.launcher_env()
        assert (
            env["HOME"] != os.environ.get("HOME")
            and Path(env["HOME"]).is_dir()
            and Path(env["TMPDIR"]).is_dir()
        )

    def test_hosts_see_only_their_own_processes_and_tmp(self, ssh_hosts):
        a, b = ssh_hosts.ips
        ssh_hosts.ssh(
            a,
            "setsid nohup sleep 301 >/dev/null 2>&1 < /dev/null & echo hi-a > /tmp/marker-a",
            timeout=20,
            check=True,
        )
        assert "sleep 301" in ssh_hosts.ssh(a, "ps -eo args", timeout=20).stdout
        assert "sleep 301" not in ssh_hosts.ssh(b, "ps -eo args", timeout=20).stdout
        assert any("sleep 301" in c for c in ssh_hosts.pids_in_host(0).values())
        assert not any("sleep 301" in c for c in ssh_hosts.pids_in_host(1).values())
        assert ssh_hosts.ssh(a, "cat /tmp/marker-a", timeout=20).stdout.strip() == "hi-a"
        assert ssh_hosts.ssh(b, "ls /tmp/marker-a", timeout=20).returncode != 0
        assert not Path("/tmp/marker-a").exists()
        # PID 1 of a host is its tini; its ps sees a handful of processes, not the machine's.
        ps = ssh_hosts.ssh(b, "ps -eo pid,args --no-headers", timeout=20).stdout.splitlines()
        assert ps[0].split()[1].endswith("tini") and len(ps) < 15, ps
        # Every ssh() has an end.
        t0 = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            ssh_hosts.ssh(a, "sleep 30", timeout=2)
        assert time.monotonic() - t0 < 10


@pytest.mark.slow
@needs_hosts
def test_cleanup_after_normal_exit_and_after_an_exception_and_twice():
    t0 = time.monotonic()
    with SshHosts(2) as hosts:
        up = time.monotonic() - t0
        assert hosts.ssh(0, "true", timeout=20).returncode == 0
        ssh_hosts_pids = hosts.pids_in_host(0)
        assert ssh_hosts_pids
    cycle = time.monotonic() - t0
    print(
        f"\nSshHosts(2) up {up:.2f} s, down {hosts.timings['close_s']:.2f} s, whole cycle {cycle:.2f} s"
    )
    assert_gone(hosts)
    assert not any(alive(pid) for pid in ssh_hosts_pids)
    hosts.close()  # a second cleanup is a no-op
    assert_gone(hosts)

    with pytest.raises(RuntimeError, match="inside the context"):
        with SshHosts(2) as hosts:
            hosts.ssh(
                1, "setsid nohup sleep 302 >/dev/null 2>&1 < /dev/null &", timeout=20, check=True
            )
            raise RuntimeError("inside the context")
    assert_gone(hosts)
    hosts.close()
    assert_gone(hosts)


@pytest.mark.slow
@needs_hosts
def test_setup_failing_halfway_leaves_nothing(monkeypatch):
    started = []
    real = SshHosts._start_host

    def start_host(self, i, expose):
        if i == 1:
            raise SshHostsError("planted failure starting the second host")
        real(self, i, expose)
        started.append(self.pids[i])

    monkeypatch.setattr(SshHosts, "_start_host", start_host)
    hosts = SshHosts(2)
    with pytest.raises(SshHostsError, match="planted failure"):
        hosts.start()
    assert started and hosts.workdir is not None
    assert_gone(hosts)


@pytest.mark.slow
@needs_hosts
def test_a_killed_runs_leftovers_are_swept_by_the_next():
    # A run whose process died without cleanup: hosts alive, names taken; the lock is gone with it.
    crashed = SshHosts(1)
    crashed.start()
    crashed._stack.pop_all()  # forget every undo step, as SIGKILL of the test process would,
    crashed._lock_socket.close()  # and release the lock as the kernel would on its death
    with SshHosts(1) as hosts:
        assert hosts.ssh(0, "hostname", timeout=20).stdout.strip() == hosts.names[0]
    assert_gone(hosts)
    assert crashed._procs[0].wait(timeout=10) is not None  # the old host's unshare was killed
    assert crashed.pids_in_host(0) == {}
    crashed.close()


@pytest.mark.slow
@needs_hosts
def test_an_unusable_venv_is_refused_up_front_with_the_reason(tmp_path):
    blocked, _ = access_plan([sys.executable, os.path.realpath(sys.executable)])
    # e.g. /root (0700) on the way to /root/.pyenv: refused when not exposed in the hosts
    if blocked:
        with pytest.raises(
            SshHostsError, match=rf"{re.escape(str(sorted(blocked)[0]))} is d.*cannot pass it"
        ):
            SshHosts(1, expose_blocked=False).start()
    # a venv below /tmp (a CI checkout) is carried into the hosts
    if str(tmp_path).startswith("/tmp/"):
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "python").symlink_to(sys.executable)
        with SshHosts(1, tmp_path / "bin") as hosts:  # start() runs the venv's python in the host
            assert (
                hosts.ssh(
                    0, f"{tmp_path / 'bin' / 'python'} -c 'print(6 * 7)'", timeout=30
                ).stdout.strip()
                == "42"
            )
            assert (
                tmp_path.relative_to("/tmp").parts[0]
                in hosts.ssh(0, "ls /tmp", timeout=30).stdout.split()
            )
        assert hosts.leftovers() == []
