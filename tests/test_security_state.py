"""Issue 30, item 10: every value bounded in the schema, experiment folders made atomically and
locked while their run lasts, and tracking failures after a run started that cost one warning line.

The schema walk below is the class check: a key added to any model without an upper bound (a
number, a timeout) fails here, whoever adds it."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from rayflow.backends import REGISTRY as BACKENDS
from rayflow.backends import backend_keys
from rayflow.launcher.keys import JobResources, Launcher
from rayflow.reference.config import _section
from rayflow.schema.kinds import Kind
from rayflow.schema.root import Compute, Mlflow, NoTracking, Root
from rayflow.workloads import REGISTRY as WORKLOADS
from rayflow.workloads import workload_keys
from rayflow.workloads.presets.keys import Data

MODELS = {
    "": Root,
    "data": Data,
    "compute": Compute,
    "tracking": Mlflow,
    "tracking(none)": NoTracking,
    "hydra.launcher": Launcher,
    **{f"workload({name})": workload_keys(name) for name in WORKLOADS},
    **{f"backend({name})": backend_keys(name) for name in BACKENDS},
}
HUGE = (10**30, 1e300, math.inf, -math.inf, math.nan)
TIMEOUT = re.compile(r"(timeout|_s$|seconds|minutes|deadline|budget)")
# Free-form values in the vocabulary of the engine or of the user's code (a Spark conf, a search
# space, Tune's stop mapping, a manifest's overrides), checked by the engine's own rules: every
# other key's kind has bounds.
FREE_FORM = {
    "a mapping",
    "a mapping, or null",
    "a list, or null",
    "a name or a mapping with `name` and parameters, or null",
}


def _leaves(model: type[BaseModel], prefix: str):
    """(dotted key, field) of every key that is not a nested section, nested sections walked."""
    for name, field in model.model_fields.items():
        nested = _section(field.annotation)
        if nested is not None:
            yield from _leaves(nested, f"{prefix}.{name}")
        elif not any(isinstance(m, Kind) and m.words in FREE_FORM for m in field.metadata):
            yield f"{prefix}.{name}".lstrip("."), field


def _adapter(field) -> TypeAdapter:
    return TypeAdapter(Annotated[(field.annotation, *field.metadata)])


def _accepts(adapter: TypeAdapter, value: Any) -> Any:
    try:
        return True, adapter.validate_python(value, context={"cfg": {}, "local_paths": False})
    except (ValidationError, ValueError, TypeError):
        return False, None


def _numeric_probes(adapter: TypeAdapter) -> list[Any]:
    """What the key accepts of the probes that are numbers (or lists or mappings of numbers):
    each kind that takes one is a numeric key, and its huge counterparts must be refused."""
    shapes = []
    for probe, shape in (
        (1, lambda v: v),
        (0, lambda v: v),
        (0.5, lambda v: v),
        (2, lambda v: v),
        ([1], lambda v: [v]),
        ({"x": 1}, lambda v: {"x": v}),
    ):
        ok, out = _accepts(adapter, probe)
        numbers = (
            out
            if isinstance(out, (int, float))
            else (
                out[0]
                if isinstance(out, list) and out
                else next(iter(out.values()), None)
                if isinstance(out, dict)
                else None
            )
        )
        if ok and isinstance(numbers, (int, float)) and not isinstance(numbers, bool):
            shapes.append(shape)
    return shapes


def test_every_number_in_the_schema_has_an_upper_bound():
    """Every key that takes a number (alone, in a list, as a mapping's values) refuses 10**30,
    1e300, infinities and NaN: no number reaches a C timeout (OverflowError), an allocation or a
    wait unbounded. Plain `int`/`float` annotations (no kind, so no bound) are refused too."""
    unbounded, numeric = [], 0
    for where, model in MODELS.items():
        for key, field in _leaves(model, where):
            assert field.annotation not in (int, float), (
                f"{key}: a plain {field.annotation.__name__}, use a kind with a bound"
            )
            adapter = _adapter(field)
            shapes = _numeric_probes(adapter)
            numeric += bool(shapes)
            for shape in shapes:
                for value in HUGE:
                    if _accepts(adapter, shape(value))[0]:
                        unbounded.append(f"{key}={shape(value)!r}")
    # the walk found the numeric keys (a probe that stopped matching would pass vacuously)
    assert numeric > 60
    assert not unbounded, unbounded


def test_every_timeout_is_positive_finite_and_bounded():
    """Every timeout, deadline and time budget: finite, and a value beyond a year is refused."""
    found = []
    for where, model in MODELS.items():
        for key, field in _leaves(model, where):
            if not TIMEOUT.search(key.rsplit(".", 1)[-1]):
                continue
            adapter = _adapter(field)
            if not _numeric_probes(adapter):
                continue
            found.append(key)
            for value in (10**8, 1e300, math.inf, math.nan, -1):
                assert not _accepts(adapter, value)[0], f"{key}={value}"
    assert {
        "schedule_timeout_s",
        "data.timeout_s",
        "tracking.timeout_s",
        "backend(attach).connect_timeout_s",
        "workload(tune).time_budget_s",
    } <= set(found), found


def test_the_launcher_bounds_its_custom_resources():
    with pytest.raises(ValidationError, match="at most"):
        JobResources.model_validate({"custom": {"x": 1e300}})
    with pytest.raises(ValidationError, match="must be a number"):
        JobResources.model_validate({"custom": {"x": math.inf}})


# -- experiment folders: made atomically, locked while their run lasts, resumed only when free --


def _cfg(tmp_path, *overrides: str):
    from rayflow.orchestrator.compose import compose_config

    return compose_config(f"storage_path={tmp_path / 'results'}", "tracking=none", *overrides)


def _experiment(tmp_path, name: str, workload: str = "cifar"):
    import json

    from rayflow.results.experiment import STATE_FILE
    from rayflow.results.signing import sign_folder

    path = tmp_path / "results" / name
    path.mkdir(parents=True)
    (path / STATE_FILE).write_text(json.dumps({"config": {"workload": {"name": workload}}}))
    sign_folder(str(path), workload)  # as its run signs it: this user's own experiment
    return path


def _held(path):
    """The experiment's lock, as a run in another process holds it (flock: per open file)."""
    from filelock import FileLock

    from rayflow.results.experiment import LOCK_FILE

    lock = FileLock(str(path / LOCK_FILE))
    lock.acquire(timeout=0)
    return lock


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path):
    """Eight runs claim the same experiment_name at once: eight folders, each made by os.mkdir
    (no exist_ok), the later ones suffixed; a folder its run left empty goes again."""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import ExitStack
    from threading import Barrier

    from rayflow.results.experiment import claimed_experiment

    cfg = _cfg(tmp_path, "experiment_name=same-second")
    barrier, stack = Barrier(8), ExitStack()

    def claim(_):
        barrier.wait()
        return stack.enter_context(claimed_experiment(cfg)).dir

    with stack:
        with ThreadPoolExecutor(8) as pool:
            paths = list(pool.map(claim, range(8)))
        assert len(set(paths)) == 8 and all(p.is_dir() for p in paths)
        assert {p.name for p in paths} == {
            "same-second",
            *(f"same-second-{n}" for n in range(1, 8)),
        }
    assert not (tmp_path / "results" / "same-second").exists()  # nothing was written in them


def test_resume_of_a_running_experiment_is_refused_naming_resume(tmp_path):
    from rayflow.errors import ConfigError
    from rayflow.results.experiment import experiment_dir

    path = _experiment(tmp_path, "cifar-running")
    lock = _held(path)
    with pytest.raises(ConfigError) as err:
        experiment_dir(_cfg(tmp_path, f"resume={path}"))
    assert err.value.key == "resume" and "is running now" in str(err.value)
    lock.release()
    # its run ended: resumable again
    assert experiment_dir(_cfg(tmp_path, f"resume={path}")) == path


def test_resume_true_passes_running_experiments_by(tmp_path):
    import os

    from rayflow.errors import ConfigError
    from rayflow.results.experiment import STATE_FILE, experiment_dir

    older, newer = _experiment(tmp_path, "cifar-older"), _experiment(tmp_path, "cifar-newer")
    os.utime(older / STATE_FILE, (1, 1))
    lock = _held(newer)
    assert experiment_dir(_cfg(tmp_path, "resume=true")) == older
    other = _held(older)
    with pytest.raises(ConfigError, match="is running now"):
        experiment_dir(_cfg(tmp_path, "resume=true"))
    lock.release(), other.release()


def test_resume_of_another_workloads_experiment_is_refused_naming_resume(tmp_path):
    from rayflow.errors import ConfigError
    from rayflow.results.experiment import experiment_dir

    path = _experiment(tmp_path, "ddp-run", workload="ddp")
    with pytest.raises(ConfigError) as err:
        experiment_dir(_cfg(tmp_path, f"resume={path}"))
    assert err.value.key == "resume" and "workload=ddp" in str(err.value)
    # resume=true looks at this workload's experiments only, whatever their folder is called
    _experiment(tmp_path, "cifar-but-ddp", workload="ddp")
    with pytest.raises(ConfigError, match="no cifar experiment"):
        experiment_dir(_cfg(tmp_path, "resume=true"))


def test_the_cli_refuses_to_resume_a_running_experiment_in_one_line(tmp_path, data_root):
    """What a user sees: one line naming `resume`, exit 2, nothing started (no Ray, no store)."""
    from rayflow.testing.processes import ray_daemon_pids
    from tests.harness.cli import Rayflow

    runner = Rayflow(tmp_path, data_root)
    path = _experiment(tmp_path, "cifar-busy")  # tmp_path / results: not the runner's storage
    lock = _held(path)
    before = ray_daemon_pids()
    try:
        out = runner.run(f"resume={path}", timeout=120)
    finally:
        lock.release()
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"rayflow: error: resume: {path} is running now"), line
    assert ray_daemon_pids() == before and not runner.db.exists()


# -- a tracking store that goes away after the run started: one warning, the outcome stands --

KILLS_THE_SERVER = """
import os, signal, time
from ray import tune


def objective(config):
    for step in range(3):
        if step == 1:  # the run's tracking has started (its parent run, this trial's run): the server goes
            try:
                os.killpg(int(config["server_pgid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(1)
        tune.report({"loss": 1.0 / (step + 1)})
"""


@pytest.fixture
def doomed_mlflow_server(tmp_path):
    """A real `mlflow server` on a free loopback port, in a process group of its own (its
    workers go with it): yields (URI, process group id)."""
    from scripts.servers.mlflow import mlflow_server

    with mlflow_server(tmp_path / "mlflow-server") as served:
        yield served


def test_a_tracking_server_stopped_mid_run_is_one_warning_and_the_outcome_stands(
    rayflow, doomed_mlflow_server
):
    """The MLflow server dies while the trial runs (after the parent run and the trial's run were
    made): the run still ends as it would, exit 0 with its results table, and the failure is one
    warning line per writer (`rayflow: warning: MLflow ...`), no traceback."""
    uri, pgid = doomed_mlflow_server
    (rayflow.workdir / "kills_server.py").write_text(KILLS_THE_SERVER)
    rayflow.env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "1"  # the default 3 only waits longer
    out = rayflow.run(
        "workload=tune",
        "workload.trainable=kills_server:objective",
        "workload.metric=loss",
        "workload.mode=min",
        f"workload.config={{server_pgid: {pgid}}}",
        "backend.num_cpus=1",
        f"tracking.uri={uri}",
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "== rayflow results ==" in out.stdout and "trials: 1 (0 errored)" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-4000:]
    warnings = [
        line for line in out.stderr.splitlines() if line.startswith("rayflow: warning: MLflow ")
    ]
    assert warnings, out.stderr[-3000:]
    # one for the trials' writer, one for the parent run: each gives up after its first failure
    assert (
        len(warnings) <= 2
        and any("trial runs" in w for w in warnings)
        and any("the run goes on" in w for w in warnings)
    ), warnings


def test_a_tracker_whose_store_went_away_warns_once_and_raises_nothing(monkeypatch, capsys):
    """Every call after the start: one warning line for the first failure, the rest skipped
    (each would wait out MLflow's retries again); a bug in a call is no tracking failure."""
    from omegaconf import OmegaConf

    from rayflow.tracking.tracker import Tracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    tracker = Tracker(
        OmegaConf.create(
            {"tracking": {"enabled": True, "uri": "http://user:pw@127.0.0.1:1", "experiment": "x"}}
        )
    )
    tracker.run_id = "0" * 32  # as start() leaves it
    tracker.set_tags({"device": "cpu"})
    tracker.log_metrics({"best_loss": 0.5})
    tracker.end("FINISHED")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "rayflow: warning: MLflow tags (the run goes on"
    ), lines
    assert "pw@" not in lines[0] and tracker.failed
    bug = Tracker(
        OmegaConf.create(
            {"tracking": {"enabled": True, "uri": "sqlite:///x.db", "experiment": "x"}}
        )
    )
    bug.run_id, bug._client = "0" * 32, object()
    with pytest.raises(ZeroDivisionError):  # not the store's failure: a bug keeps its traceback
        bug.write("x", lambda client, run_id: 1 / 0)
