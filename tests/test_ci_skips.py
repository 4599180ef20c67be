"""In CI (`CI` set) a test that cannot run here fails instead of passing unrun: any skip but the
`gpu` and `cloud` markers' and a skip written into a test's parameters is a failure that says
why it was skipped (tests/harness/needs.py). Run on a small suite of its own, as pytest runs ours."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

SUITE = {
    "conftest.py": """
        from tests.harness.needs import pytest_make_collect_report, pytest_runtest_makereport
        """,
    "test_kinds.py": """
        import pytest
        from tests.harness.needs import need

        def test_runs():
            pass

        def test_needs_what_is_missing():
            need(False, "a network namespace")

        def test_skips_at_run_time():
            pytest.skip("no sshd here")

        @pytest.mark.skipif(True, reason="not root")
        def test_skipif_the_machine():
            pass

        @pytest.mark.gpu
        def test_gpu():
            pytest.skip("no CUDA device")

        @pytest.mark.cloud
        def test_cloud():
            pytest.skip("no credentials")

        @pytest.mark.parametrize("entry", [pytest.param("x", marks=pytest.mark.skip(reason="GPU only"))])
        def test_an_entry_that_cannot_run_on_a_cpu(entry):
            pass

        @pytest.mark.xfail(reason="known", strict=True)
        def test_known_to_fail():
            assert False
        """,
    "test_module_skipped.py": """
        import pytest
        pytest.importorskip("a_module_that_is_not_installed")
        """,
}


# a suite of its own: no project config, a collection error reported beside the rest
PYTEST = ["-c", os.devnull, "--rootdir", ".", "-p", "no:cacheprovider", "-n", "0", "-q"]
PYTEST += ["--continue-on-collection-errors", "-W", "ignore::pytest.PytestUnknownMarkWarning"]


def _outcomes(folder: Path, ci: bool) -> tuple[dict[str, str], str]:
    """Each test's outcome (passed, failed, skipped, xfail), by name, from pytest's JUnit report."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    report = folder / f"report-{ci}.xml"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST, f"--junitxml={report}", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=folder,
    )
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name") or case.get("classname")
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        skipped = case.find("skipped")
        if skipped is not None and skipped.get("type") == "pytest.xfail":
            kinds = ["xfail"]
        found[name.split("[")[0]] = {"failure": "failed", "error": "failed"}.get(
            kinds[0] if kinds else "passed", kinds[0] if kinds else "passed"
        )
    return found, out.stdout


@pytest.mark.no_store
def test_in_ci_only_gpu_cloud_and_written_skips_skip(tmp_path):
    for name, text in SUITE.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    ci, said = _outcomes(tmp_path, ci=True)
    assert ci == {
        "test_runs": "passed",
        "test_needs_what_is_missing": "failed",
        "test_skips_at_run_time": "failed",
        "test_skipif_the_machine": "failed",
        "test_gpu": "skipped",
        "test_cloud": "skipped",
        "test_an_entry_that_cannot_run_on_a_cpu": "skipped",
        "test_known_to_fail": "xfail",
        "test_module_skipped": "failed",
    }, said
    assert "CI must run this, and it was skipped: no sshd here" in said
    laptop, said = _outcomes(tmp_path, ci=False)
    assert {name for name, word in laptop.items() if word == "skipped"} == {
        "test_needs_what_is_missing",
        "test_skips_at_run_time",
        "test_skipif_the_machine",
        "test_gpu",
        "test_cloud",
        "test_an_entry_that_cannot_run_on_a_cpu",
        "test_module_skipped",
    }, said
