"""A `backend=vm provider=local` command line for SSH hosts that need not exist: the tests that
check what a vm start refuses, records or tears down before any SSH connection is made."""

from __future__ import annotations

from pathlib import Path


def local_hosts(tmp_path: Path, *extra: str) -> list[str]:
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    return [
        "backend=vm",
        "backend.provider=local",
        "backend.head_ip=10.99.0.11",
        "backend.worker_ips=[10.99.0.12]",
        "backend.ssh_user=me",
        f"backend.ssh_private_key={key}",
        "backend.max_worker_nodes=1",
        *extra,
    ]
