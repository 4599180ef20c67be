"""ASHA tuning end to end on a real local Ray cluster, checked the way a user would look."""

from __future__ import annotations

import csv
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from rayflow.testing.processes import process_pids, ray_daemon_pids, wait_until
from tests.harness.cli import printed_resume
from tests.harness.noise import noise

# The dashboard is not what these tests are about: their local runs start Ray without it
# (tests/harness/cli.py WITHOUT_DASHBOARD); the default is what test_quiet, test_secrets, the
# first-hour tests and the others run.
pytestmark = pytest.mark.no_dashboard

SMALL = ["workload.num_samples=2", "workload.max_epochs=2", "backend.num_cpus=2"]


def test_asha_run_lands_in_mlflow_with_checkpoints(rayflow):
    secret = "s3cr3t-value-never-logged"
    out = rayflow.run(*SMALL, f"+tracking.api_token={secret}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "== rayflow results ==" in out.stdout and "trial-epochs used:" in out.stdout
    assert "mlflow ui --backend-store-uri sqlite:///" in out.stdout
    # the first trial's start-up (process, imports) is one line with its time, not silence
    waits = [
        line
        for line in out.stderr.splitlines()
        if "waiting for the first trial's first result" in line
    ]
    assert len(waits) == 1 and " done in " in waits[0] and "\r" not in out.stderr, waits

    client, parents, children = rayflow.mlflow("cifar")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    tags = parent.data.tags
    assert (
        tags["backend"] == "local" and tags["workload"] == "cifar" and tags["synthetic"] == "true"
    )
    assert (
        tags["device"] == "cpu" and tags["ray_version"].startswith("2.") and tags["torch_version"]
    )
    assert parent.data.params["workload.num_samples"] == "2"
    assert parent.data.params["tracking.api_token"] == "***"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"config.yaml", "cluster", "best_checkpoint"} <= artifacts
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "cluster")] == [
        "cluster/spec.yaml"
    ]
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "best_checkpoint")] == [
        "best_checkpoint/checkpoint.pt"
    ]
    config_text = Path(
        client.download_artifacts(parent.info.run_id, "config.yaml", str(rayflow.workdir))
    ).read_text()
    assert yaml.safe_load(config_text)["workload"]["max_epochs"] == 2
    assert "best_val_loss" in parent.data.metrics and "best_val_accuracy" in parent.data.metrics
    [experiment] = rayflow.experiments()
    assert (
        f"plots: {experiment / 'plots'}/ (learning_curves.png, search.png); MLflow: plots/"
        in out.stdout
    )
    plots = rayflow.plots(client, parent)
    assert set(plots) == {"learning_curves.png", "search.png"}
    curves = plots["learning_curves.png"]
    # ASHA's defaults: grace_period 1, reduction_factor 2, max_t = max_epochs = 2
    assert curves["lines"] == 2 and curves["rungs"] == [1, 2] and curves["metric"] == "val_loss"
    stopped = sum(r.data.tags.get("stopped_early") == "true" for r in children[parent.info.run_id])
    assert curves["stopped_early"] == stopped == parent.data.metrics["trials_stopped_early"]
    [best] = [r for r in children[parent.info.run_id] if r.data.tags["trial_id"] == curves["best"]]
    assert best.data.metrics["val_loss"] == parent.data.metrics["best_val_loss"]
    assert plots["search.png"]["points"] == 2 and "lr" in plots["search.png"]["panels"]

    trials = children[parent.info.run_id]
    assert len(trials) == 2
    for run in trials:
        assert run.info.status == "FINISHED" and run.data.tags["device"] == "cpu"
        history = client.get_metric_history(run.info.run_id, "val_loss")
        epochs = int(run.data.metrics["epoch"])
        assert [m.step for m in history] == list(range(1, epochs + 1))
        assert 0 <= run.data.metrics["val_accuracy"] <= 1
        assert {"l1", "l2", "lr", "batch_size"} <= set(run.data.params)

    assert len(rayflow.checkpoints()) >= 2  # a checkpoint per trial-epoch, on disk
    everything = (
        out.stdout
        + out.stderr
        + "".join(
            p.read_text(errors="ignore")
            for p in rayflow.workdir.rglob("*")
            if p.is_file() and p.suffix in {".log", ".yaml", ".json"}
        )
    )
    assert secret not in everything
    assert secret not in "".join(
        str(v) for r in [parent, *trials] for v in [*r.data.params.values(), *r.data.tags.values()]
    )


@pytest.mark.no_store
def test_tracking_none_logs_nothing(rayflow):
    out = rayflow.run("workload.num_samples=1", "workload.max_epochs=1", "tracking=none")
    assert out.returncode == 0, out.stderr[-3000:]
    assert not rayflow.db.exists() and "tracking is off" in out.stdout


def _progress(trial_dir: Path) -> list[dict]:
    try:
        with open(trial_dir / "progress.csv") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def test_interrupt_then_resume_continues_without_repeating_finished_trials(rayflow):
    # Trials take both CPUs, so they run one after the other: one finished, one cut mid-way, one
    # not started when Ctrl-C lands. Epochs of about 0.5 s (6000 images) leave the test a window
    # of two epochs to see the second trial mid-way (at 4000 images and eight epochs, 0.36 s
    # epochs, a loaded CI machine once missed it); four epochs a trial, not eight at 8000 images,
    # took the test from about 6 minutes under CI's load to about 3.5.
    epochs = 4
    args = [
        "workload.num_samples=3",
        f"workload.max_epochs={epochs}",
        f"workload.scheduler.grace_period={epochs}",
        "workload.resources_per_trial.cpu=2",
        "backend.num_cpus=2",
        "data.synthetic_train_size=6000",
        "workload.search_space.batch_size=[32]",
    ]
    # Tune copies its driver's files (progress.csv) into the experiment folder when it saves
    # the experiment's state: "auto" is every 10 s or more, which a quiet machine's whole run
    # (about 9 s) can pass without; the window the test looks for is seen only through them.
    rayflow.env["TUNE_GLOBAL_CHECKPOINT_S"] = "0.5"
    proc, log = rayflow.start(*args)

    def second_trial_checkpointed():
        trials = sorted(p for p in rayflow.storage.glob("*/train_cifar_*") if p.is_dir())
        done = [t for t in trials if len(_progress(t)) == epochs]
        running = [t for t in trials if 0 < len(list(t.glob("checkpoint_*"))) < epochs - 1]
        return done and running and (done, running)

    found = wait_until(second_trial_checkpointed, timeout=180, interval=0.1)
    assert found, log.read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    assert "resume=" in log.read_text()
    done, running = found
    finished_before = {t.name: _progress(t) for t in done}

    # A resume brings the experiment's own store back; a store named on the command line goes on
    # top: from another directory the relative sqlite:///mlflow.db is another store, which does not
    # hold the experiment's parent run: refused in one line, nothing started, no store made there.
    elsewhere = rayflow.workdir / "elsewhere"
    elsewhere.mkdir()
    daemons = ray_daemon_pids()
    [experiment] = [p for p in rayflow.storage.iterdir() if p.name.startswith("cifar-")]

    def from_elsewhere(resume: str) -> str:
        wrong = subprocess.run(
            rayflow.argv(*args, f"resume={resume}", "tracking.uri=sqlite:///mlflow.db"),
            cwd=elsewhere,
            env=rayflow.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert wrong.returncode == 2, wrong.stderr[-2000:]
        [line] = wrong.stderr.strip().splitlines()
        return line

    line = from_elsewhere(str(experiment))
    assert (
        line.startswith("rayflow: error: resume: the experiment's MLflow parent run ")
        and "does not exist here" in line
    ), line
    # resume=true from there does not pick another folder's experiment: it names it
    line = from_elsewhere("true")
    assert line.startswith(
        f"rayflow: error: resume: no cifar experiment of this folder ({elsewhere})"
    )
    assert f"{experiment.name} ({rayflow.workdir})" in line, line
    assert not (elsewhere / "mlflow.db").exists() and ray_daemon_pids() == daemons

    # the one command the interrupted run printed, pasted as is (the experiment carries its keys)
    out = rayflow.run_verbatim(printed_resume(log.read_text()))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trials: 3" in out.stdout
    # quiet by default, the interrupted run and the resumed one: Ray's and MLflow's own lines
    # (a checkpoint saved, one restored) are in the experiment's log, not on the terminal
    assert noise(log.read_text()) == {} and noise(out.stdout + out.stderr) == {}
    kept = noise((experiment / "rayflow.log").read_text())
    assert kept.get("checkpoint", 0) >= epochs, kept
    assert f"log: {experiment / 'rayflow.log'}" in out.stdout
    for name, rows in finished_before.items():
        trial = next(rayflow.storage.glob(f"*/{name}"))
        assert _progress(trial) == rows, "a finished trial was run again"
    resumed = _progress(next(rayflow.storage.glob(f"*/{running[0].name}")))
    seen = [int(r["epoch"]) for r in resumed]
    assert seen[-1] == epochs and seen.count(1) == 1, (
        f"resumed trial restarted from scratch: {seen}"
    )

    client, parents, children = rayflow.mlflow("cifar")
    assert len(parents) == 1, "resume must continue the same parent run"
    assert parents[0].info.status == "FINISHED" and parents[0].data.tags.get("resumed") == "true"
    assert len(children[parents[0].info.run_id]) == 3
    # the plots of the resumed run draw the whole history: every epoch of the trial cut in two
    curves = rayflow.plots(client, parents[0])["learning_curves.png"]
    assert curves["lines"] == 3 and curves["stopped_early"] == 0 and curves["rungs"] == [epochs]
    assert curves["points"] == {
        t.data.tags["trial_id"]: epochs for t in children[parents[0].info.run_id]
    }
    cut = next(t for t in curves["points"] if running[0].name.startswith(f"train_cifar_{t}_"))
    assert curves["points"][cut] == epochs  # epochs before the interrupt and after the resume


def test_killed_trial_worker_restarts_from_its_checkpoint(rayflow):
    import os

    epochs = 8
    args = [
        "workload.num_samples=1",
        f"workload.max_epochs={epochs}",
        f"workload.scheduler.grace_period={epochs}",
        "data.synthetic_train_size=4000",
        "workload.search_space.batch_size=[32]",
        "workload.max_failures=2",
    ]
    proc, log = rayflow.start(*args)

    def trial_worker_after_two_epochs():
        return len(rayflow.checkpoints()) >= 2 and process_pids(b"ray::ImplicitFunc")

    pids = wait_until(trial_worker_after_two_epochs, timeout=180, interval=0.1)
    assert pids and len(pids) == 1, log.read_text()[-3000:]
    os.kill(pids.pop(), signal.SIGKILL)
    assert len(rayflow.checkpoints()) < epochs - 2, (
        "the trial finished before the test could kill it"
    )
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    rows = [r for t in rayflow.storage.glob("*/train_cifar_*") for r in _progress(t)]
    seen = [int(r["epoch"]) for r in rows]
    assert seen[-1] == epochs and seen.count(1) == 1, f"the trial restarted from scratch: {seen}"
    assert len({r["pid"] for r in rows}) == 2, "the trial should have moved to a new worker process"
    client, parents, children = rayflow.mlflow("cifar")
    assert parents[0].info.status == "FINISHED"


def test_multirun_reuses_one_cluster(rayflow):
    out = rayflow.run(
        "-m",
        "workload.num_samples=1",
        "workload.max_epochs=1",
        "workload.scheduler.reduction_factor=2,4",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("[rayflow] starting the local cluster") == 1
    assert out.stdout.count("[rayflow] reusing the local cluster") == 1
    client, parents, children = rayflow.mlflow("cifar")
    assert sorted(p.data.params["workload.scheduler.reduction_factor"] for p in parents) == [
        "2",
        "4",
    ]
    # start-up figures belong to the job that started the cluster, not to the one reusing it
    assert sorted("cluster_start_s" in p.data.metrics for p in parents) == [False, True]
    assert len(rayflow.experiments()) == 2


def test_sigterm_mid_run_stops_everything_and_keeps_the_experiment(rayflow):
    proc, log = rayflow.start(
        "workload.num_samples=2", "workload.max_epochs=30", "workload.scheduler.grace_period=30"
    )
    assert wait_until(lambda: rayflow.checkpoints(), timeout=180, interval=0.1), log.read_text()[
        -3000:
    ]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert "resume=" in log.read_text()
    client, parents, _ = rayflow.mlflow("cifar")
    assert parents[0].info.status == "KILLED"
    assert rayflow.experiments()  # the rayflow fixture asserts no Ray daemon is left


def test_a_trial_no_node_can_hold_fails_after_schedule_timeout_on_an_attached_cluster(
    rayflow, head_node
):
    """attach cannot know the cluster's size up front: the 2-CPU trial waits for a 1-CPU
    cluster only schedule_timeout_s, then the run fails with one line (exit 1)."""
    import time

    started = time.monotonic()
    out = rayflow.run(
        "backend=attach",
        f"backend.address={head_node}",
        "ray_auth_mode=token",
        "workload.num_samples=1",
        "workload.max_epochs=1",
        "workload.resources_per_trial.cpu=2",
        "schedule_timeout_s=5",
        timeout=120,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("rayflow: error: schedule_timeout_s: ")
        and "2 CPU" in last
        and "1 CPU" in last
    ), last
    assert "workload.resources_per_trial.cpu" in last and "Traceback" not in out.stderr
    assert time.monotonic() - started < 90
    # attach starts nothing: it says it connects (a vm or kuberay job's head attaches too)
    assert "[rayflow] connecting to the running cluster (attach)" in out.stdout
    assert "starting the attach cluster" not in out.stdout
    client, parents, _ = rayflow.mlflow("cifar")
    assert parents[0].info.status == "FAILED"
