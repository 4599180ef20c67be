"""The resume command rayflow prints, run verbatim, continues the experiment: for a Tune function,
a Train loop and an RLlib algorithm of the user's (each failing on purpose on its first run, from
a project folder outside the repository, as examples/ projects run; the CIFAR preset cut by
Ctrl-C is tests/test_tune_run.py's interrupted run, resumed by the command it printed). One instruction is printed, rayflow's; a trainable that saves no checkpoint is said to
restart its unfinished trials from the start. A resume that would change what the trials run is
refused in one line naming the key."""

from __future__ import annotations

import subprocess

import pytest

from tests.harness.cli import printed_resume

# The dashboard is not what these tests are about: their local runs start Ray without it
# (tests/harness/cli.py WITHOUT_DASHBOARD); the default is what test_quiet, test_secrets, the
# first-hour tests and the others run.
pytestmark = pytest.mark.no_dashboard

# The user's project: each entry point fails while FAIL (a file next to it) exists.
FLAKY = """
from pathlib import Path

FAIL = Path({marker!r})


def objective(config):
    from ray import tune

    if FAIL.exists():
        raise RuntimeError("failing on purpose")
    for i in range(2):
        tune.report({{"loss": config["lr"] / (i + 1)}})


def train_loop(config):
    from ray import train

    if FAIL.exists():
        raise RuntimeError("failing on purpose")
    train.report({{"loss": 1.0}})


try:
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv
except ImportError:  # only the RLlib test's env needs it
    CartPoleEnv = object


class FlakyCartPole(CartPoleEnv):
    def __init__(self, config=None):
        if FAIL.exists():
            raise RuntimeError("failing on purpose")
        super().__init__()
"""

TUNE = [
    "workload=tune",
    "workload.trainable=flaky:objective",
    "workload.metric=loss",
    "workload.mode=min",
    "workload.search_space={lr: {loguniform: [1e-3, 1e-1]}}",
    "backend.num_cpus=1",
]
TRAIN = [
    "workload=train",
    "workload.train_loop=flaky:train_loop",
    "workload.num_workers=1",
    "backend.num_cpus=1",
]
RLLIB = [
    "workload=rllib",
    "workload.algorithm=PPO",
    "workload.env=flaky:FlakyCartPole",
    "workload.config={env_runners: {num_env_runners: 0}, "
    "training: {train_batch_size_per_learner: 64, minibatch_size: 32, num_epochs: 1}}",
    "workload.stop={training_iteration: 1}",
    "workload.checkpoint_every=1",
    "backend.num_cpus=1",
]
# the whole command: it carries what a resume takes from its command line only (backend.num_cpus)
NO_CHECKPOINT = "saved no checkpoint"


def _project(rayflow):
    marker = rayflow.workdir / "FAIL"
    marker.touch()
    (rayflow.workdir / "flaky.py").write_text(FLAKY.format(marker=str(marker)))
    return marker


def _fails_then_resumes(rayflow, args: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    marker = _project(rayflow)
    first = rayflow.run(*args, timeout=400)
    assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-3000:]
    command = printed_resume(first.stdout + first.stderr)
    marker.unlink()  # the user fixed their code
    out = rayflow.run_verbatim(command)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    # A traceback of rayflow's or the user's own starts a line; one a Ray actor logs about its
    # own retries (a TrainController's timed-out resource request under load) is prefixed with
    # "(ActorName pid=N)" and is Ray's to print.
    ours = [line for line in out.stderr.splitlines() if line.startswith("Traceback")]
    assert not ours and "Continue with" not in out.stderr + out.stdout, out.stderr[-3000:]
    return out, command


def test_the_printed_resume_of_a_tune_function_runs_verbatim(rayflow):
    out, command = _fails_then_resumes(rayflow, TUNE)
    assert "== rayflow results ==" in out.stdout and "best loss" in out.stdout, out.stdout[-2000:]
    # the function saves no checkpoint: its errored trial runs again from the start, and says so
    [line] = [line for line in out.stdout.splitlines() if NO_CHECKPOINT in line]
    assert "1 unfinished trial(s)" in line and "restart from the start" in line, line
    client, parents, children = rayflow.mlflow("tune")
    [parent] = parents  # the same parent run, continued
    assert parent.info.status == "FINISHED" and parent.data.tags.get("resumed") == "true"

    # what the trials run cannot change on resume: one line naming the key, nothing started
    refused = rayflow.run_verbatim(f"{command} workload.metric=accuracy")
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = refused.stderr.strip().splitlines()
    assert (
        line.startswith("rayflow: error: workload.metric: cannot change on resume: ")
        and "'loss'" in line
    ), line


def test_the_printed_resume_of_a_train_loop_runs_verbatim(rayflow):
    out, _ = _fails_then_resumes(rayflow, TRAIN)
    assert "== rayflow results (Ray Train) ==" in out.stdout, out.stdout[-2000:]


def test_the_printed_resume_of_an_rllib_algorithm_runs_verbatim(rayflow):
    out, _ = _fails_then_resumes(rayflow, RLLIB)
    assert "== rayflow results" in out.stdout, out.stdout[-2000:]


# -- what a resume composes, without Ray: the experiment's state as a run writes it --


def _saved_experiment(tmp_path, *overrides: str):
    import json

    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.resume import RESUMED_GROUPS, carried, group_choices, resumed_keys
    from rayflow.results.experiment import STATE_FILE
    from rayflow.results.signing import sign_folder
    from rayflow.schema.values import to_container
    from rayflow.security.redaction import redact

    cfg = compose_config(*overrides)
    path = tmp_path / "tune-1"
    path.mkdir()
    state = {
        "mlflow_run_id": None,
        "choices": {g: c for g, c in group_choices(list(overrides)).items() if g in RESUMED_GROUPS},
        "config": {k: to_container(cfg)[k] for k in resumed_keys(cfg)},
        "asks": carried(list(overrides))[1],  # the secrets its resume command leaves out
    }
    (path / STATE_FILE).write_text(json.dumps(redact(state)))
    sign_folder(str(path), str(cfg.workload.name))  # as its run signs it
    return path, to_container(cfg)


def test_a_resume_composes_the_experiments_workload_and_keys(tmp_path):
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.resume import resumed
    from rayflow.schema.values import to_container

    path, first = _saved_experiment(
        tmp_path,
        *TUNE[:-1],
        "workload.stop={training_iteration: 3}",
        "backend=attach",
        "backend.address=127.0.0.1:6379",
    )
    point, cfg = resumed(
        [f"resume={path}", "tracking=none"], compose_config(f"resume={path}", "tracking=none")
    )
    assert to_container(cfg.workload) == first["workload"]
    assert cfg.tracking.enabled is False  # the command line's own choice goes on top
    assert "workload=tune" in point and point[-1] == f"resume={path}"
    # the backend is this invocation's, never the experiment's (issue 43: a store's state does
    # not choose where the run goes or with which credentials)
    assert "backend=attach" not in point and cfg.backend.name == "local"


def test_a_resume_refuses_in_one_line_what_would_change_the_trials(tmp_path):
    import pytest

    from rayflow.errors import ConfigError
    from rayflow.orchestrator.preflight import preflight

    path, _ = _saved_experiment(tmp_path, *TUNE, "+backend.api_token=s3cr3t")
    for given, key in (
        (["workload.metric=accuracy"], "workload.metric"),
        (["workload=cifar"], "workload"),
        (["seed=7"], "seed"),
        (["+backend.api_token=s3cr3t", "workload.num_samples=4"], "workload.num_samples"),
    ):
        with pytest.raises(ConfigError) as err:
            preflight([f"resume={path}", *given])
        assert err.value.key == key and "cannot change on resume" in str(err.value), str(err.value)
    # the token was saved masked: it must come again, and the refusal says how
    with pytest.raises(ConfigError) as err:
        preflight([f"resume={path}"])
    assert err.value.key == "backend.api_token" and "+backend.api_token=..." in str(err.value)
    assert "s3cr3t" not in (path / "rayflow.json").read_text()
