"""`hydra/sweeper=rayflow` as a Hydra user meets it: examples/hydra-sweep (an app written for Hydra's
Optuna sweeper, its config's sweeper line changed), copied outside the repository and run in a
subprocess. What Hydra's Optuna sweeper tests check (plugins/hydra_optuna_sweeper/tests: the
sweep's jobs and overrides, optimization_results.yaml, failing jobs, the example app), and what
Tune adds: trials of unequal length never wait for a batch, ASHA stops a bad trial early, MLflow
holds the sweep, Ctrl-C and resume. The search-space table: tests/test_sweeper_params.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import yaml

from rayflow.testing.processes import ray_daemon_pids, wait_until
from tests.harness.hydra_app import SweepApp


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One search of the example app as its config has it (x a range, y a choice, seed 123),
    with ASHA, 2 trials at a time, trials of unequal length (steps 1 or 6), and a task that raises
    in some (error=true)."""
    app = SweepApp(tmp_path_factory.mktemp("sweeper") / "app")
    out = app.run(
        "hydra.sweeper.n_trials=10",
        "hydra.sweeper.max_concurrent=2",
        "hydra.sweeper.scheduler={name: asha, grace_period: 1, max_t: 7}",
        "steps=choice(1, 6)",
        "step_s=0.4",
        "error=choice(false, false, false, true)",
    )
    return app, out


def test_the_optuna_sweepers_app_runs_and_writes_optimization_results(searched):
    app, out = searched
    rows = app.table()
    failed = [r for r in rows if r["state"] == "failed"]
    # failing jobs are recorded, the search goes on, and the sweep says it failed (as Optuna's
    # max_failure_rate=0 does), after writing what it found
    assert len(rows) == 10 and failed and len(failed) < 10, rows
    assert out.returncode == 1 and "RuntimeError: cfg.error is True" in out.stderr, out.stderr[
        -3000:
    ]
    results = app.results()
    # the searched keys, not the fixed one (step_s), as the Optuna sweeper's best_params
    assert results["name"] == "rayflow" and set(results["best_params"]) == {
        "x",
        "y",
        "steps",
        "error",
    }
    ok = [r for r in rows if r["state"] != "failed" and r["objective"]]
    best = min(ok, key=lambda r: float(r["objective"]))
    assert results["best_value"] == pytest.approx(float(best["objective"]))
    assert results["best_params"]["x"] == pytest.approx(float(best["x"]))
    # each value as the Optuna sweeper reads the config's params: x on its 0.5 grid, y a choice
    for row in rows:
        assert float(row["x"]) * 2 == int(float(row["x"]) * 2) and -5.5 <= float(row["x"]) <= 5.5
        assert int(row["y"]) in (-5, 0, 5)


def test_failures_within_max_failure_rate_leave_the_sweep_successful(tmp_path):
    """As the Optuna sweeper's max_failure_rate: every trial failing, tolerated at 1.0."""
    app = SweepApp(tmp_path / "app")
    out = app.run("hydra.sweeper.n_trials=2", "hydra.sweeper.max_failure_rate=1.0", "error=true")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RuntimeError: cfg.error is True" in out.stderr
    assert [r["state"] for r in app.table()] == ["failed", "failed"]
    assert not (app.sweep_dir / "optimization_results.yaml").exists()  # no best to write


def test_each_trial_is_a_hydra_job_with_its_own_folder_overrides_and_log(searched):
    app, _ = searched
    for row in app.table():
        job = app.sweep_dir / row["job"]
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        assert f"y={row['y']}" in overrides and any(o.startswith("x=") for o in overrides)
        assert "step_s=0.4" in overrides  # a fixed value of the command line, in every trial
        config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text())
        assert config["x"] == pytest.approx(float(row["x"])) and config["steps"] == int(
            row["steps"]
        )
        hydra = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert hydra["job"]["num"] == int(row["job"]) and hydra["mode"] == "MULTIRUN"
        if row["state"] == "completed":  # the task's own log line, in the job's log
            assert "x=" in (job / "sphere.log").read_text()
        if row["state"] == "failed":
            assert config["error"] is True
        else:
            assert config["error"] is False


def test_trials_of_unequal_length_never_wait_for_a_batch(tmp_path):
    """With 2 slots, a trial starts as soon as a slot frees, while a long one still runs. Under
    Hydra's batched sweepers, the third trial waits for both of the first batch. The random
    sampler's seed fixes the order: the first trial is long (10 steps, 5 s), the next three short."""
    app = SweepApp(tmp_path / "app")
    out = app.run(
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=1",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.max_concurrent=2",
        "steps=choice(1, 10)",
        "step_s=0.5",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["steps"]) for r in app.table()] == [10, 1, 1, 1]
    spans = app.trial_spans()
    long_from, long_to = spans[0]
    # the first short trial was the long one's batch mate; the others started beside it
    assert all(long_from < spans[job][0] < long_to for job in (2, 3)), spans


def test_asha_stops_a_clearly_bad_trial_before_its_last_report(searched):
    app, _ = searched
    rows = app.table()
    stopped = [r for r in rows if r["state"] == "stopped early"]
    assert stopped, rows
    best = min(float(r["objective"]) for r in rows if r["state"] == "completed")
    for row in stopped:  # ended before its task returned (its steps' reports, then the return)
        assert int(row["reports"]) <= int(row["steps"]) and float(row["objective"]) > best, row
    completed = [r for r in rows if r["state"] == "completed"]
    assert completed and all(int(r["reports"]) == int(r["steps"]) + 1 for r in completed)


def test_mlflow_holds_the_sweep_and_a_run_per_trial(searched):
    from mlflow.tracking import MlflowClient

    app, _ = searched
    client = MlflowClient(app.env["MLFLOW_TRACKING_URI"])
    [experiment] = [e for e in client.search_experiments() if e.name == "sphere"]
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(trials) == 10
    assert parent.data.metrics["best_objective"] == pytest.approx(app.results()["best_value"])
    for run in trials:
        assert {"x", "y", "steps", "error"} <= set(run.data.params), run.data.params
        assert "_hydra_job" not in run.data.params
    # every reported value, as in trials.csv (the longest trial's reports)
    longest = max(len(client.get_metric_history(r.info.run_id, "objective")) for r in trials)
    assert longest == max(int(r["reports"] or 0) for r in app.table()) > 1
    # and whether the scheduler stopped it
    finished = [r for r in trials if r.info.status == "FINISHED"]
    assert finished and all(r.data.tags["stopped_early"] in ("true", "false") for r in finished)
    assert any(r.data.tags.get("stopped_early") == "true" for r in trials)
    assert any(a.path == "plots" for a in client.list_artifacts(parent.info.run_id))


def test_ctrl_c_stops_the_search_and_the_printed_resume_finishes_it(tmp_path):
    app = SweepApp(tmp_path / "app")
    before_pids = ray_daemon_pids()
    argv = app.argv(
        "hydra.sweeper.n_trials=6", "hydra.sweeper.max_concurrent=1", "steps=3", "step_s=1.0"
    )
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(
        argv, cwd=app.folder, env=app.env, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert wait_until(
            lambda: len(app.trial_reports()) >= 2 or proc.poll() is not None, timeout=240
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (tmp_path / "first.log").read_text()
    hint = said.split("Continue the search with the same command and: ")[-1].splitlines()[0]
    assert hint == f"hydra.sweep.dir={app.sweep_dir} hydra.sweeper.resume=true", said[-3000:]
    assert "python -m rayflow" not in said  # a sweep is continued as a sweep, never as a run
    before = app.trial_reports()
    finished = {j for j, rows in before.items() if rows[-1].get("ran_to_end")}
    assert finished and len(before) < 6  # work left: under load, more trials may have begun
    assert wait_until(lambda: not ray_daemon_pids() - before_pids, timeout=30), "Ray outlived it"

    out = app.run(
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.max_concurrent=1",
        "steps=3",
        "step_s=1.0",
        *hint.split(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    after = app.trial_reports()
    assert sorted(after) == [0, 1, 2, 3, 4, 5]
    for job in finished:  # a finished trial is not run again
        assert after[job] == before[job]
    assert {r["state"] for r in app.table()} == {"completed"}


def test_bad_sweeper_keys_and_params_are_refused_in_one_line_before_anything_starts(tmp_path):
    app = SweepApp(tmp_path / "app")
    for override, line in [
        ("hydra.sweeper.n_trials=0", "rayflow: error: hydra.sweeper.n_trials: "),
        ("hydra.sweeper.direction=up", "rayflow: error: hydra.sweeper.direction: "),
        (
            "x=tag(log, interval(0, 1))",
            "rayflow: error: hydra.sweeper.params.x: loguniform lower must be > 0",
        ),
        ("hydra.sweeper.scheduler=ashaa", "rayflow: error: hydra.sweeper.scheduler"),
        ("hydra.sweeper.scheduler=pbt", "rayflow: error: hydra.sweeper.scheduler: pbt restarts"),
        (
            "hydra.sweeper.max_worker_nodes=2",
            "rayflow: error: hydra.sweeper.max_worker_nodes: not a key of backend=local",
        ),
    ]:
        out = app.run(override, timeout=120)
        assert out.returncode == 1 and line in out.stderr, (override, out.stderr[-2000:])
        assert "Traceback" not in out.stderr and "starting" not in out.stdout + out.stderr
        assert not (app.sweep_dir / "search").exists()


PLAIN_APP = """
import hydra
import rayflow

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    for step in range(3):
        rayflow.report(loss=1.0 / (step + 1))

main()
"""


def test_rayflow_report_does_nothing_in_a_plain_run_and_warns_once_under_another_sweeper(tmp_path):
    (tmp_path / "app.py").write_text(PLAIN_APP)
    env = dict(os.environ)

    def run(*overrides):
        return subprocess.run(
            [sys.executable, "app.py", *overrides],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    plain = run()
    assert plain.returncode == 0 and "rayflow.report" not in plain.stderr, plain.stderr
    basic = run("-m", "+a=1,2")  # Hydra's basic sweeper: two jobs, three reports each
    assert basic.returncode == 0, basic.stderr
    assert basic.stderr.count("rayflow.report does nothing under this sweeper") == 1, basic.stderr
