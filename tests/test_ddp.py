"""workload=ddp end to end: Ray Train with 2 gloo workers on synthetic data, through the CLI."""

from __future__ import annotations

import os
import re
import signal

import torch

from rayflow.testing.processes import process_pids, wait_until

DDP = ["workload=ddp", "backend.num_cpus=2", "workload.num_workers=2", "workload.batch_size=32"]
# A small ResNet at batch 32 takes a few seconds an epoch here: long enough to act mid-epoch 2,
# once epoch 1's checkpoint is recorded, and see the run finish from that checkpoint.
EPOCHS = 2
SLOW_EPOCHS = [*DDP, "workload.model=resnet", f"workload.epochs={EPOCHS}"]


def checkpoints(rayflow):
    return sorted(rayflow.storage.glob("ddp-*/checkpoint_*/checkpoint.pt"))


def registered_checkpoint(rayflow) -> bool:
    """Ray Train has recorded a checkpoint (its snapshot file), not just received its files."""
    return any(rayflow.storage.glob("ddp-*/checkpoint_manager_snapshot.json"))


def train_run(rayflow):
    """(client, the parent run, its one nested 'train' run) of the ddp MLflow experiment."""
    client, parents, children = rayflow.mlflow("ddp")
    assert len(parents) == 1
    nested = children[parents[0].info.run_id]
    assert [r.info.run_name for r in nested] == ["train"]
    return client, parents[0], nested[0]


def history(client, run, name) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))


def test_two_workers_two_epochs_learn_checkpoint_and_log_each_epoch(rayflow):
    out = rayflow.run(*DDP, "workload.epochs=2")
    assert out.returncode == 0, out.stderr[-3000:]
    # Ray Train's own line, in the run's log (the terminal leaves it out)
    assert "Started training worker group of size 2" in rayflow.run_logs()

    client, parent, train = train_run(rayflow)
    for name in ("train_loss", "val_loss", "val_accuracy", "samples_per_s"):
        assert [step for step, _ in history(client, train, name)] == [1, 2], name
    losses = [v for _, v in history(client, train, "train_loss")]
    assert losses[1] < losses[0], f"training loss did not decrease: {losses}"
    assert train.info.status == "FINISHED" and parent.info.status == "FINISHED"
    assert parent.data.metrics["val_accuracy"] == history(client, train, "val_accuracy")[-1][1]
    assert parent.data.metrics["epochs_completed"] == 2

    saved = checkpoints(rayflow)
    assert saved, "no checkpoint written"
    state = torch.load(saved[-1], map_location="cpu")
    assert state["epoch"] == 2 and {"model", "optimizer", "scheduler"} <= set(state)
    assert "final val_accuracy" in out.stdout
    plots = rayflow.plots(client, parent)
    ticks = plots["training.png"].pop("ticks")
    assert plots == {
        "training.png": {
            "lines": 4,
            "panels": {"loss": 2, "accuracy": 1, "throughput": 1},
            "epochs": [1, 2],
        }
    }
    assert ticks and all(t == int(t) for t in ticks)  # whole epochs only
    assert "plots: " in out.stdout and "(training.png); MLflow: plots/" in out.stdout


def test_interrupt_then_resume_continues_and_a_killed_worker_restarts_the_group(rayflow):
    """Two runs where there were four: Ctrl-C mid-epoch 2, then the resumed run loses a worker
    mid-epoch 2 and its group restarts from the last checkpoint, finishing the run (exit 0). The
    resumed run is the killed-worker run: the same workload, cluster and checkpoints."""
    proc, log = rayflow.start(*SLOW_EPOCHS, "workload.max_failures=2")
    assert wait_until(lambda: registered_checkpoint(rayflow), timeout=240, interval=0.1), (
        log.read_text()[-3000:]
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    assert "resume=" in log.read_text()
    client, parent, train = train_run(rayflow)
    done = int(history(client, train, "epoch")[-1][1])
    assert done < EPOCHS and train.info.status == "KILLED"
    interrupted_logs = rayflow.run_logs()  # the resumed run's lines are appended to it

    proc, log = rayflow.start("workload=ddp", "resume=true", log_name="resume.log")

    def resumed_workers():
        # the resumed group has loaded its checkpoint: kill one of its workers mid-epoch 2
        resumed = "rank 0 resumed from the checkpoint of epoch" in log.read_text()
        return resumed and process_pids(b"ray::RayTrainWorker")

    workers = wait_until(resumed_workers, timeout=240, interval=0.1)
    assert workers and len(workers) == 2, log.read_text()[-3000:]
    os.kill(min(workers), signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]

    text = log.read_text()
    logs = rayflow.run_logs()
    assert logs.startswith(interrupted_logs)
    assert logs[len(interrupted_logs) :].count("Started training worker group of size 2") == 2, (
        "the worker group was not restarted"
    )
    # The epoch Ctrl-C cut into may have reached MLflow but not Ray Train's checkpoint record:
    # the run continues from the last recorded checkpoint, which is at most one epoch back; the
    # group restarted after the kill loads the checkpoint again (the latest, so no earlier one).
    # (Ray prints a worker's line twice here: one (pid, epoch) per group start, in order)
    lines = re.findall(
        r"pid=(\d+)[^)\n]*\)[^\n]*rank 0 resumed from the checkpoint of epoch (\d+)", text
    )
    resumed = [int(epoch) for _, epoch in dict.fromkeys(lines)]
    assert len(resumed) == 2, (lines, text[-3000:])
    assert done - 1 <= resumed[0] <= done, (resumed, done)
    assert resumed[1] >= max(resumed[0], 1), "the restarted workers did not load the checkpoint"
    client, parent, train = train_run(rayflow)  # the same parent and nested run, continued
    assert history(client, train, "epoch")[-1] == (EPOCHS, EPOCHS)
    epochs = [step for step, _ in history(client, train, "epoch")]
    assert epochs[-1] == EPOCHS and epochs.count(1) == 1, f"epochs repeated from scratch: {epochs}"
    assert train.info.status == "FINISHED"
    assert (
        parent.data.tags.get("resumed") == "true"
        and parent.data.metrics["epochs_completed"] == EPOCHS
    )
    # the plot of the resumed run has every epoch, those before the interrupt too
    assert rayflow.plots(client, parent)["training.png"]["epochs"] == [1, 2]


def test_tune_sweeps_lr_with_one_train_run_per_trial(rayflow):
    out = rayflow.run(
        *DDP, "workload.epochs=2", "workload.tune=true", "workload.sweep.num_samples=2", timeout=400
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ddp")
    [parent] = parents
    trials = children[parent.info.run_id]
    assert len(trials) == 2 and all("lr" in t.data.params for t in trials)
    assert all("val_accuracy" in t.data.metrics for t in trials)
    assert parent.data.metrics["best_val_accuracy"] == max(
        t.data.metrics["val_accuracy"] for t in trials
    )
    # each trial's Ray Train run
    runs = sorted(p.name for p in rayflow.storage.glob("ddp-*/train-*"))
    assert len(runs) == 2, runs
    plots = rayflow.plots(client, parent)
    curves = plots["learning_curves.png"]
    assert curves["lines"] == 2 and curves["rungs"] == [1, 2] and curves["metric"] == "val_accuracy"
    [best] = [t for t in trials if t.data.tags["trial_id"] == curves["best"]]
    assert best.data.metrics["val_accuracy"] == parent.data.metrics["best_val_accuracy"]
    assert curves["stopped_early"] == parent.data.metrics["trials_stopped_early"]
    assert plots["search.png"]["panels"] == ["lr"] and plots["search.png"]["points"] == 2
