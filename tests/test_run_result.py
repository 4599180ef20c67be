"""A submitted run's RunResult travels back as the job's last log line (rayflow.results.run_result): what
this side rebuilds from it, and what the user's terminal is not shown. (A forged, pickled or
smuggled line: tests/test_security_results.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rayflow.results.run_result import (
    RESULT_MARKER,
    ReturnedSummary,
    RunResult,
    result_line,
    returned_result,
    without_result_line,
)
from rayflow.security import result_channel


def _job_side(tmp_path: Path) -> RunResult:
    (tmp_path / "exp").mkdir()
    summary = ReturnedSummary(
        best_config={"lr": np.float64(0.01)},
        best_metrics={"loss": 0.25, "acc": float("nan")},
        errored=1,
        error="ValueError: boom",
        devices=["cpu"],
        metrics={"best_loss": 0.25},
        text="\n== rayflow results ==\nbest config:\n  lr: 0.01\n",
    )
    return RunResult(
        "tune",
        summary,
        tmp_path / "exp",
        ("backend=attach",),
        {"workload": {"name": "tune"}},
        "sqlite:////x/mlflow.db",
        "tune",
        "7",
        "run-1",
        trial_rows=[
            {"trial_id": "a", "loss": np.float32(0.25), "done": True},
            {"trial_id": "b", "loss": math.inf},
        ],
    )


KEY = bytes(range(32))


@pytest.fixture
def job_key(monkeypatch):
    """This process as a submitted job's driver: it took the submission's key at its start."""
    monkeypatch.setenv(result_channel.KEY_ENV, KEY.hex())
    result_channel.take_key()
    yield KEY
    monkeypatch.setattr(result_channel._TAKEN, "key", None)


def test_the_result_line_rebuilds_the_run_result_on_the_submitting_side(tmp_path, job_key):
    line = result_line(_job_side(tmp_path), "FAILED")
    assert line.startswith(RESULT_MARKER) and "\n" not in line
    log = f"job output\n{line}\nmore output\n"
    mine = RunResult(
        "tune",
        None,
        Path("/here"),
        ("backend=vm",),
        {"backend": {"name": "vm"}},
        "sqlite:////x/mlflow.db",
        "tune",
    )
    result, status = returned_result(log, mine, job_key)
    # this side's command line
    assert status == "FAILED" and result is mine and result.overrides == ("backend=vm",)
    assert result.experiment_dir == tmp_path / "exp"  # the job's folder (on the head)
    assert (result.mlflow_experiment_id, result.mlflow_run_id) == ("7", "run-1")
    assert result.best_config == {"lr": 0.01} and result.best_metrics == {
        "loss": 0.25,
        "acc": None,
    }  # NaN: no value
    assert result.summary.errored == 1 and result.summary.table().startswith(
        "\n== rayflow results =="
    )
    trials = result.trials
    assert (
        list(trials["trial_id"]) == ["a", "b"]
        and trials["loss"][0] == 0.25
        and trials["loss"].isna()[1]
    )
    assert without_result_line(log) == "job output\nmore output\n"


def test_a_job_that_said_nothing_leaves_the_result_as_this_side_knows_it():
    mine = RunResult("tune", None, Path("/here"))
    assert returned_result(
        "Traceback (most recent call last):\n  ...\nImportError: x\n", mine, KEY
    ) == (mine, None)
    assert mine.summary is None and mine.best_metrics == {}
