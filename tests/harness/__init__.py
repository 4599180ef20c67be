"""Test machinery that is not a test: SSH hosts from network namespaces (ssh_hosts), the real
Kubernetes stack of scripts/kube_local for a pytest worker (kube_local), the CIFAR archive server
(archive), the rayflow command-line runner (cli) and planted secrets (secrets). Fixtures that use
them live in tests/conftest.py.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository's root
