"""storage_path on an object store (issue 33), against a real S3-compatible server on loopback
(moto, scripts/servers/s3.py) with credentials it checks, through the standard AWS settings
only: nothing inside rayflow, pyarrow or Ray is patched.

A store that cannot be used is one line naming storage_path before anything starts, with no
secret in it; a local run (the one scripts/bench.py object-storage makes on the store) keeps its
whole experiment there: Tune's state, every checkpoint, rayflow's state and plots; `resume=true`
finds the latest experiment there. Separate machines, a resume on a new cluster, the MLflow tags
naming the store and a lost node: tests/test_vm_ssh.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.servers.s3 import S3Server


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


BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


@pytest.mark.no_store
def test_a_run_keeps_its_whole_experiment_in_the_bucket_and_resume_finds_it_there(rayflow, s3):
    """scripts/bench.py object-storage in its smoke form (so it does not rot), against this
    store: its two cifar runs, one with a folder, one on s3://, as a user runs them; the second's
    experiment is all in the bucket, and nothing of it in a folder."""
    env = {**rayflow.env, **s3.env()}
    out = subprocess.run(
        [sys.executable, str(BENCH), "object-storage", "--smoke", f"--store={s3.uri('bench')}"],
        cwd=rayflow.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["name"] == "object-storage" and result["smoke"] is True
    assert result["store"] == "given" and result["ratio"] > 0 and result["trials"] == 2, result

    # (pyarrow marks each folder with an empty object named after it: `bench/`, ...)
    [experiment] = {k.split("/")[1] for k in s3.objects("bench/")} - {""}
    where = s3.uri(f"bench/{experiment}")
    assert f"experiment: {where}   (continue it with resume={where})" in out.stderr
    keys = [k for k in s3.objects(f"bench/{experiment}/") if not k.endswith("/")]
    names = {k.split("/", 2)[2] for k in keys}
    # Tune's state, rayflow's, the plots, and each trial's checkpoint and results
    assert {"rayflow.json", "tuner.pkl", "plots/learning_curves.png"} <= names, names
    assert any(n.startswith("experiment_state-") for n in names)
    checkpoints = {k.rsplit("/", 1)[0] for k in keys if "/checkpoint_00000" in k}
    assert len(checkpoints) == 2, checkpoints  # 2 trials x 1 epoch
    assert sum(k.endswith("/result.json") for k in keys) == 2
    assert not any(k.endswith(".rayflow.lock") for k in keys)  # its lease went with its run

    # resume=true looks for the latest experiment of the workload in the bucket: this one, run
    # from the benchmark's own folder, is named as another folder's and passed over from here;
    # resume=PATH takes it
    from rayflow.errors import ConfigError
    from rayflow.orchestrator.compose import compose_config
    from rayflow.results.experiment import locate
    from rayflow.runtime.environment import scoped_env

    with scoped_env(s3.env()):
        with pytest.raises(ConfigError) as refused:
            locate(compose_config(f"storage_path={s3.uri('bench')}", "resume=true"))
        assert f"passed over 1 of other folders: {experiment} (" in str(refused.value)
        found = locate(compose_config(f"storage_path={s3.uri('bench')}", f"resume={where}"))
    assert found.location == where and found.remote
