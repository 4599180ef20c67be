"""Tune trainables as their authors wrote them: actors are reused only where it is safe, and the
results block counts as restarted only trials Tune restarted from a checkpoint."""

from __future__ import annotations

import json

import pytest
from ray.tune import Trainable
from ray.tune.utils.mock_trainable import MyTrainableClass

from rayflow.errors import ConfigError
from rayflow.results.records import trial_restarts
from rayflow.workloads.tune import reuse_actors


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
        _trial(tmp_path, "t4", "ERRORED", 1, checkpoint=True),  # its one failure ended it
        _trial(tmp_path, "t5", "ERRORED", 3, checkpoint=True),  # restarted twice, then ended
    ]
    (tmp_path / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps({"trial_data": entries})
    )
    assert trial_restarts(tmp_path) == (3, "RuntimeError: node lost")
