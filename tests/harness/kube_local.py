"""The real Kubernetes stack for the kuberay tests: scripts/kube_local's LocalKube (the control
plane, the KubeRay operator, the process kubelet's two Nodes) with an S3 server and an MLflow
server on its bridge, started once per pytest worker (`local_kube`, session scope: the modules
that use it run on one worker, tests/conftest.py's SAME_WORKER).

Each worker's stack has names and a subnet of its own (prefix `rfk<N>`, 10.214.<N+1>.0/24), so
two workers never meet, nor scripts/kube-local.sh's (`rfk`, 10.214.0.0/24). Without the built
binaries, root or network namespaces it skips in one line; under CI it fails
(tests/harness/needs.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.needs import need

NODES = ("node-1", "node-2")


@dataclass
class Stack:
    kube: Any  # scripts.kube_local.local.LocalKube
    s3: Any  # scripts.servers.s3.S3Server
    mlflow_url: str

    @property
    def kubeconfig(self) -> Path:
        return self.kube.kubeconfig

    def env(self) -> dict[str, str]:
        """What a run from this machine needs (the S3 server's settings, token auth)."""
        return {**self.s3.env(), "RAY_AUTH_MODE": "token"}

    def backend(self, *more: str) -> list[str]:
        """backend=kuberay on this stack, as a user of scripts/kube-local.sh would run it."""
        return [
            "backend=kuberay",
            f"backend.kubeconfig={self.kubeconfig}",
            "backend.image=rayproject/ray:2.60.0",
            "backend.job_pip=[]",  # the pods run this machine's venv: nothing to install
            "backend.start_timeout_s=120",
            "backend.delete_timeout_s=60",
            *more,
        ]

    def get(self, *args: str) -> dict:
        import json

        return json.loads(self.kube.kubectl("get", *args, "-o", "json"))

    def events(self, kind: str | None = None) -> list[dict]:
        items = self.get("events", "-A")["items"]
        return [e for e in items if kind is None or e["involvedObject"]["kind"] == kind]

    def pods(self, cluster: str, kind: str) -> list[dict]:
        """The pods of RayCluster `cluster` of one node type (head, worker)."""
        return self.get("pods", "-l", f"ray.io/cluster={cluster},ray.io/node-type={kind}")["items"]

    def phases(self) -> dict[str, str]:
        """Every pod's phase, by name (a failure's context)."""
        return {
            p["metadata"]["name"]: p["status"].get("phase", "") for p in self.get("pods")["items"]
        }

    def operator_said(self, about: str, lines: int = 30) -> str:
        """The KubeRay operator's last log lines naming `about` (a failure's context)."""
        log = self.kube.plane.folder / "kuberay-operator.log"
        said = [line for line in log.read_text(errors="replace").splitlines() if about in line]
        return "\n".join(said[-lines:])

    def mark(self) -> int:
        """Where the API server's audit log ends now (`asked_since`)."""
        return self.kube.plane.audit.mark()

    def asked_since(self, mark: int) -> list[dict]:
        """What a run of rayflow, not kubectl nor a component, asked the API server since `mark`:
        the audit log's events of the admin user's clients other than kubectl."""
        return [
            e
            for e in self.kube.plane.audit.since(mark)
            # an unauthenticated request (a probe that sent no credentials) has no username
            if e.get("user", {}).get("username") == "rayflow-admin"
            and not e.get("userAgent", "").startswith("kubectl")
        ]

    def put(self, obj: dict, folder: Path) -> dict:
        """Create `obj` as another party would, with kubectl: the object as created."""
        import json

        path = folder / f"put-{obj['kind'].lower()}-{obj['metadata']['name']}.json"
        path.write_text(json.dumps(obj))
        return json.loads(self.kube.kubectl("create", "-f", str(path), "-o", "json"))

    def left(self, name: str) -> list[str]:
        """What of RayCluster `name` is left: the cluster, its pods, Services and Secrets."""
        found = [
            f"raycluster/{name}"
            for c in self.get("rayclusters")["items"]
            if c["metadata"]["name"] == name
        ]
        for kind in ("pods", "services", "secrets"):
            found += [
                f"{kind}/{o['metadata']['name']}"
                for o in self.get(kind)["items"]
                if o["metadata"]["name"].startswith(name + "-") or o["metadata"]["name"] == name
            ]
        return found


def unavailable_reason() -> str | None:
    from scripts.kube_local import build

    if os.geteuid() != 0:
        return "root (network namespaces, a bridge, mounts) for the local Kubernetes"
    missing = [c for c in ("ip", "unshare", "nsenter", "tini", "mount") if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} for the process kubelet"
    bin_dir = build.build_dir() / "bin"
    if not all((bin_dir / b).is_file() for b in build.BINARIES):
        go = "" if shutil.which("go") else "; no `go` on PATH"
        return f"the control plane built in {bin_dir} (`bash scripts/setup.sh --test`{go})"
    return None


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


@pytest.fixture(scope="session")
def local_kube(tmp_path_factory):
    from scripts.kube_local import build
    from scripts.kube_local.local import LocalKube
    from scripts.servers.mlflow import mlflow_server
    from scripts.servers.s3 import S3Server

    reason = unavailable_reason()
    need(reason is None, str(reason))
    index = _worker_index()
    folder = tmp_path_factory.mktemp("local-kube")
    kube = LocalKube(
        folder,
        build.build_dir() / "bin",
        NODES,
        subnet=f"10.214.{index + 1}.0/24",  # .0: scripts/kube-local.sh's
        prefix=f"rfk{index}",
    )
    with (
        kube,
        S3Server(host=kube.address, bucket="rayflow-local") as s3,
        mlflow_server(folder / "mlflow", host=kube.address) as (url, _),
    ):
        yield Stack(kube, s3, url)
    left = leftovers(kube.prefix, folder)
    assert not left, f"the local Kubernetes left behind: {left}"


def leftovers(prefix: str, folder: Path) -> list[str]:
    """What of a stopped LocalKube is still here: processes started from its folder (the control
    plane, the kubelet) or in its pods' namespaces, those namespaces, its links."""
    import psutil

    from scripts.kube_local import net

    found = [f"namespace {ns}" for ns in net.netns_names() if ns.startswith(f"{prefix}-")]
    found += [f"link {link}" for link in net.link_names() if link.startswith(f"{prefix}-")]
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(folder) in line or f"--prefix={prefix} " in line + " ":
            found.append(f"process {proc.info['pid']}: {line[:120]}")
    return found
