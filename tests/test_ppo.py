"""workload=ppo end to end: RLlib PPO on CartPole-v1 through Tune, MLflow and checkpoints."""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("ray.rllib")

from rayflow.testing.processes import wait_until

# The dashboard is not what these tests are about: their local runs start Ray without it
# (tests/harness/cli.py WITHOUT_DASHBOARD); the default is what test_quiet, test_secrets, the
# first-hour tests and the others run.
pytestmark = pytest.mark.no_dashboard

# Small iterations (1000 env steps) keep a short run short; the defaults are RLlib's tuned ones.
QUICK = [
    "workload=ppo",
    "backend.num_cpus=2",
    "workload.train_batch_size=1000",
    "workload.checkpoint_every=1",
]


def checkpoints(rayflow):
    return sorted(rayflow.storage.glob("ppo-*/PPO_*/checkpoint_*/algorithm_state.pkl"))


def history(client, run, name) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))


def test_lr_grid_logs_each_iteration_and_checkpoints(rayflow):
    out = rayflow.run(
        *QUICK, "workload.lr_grid=[1.0e-4,1.0e-3]", "workload.stop.iterations=2", timeout=400
    )
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ppo")
    [parent] = parents
    trials = children[parent.info.run_id]
    assert sorted(float(t.data.params["lr"]) for t in trials) == [1e-4, 1e-3]
    for trial in trials:
        assert trial.data.params["env"] == "CartPole-v1"
        assert [s for s, _ in history(client, trial, "episode_return_mean")] == [1, 2]
        assert [v for _, v in history(client, trial, "num_env_steps_sampled_lifetime")] == [
            1000,
            2000,
        ]
        assert all(v > 0 for _, v in history(client, trial, "env_steps_per_s"))
    best = max(trials, key=lambda t: t.data.metrics["episode_return_mean"])
    assert parent.data.metrics["episode_return_mean"] == max(
        v for _, v in history(client, best, "episode_return_mean")
    )
    assert parent.data.metrics["num_env_steps_sampled_lifetime"] in (1000, 2000)
    assert len(checkpoints(rayflow)) >= 2  # both trials, every iteration (and at the end)
    assert "best episode_return_mean" in out.stdout
    returns = rayflow.plots(client, parent)["returns.png"]  # default stop: episode_return_mean 450
    drawn = {
        key: returns.get(key) for key in ("lines", "lrs", "points", "goal")
    }  # besides its title, state, colours
    assert drawn == {"lines": 2, "lrs": [1e-4, 1e-3], "points": [2, 2], "goal": 450.0}


def test_the_trial_and_its_env_runner_start_in_workers_the_cluster_prestarted(rayflow):
    """No start-up tax: backend=local has Ray's idle workers import torch and RLlib as it starts,
    and the trial's algorithm (despite Tune's runtime_env) and its env runner (inside the trial's
    placement group, which takes every CPU) run in those processes, not in new ones."""
    import time

    import ray
    from ray.util.state import list_actors, list_workers

    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.preflight import plan_job
    from rayflow.results.experiment import experiment_dir
    from rayflow.tracking.tracker import Tracker
    from rayflow.workloads import RunContext
    from rayflow.workloads.presets import ppo

    cfg = compose_config(
        *QUICK, "workload.stop.iterations=1", "tracking=none", f"storage_path={rayflow.storage}"
    )
    plan = plan_job(cfg, [])
    with running(plan.backend, plan.preload):
        assert (
            plan.backend.init_kwargs(plan.preload)["_system_config"]["num_workers_soft_limit"] == 2
        )
        fit_ms = time.time() * 1000
        summary = ppo.run(cfg, RunContext(Tracker(cfg), experiment_dir(cfg), False))
        # This cluster's address: with none, the state API guesses the machine's latest Ray
        # instance, which may be another test's (the other pytest-xdist worker's).
        address = ray.get_runtime_context().gcs_address
        pids = {a.class_name: a.pid for a in list_actors(address=address, detail=True, limit=100)}
        launched = {
            w.pid: w.worker_launch_time_ms
            for w in list_workers(address=address, detail=True, limit=100)
        }
    assert summary.trials == 1 and summary.errored == 0
    for name in ("PPO", "SingleAgentEnvRunner"):
        assert launched[pids[name]] < fit_ms, f"{name} ran in a worker started after the run began"


def test_interrupt_then_resume_continues_the_iterations(rayflow):
    proc, log = rayflow.start(*QUICK, "workload.stop.iterations=8")
    assert wait_until(lambda: len(checkpoints(rayflow)) >= 2, timeout=240, interval=0.2), (
        log.read_text()[-3000:]
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    client, parents, children = rayflow.mlflow("ppo")
    [trial] = children[parents[0].info.run_id]
    done = history(client, trial, "episode_return_mean")[-1][0]
    assert done < 8

    out = rayflow.run("workload=ppo", "resume=true", timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, children = rayflow.mlflow("ppo")
    assert len(parents) == 1 and parents[0].data.tags.get("resumed") == "true"
    [trial] = children[parents[0].info.run_id]
    steps = [s for s, _ in history(client, trial, "num_env_steps_sampled_lifetime")]
    assert steps[-1] == 8 and steps.count(1) == 1, f"iterations restarted from scratch: {steps}"
    lifetime = history(client, trial, "num_env_steps_sampled_lifetime")[-1][1]
    assert lifetime == 8000  # the restored algorithm kept counting


@pytest.mark.no_store
def test_unknown_environment_is_refused_before_anything_starts(rayflow):
    out = rayflow.run("workload=ppo", "workload.env=CartPol-v1")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    # Gymnasium's suggestion
    assert line.startswith("rayflow: error: workload.env") and "CartPole" in line
    assert not rayflow.storage.exists() and not rayflow.db.exists()


@pytest.mark.slow
def test_default_config_reaches_450_within_300k_env_steps(rayflow):
    out = rayflow.run("workload=ppo", "backend.num_cpus=2", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    client, parents, _ = rayflow.mlflow("ppo")
    metrics = parents[0].data.metrics
    assert metrics["episode_return_mean"] >= 450, metrics
    assert metrics["num_env_steps_sampled_lifetime"] <= 300_000, metrics
