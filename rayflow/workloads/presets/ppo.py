"""workload=ppo: RLlib PPO on a Gymnasium environment — a preset of workload=rllib.

Its keys (RLlib's tuned CartPole example by default) build a PPOConfig (`algo_config`, which
scripts/bench_ppo.py also trains directly); workload=rllib's `run_config` runs it as a Tune
experiment, so stop criteria, checkpoints every N iterations, restarts (max_failures),
`resume=true` and the MLflow trial runs are those of any RLlib workload; `lr_grid` makes one
trial per learning rate (tune.grid_search, as in the seed notebook).
"""

from __future__ import annotations

from ray import tune  # with ray.rllib: the `rllib` extra; imported only when workload=ppo is chosen

from rayflow.runtime.placement import Bundle
from rayflow.workloads.rllib import environment, run_config, validated
from rayflow.workloads.rllib_results import METRICS, RETURN, STEPS, StepRate

KIND = "rllib"
# What the trial's process (the Algorithm with its learner) and its env runners import before
# the first iteration: 2-5 s that Ray's prestarted workers can spend before the run needs them.
WORKER_IMPORTS = (
    "torch",
    "ray.rllib.algorithms.ppo",
    "ray.rllib.algorithms.ppo.torch.ppo_torch_learner",
    "ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module",
    "ray.rllib.env.single_agent_env_runner",
    "rayflow.workloads.presets.ppo",
    # 1.5 s: the seed (.debugging) turns on torch.use_deterministic_algorithms, which imports it
    "torch._inductor.config",
)
# The trial's params in MLflow (its config is RLlib's whole AlgorithmConfig; the parent run
# holds rayflow's config).
PARAMS = (
    "env",
    "lr",
    "gamma",
    "train_batch_size",
    "minibatch_size",
    "num_epochs",
    "num_env_runners",
    "seed",
)


def prepare(cfg, here: bool) -> None:
    """Nothing: the environment is the data: no data set to prepare."""


def worker_imports(cfg) -> tuple[str, ...]:
    return WORKER_IMPORTS


def metrics(cfg) -> dict[str, str]:
    return METRICS


def params(cfg) -> tuple[str, ...]:
    return PARAMS


def figures(cfg, experiment_dir):
    from rayflow.results.plots.curves import returns
    from rayflow.results.records import tune_trials

    goal = cfg.workload.stop.get("episode_return_mean")
    return [
        (
            "returns.png",
            lambda: returns(
                tune_trials(experiment_dir), None if goal is None else float(goal), "PPO"
            ),
        )
    ]


def check(cfg) -> None:
    """What the schema (rayflow.workloads.presets.keys.Ppo) cannot know: the environment exists, and
    RLlib's own consistency checks of the algorithm's config pass."""
    environment(str(cfg.workload.env))
    validated(algo_config(cfg, gpu=False), "workload")


def demand(cfg) -> list[Bundle]:
    """A trial: the algorithm with its learner (1 CPU, the GPU with compute=gpu) and its env
    runners (1 CPU each), placed together as RLlib's default resource request asks."""
    gpu = float(cfg.compute.gpus_per_trial or 0) if cfg.compute.device != "cpu" else 0.0
    algorithm = Bundle(
        "the PPO algorithm and its learner",
        {"CPU": 1.0, "GPU": 1.0 if gpu else 0.0},
        {"CPU": "workload", "GPU": "compute"},
    )
    runners = int(cfg.workload.num_env_runners)
    if not runners:
        return [algorithm]
    return [
        algorithm,
        Bundle(
            "an env runner",
            {"CPU": 1.0},
            {"CPU": "workload.num_env_runners"},
            count=runners,
            count_key="workload.num_env_runners",
        ),
    ]


def algo_config(cfg, gpu: bool):
    """The PPOConfig the workload keys describe (also what scripts/bench.py runs directly)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    w = cfg.workload
    return (
        PPOConfig()
        .environment(str(w.env))
        .env_runners(
            num_env_runners=int(w.num_env_runners),
            num_envs_per_env_runner=int(w.num_envs_per_env_runner),
        )
        .training(
            lr=float(w.lr),
            gamma=float(w.gamma),
            train_batch_size_per_learner=int(w.train_batch_size),
            minibatch_size=int(w.minibatch_size),
            num_epochs=int(w.num_epochs),
            vf_loss_coeff=float(w.vf_loss_coeff),
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=list(w.hidden),
                fcnet_activation=str(w.activation),
                vf_share_layers=bool(w.vf_share_layers),
            )
        )
        # the learner runs in the trial's actor
        .learners(num_learners=0, num_gpus_per_learner=1 if gpu else 0)
        .callbacks(StepRate)
        .debugging(seed=int(cfg.seed))
    )


def stop_criteria(w) -> dict:
    stop = {
        RETURN: w.stop.episode_return_mean,
        STEPS: w.stop.env_steps,
        "training_iteration": w.stop.iterations,
    }
    return {k: v for k, v in stop.items() if v is not None}


def run(cfg, ctx):
    w = cfg.workload
    gpu = float(cfg.compute.gpus_per_trial or 0) > 0
    grid = {"lr": tune.grid_search([float(v) for v in w.lr_grid])} if w.lr_grid is not None else {}
    return run_config(
        algo_config(cfg, gpu),
        ctx,
        grid,
        stop_criteria(w),
        int(w.checkpoint_every),
        int(w.max_failures),
        gpu,
        PARAMS,
        shown_keys=("lr",),  # as before the grid was generalised
    )
