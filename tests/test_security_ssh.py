"""SSH as rayflow runs it (issue 43, classes 3 and 10): every ssh command ends its options with
`--` before a host that was checked to be an IP address or a host name, and pins the hosts' keys
per cluster in the user's cache on first contact (rayflow.security.ssh); the tunnel to a head's
dashboard leaves no port to take (rayflow.backends.vm.tunnel).

The tunnel tests reach a real sshd without a daemon or a port: ssh starts it itself as its
ProxyCommand (`sshd -i`, inetd mode), with a host key of the test's, so a changed host key is one
file written over. As root that sshd needs its privilege-separation folder, made in a private
/run of its own mount namespace (unshare), never on the machine.
"""

from __future__ import annotations

import getpass
import http.server
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rayflow.backends.vm import kept as vm_kept
from rayflow.backends.vm import tunnel
from rayflow.errors import ClusterError, ConfigError
from rayflow.security import ports, ssh
from tests.harness.needs import need

SSHD = "/usr/sbin/sshd"
BAD_HOST = "is not a host: use an IP address or a host name"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "rayflow"


# --- the command line ---------------------------------------------------------------------------


def test_every_ssh_command_ends_its_options_before_the_host_and_pins_keys_per_cluster(
    cache, monkeypatch
):
    auth = {"ssh_user": "me", "ssh_private_key": "~/.ssh/k"}
    pins = cache / "known_hosts" / "my-hosts"
    forward = tunnel.tunnel_command(auth, "10.0.0.5", "/tmp/rf-tunnel-x/d.sock", 8265, "my-hosts")
    ran: list[list[str]] = []

    def run(argv, **kwargs):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(vm_kept.subprocess, "run", run)
    config = {"cluster_name": "my-hosts", "auth": auth, "provider": {"worker_ips": ["w1", "::1"]}}
    vm_kept.stop_local_workers(config)
    for argv, host, after in (
        (forward, "me@10.0.0.5", []),
        (ran[0], "me@w1", ["bash --login -c -i 'ray stop'"]),
        (ran[1], "me@::1", ["bash --login -c -i 'ray stop'"]),
    ):
        assert argv[0] == "ssh" and argv[argv.index("--") :] == ["--", host, *after], argv
        options = argv[: argv.index("--")]
        assert "StrictHostKeyChecking=accept-new" in options
        assert f"UserKnownHostsFile={pins}" in options
        assert not {"StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"} & set(options)
        assert options[options.index("-i") + 1] == os.path.expanduser("~/.ssh/k")
    assert stat.S_IMODE(pins.parent.stat().st_mode) == 0o700
    # the tunnel's local end is a socket file, never a port number on its command line
    assert forward[forward.index("-L") + 1] == "/tmp/rf-tunnel-x/d.sock:127.0.0.1:8265"
    assert {"-N", "ExitOnForwardFailure=yes", "BatchMode=yes"} <= set(forward)


@pytest.mark.parametrize(
    "override, line",
    [
        ("backend.head_ip='-oProxyCommand=x'", f"backend.head_ip: '-oProxyCommand=x' {BAD_HOST}"),
        ("backend.worker_ips=['a b']", f"backend.worker_ips: 'a b' {BAD_HOST}"),
        ("backend.worker_ips=['$(x)']", f"backend.worker_ips: '$(x)' {BAD_HOST}"),
        (
            "backend.ssh_user='-oProxyCommand=x'",
            "backend.ssh_user: '-oProxyCommand=x' is not a user name",
        ),
        (
            "+backend.overrides.provider.worker_ips=['10.0.0.3','-oProxyCommand=x']",
            f"backend.overrides: provider.worker_ips: '-oProxyCommand=x' {BAD_HOST}",
        ),
        (
            "+backend.overrides.auth.ssh_user='a;b'",
            "backend.overrides: auth.ssh_user: 'a;b' is not a user name",
        ),
    ],
)
def test_a_bad_host_or_user_is_refused_naming_its_key_before_anything_starts(
    override, line, tmp_path
):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayflow",
            "backend=vm",
            "backend.provider=local",
            "backend.head_ip=10.0.0.1",
            "backend.worker_ips=[10.0.0.2]",
            "backend.ssh_user=me",
            override,
            "dry_run=true",
            "tracking=none",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == "", out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(f"rayflow: error: {line}")


def test_a_bad_host_in_a_users_cluster_yaml_or_a_record_never_reaches_ssh(tmp_path, monkeypatch):
    from rayflow.backends.vm.user_file import check_final

    doc = {
        "cluster_name": "mine",
        "provider": {"type": "local", "head_ip": "10.0.0.1", "worker_ips": ["-oProxyCommand=x"]},
        "auth": {"ssh_user": "me"},
    }
    with pytest.raises(ConfigError) as refused:
        check_final(doc, "my.yaml", "local")
    assert str(refused.value).startswith(
        f"backend.cluster_yaml: my.yaml: provider.worker_ips: '-oProxyCommand=x' {BAD_HOST}"
    )
    # a config read back later (the head's own copy, a record): refused before ssh runs
    monkeypatch.setattr(vm_kept.subprocess, "run", lambda *a, **k: pytest.fail("ssh ran"))
    with pytest.raises(ClusterError, match=f"^provider.worker_ips: '-oProxyCommand=x' {BAD_HOST}"):
        vm_kept.stop_local_workers(doc)
    with pytest.raises(ClusterError, match="^auth.ssh_user: '-l' is not a user name"):
        ssh.command({"ssh_user": "-l"}, "10.0.0.1", "mine")


# --- the tunnel, through a real sshd -----------------------------------------------------------


class Sshd:
    """An sshd that ssh starts itself (ProxyCommand `sshd -i`) with `host_key`, for the auth
    it accepts (this user, or root, with a key of the test's)."""

    def __init__(self, folder: Path):
        need(os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None, "sshd, ssh-keygen")
        self.folder = folder
        self.host_key = folder / "host_key"
        client_key = folder / "client_key"
        self.new_host_key()
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", client_key], check=True
        )
        config = folder / "sshd_config"
        config.write_text(
            f"HostKey {self.host_key}\nPidFile none\nUsePAM no\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"AuthorizedKeysFile {client_key}.pub\nPermitRootLogin prohibit-password\n"
            "LogLevel QUIET\n"
        )
        if os.geteuid() == 0:  # sshd as root wants /run/sshd: a private /run for it alone
            need(shutil.which("unshare") is not None, "unshare (util-linux)")
            proxy = (
                "unshare --mount --propagation private sh -c 'mount -t tmpfs rf-sshd /run && "
                f"mkdir -m 755 /run/sshd && exec {SSHD} -i -f {config}'"
            )
        else:
            proxy = f"{SSHD} -i -f {config}"
        self.auth = {
            "ssh_user": getpass.getuser(),
            "ssh_private_key": str(client_key),
            "ssh_proxy_command": proxy,
        }

    def new_host_key(self) -> None:
        for path in (self.host_key, Path(f"{self.host_key}.pub")):
            path.unlink(missing_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.host_key], check=True
        )


class Dashboard(http.server.BaseHTTPRequestHandler):
    """The head's dashboard, on this machine's loopback (where the sshd forwards to)."""

    def do_GET(self) -> None:
        body = b"pong"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def head(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Sshd(tmp_path), server.server_address[1]
    server.shutdown()
    server.server_close()


def _get(url: str, timeout_s: float = 20) -> bytes:
    """The answer through the tunnel, once ssh is in (at most timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=5) as answer:
                return bytes(answer.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _ended(opened: tunnel.Tunnel, timeout_s: float = 20) -> ClusterError:
    opened.proc.wait(timeout=timeout_s)
    failed = tunnel.tunnel_failed(opened)
    assert failed is not None
    return failed


def test_the_tunnel_pins_the_heads_key_and_refuses_one_that_changed(head, cache, capsys):
    sshd, remote = head
    pins = cache / "known_hosts" / "rf-pinned"
    opened, url = tunnel.open_tunnel(sshd.auth, "pinned-head", remote, "rf-pinned")
    try:
        assert _get(url) == b"pong"
        # first contact recorded the head's key, under its name, in the cluster's pin file
        assert [line.split()[0] for line in pins.read_text().splitlines()] == ["pinned-head"]
        # the URL's port is this process's own; ssh's end is a socket in a private folder
        relay_port = int(url.rsplit(":", 1)[1])
        assert [s.uid for s in ports.listeners("127.0.0.1", relay_port)] == [os.getuid()]
        forward = opened.proc.args[opened.proc.args.index("-L") + 1]
        assert forward.startswith(opened.folder + "/") and str(relay_port) not in forward
        assert stat.S_IMODE(os.stat(opened.folder).st_mode) == 0o700
        # ssh dies mid-run: the port stays held here, so no one else can bind it for the token
        os.killpg(opened.proc.pid, 9)
        failed = _ended(opened)
        assert str(failed).startswith("backend=vm: the SSH tunnel to the head's dashboard failed")
        with socket.socket() as squatter, pytest.raises(OSError):
            squatter.bind(("127.0.0.1", relay_port))
        with pytest.raises(OSError):  # the request finds the tunnel gone, nothing else
            urllib.request.urlopen(f"{url}/api/version", timeout=5)
    finally:
        tunnel.close_tunnel(opened)
    assert not os.path.exists(opened.folder)

    sshd.new_host_key()  # the head now shows another key: a rebuilt host, or someone in between
    opened, url = tunnel.open_tunnel(sshd.auth, "pinned-head", remote, "rf-pinned")
    try:
        failed = _ended(opened)
    finally:
        tunnel.close_tunnel(opened)
    fix = f"ssh-keygen -R pinned-head -f {pins}"
    assert str(failed) == (
        "backend=vm: the SSH tunnel to the head's dashboard failed: the host key of pinned-head "
        f"changed since rayflow first reached it for cluster rf-pinned (pinned in {pins}): "
        f"someone may be intercepting the connection; if the host was rebuilt, clear the pin "
        f"with `{fix}` and run again"
    )
    # stopping Ray on worker hosts checks the same pins (from here, and from the head's autostop)
    vm_kept.stop_local_workers(
        {
            "cluster_name": "rf-pinned",
            "auth": sshd.auth,
            "provider": {"worker_ips": ["pinned-head"]},
        }
    )
    warned = capsys.readouterr().err.strip().splitlines()
    assert warned == [
        "rayflow: warning: `ray stop` was not run on worker host pinned-head: the host key of "
        f"pinned-head changed since rayflow first reached it for cluster rf-pinned (pinned in "
        f"{pins}): someone may be intercepting the connection; if the host was rebuilt, clear "
        f"the pin with `{fix}` and run again"
    ]
    # as told: the pin cleared, the next contact records the new key
    subprocess.run(fix.split(), check=True, capture_output=True)
    opened, url = tunnel.open_tunnel(sshd.auth, "pinned-head", remote, "rf-pinned")
    try:
        assert _get(url) == b"pong"
    finally:
        tunnel.close_tunnel(opened)
