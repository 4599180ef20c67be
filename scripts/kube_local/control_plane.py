"""The real control plane from build.py's binaries, as processes of this machine: etcd, the API
server, the controller-manager, the scheduler and KubeRay's operator, with the operator's CRDs
applied server-side.

- **Who may talk to what.** Every port is on `address` (loopback by default), picked free at
  start. etcd speaks TLS and accepts only the API server's client certificate, as its peer port
  does only its own: a loopback port is reachable by every user of the machine. The API server
  authenticates client certificates and service-account tokens (anonymous requests are refused)
  and authorizes with the Node and RBAC authorizers. The controller-manager and the scheduler
  act as their own identities, bound by Kubernetes' default roles. The operator acts as
  `kuberay-operator`, bound to its release's own ClusterRole.
- **Which controllers.** Only those a RayCluster's and a RayJob's life needs:
  - garbage collection (owner references);
  - service accounts and their tokens, and each namespace's `kube-root-ca.crt`, which projected
    token volumes need;
  - endpoints and endpoint slices;
  - Jobs (a RayJob's submitter) and their TTL;
  - namespaces, pod garbage collection, role aggregation;
  - node lifecycle (a Node whose Lease goes stale is tainted and its pods evicted).
- **Names.** The operator runs in a mount namespace of its own whose /etc/hosts the process
  kubelet keeps (`operator_hosts`): it reaches a RayJob's head by its Service's cluster name, as
  in a pod with cluster DNS.
- **Stopping.** In the reverse order, each process group SIGTERMed then SIGKILLed after
  STOP_GRACE_S: the API server does not end on SIGTERM within 30 s. It goes on past a failing
  step, and leaves no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from scripts.kube_local import audit as audit_log
from scripts.kube_local.pki import make_pki
from scripts.kube_local.undo import Stack

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
SERVICE_RANGE = "10.96.0.0/24"
CONTROLLERS = (
    "garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "job-controller",
    "ttl-after-finished-controller",
    "namespace-controller",
    "pod-garbage-collector-controller",
    "clusterrole-aggregation-controller",
    "node-lifecycle-controller",
)


def _binding(name: str, role: str, user: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


# The process kubelet's stand-in for cluster DNS reads Services and EndpointSlices, and only
# those (scripts/kube_local/hosts.py), as CoreDNS's ClusterRole allows.
DNS_ROLE = (
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "rayflow:local-dns"},
        "rules": [
            {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]},
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["list", "watch"],
            },
        ],
    },
    _binding("rayflow:local-dns", "rayflow:local-dns", "rayflow:local-dns"),
)


class ControlPlaneError(RuntimeError):
    pass


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@dataclass
class ControlPlane(Stack):
    """`start()` it (or use it as a context manager); `kubeconfig(name)` is an identity's kubeconfig
    (`admin`, or `node-NAME` for a node of `nodes`); `stop()` undoes what start did."""

    error = ControlPlaneError

    folder: Path
    bin_dir: Path
    nodes: tuple[str, ...] = ("node-1",)
    address: str = "127.0.0.1"
    server: str = ""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def operator_hosts(self) -> Path:
        """The operator's /etc/hosts, kept up to date by the process kubelet (--extra-hosts)."""
        return self.folder / "operator-hosts"

    @property
    def manifests(self) -> Path:
        return self.bin_dir.parent / "kuberay"

    def start(self) -> None:
        pki = make_pki(self.folder / "pki", (self.address, "10.96.0.1"), self.nodes)
        etcd_url = self._etcd(pki)
        port = _free_port(self.address)
        self.server = f"https://{self.address}:{port}"
        self._run("kube-apiserver", *self._apiserver_args(pki, etcd_url, port))
        self._wait(f"{self.server}/readyz", "the API server's /readyz")
        for name in ("admin", "controller-manager", "scheduler", "kuberay-operator", "local-dns"):
            self._write_kubeconfig(name)
        for node in self.nodes:
            self._write_kubeconfig(f"node-{node}")
        self._run("kube-controller-manager", *self._controller_manager_args(pki))
        self._run("kube-scheduler", *self._component_args("scheduler"))
        self.kubectl("apply", "--server-side", "-f", str(self.manifests))
        self._bind_operator()
        self._apply(*DNS_ROLE)
        probe = _free_port("127.0.0.1")
        self._run(
            "kuberay-operator",
            "--enable-leader-election=false",
            "--metrics-addr",
            f"127.0.0.1:{_free_port('127.0.0.1')}",
            "--health-probe-bind-address",
            f"127.0.0.1:{probe}",
            env={"KUBECONFIG": str(self.kubeconfig("kuberay-operator"))},
            # it asks a RayJob's head for the job's status by the head Service's name
            hosts=True,
        )
        self._wait(f"http://127.0.0.1:{probe}/readyz", "the operator's /readyz", tls=False)

    def kubeconfig(self, name: str) -> Path:
        return self.folder / f"{name}.kubeconfig"

    @property
    def audit(self) -> audit_log.AuditLog:
        """The API server's record of every request (scripts/kube_local/audit.py)."""
        return audit_log.AuditLog(self.folder / "audit.log", self.server, self.folder / "pki")

    def kubectl(self, *args: str, identity: str = "admin") -> str:
        done = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig(identity)), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    # --- the processes ------------------------------------------------------------------------

    def _etcd(self, pki: Path) -> str:
        client, peer = _free_port("127.0.0.1"), _free_port("127.0.0.1")
        tls = [f"--cert-file={pki}/etcd.crt", f"--key-file={pki}/etcd.key"]
        peer_tls = [f"--peer-cert-file={pki}/etcd.crt", f"--peer-key-file={pki}/etcd.key"]
        self._run(
            "etcd",
            f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls=https://127.0.0.1:{client}",
            f"--advertise-client-urls=https://127.0.0.1:{client}",
            f"--listen-peer-urls=https://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=https://127.0.0.1:{peer}",
            f"--initial-cluster=default=https://127.0.0.1:{peer}",
            "--listen-metrics-urls=",
            *tls,
            "--client-cert-auth",
            f"--trusted-ca-file={pki}/ca.crt",
            *peer_tls,
            "--peer-client-cert-auth",
            f"--peer-trusted-ca-file={pki}/ca.crt",
        )
        return f"https://127.0.0.1:{client}"

    def _apiserver_args(self, pki: Path, etcd_url: str, port: int) -> list[str]:
        return [
            f"--etcd-servers={etcd_url}",
            f"--etcd-cafile={pki}/ca.crt",
            f"--etcd-certfile={pki}/etcd-client.crt",
            f"--etcd-keyfile={pki}/etcd-client.key",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={port}",
            f"--tls-cert-file={pki}/apiserver.crt",
            f"--tls-private-key-file={pki}/apiserver.key",
            f"--client-ca-file={pki}/ca.crt",
            "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--enable-admission-plugins=NodeRestriction",
            *audit_log.apiserver_args(self.folder),
        ]

    def _component_args(self, identity: str) -> list[str]:
        """A controller-manager's or scheduler's identity and serving port, as kubeadm sets them."""
        kubeconfig = str(self.kubeconfig(identity))
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={_free_port('127.0.0.1')}",
            "--leader-elect=false",
        ]

    def _controller_manager_args(self, pki: Path) -> list[str]:
        return [
            *self._component_args("controller-manager"),
            "--use-service-account-credentials",
            f"--service-account-private-key-file={pki}/sa.key",
            f"--root-ca-file={pki}/ca.crt",
            f"--controllers={','.join(CONTROLLERS)}",
        ]

    def _bind_operator(self) -> None:
        self._apply(_binding("kuberay-operator", "kuberay-operator", "kuberay-operator"))

    def _apply(self, *docs: dict) -> None:
        path = self.folder / "applied.json"
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))
        self.kubectl("apply", "--server-side", "-f", str(path))

    def _run(
        self, name: str, *args: str, env: dict[str, str] | None = None, hosts: bool = False
    ) -> None:
        """Start a component; `hosts`: in a mount namespace of its own whose /etc/hosts is
        `operator_hosts` (the cluster's Service names, as a pod's cluster DNS answers them)."""
        log = open(self.folder / f"{name}.log", "ab")  # noqa: SIM115  (the process's own, closed on stop)
        argv = [str(self.bin_dir / name), *args]
        if hosts:
            self.operator_hosts.write_text("127.0.0.1\tlocalhost\n")
            argv = ["unshare", "--mount", "--propagation", "private", "--"]
            argv += ["bash", "-c", 'mount --bind "$1" /etc/hosts && shift && exec "$@"', "-"]
            argv += [str(self.operator_hosts), str(self.bin_dir / name), *args]
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its group: SIGKILLed whole on stop
            env={**os.environ, **(env or {})},
        )
        self.procs[name] = proc
        self.undo(f"stop {name}", lambda: _stop(proc, log))
        time.sleep(0.05)
        if proc.poll() is not None:
            raise ControlPlaneError(f"{name} exited at once ({proc.returncode}): see {log.name}")

    def _wait(self, url: str, what: str, tls: bool = True) -> None:
        context = None
        if tls:
            pki = self.folder / "pki"
            context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise ControlPlaneError(f"{', '.join(dead)} exited while waiting for {what}")
            try:
                with urllib.request.urlopen(url, context=context, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise ControlPlaneError(f"{what} did not answer within {READY_TIMEOUT_S:.0f} s")

    def _write_kubeconfig(self, name: str) -> None:
        pki = self.folder / "pki"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "rayflow-local",
                    "cluster": {"server": self.server, "certificate-authority": f"{pki}/ca.crt"},
                }
            ],
            "users": [
                {
                    "name": name,
                    "user": {
                        "client-certificate": f"{pki}/{name}.crt",
                        "client-key": f"{pki}/{name}.key",
                    },
                }
            ],
            "contexts": [
                {"name": "rayflow-local", "context": {"cluster": "rayflow-local", "user": name}}
            ],
            "current-context": "rayflow-local",
        }
        fd = os.open(self.kubeconfig(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)


def _stop(proc: subprocess.Popen, log) -> None:
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        else:  # its own children may outlive it in its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        log.close()
