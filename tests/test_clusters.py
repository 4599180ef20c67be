"""`rayflow status`, `down` and `logs` without a cluster: what a user sees of an empty registry,
of a name rayflow did not keep, and of a kept cluster that went away behind rayflow's back (shown
gone once, then forgotten; its last job's log still read from MLflow). The commands on live
clusters are tested where each backend's cluster is: test_vm.py (fake_multinode), test_vm_ssh.py
(SSH hosts), test_kuberay.py (the emulator), test_spark.py (a notebook kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rayflow.backends import kept


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A registry of the test's own ($XDG_CACHE_HOME), for this process and its commands."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    return folder


def command(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=dict(os.environ),
    )


def test_an_empty_registry_and_a_name_rayflow_did_not_keep(cache):
    out = command("status")
    assert out.returncode == 0 and out.stdout.strip() == "no kept clusters", out.stderr
    assert json.loads(command("status", "--json").stdout) == []
    for args, verb in ((("down", "nope"), "down"), (("logs", "nope"), "logs")):
        out = command(*args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines() == [
            f"rayflow: error: rayflow {verb}: no kept cluster named 'nope' "
            "(`rayflow status` lists them)"
        ]
    out = command("down")  # neither a name nor --all
    assert out.returncode == 2 and "one of the arguments name --all is required" in out.stderr


def test_the_python_calls_say_the_same(cache):
    import rayflow
    from rayflow.errors import ConfigError

    assert rayflow.clusters() == []
    with pytest.raises(ConfigError) as refused:
        rayflow.down("nope")
    assert refused.value.key == "rayflow down" and "no kept cluster named 'nope'" in str(
        refused.value
    )


def test_a_cluster_gone_behind_rayflows_back_is_shown_gone_once_and_its_last_log_stays(
    cache, tmp_path
):
    """A kept fake_multinode cluster whose processes are gone (its autostop, a reboot): `status`
    says so once and forgets it; `logs` still prints its last job's log from MLflow, masked."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("kept"))
    client.log_text(run.info.run_id, "the job ran\npassword=hunter2-PLANTED\n", "job/driver.log")
    kept.keep(
        kept.KeptCluster(
            backend="vm",
            name="rf-gone",
            owner_run="0123abcd",
            section={"name": "vm", "provider": "fake_multinode"},
            started_at=time.time() - 90,
            where={"provider": "fake_multinode", "temp_dir": str(tmp_path / "rf-vm-gone")},
            last_job={"job_id": "raysubmit_1", "tracking_uri": uri, "run_id": run.info.run_id},
        )
    )
    first = json.loads(command("status", "--json").stdout)
    assert [(r["name"], r["state"]) for r in first] == [("rf-gone", "gone")]
    assert command("status").stdout.strip() == "no kept clusters"
    out = command("logs", "rf-gone")
    assert out.returncode == 0, out.stderr
    assert "the job ran" in out.stdout and "hunter2-PLANTED" not in out.stdout
    out = command("logs", "rf-gone", "raysubmit_0")
    assert out.returncode == 2 and "only its last job's log (raysubmit_1) was kept" in out.stderr


def test_down_stops_nothing_by_a_record_that_names_what_rayflow_did_not_make(cache, tmp_path):
    """A record is this user's own file; what it names is checked all the same before anything
    is stopped by it: a folder that is not a fake cluster's temp dir stops no process. Not torn
    down: the record stays, and the one line says how to finish by hand."""
    theirs = tmp_path / "important"
    theirs.mkdir()
    kept.keep(
        kept.KeptCluster(
            backend="vm",
            name="rf-edited",
            owner_run="0123abcd",
            section={"name": "vm", "provider": "fake_multinode"},
            where={"provider": "fake_multinode", "temp_dir": str(theirs)},
        )
    )
    out = command("down", "rf-edited")
    record = cache / "rayflow" / "clusters" / "vm.rf-edited.json"
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"rayflow: error: vm cluster rf-edited: {theirs} is not a fake_multinode cluster's temp "
        "dir of yours (rf-vm-*): nothing stopped; rf-edited is not torn down, its record is "
        "kept: `rayflow down rf-edited` tries again, "
        f"`rm {record}` forgets it once you have stopped it by hand"
    ], out.stderr
    assert "torn down" not in out.stdout and theirs.is_dir() and record.is_file()


def test_down_all_takes_every_record_and_leaves_none(cache, tmp_path):
    for name in ("rf-one", "rf-two"):
        kept.keep(
            kept.KeptCluster(
                backend="vm",
                name=name,
                owner_run=f"{name}-run",
                section={"name": "vm", "provider": "fake_multinode"},
                where={"provider": "fake_multinode", "temp_dir": str(tmp_path / f"rf-vm-{name}")},
            )
        )
    out = command("down", "--all")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[rayflow] rf-one: torn down", "[rayflow] rf-two: torn down"]
    assert command("status").stdout.strip() == "no kept clusters"


@pytest.mark.parametrize(
    "minutes, said", [(1, "1 idle minute"), (2, "2 idle minutes"), (0.5, "0.5 idle minutes")]
)
def test_idle_minutes_read_as_english(minutes, said):
    from rayflow.backends.kept import idle_minutes

    assert idle_minutes(minutes) == said
