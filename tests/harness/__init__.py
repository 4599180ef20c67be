"""Test machinery that is not a test: SSH hosts from network namespaces (ssh_hosts), the
Kubernetes API emulator (kube_emulator, with its services proxy kube_proxy, RBAC kube_rbac and
TLS certificates tls), the KubeRay operator's part (kube_operator), a head pod's mount namespace
and Ray head (kube_head), the CIFAR archive server (archive), the rayflow command-line
runner (cli) and planted secrets (secrets). Fixtures that use them live in tests/conftest.py.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository's root
