"""rayflow.run / compose / dry_run: the CLI's job as a Python call, several in one process (a
notebook kernel), with exceptions for errors and the process left as it was found.

The runs happen in a child Python process per test (as a kernel would hold them), which
reports what it saw as JSON lines; this process checks them and that no Ray daemon is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import rayflow as api
from rayflow.testing.processes import ray_daemon_pids

SMALL = ["workload.num_samples=2", "workload.max_epochs=2", "backend.num_cpus=2"]
# The dashboard is not what these tests are about (as the no_dashboard modules, docs/testing.md):
# their cifar and ppo runs start Ray without it, about 4 s of CPU less a run; Ray Train's ddp run
# keeps it (it uses the state API the dashboard serves).
NO_DASHBOARD = "backend.include_dashboard=false"


def session(rayflow, body: str, timeout: float = 600, capture: bool = False) -> dict:
    """Run `body` in a fresh Python process in the test's work folder; {step: what it reported}."""
    prelude = textwrap.dedent(f"""
        import json, os, signal, sys
        import rayflow
        BASE = {rayflow.base!r}
        def report(step, **values):
            print("API " + json.dumps({{"step": step, **values}}, default=str), flush=True)
        def ray_connected():
            return "ray" in sys.modules and sys.modules["ray"].is_initialized()
    """)
    out = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        cwd=rayflow.workdir,
        env=rayflow.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "\x1b[" not in out.stdout + out.stderr  # no colour codes: the output is not a terminal
    reports = [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("API ")]
    seen = {r.pop("step"): r for r in reports}
    if capture:
        seen["_output"] = out.stdout
    return seen


def test_a_bad_override_raises_the_configuration_error_naming_the_key(tmp_path):
    before = dict(os.environ)
    with pytest.raises(api.ConfigError) as err:
        api.run("workload.num_samples=0", f"storage_path={tmp_path}")
    assert err.value.key == "workload.num_samples" and str(err.value).startswith(
        "workload.num_samples: "
    )
    with pytest.raises(api.ConfigError) as err:
        api.run("workload.no_such_key=1")
    assert err.value.key == "workload.no_such_key"
    with pytest.raises(api.ConfigError) as err:
        api.compose("backend=nowhere")
    assert err.value.key == "backend=nowhere" and "choose from" in str(err.value)
    assert dict(os.environ) == before and not (tmp_path / "cifar").exists()


def test_compose_and_dry_run_return_the_config_and_the_spec(tmp_path):
    before = ray_daemon_pids()
    cfg = api.compose("workload=ppo", "workload.lr=0.001")
    assert cfg.workload.name == "ppo" and cfg.workload.lr == 0.001 and cfg.backend.name == "local"
    spec = api.dry_run(
        "backend.num_cpus=1", f"storage_path={tmp_path}", "+tracking.api_token=s3cr3t"
    )
    assert "num_cpus: 1" in spec and "s3cr3t" not in spec
    assert ray_daemon_pids() == before  # a dry run starts nothing


def test_a_run_an_interrupted_one_resumed_a_refusal_and_another_run_in_one_process(rayflow):
    before = ray_daemon_pids()
    seen = session(
        rayflow,
        f"""
        NO_DASHBOARD = {NO_DASHBOARD!r}
        import threading, time
        from pathlib import Path
        BASE = [*BASE, NO_DASHBOARD]  # every run here is cifar's
        env, sigint = dict(os.environ), signal.getsignal(signal.SIGINT)
        def report_run(name, r):
            report(name, best_config=r.best_config, val_accuracy=r.best_metrics.get("val_accuracy"),
                   folder=str(r.experiment_dir), exists=r.experiment_dir.is_dir(), run_id=r.mlflow_run_id,
                   experiment=r.mlflow_experiment, trials=len(r.trials), columns=list(r.trials.columns),
                   type=type(r.trials).__name__, connected=ray_connected(), env_same=dict(os.environ) == env)
        report_run("first", rayflow.run(*BASE, *{SMALL!r}))

        storage = Path(BASE[0].split("=", 1)[1])
        known = set(storage.iterdir())
        def interrupt():  # the kernel's interrupt, once the new experiment has a checkpoint
            while not [p for p in storage.glob("*/*/checkpoint_*") if p.parents[1] not in known]:
                time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt, daemon=True).start()
        try:
            rayflow.run(*BASE, "workload.num_samples=1", "workload.max_epochs=8", "backend.num_cpus=2")
            report("interrupt", raised=None)
        except KeyboardInterrupt as err:
            report("interrupt", raised=type(err).__name__, connected=ray_connected(),
                   env_same=dict(os.environ) == env, sigint_same=signal.getsignal(signal.SIGINT) is sigint,
                   folder=str(err.result.experiment_dir), resumable=(err.result.experiment_dir / "tuner.pkl").exists())
            resumed = err.result.resume()
            report("resumed", folder=str(resumed.experiment_dir), trials=len(resumed.trials),
                   epochs=sorted(resumed.trials["epoch"].tolist()), connected=ray_connected())
        try:
            rayflow.run(*BASE, "workload.num_samples=0")
        except rayflow.ConfigError as err:
            report("refused", key=err.key)
        # another run after the refusal: the sweep's first job, with a search space of its own
        sweep = rayflow.run(*BASE, *{SMALL!r}, "workload.search_space.lr.min=0.01",
                            "workload.scheduler.reduction_factor=2,4", multirun=True)
        report_run("after", sweep[0])
        report("sweep", folders=[str(r.experiment_dir) for r in sweep], trials=[len(r.trials) for r in sweep],
               connected=ray_connected())
    """,
        capture=True,
    )
    # two runs of one process, an interrupted one, its resume and a refusal between them
    first, after = seen["first"], seen["after"]
    assert first["folder"] != after["folder"] and first["run_id"] != after["run_id"]
    for result in (first, after):
        assert result["exists"] and result["experiment"] == "cifar" and not result["connected"]
        assert result["env_same"]
        assert (
            result["type"] == "DataFrame"
            and result["trials"] == 2
            and {"lr", "val_accuracy", "epoch"} <= set(result["columns"])
        )
        assert 0 <= result["val_accuracy"] <= 1 and "lr" in result["best_config"]
    client, parents, _ = rayflow.mlflow("cifar")
    assert {first["run_id"], after["run_id"]} <= {p.info.run_id for p in parents}
    assert after["best_config"]["lr"] >= 0.01  # its own search space, not the first run's

    stopped = seen["interrupt"]
    assert (
        stopped["raised"] == "RunInterrupted" and not stopped["connected"] and stopped["resumable"]
    )
    assert stopped["env_same"] and stopped["sigint_same"]
    assert seen["resumed"]["folder"] == stopped["folder"] and seen["resumed"]["epochs"] == [8]
    assert not seen["resumed"]["connected"]
    # a failed preflight, then a run that works (checked with the first above)
    assert seen["refused"]["key"] == "workload.num_samples"
    sweep = seen["sweep"]
    assert len(set(sweep["folders"])) == 2 and sweep["trials"] == [2, 2] and not sweep["connected"]
    # the sweep's second job
    assert seen["_output"].count("[rayflow] reusing the local cluster") == 1
    assert ray_daemon_pids() - before == set()


def test_a_failed_run_raises_with_the_trial_error_then_ddp_and_ppo_return_their_results(
    rayflow, tmp_path
):
    broken = tmp_path / "broken" / "cifar-10-batches-py"  # every batch file there, none readable
    broken.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (broken / name).write_bytes(b"not a pickle")
    seen = session(
        rayflow,
        f"""
        try:
            rayflow.run(BASE[0], "data.root={broken.parent}", "data.synthetic=false", "data.download=false",
                        "workload.num_samples=1", "workload.max_epochs=1", "workload.max_failures=0", "backend.num_cpus=1",
                        {NO_DASHBOARD!r})
        except rayflow.RunFailed as err:
            report("failed", message=str(err), folder=str(err.result.experiment_dir), connected=ray_connected())
        ddp = rayflow.run(*BASE, "workload=ddp", "workload.num_workers=2", "workload.epochs=2", "backend.num_cpus=2")
        report("ddp", metrics=ddp.best_metrics, config=ddp.best_config, epochs=ddp.trials["epoch"].tolist(),
               run_id=ddp.mlflow_run_id, connected=ray_connected())
        ppo = rayflow.run("workload=ppo", "backend.num_cpus=2", BASE[0], "workload.train_batch_size=1000",
                          "workload.stop.iterations=2", {NO_DASHBOARD!r})
        report("ppo", metrics=ppo.best_metrics, config=ppo.best_config, trials=ppo.trials.to_dict("records"),
               run_id=ppo.mlflow_run_id, text=repr(ppo), connected=ray_connected())
    """,
    )
    failed = seen["failed"]
    assert (
        failed["message"].startswith("1 trial(s) errored: ")
        and "pickle" in failed["message"].lower()
    ), failed
    assert "\n" not in failed["message"] and not failed["connected"]
    ddp, ppo = seen["ddp"], seen["ppo"]
    assert (
        ddp["epochs"] == [1, 2]
        and 0 <= ddp["metrics"]["val_accuracy"] <= 1
        and ddp["config"]["num_workers"] == 2
    )
    assert ppo["metrics"]["episode_return_mean"] > 0 and ppo["config"] == {"lr": 0.0003}
    [trial] = ppo["trials"]
    assert (
        trial["lr"] == 0.0003
        and trial["iterations"] == 2
        and trial["num_env_steps_sampled_lifetime"] == 2000
    )
    assert "best episode_return_mean" in ppo["text"] and ppo["run_id"] in ppo["text"]
    assert not ddp["connected"] and not ppo["connected"]
    client, parents, _ = rayflow.mlflow("ppo")
    assert ppo["run_id"] in {p.info.run_id for p in parents}
