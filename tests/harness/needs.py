"""What a test needs of the machine (root, network namespaces, sshd): skipped where it is missing
on a developer's machine, a failure in CI (`CI` set), where a test that cannot run must not pass
unrun. In CI only the `gpu` and `cloud` markers skip (a GPU, cloud accounts, a real Kubernetes
cluster: what no CI machine has), and a skip written into a test's parameters (Ray's own examples
that cannot run on a CPU, each with its reason); any other skip, however it came about, is made a
failure there (the two hooks below, which tests/conftest.py imports)."""

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


SKIP_IN_CI = ("gpu", "cloud")


def unrun_in_ci(report, item=None) -> None:
    """In CI, a skipped test or module becomes a failure that names why it was skipped, unless it
    is one that skips there (SKIP_IN_CI, or an unconditional `pytest.mark.skip`)."""
    if not (os.environ.get("CI") and report.skipped) or hasattr(report, "wasxfail"):
        return
    if item is not None and (
        any(item.get_closest_marker(name) for name in SKIP_IN_CI) or item.get_closest_marker("skip")
    ):
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"CI must run this, and it was skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    unrun_in_ci(outcome.get_result(), item)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    unrun_in_ci(outcome.get_result())  # a module skipped whole (a missing import)
