"""Common mistakes in a command line, caught before anything starts with the fix in the line:
a stop mapping's keys and values, a mistyped object-store URI, a key of another backend or
workload, a key mistyped (did you mean). Each is a class of cases: the listed ones (issue 44)
and variants beside them. In-process dry runs: composing and checking start nothing."""

from __future__ import annotations

import pytest

from rayflow.api import dry_run
from rayflow.errors import ConfigError

TRAIN = "def objective(config):\n    return {'loss': 1.0}\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's folder with a trainable, where the command runs (a user's code outside the
    package)."""
    (tmp_path / "mistakes_train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # what `python -m rayflow` from there imports
    return tmp_path


TUNE = [
    "workload=tune",
    "workload.trainable=mistakes_train:objective",
    "workload.metric=loss",
    "workload.mode=min",
]


def refusal(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        dry_run(*overrides)
    assert "\n" not in str(caught.value)
    return caught.value


STOPS = [
    # (stop, the key named, what the line says)
    ("{training_iteration: ten}", "workload.stop.training_iteration", "must be a number"),
    ("{training_iteration: -1}", "workload.stop.training_iteration", "must be > 0"),
    ("{time_total_s: 0}", "workload.stop.time_total_s", "must be > 0"),
    ("{training_iteration: 1e100}", "workload.stop.training_iteration", "at most"),
    (
        "{trainng_iteration: 5}",
        "workload.stop.trainng_iteration",
        "did you mean training_iteration?",
    ),
    ("{los: 0.1}", "workload.stop.los", "did you mean loss?"),
    ("{accuracy: 0.9}", "workload.stop.accuracy", "workload.reports"),
    ("{done: 1}", "workload.stop.done", "true or false"),
    ("{loss: [1]}", "workload.stop.loss", "must be a number"),
]


@pytest.mark.parametrize("stop, key, says", STOPS, ids=[s for s, _, _ in STOPS])
def test_a_stop_a_trial_never_reaches_is_refused_naming_its_key(project, stop, key, says):
    err = refusal(*TUNE, f"workload.stop={stop}")
    assert err.key == key and says in str(err)


@pytest.mark.parametrize(
    "extra",
    [
        ["workload.stop={training_iteration: 3, loss: 0.05}"],
        ["workload.stop={done: true}"],
        ["workload.stop={accuracy: 0.9}", "workload.reports=[accuracy]"],
        ["workload.stop={time_total_s: 30.5}"],
    ],
)
def test_a_stop_on_reported_keys_passes(project, extra):
    assert "auth_mode" in dry_run(*TUNE, *extra)


def test_a_train_sweep_and_rllib_stop_take_numbers_only(project):
    err = refusal(
        "workload=train",
        "workload.train_loop=mistakes_train:objective",
        "workload.sweep={metric: loss, mode: min, stop: {training_iteration: ten}}",
    )
    assert err.key == "workload.sweep.stop.training_iteration"
    err = refusal("workload=rllib", "workload.stop={env_runners/episode_return_mean: high}")
    assert err.key == "workload.stop.env_runners/episode_return_mean"


STORAGE = [
    ("s3:/bucket/runs", "did you mean s3://bucket/runs?"),
    ("s3:bucket/runs", "did you mean s3://bucket/runs?"),
    ("S3://bucket/runs", "did you mean s3://bucket/runs?"),
    ("s3//bucket/runs", "did you mean s3://bucket/runs?"),
    ("gs:/bucket/runs", "did you mean gs://bucket/runs?"),
    ("GCS://bucket/runs", "did you mean gcs://bucket/runs?"),
    ("file:///srv/runs", "give the folder itself, /srv/runs"),
    ("dbfs:/runs", "/dbfs/runs"),
    ("https://host/runs", "not an object store"),
]


@pytest.mark.parametrize("path, says", STORAGE, ids=[p for p, _ in STORAGE])
def test_a_mistyped_storage_uri_is_refused_with_the_fix(project, path, says):
    err = refusal(*TUNE, f"storage_path={path}")
    assert err.key == "storage_path" and says in str(err)
    assert not any(
        p.name.lower().startswith(("s3", "gs", "file", "dbfs")) for p in project.iterdir()
    )


def test_a_folder_with_a_colon_is_still_a_folder(project):
    assert "auth_mode" in dry_run(*TUNE, "storage_path=runs:2024")


MISTYPED = [
    (["workload.num_sample=3"], "workload.num_sample", "did you mean workload.num_samples?"),
    (["num_samples=3"], "num_samples", "did you mean workload.num_samples?"),
    (["tracking.urii=x"], "tracking.urii", "did you mean tracking.uri?"),
    (
        ["workload.resources_per_trial.cpus=2"],
        "workload.resources_per_trial.cpus",
        "did you mean workload.resources_per_trial.cpu?",
    ),
    (
        ["backend.keep_cluster=true"],
        "backend.keep_cluster",
        "not a key of backend=local; it is a key of backend=kuberay, backend=spark, backend=vm",
    ),
    (
        ["backend=spark", "backend.cluster_yaml=x.yaml"],
        "backend.cluster_yaml",
        "not a key of backend=spark; it is a key of backend=vm",
    ),
    (
        ["workload.grid={lr: [1]}"],
        "workload.grid",
        "not a key of workload=tune; it is a key of workload=rllib",
    ),
    (["backend.zzz=1"], "backend.zzz", "unknown key (backend has: dashboard_host"),
]


@pytest.mark.parametrize("extra, key, says", MISTYPED, ids=[" ".join(e) for e, _, _ in MISTYPED])
def test_an_unknown_key_is_named_with_where_it_exists(project, extra, key, says):
    err = refusal(*TUNE, *extra)
    assert err.key == key and says in str(err)
    assert "struct" not in str(err) and "Key '" not in str(err)  # rayflow's words, not OmegaConf's
