"""Issue 47, item 3: the Plan is the run's only input. A resume's experiment is located and its state
read once, by the preflight (each a network call on an object store); the run takes both from the
Plan. What the run may read again is what another run changed meanwhile. Nothing here starts Ray:
the run path is followed up to the cluster's start, which a stand-in refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayflow.results import experiment as experiment_module
from rayflow.results import storage
from rayflow.results.experiment import STATE_FILE


def objective(config):  # the resumed experiment's trainable; never called here
    return None


WORKLOAD = [
    "workload=tune",
    f"workload.trainable={__name__}:objective",
    "workload.metric=loss",
    "workload.mode=min",
    "workload.search_space={lr: {loguniform: [1e-3, 1e-1]}}",
]


@pytest.fixture(autouse=True)
def user(tmp_path, monkeypatch):
    """This test's user: a key of their own (their cache), a project folder of their own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)


@pytest.fixture(scope="module")
def s3():
    from scripts.servers.s3 import S3Server

    with S3Server(bucket="rayflow-plan") as server:
        yield server


def _saved(where: str, workload: str = "tune", **extra) -> str:
    """An experiment as a run of WORKLOAD leaves it (a folder, or under an object store): its
    state, signed as `workload`'s."""
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.resume import resumed_keys
    from rayflow.results.signing import sign_folder
    from rayflow.schema.values import to_container

    cfg = compose_config(*WORKLOAD)
    state = {
        "mlflow_run_id": None,
        "choices": {"workload": "tune"},
        "config": {k: to_container(cfg)[k] for k in resumed_keys(cfg)},
        **extra,
    }
    _write_state(where, state)
    sign_folder(where, workload)
    return where


def _write_state(where: str, state: dict) -> None:
    if storage.is_uri(where):
        storage.write_text(storage.join(where, STATE_FILE), json.dumps(state))
        return
    Path(where).mkdir(parents=True, exist_ok=True)
    (Path(where) / STATE_FILE).write_text(json.dumps(state))


def _folder(tmp_path) -> str:
    return str(tmp_path / "results" / "tune-1")


class Counted:
    """How often the experiment was looked up (whether a run holds it: every locate asks) and
    its state file read (at the store's door, whichever module asks)."""

    def __init__(self, monkeypatch):
        self.lookups = self.state_reads = 0
        is_running, read_capped = experiment_module.is_running, storage.read_capped

        def counted_is_running(*args, **kwargs):
            self.lookups += 1
            return is_running(*args, **kwargs)

        def counted_read(uri, *args, **kwargs):
            self.state_reads += str(uri).endswith("/" + STATE_FILE)
            return read_capped(uri, *args, **kwargs)

        monkeypatch.setattr(experiment_module, "is_running", counted_is_running)
        monkeypatch.setattr(storage, "read_capped", counted_read)


class ClusterStart(Exception):
    """Where the stand-in cluster stops the run: what came before ran as in a real one."""


class NoCluster:
    spec = ""

    def acquire(self):
        raise ClusterStart


def _plan(where: str, *overrides: str):
    from rayflow.orchestrator.preflight import preflight

    [plan] = preflight([f"resume={where}", "backend.num_cpus=1", *overrides])
    return plan


@pytest.mark.parametrize("tracking", ["tracking=none", "tracking.uri=sqlite:///mlflow.db"])
def test_a_resume_locates_its_experiment_and_reads_its_state_once(tmp_path, monkeypatch, tracking):
    """Composing the resume, checking it (its MLflow parent run included), holding the folder and
    starting the run: one look-up and one read of its state, the Plan carrying both."""
    from rayflow.orchestrator.session import run_job

    where = _saved(_folder(tmp_path), note="from the first run")
    counted = Counted(monkeypatch)
    plan = _plan(where, tracking)
    assert plan.resumed is not None and plan.resumed.experiment.location == where
    assert plan.resumed.state["note"] == "from the first run"
    assert (counted.lookups, counted.state_reads) == (1, 1)
    with pytest.raises(ClusterStart):
        run_job(plan, NoCluster())
    assert (counted.lookups, counted.state_reads) == (1, 1)


def test_on_an_object_store_the_state_is_one_request(tmp_path, monkeypatch, s3):
    """The same on a store, where each is a request: the state read once; whether a run holds
    the experiment asked again as the run takes its lease (a store has no lock to take at once,
    and a sweep's later job may start hours after the preflight)."""
    from rayflow.orchestrator.session import run_job

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    where = _saved(s3.uri(f"{tmp_path.name}/tune-1"), note="from the first run")
    counted = Counted(monkeypatch)
    plan = _plan(where, "tracking=none")
    assert plan.resumed is not None and plan.resumed.state["note"] == "from the first run"
    assert (counted.lookups, counted.state_reads) == (1, 1)
    with pytest.raises(ClusterStart):
        run_job(plan, NoCluster())
    assert (counted.lookups, counted.state_reads) == (2, 1)


def test_a_new_experiment_is_neither_looked_up_nor_read(tmp_path, monkeypatch):
    from rayflow.orchestrator.preflight import preflight
    from rayflow.orchestrator.session import run_job

    counted = Counted(monkeypatch)
    [plan] = preflight([*WORKLOAD, "tracking=none", f"storage_path={tmp_path / 'results'}"])
    assert plan.resumed is None
    with pytest.raises(ClusterStart):
        run_job(plan, NoCluster())
    assert (counted.lookups, counted.state_reads) == (0, 0)


def test_a_state_another_run_changed_since_the_plan_is_read_again(tmp_path, monkeypatch):
    """Between the preflight and the run holding the folder, another run went on with it (an
    earlier job of a sweep): the run goes on from that run's state, not the preflight's."""
    from rayflow.results.experiment import claimed_experiment, held_state
    from rayflow.results.signing import sign_folder

    where = _saved(_folder(tmp_path))
    plan = _plan(where, "tracking=none")
    assert plan.resumed is not None
    state = json.loads((tmp_path / "results" / "tune-1" / STATE_FILE).read_text())
    (tmp_path / "results" / "tune-1" / STATE_FILE).write_text(
        json.dumps({**state, "train_run_id": "the-other-runs"})
    )
    sign_folder(where, "tune")  # as that run signed what it wrote
    counted = Counted(monkeypatch)
    with claimed_experiment(plan.cfg, plan.resumed.experiment):
        assert held_state(plan.resumed)["train_run_id"] == "the-other-runs"
    assert counted.state_reads == 1
    assert "train_run_id" not in plan.resumed.state  # what the preflight read stays as it was


def test_an_experiment_signed_as_another_workloads_is_refused_naming_it(tmp_path):
    """Its state says tune, its signature train: the job the state composes is refused, as before
    the experiment was located once."""
    from rayflow.errors import ConfigError

    where = _saved(_folder(tmp_path), workload="train")
    with pytest.raises(ConfigError) as err:
        _plan(where, "tracking=none")
    assert err.value.key == "resume"
    assert str(err.value) == (
        f"resume: {where} is an experiment of workload train, not tune; resume it with "
        "workload=train"
    )
