"""storage_path on an object store (issue 33), against a real S3-compatible server on loopback
(moto, tests/harness/s3_server.py) with credentials it checks, through the standard AWS settings
only: nothing inside rayflow, pyarrow or Ray is patched.

A store that cannot be used is one line naming storage_path before anything starts, with no
secret in it; a local run keeps its whole experiment there (Tune's state, every checkpoint,
rayflow's state and plots) and nothing in a local folder; `resume=true` finds the latest
experiment there. Separate machines, a resume on a new cluster and a lost node:
tests/test_vm_ssh.py.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.harness.s3_server import S3Server


@pytest.fixture(scope="module")
def s3():
    with S3Server(bucket="rayflow-storage") as server:
        yield server


def _refused(rayflow, s3, env: dict, *args: str):
    started = time.monotonic()
    rayflow.env = {**rayflow.env, **env}
    out = rayflow.run(*args, "tracking=none", base=False, timeout=120)
    took = time.monotonic() - started
    return out, took


@pytest.mark.no_store
@pytest.mark.parametrize(
    "case,expected",
    [
        ("endpoint", "cannot connect to the store (endpoint http://127.0.0.1:9)"),
        ("bucket", "the bucket does not exist"),
        ("credentials", "the store refused the credentials"),
    ],
)
def test_a_store_that_cannot_be_used_is_one_line_before_anything_starts(
    rayflow, s3, case, expected
):
    env, uri = dict(s3.env()), s3.uri("runs")
    if case == "endpoint":
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # nothing listens there
    elif case == "bucket":
        uri = "s3://no-such-bucket/runs"
    else:
        env["AWS_SECRET_ACCESS_KEY"] = "wrong-" + s3.secret_key[6:]
    out, took = _refused(rayflow, s3, env, f"storage_path={uri}")
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"rayflow: error: storage_path: {uri}: {expected}"), line
    assert "Traceback" not in out.stderr and "starting" not in out.stdout
    assert env["AWS_SECRET_ACCESS_KEY"] not in out.stdout + out.stderr
    assert took < 60
    assert not s3.objects("runs/")  # the probe's marker went again


@pytest.mark.no_dashboard
def test_a_run_keeps_its_whole_experiment_in_the_bucket_and_resume_finds_it_there(rayflow, s3):
    rayflow.env = {**rayflow.env, **s3.env()}
    store = s3.uri("local-run")
    args = (
        f"storage_path={store}",
        "workload.num_samples=2",
        "workload.max_epochs=2",
        "workload.scheduler.grace_period=2",
    )
    out = rayflow.run(*args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # (pyarrow marks each folder with an empty object named after it: `local-run/`, ...)
    [experiment] = {k.split("/")[1] for k in s3.objects("local-run/")} - {""}
    where = f"{store}/{experiment}"
    assert f"experiment: {where}   (continue it with resume={where})" in out.stdout
    keys = [k for k in s3.objects(f"local-run/{experiment}/") if not k.endswith("/")]
    names = {k.split("/", 2)[2] for k in keys}
    # Tune's state, rayflow's, the plots, and each trial's two checkpoints and results
    assert {"rayflow.json", "tuner.pkl", "plots/learning_curves.png"} <= names, names
    assert any(n.startswith("experiment_state-") for n in names)
    checkpoints = {k.rsplit("/", 1)[0] for k in keys if "/checkpoint_00000" in k}
    assert len(checkpoints) == 4, checkpoints
    assert sum(k.endswith("/result.json") for k in keys) == 2
    assert not any(k.endswith(".rayflow.lock") for k in keys)  # its lease went with its run
    assert not rayflow.storage.exists()  # nothing in the local default's place

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{rayflow.db}")
    runs = client.search_runs([client.get_experiment_by_name("cifar").experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.tags["experiment_dir"] == where
    assert parent.data.tags["best_checkpoint"].startswith(f"{where}/train_cifar_")
    state = json.loads(s3.read(f"local-run/{experiment}/rayflow.json"))
    assert state["mlflow_run_id"] == parent.info.run_id

    # resume=true looks for the latest experiment of the workload in the bucket: this one,
    # finished, so nothing is run again and the same parent run goes on
    again = rayflow.run(*args[:1], "resume=true")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"experiment: {where}" in again.stdout
    assert set(s3.objects(f"local-run/{experiment}/")) >= set(keys)
