"""bench.py ppo: wall seconds and env steps to a return of 450 on CartPole-v1.

rayflow's side is the ppo workload as the CLI runs it (its PPOConfig through Ray Tune, the
per-iteration MLflow trial runs, checkpoints every 5 iterations and at the end); the plain
side is the same PPOConfig (rayflow.workloads.presets.ppo.algo_config) built and trained directly
with RLlib's Algorithm.train() until the return reaches the goal. Sides alternate, with the
same seed. Each run gets a new local cluster, started the way `python -m rayflow
workload=ppo` starts it (backend=local, 2 CPUs, its idle workers importing the workload's
modules), and its clock starts the moment ray.init returns: what the CLI does after its
cluster is up (parent MLflow run aside, made before the cluster) is on the clock.

--smoke: one iteration of 256 env steps on each side (`--max-steps 256 --train-batch-size 256`),
far from the goal (`reached` is false): the same two paths, not the training.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_common import log, smoke_option

RETURN_KEY = ("env_runners", "episode_return_mean")


def planned(cfg):
    """The preflight's plan of the job, as `python -m rayflow workload=ppo backend.num_cpus=2`
    checks it: the backend, what its workers preload (none with --no-warm:
    backend.preload_worker_imports=false), the trial slots."""
    from rayflow.orchestrator.preflight import plan_job

    return plan_job(cfg, [])


def cluster(plan):
    """A new local cluster, started as the CLI starts the plan's."""
    from rayflow.orchestrator.cluster import running

    return running(plan.backend, plan.preload)


def overrides(args) -> list[str]:
    return [
        "workload=ppo",
        "backend.num_cpus=2",
        f"backend.preload_worker_imports={str(args.warm).lower()}",
        *(["backend.include_dashboard=false"] if args.smoke else []),
        *([f"workload.train_batch_size={args.train_batch_size}"] if args.train_batch_size else []),
    ]


def rayflow_side(folder: Path, args) -> tuple[float, int, float]:
    """(wall s, env steps, return) of workload=ppo through rayflow's Tune path, MLflow on."""
    from rayflow.orchestrator.compose import compose_config
    from rayflow.results.experiment import experiment_dir
    from rayflow.tracking.tracker import Tracker
    from rayflow.workloads import RunContext
    from rayflow.workloads.presets import ppo

    cfg = compose_config(
        *overrides(args),
        f"storage_path={folder}",
        f"tracking.uri=sqlite:///{folder}/mlflow.db",
        f"workload.stop.episode_return_mean={args.goal}",
        f"workload.stop.env_steps={args.max_steps}",
    )
    plan = planned(cfg)
    tracker = Tracker(cfg)
    tracker.start(cfg, "", tags={"workload": "ppo"})  # the store and parent run exist before timing
    context = RunContext(tracker, experiment_dir(cfg), resume=False, trial_slots=plan.trial_slots)
    with cluster(plan):
        start = time.perf_counter()
        summary = ppo.run(cfg, context)
        wall = time.perf_counter() - start
    tracker.end("FINISHED")
    if summary.errored:
        raise RuntimeError(f"bench ppo: rayflow's trial failed: {summary.error}")
    return wall, int(summary.steps_at_best or 0), float(summary.best_return or 0)


def plain_side(folder: Path, args) -> tuple[float, int, float]:
    """The same PPOConfig, driven by RLlib alone, on the same kind of cluster."""
    from rayflow.orchestrator.compose import compose_config
    from rayflow.workloads.presets.ppo import algo_config

    cfg = compose_config(*overrides(args), "tracking=none")
    config = algo_config(cfg, gpu=False)
    with cluster(planned(cfg)):
        return _train(config, args)


def _train(config, args) -> tuple[float, int, float]:
    start = time.perf_counter()
    algo = config.build_algo()
    try:
        while True:
            result = algo.train()
            value = result[RETURN_KEY[0]].get(RETURN_KEY[1], 0.0)
            steps = int(result["num_env_steps_sampled_lifetime"])
            if value >= args.goal or steps >= args.max_steps:
                return time.perf_counter() - start, steps, float(value)
    finally:
        algo.stop()


def ppo(args) -> dict:
    import ray

    tmp = Path(tempfile.mkdtemp(prefix="rayflow-bench-ppo-"))
    runs: dict[str, list[tuple[float, int, float]]] = {"rayflow": [], "plain": []}
    try:
        for rep in range(args.repeats):  # alternate, so drift on a noisy machine hits both
            for name, side in (("rayflow", rayflow_side), ("plain", plain_side)):
                folder = tmp / f"{name}-{rep}"
                folder.mkdir()
                runs[name].append(side(folder, args))
                wall, steps, value = runs[name][-1]
                log(
                    f"repeat {rep + 1}/{args.repeats} {name}: return {value:.1f} after {steps} env steps, {wall:.1f} s"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = statistics.median(r[0] for r in runs["rayflow"])
    plain = statistics.median(r[0] for r in runs["plain"])
    return {
        "name": "ppo",
        "ratio": round(wall / plain, 4),
        "wall_s": round(wall, 2),
        "plain_wall_s": round(plain, 2),
        "env_steps": statistics.median(r[1] for r in runs["rayflow"]),
        "plain_env_steps": statistics.median(r[1] for r in runs["plain"]),
        "reached": all(r[2] >= args.goal for side in runs.values() for r in side),
        "warm_workers": args.warm,
        "runs": runs,
        "goal": args.goal,
        "env": "CartPole-v1",
        "repeats": args.repeats,
        "ray_version": ray.__version__,
    }


def ppo_args(p) -> None:
    p.add_argument(
        "--repeats", type=int, default=2, help="runs of each side, alternating; medians compared"
    )
    p.add_argument("--goal", type=float, default=450.0, help="episode_return_mean to reach")
    p.add_argument(
        "--max-steps", type=int, default=300_000, help="give up after this many env steps"
    )
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="both sides without backend.preload_worker_imports (what it saves)",
    )
    p.add_argument(
        "--train-batch-size",
        type=int,
        default=None,
        help="workload.train_batch_size on both sides (default: the workload's, 4000)",
    )
    smoke_option(p, repeats=1, max_steps=256, train_batch_size=256)
