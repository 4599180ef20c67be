"""A "head pod" on this machine: processes that see what a pod's processes see of the API server.

In a pod with a service account, the kubelet mounts the account's credentials read-only at
/var/run/secrets/kubernetes.io/serviceaccount (`token`, `ca.crt`, `namespace`) and sets
KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT; in-cluster clients
(`kubernetes.config.load_incluster_config()`) read exactly those. Here no pod can run, and
/var/run/secrets must not appear on the machine (/var/run is /run, shared by everything on it), so:

- `PodNamespace` runs a command in a private mount namespace
  (`unshare --mount --propagation private`) whose setup script, before it execs the command:
  mounts a small tmpfs on a scratch folder of its own, overlays /run (the target of /var/run) with
  an upper layer on that tmpfs, so the machine's /run stays visible and nothing written to it
  inside leaves the namespace (a plain tmpfs over /run where overlayfs is refused: then /run's
  contents are hidden inside, which neither Ray nor a Kubernetes client needs), makes
  /run/secrets/kubernetes.io/serviceaccount a tmpfs holding the three files, and remounts it
  read-only, as the kubelet's projected volume is. Everything started in it, and everything those
  start, daemons included, stays in that namespace for as long as it lives; the namespace goes
  with its last process. The files are staged on the machine in a 0700 folder for the copy
  (`unstage()` removes them, `close()` the rest once the namespace's processes are gone).
- `PodRayHead` is tests/test_kuberay.py's RayHead started in such a namespace: `ray start --head`
  with token auth (RAY_AUTH_MODE/RAY_AUTH_TOKEN), its own temp dir and free ports, the dashboard on
  127.0.0.1, and the in-cluster environment (KUBERNETES_SERVICE_HOST=127.0.0.1,
  KUBERNETES_SERVICE_PORT=the emulator's HTTPS port; KUBECONFIG removed, so a client takes the
  in-cluster path). Its raylet, GCS, dashboard and every job and worker they start stay in the
  namespace: start() checks the raylet reads the token there. stop() stops the processes naming
  its temp dir (rayflow.runtime.processes), never `ray stop`.

Usage (needs root: see unavailable_reason()):
    with KubeEmulator(tls=True) as emu:
        head = PodRayHead.for_emulator(emu, "default", "rayflow-autostop")
        head.start()       # then FakeKubeRayOperator(emu, head.dashboard_url, head.token)
        head.read_in_pod("/var/run/secrets/kubernetes.io/serviceaccount/token") == head.sa_token
        head.stop()
    with PodNamespace(token=t, ca_path=emu.ca_path) as pod:
        subprocess.run(pod.argv(["cat", SA_DIR + "/token"]), env={**os.environ, **emu.in_cluster_env()})
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from rayflow.runtime.processes import GONE, processes_mentioning, stop_processes_mentioning

if TYPE_CHECKING:
    from tests.harness.kube_emulator import KubeEmulator

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_SCRIPT = r"""
set -eu
staged=$1 scratch=$2
shift 2
run=$(readlink -f /var/run)
mount -t tmpfs -o mode=0700,nosuid,nodev,size=4m rf-pod-scratch "$scratch"
mkdir "$scratch/upper" "$scratch/work"
if ! mount -t overlay rf-pod-run \
    -o "lowerdir=$run,upperdir=$scratch/upper,workdir=$scratch/work" "$run" 2>/dev/null; then
  mount -t tmpfs -o mode=0755,nosuid,nodev,size=16m rf-pod-run "$run"
  ln -s /dev/shm "$run/shm"
fi
sa="$run/secrets/kubernetes.io/serviceaccount"
mkdir -p "$sa"
mount -t tmpfs -o mode=0755,nosuid,nodev,size=1m rf-pod-sa "$sa"
cp "$staged/token" "$staged/ca.crt" "$staged/namespace" "$sa/"
chmod 0644 "$sa/token" "$sa/ca.crt" "$sa/namespace"
mount -o remount,ro,nosuid,nodev "$sa"
exec "$@"
"""


@functools.cache
def unavailable_reason() -> str | None:
    """Why a pod namespace cannot be made here (for pytest.skip), or None."""
    missing = [c for c in ("unshare", "nsenter", "mount", "bash") if shutil.which(c) is None]
    if missing:
        return f"a pod's mount namespace needs {', '.join(missing)}"
    if os.geteuid() != 0:
        return "a pod's mount namespace needs root (unshare --mount, tmpfs and overlay mounts)"
    with tempfile.TemporaryDirectory(prefix="rf-kpod-probe-") as folder:
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private"]
            + ["mount", "-t", "tmpfs", "-o", "size=1m", "rf-pod-probe", folder],
            capture_output=True,
            text=True,
            timeout=30,
        )
    if probe.returncode != 0:
        return f"unshare --mount / mount -t tmpfs refused here: {probe.stderr.strip()}"
    return None


def free_ports(count: int) -> list[int]:
    """Distinct ports, held open together while chosen (one closed at once may come back)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except GONE:
        return ""


class PodNamespace:
    """Stages a service account's files; `argv(command)` runs `command` in a fresh private mount
    namespace where they are at SA_DIR. A context manager (close() removes the staged files)."""

    def __init__(
        self,
        *,
        token: str,
        ca_path: str | os.PathLike,
        namespace: str = "default",
        workdir: str | os.PathLike | None = None,
    ):
        self.token, self.namespace = token, namespace
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rf-kpod-"))
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.staged = self.workdir / "serviceaccount"
        self.scratch = self.workdir / "mnt"  # a mount point inside the namespace only
        self.staged.mkdir(mode=0o700, exist_ok=True)
        self.scratch.mkdir(mode=0o700, exist_ok=True)
        (self.staged / "token").write_text(token)
        (self.staged / "namespace").write_text(namespace)
        shutil.copyfile(ca_path, self.staged / "ca.crt")

    def argv(self, command: list[str]) -> list[str]:
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            POD_SCRIPT,
            "rf-pod",
            str(self.staged),
            str(self.scratch),
            *command,
        ]

    def unstage(self) -> None:
        """Remove the staged copies of the files (namespaces already set up keep theirs)."""
        shutil.rmtree(self.staged, ignore_errors=True)

    def close(self) -> None:
        """Remove the staged files and the scratch folder: once no process is left in the
        namespaces made (the scratch folder backs their /run's upper layer)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PodNamespace:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def nsenter_argv(pid: int, command: list[str]) -> list[str]:
    """`command` run in the mount namespace of process `pid`."""
    return ["nsenter", f"--target={pid}", "--mount", "--", *command]


class PodRayHead:
    """A real Ray head (dashboard, token auth) whose processes live in a PodNamespace: what the
    head pod of a RayCluster with `serviceAccountName` runs. Attributes: `token` (Ray's auth
    token), `temp_dir`, `dashboard_url` (as RayHead's, for FakeKubeRayOperator), `sa_token`,
    `namespace`, `kube_env` (the KUBERNETES_SERVICE_* variables it runs with)."""

    def __init__(
        self,
        *,
        sa_token: str,
        ca_path: str | os.PathLike,
        kube_port: int,
        namespace: str = "default",
        kube_host: str = "127.0.0.1",
        num_cpus: int = 2,
    ):
        self.token = secrets.token_hex(24)
        self.sa_token, self.namespace = sa_token, namespace
        self.kube_env = {
            "KUBERNETES_SERVICE_HOST": kube_host,
            "KUBERNETES_SERVICE_PORT": str(kube_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(kube_port),
            "KUBERNETES_PORT": f"tcp://{kube_host}:{kube_port}",
        }
        self.num_cpus = num_cpus
        # short: Ray's socket paths stay < 108 chars
        self.temp_dir = tempfile.mkdtemp(prefix="rf-kp-")
        self.dashboard_url = f"http://127.0.0.1:{free_ports(1)[0]}"
        self.pod = PodNamespace(token=sa_token, ca_path=ca_path, namespace=namespace)

    @classmethod
    def for_emulator(
        cls, emulator: KubeEmulator, namespace: str, service_account: str, **kwargs: Any
    ) -> PodRayHead:
        """A head whose pod runs as `service_account` of `namespace` (a fresh token) against
        `emulator`'s HTTPS port (KubeEmulator(tls=True))."""
        if not emulator.https_port:
            raise RuntimeError(
                "PodRayHead needs KubeEmulator(tls=True): in-cluster clients speak HTTPS"
            )
        return cls(
            sa_token=emulator.service_account_token(namespace, service_account),
            ca_path=emulator.ca_path,
            kube_port=emulator.https_port,
            namespace=namespace,
            **kwargs,
        )

    def start(self) -> None:
        # jobs run `python`: this venv's, as the image's would be
        bin_dir = Path(sys.executable).parent
        env = dict(
            os.environ,
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            **self.kube_env,
        )
        for name in ("MLFLOW_TRACKING_URI", "KUBECONFIG"):  # a pod has neither
            env.pop(name, None)
        port, agent, client, metrics, runtime_env = free_ports(5)
        command = [
            str(bin_dir / "ray"),
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_url.rsplit(':', 1)[1]}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={agent}",
            f"--ray-client-server-port={client}",
            f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}",
        ]
        try:
            out = subprocess.run(
                self.pod.argv(command), env=env, capture_output=True, text=True, timeout=120
            )
            if out.returncode != 0:
                raise RuntimeError(
                    f"ray start --head in the pod namespace exited {out.returncode}: "
                    f"{(out.stdout + out.stderr)[-3000:]}"
                )
            seen = self.read_in_pod(f"{SA_DIR}/token")
            if seen != self.sa_token:
                raise RuntimeError(f"the raylet does not see the pod's token at {SA_DIR}/token")
        except BaseException:
            self.stop()
            raise
        finally:
            self.pod.unstage()  # the namespace has its copies

    def raylet_pid(self) -> int:
        raylets = [p.pid for p in processes_mentioning(self.temp_dir) if _name(p) == "raylet"]
        if not raylets:
            raise RuntimeError(f"no raylet of the head in {self.temp_dir} is running")
        return raylets[0]

    def pids(self) -> set[int]:
        return {p.pid for p in processes_mentioning(self.temp_dir)}

    def nsenter_argv(self, command: list[str]) -> list[str]:
        """`command` run in the head pod's mount namespace (through its raylet's)."""
        return nsenter_argv(self.raylet_pid(), command)

    def read_in_pod(self, path: str) -> str:
        out = subprocess.run(
            self.nsenter_argv(["cat", path]), capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise FileNotFoundError(f"{path} in the head pod: {out.stderr.strip()}")
        return out.stdout

    def stop(self) -> None:
        stop_processes_mentioning(self.temp_dir)
        self.pod.close()
