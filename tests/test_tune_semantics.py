"""Tune trainables as their authors wrote them: actors are reused only where it is safe, and the
results block counts as restarted only trials Tune restarted from a checkpoint; a metric no trial
reports ends the run in one line; the plot of a scheduler's trials names those that errored."""

from __future__ import annotations

import json

import pytest
from ray.tune import Trainable
from ray.tune.utils.mock_trainable import MyTrainableClass

from rayflow.errors import ConfigError
from rayflow.results.records import trial_restarts
from rayflow.workloads.tune import reuse_actors
from tests.harness.examples import copy_example


def objective(config):
    return {"loss": 1.0}


class Resets(Trainable):
    def step(self):
        return {"loss": 1.0}

    def reset_config(self, new_config):
        return True


class InheritsReset(Resets):
    """A user's class whose base (the user's own) implements reset_config."""


class NoReset(Trainable):
    def step(self):
        return {"loss": 1.0}


@pytest.mark.parametrize(
    "trainable, reuse",
    [
        (objective, True),
        (Resets, True),
        (InheritsReset, True),
        (NoReset, False),
        (MyTrainableClass, False),
    ],
    ids=["function", "class-resets", "inherits-reset", "class-no-reset", "ray-mock-trainable"],
)
def test_reuse_is_on_where_it_is_safe_by_default(trainable, reuse):
    assert reuse_actors(trainable, None) is reuse


@pytest.mark.parametrize("trainable", [NoReset, MyTrainableClass])
def test_asking_reuse_of_a_class_without_reset_config_is_refused(trainable):
    with pytest.raises(ConfigError) as caught:
        reuse_actors(trainable, True)
    assert caught.value.key == "workload.reuse_actors"
    assert "reset_config" in str(caught.value)


def test_reuse_asked_for_is_kept_where_it_is_safe():
    assert reuse_actors(Resets, True) and reuse_actors(objective, True)
    assert not reuse_actors(Resets, False) and not reuse_actors(objective, False)


def _trial(folder, name, status, failures, checkpoint):
    trial = {"trial_id": name, "status": status, "relative_logdir": name}
    (folder / name).mkdir()
    if checkpoint:
        (folder / name / "checkpoint_000000").mkdir()
    return [json.dumps(trial), json.dumps({"num_failures": str(failures)})]


def test_only_trials_restarted_from_a_checkpoint_count_as_restarted(tmp_path):
    (tmp_path / "t0").mkdir()
    (tmp_path / "t0" / "error.txt").write_text(
        "Failure # 1 (occurred at x)\nRuntimeError: node lost. Ray says more\n"
    )
    entries = [
        _trial(tmp_path, "t1", "TERMINATED", 1, checkpoint=True),  # restarted from its checkpoint
        _trial(tmp_path, "t2", "TERMINATED", 1, checkpoint=False),  # ran again from its start
        _trial(tmp_path, "t4", "ERROR", 1, checkpoint=True),  # its one failure ended it
        _trial(tmp_path, "t5", "ERROR", 3, checkpoint=True),  # restarted twice, then ended
    ]
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps({"trial_data": entries})
    )
    assert trial_restarts(tmp_path) == (3, "RuntimeError: node lost")


def test_the_hyperband_plot_title_counts_errored_trials_even_without_a_folder(tmp_path):
    """An errored trial is named in the plot's title, also one that errored before it wrote its
    folder (only Tune's state holds it, as when an actor could not be reused)."""
    from rayflow.results.plots.make import tune_figures

    for trial_id, status in [("h_00000", "TERMINATED"), ("h_00001", "ERROR")]:
        folder = tmp_path / f"MyTrainableClass_{trial_id}_0"
        folder.mkdir()
        (folder / "params.json").write_text("{}")
        row = {"trial_id": trial_id, "training_iteration": 1, "loss": 1.0}
        (folder / "result.json").write_text(json.dumps(row) + "\n")
    trials = [
        [json.dumps({"trial_id": t, "status": s, "relative_logdir": t}), "{}"]
        for t, s in [("h_00000", "TERMINATED"), ("h_00001", "ERROR"), ("h_00002", "ERROR")]
    ]
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps({"trial_data": trials})
    )
    figures = dict(tune_figures(tmp_path, "loss", "min", "training_iteration", 2, [], "HyperBand"))
    _, meta = figures["learning_curves.png"]()
    assert meta["state"] == "2 of 3 trials ERRORED" and "2 of 3 trials ERRORED" in meta["title"]


TINY = [
    "workload=tune",
    "workload.num_samples=2",
    "workload.stop={training_iteration: 2}",
    "tracking=none",
    "backend.num_cpus=2",
]


@pytest.mark.no_dashboard
def test_rays_mock_trainable_class_runs_every_trial_under_hyperband(rayflow):
    """Ray's own hyperband example's class, unchanged: it has no reset_config, so its trials run
    in a process each (Tune's default), and none is lost or said to be restarted."""
    out = rayflow.run(
        *TINY,
        "workload.trainable=ray.tune.utils.mock_trainable:MyTrainableClass",
        "workload.metric=episode_reward_mean",
        "workload.mode=max",
        "workload.scheduler=hyperband",
        "workload.search_space={width: {randint: [10, 100]}, height: {randint: [0, 100]}}",
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "trials: 2 (0 stopped early by HyperBand, 0 errored)" in out.stdout
    assert "restarted" not in out.stdout


@pytest.mark.no_dashboard
def test_a_metric_no_trial_reports_ends_the_run_in_one_line_with_the_keys_reported(rayflow):
    copy_example("tune-pbt", rayflow.workdir)
    out = rayflow.run(
        *TINY,
        "workload.trainable=train:objective",
        "workload.metric=los",
        "workload.mode=min",
        "workload.search_space={lr: {loguniform: [1e-3, 1e-1]}}",
        "workload.stop={training_iteration: 50}",
        timeout=300,
    )
    assert out.returncode == 1
    said = out.stdout + out.stderr
    assert "Traceback" not in said
    assert "== rayflow results ==" in out.stdout
    assert "no trial reported los (2 trials); they report: accuracy, epoch, loss" in out.stdout
    [error] = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert error.startswith(
        "rayflow: error: workload.metric: no trial reports 'los'; they report: accuracy, epoch, "
        "loss. Continue with: python -m rayflow resume="
    )
    # the run ended at the first results, not after 50 iterations
    assert "training_iteration=50" not in said


def test_the_keys_a_refused_result_held_are_read_as_text():
    """Tune's strict-metric error quotes the result: its keys, Tune's own counters and the config
    left out, are shown escaped (a trial's key is the trial's text)."""
    from rayflow.workloads.tune_runner import reported_instead

    said = (
        "Trial returned a result which did not include the specified metric(s) `los` that "
        "`tune.TuneConfig()` expects. Result: {'loss': 0.2, 'acc\x1b[2J': 1, "
        "'training_iteration': 1, 'config/lr': 0.1}"
    )
    assert reported_instead(ValueError(said)) == ("acc\\x1b[2J", "loss")
    assert reported_instead(ValueError("another error")) is None
