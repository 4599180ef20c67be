"""The user's own code on backend=local: the three projects of examples/, copied to a folder
outside the repository and run from there as a user would, and a function defined in a
notebook-like `__main__` handed to rayflow.run. Each leaves an MLflow parent run with nested
runs and plots."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.examples import copy_example
from tests.harness.noise import noise

# The dashboard is not what these tests are about: their local runs start Ray without it
# (tests/harness/cli.py WITHOUT_DASHBOARD); the default is what test_quiet, test_secrets, the
# first-hour tests and the others run.
pytestmark = pytest.mark.no_dashboard


def project(rayflow, name: str):
    """The example's files in the test's work folder: the user's project, outside the repository."""
    return copy_example(name, rayflow.workdir)


def assert_quiet_with_a_log(rayflow, out, client, parent, checkpoints: int) -> None:
    """At the default verbosity the run printed none of Ray's and MLflow's own lines; its log in
    the experiment folder, and in the parent run, holds them: a line per checkpoint at least."""
    assert noise(out.stdout + out.stderr) == {}, out.stdout + out.stderr
    [log] = rayflow.storage.glob("*/rayflow.log")
    kept = noise(log.read_text())
    assert kept.get("checkpoint", 0) >= checkpoints, kept
    assert f"log: {log}   (and " in out.stdout
    assert "rayflow.log" in {a.path for a in client.list_artifacts(parent.info.run_id)}


PBT = [
    "workload=tune",
    "workload.trainable=train:objective",
    "workload.metric=loss",
    "workload.mode=min",
    "workload.search_space={lr: {loguniform: [1e-3, 1e-1]}, width: {choice: [16, 32]}}",
    "workload.scheduler={name: pbt, time_attr: training_iteration, perturbation_interval: 2, "
    "hyperparam_mutations: {lr: {loguniform: [1e-3, 1e-1]}}}",
    "workload.num_samples=2",
    "workload.stop={training_iteration: 4}",
    "backend.num_cpus=2",
]


def test_a_tune_function_under_pbt_runs_from_the_users_folder(rayflow):
    project(rayflow, "tune-pbt")
    out = rayflow.run(*PBT, timeout=400)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "== rayflow results ==" in out.stdout and "best loss" in out.stdout
    client, parents, children = rayflow.mlflow("tune")
    [parent] = parents
    assert_quiet_with_a_log(rayflow, out, client, parent, checkpoints=8)
    assert parent.info.status == "FINISHED" and parent.data.tags["workload"] == "tune"
    assert parent.data.params["workload.trainable"] == "train:objective"
    assert "best_loss" in parent.data.metrics
    trials = children[parent.info.run_id]
    assert len(trials) == 2
    for run in trials:
        assert run.info.status == "FINISHED" and {"lr", "width"} <= set(run.data.params)
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in history] == [1, 2, 3, 4]  # every report, by training_iteration
        assert "accuracy" in run.data.metrics  # what the user reports, not only the metric
    plots = rayflow.plots(client, parent)
    curves = plots["learning_curves.png"]
    assert (
        curves["lines"] == 2 and curves["metric"] == "loss" and curves["x"] == "training_iteration"
    )
    assert "lr" in plots["search.png"]["panels"]


def test_a_notebook_function_runs_through_rayflow_run(rayflow):
    """`objective` is defined in __main__ (a notebook cell): it reaches the trials pickled by value."""
    script = f"""
import json, rayflow
from ray import tune

def objective(config):
    for step in range(3):
        tune.report({{"score": config["x"] * (step + 1) + config["offset"]}})

result = rayflow.run("workload=tune", "backend.num_cpus=2", "backend.include_dashboard=false", "storage_path={rayflow.storage}", "workload.metric=score",
                     "workload.mode=max", trainable=objective, search_space={{"x": {{"grid_search": [1, 2]}}}},
                     config={{"offset": 10}})
rows = result.trials
print("RESULT", json.dumps({{"best": result.best_config, "metrics": result.best_metrics, "trials": len(rows),
                            "columns": sorted(rows.columns)}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=rayflow.workdir,
        env=rayflow.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    assert result["best"] == {"offset": 10, "x": 2} and result["metrics"]["score"] == 16
    assert result["trials"] == 2 and "score" in result["columns"]
    client, parents, children = rayflow.mlflow("tune")
    assert parents[0].data.params["workload.trainable"] == "__main__:objective"
    assert len(children[parents[0].info.run_id]) == 2


def test_a_train_loop_runs_from_the_users_folder(rayflow):
    project(rayflow, "train-loop")
    out = rayflow.run(
        "workload=train",
        "workload.train_loop=loop:train_loop",
        "workload.num_workers=2",
        "workload.train_loop_config={epochs: 2, lr: 0.01, batch_size: 512}",  # few all-reduces
        "backend.num_cpus=2",
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "== rayflow results (Ray Train) ==" in out.stdout
    client, parents, children = rayflow.mlflow("train")
    [parent] = parents
    assert_quiet_with_a_log(rayflow, out, client, parent, checkpoints=2)
    assert parent.info.status == "FINISHED" and parent.data.metrics["epochs_completed"] == 2
    [run] = children[parent.info.run_id]
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")] == [1, 2]
    training = rayflow.plots(client, parent)["training.png"]
    assert training["x"] == "epoch" and {"loss", "val_loss"} <= set(training["panels"])


@pytest.mark.slow
def test_dqn_reaches_150_on_cartpole_within_100k_env_steps(rayflow):
    """examples/rllib-dqn's command: an RLlib algorithm by its registry name, its config sections
    and a one-point grid from YAML, stopped by Tune's stop mapping over RLlib's nested results."""
    out = rayflow.run(
        "workload=rllib",
        "workload.algorithm=DQN",
        "workload.env=CartPole-v1",
        "workload.config={training: {n_step: 3, epsilon: [[0, 1.0], [10000, 0.02]]}}",
        "workload.stop={env_runners/episode_return_mean: 150, num_env_steps_sampled_lifetime: 100000}",
        "workload.grid={lr: [5e-4]}",
        "backend.num_cpus=2",
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "== rayflow results (RLlib DQN) ==" in out.stdout and "best lr: 0.0005" in out.stdout
    assert "goal 150: reached" in out.stdout, out.stdout[-2000:]
    client, parents, children = rayflow.mlflow("rllib")
    [parent] = parents
    assert parent.data.metrics["episode_return_mean"] >= 150
    assert parent.data.metrics["num_env_steps_sampled_lifetime"] <= 100_000
    [trial] = children[parent.info.run_id]
    assert trial.data.params["lr"] == "0.0005" and "episode_return_mean" in trial.data.metrics
    returns = rayflow.plots(client, parent)["returns.png"]
    assert returns["lines"] == 1 and returns["goal"] == 150
