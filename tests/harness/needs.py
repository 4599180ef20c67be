"""What a test needs of the machine (root, network namespaces, sshd): skipped where it is missing
on a developer's machine, a failure in CI (`CI` set), where a test that cannot run must not pass
unrun."""

from __future__ import annotations

import os

import pytest

NOBODY = 65534  # the second OS user the shared-place tests act as


def need(present: bool, what: str) -> None:
    """Skip (a developer's machine) or fail (CI) the calling test unless `present`."""
    if present:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test: it needs {what}")
    pytest.skip(f"needs {what}")


def need_root() -> None:
    need(os.geteuid() == 0, "root (to act as a second OS user, nobody)")
