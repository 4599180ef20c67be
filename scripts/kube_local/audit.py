"""The API server's own audit log, as the local control plane's record of who asked it what.

Tests read it to assert what a run did *not* do ("nothing reached that cluster's dashboard", "no
RoleBinding was created"): only the API server sees every request, including those it refused,
and writes each one once it has answered (the log backend's blocking mode).

- **What is kept.** Every request's metadata (user, user agent, verb, URI with its query, the
  object, the response code). The bodies of what rayflow writes (RayClusters, RayJobs and the
  autostop's RBAC objects), so a test can read what was sent though the object is gone since.
- **What is not.** Secret and ConfigMap bodies (only their metadata: a Ray token never lands in
  the log), Leases and health checks (noise: the kubelet renews its Nodes' every few seconds).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*"]},
        {"level": "Metadata", "resources": [{"group": "", "resources": ["secrets", "configmaps"]}]},
        {
            "level": "Request",
            "verbs": ["create", "update", "patch"],
            "resources": [
                {"group": "ray.io", "resources": ["rayclusters", "rayjobs"]},
                {"group": "", "resources": ["serviceaccounts", "services"]},
                {"group": "rbac.authorization.k8s.io", "resources": ["roles", "rolebindings"]},
            ],
        },
        {"level": "Metadata"},
    ],
}


def apiserver_args(folder: Path) -> list[str]:
    """The API server's flags for a log in `folder` (its policy written there)."""
    policy = folder / "audit-policy.json"
    policy.write_text(json.dumps(POLICY))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={folder / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
    ]


@dataclass
class AuditLog:
    """`mark()` where the log ends now; `since(mark)` the requests answered after it."""

    path: Path
    server: str
    pki: Path
    settle_s: float = 10.0

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def since(self, mark: int) -> list[dict]:
        """Each request answered since `mark`, oldest first. A request of our own (a GET of a
        namespace no one has, named at random) goes last; waiting until it is logged means every
        request answered before it is too."""
        sentinel = f"audit-{uuid.uuid4().hex[:12]}"
        self._ask(f"/api/v1/namespaces/{sentinel}")
        deadline = time.monotonic() + self.settle_s
        while True:
            events = self._read(mark)
            if any(sentinel in e.get("requestURI", "") for e in events):
                return [e for e in events if sentinel not in e.get("requestURI", "")]
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the audit log did not show our own request within {self.settle_s} s"
                )
            time.sleep(0.1)

    def _read(self, mark: int) -> list[dict]:
        with open(self.path, "rb") as f:
            f.seek(mark)
            lines = f.read().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def _ask(self, path: str) -> None:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        try:
            urllib.request.urlopen(f"{self.server}{path}", context=context, timeout=10).close()
        except urllib.error.HTTPError as answer:  # the 404 we asked for
            if answer.code != 404:
                raise
