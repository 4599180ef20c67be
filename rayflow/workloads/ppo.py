"""workload=ppo: RLlib PPO on a Gymnasium environment, as a Ray Tune experiment.

RLlib's current API stack: PPOConfig with env runners (sampling actors) and a learner
(on a GPU with compute=gpu) updating an RLModule. Tune runs the Algorithm class as its
trainable, so stop criteria, checkpoints every N iterations, restarts (max_failures),
`resume=true` and the MLflow trial runs work as for workload=cifar; `lr_grid` makes one
trial per learning rate (tune.grid_search, as in the seed notebook).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import gymnasium  # with ray.rllib: the `rllib` extra; imported only when workload=ppo is chosen
from ray import tune
from ray.rllib.callbacks.callbacks import RLlibCallback

from rayflow.errors import ConfigError
from rayflow.placement import Bundle

USES_DATA = False  # the environment is the data: no CIFAR download or synthetic set
# What the trial's process (the Algorithm with its learner) and its env runners import before
# the first iteration: 2-5 s that Ray's prestarted workers can spend before the run needs them.
WORKER_IMPORTS = (
    "torch", "ray.rllib.algorithms.ppo", "ray.rllib.algorithms.ppo.torch.ppo_torch_learner",
    "ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module", "ray.rllib.env.single_agent_env_runner",
    "rayflow.workloads.ppo",
    "torch._inductor.config",  # 1.5 s: the seed (.debugging) turns on torch.use_deterministic_algorithms, which imports it
)
RETURN = "env_runners/episode_return_mean"
STEPS = "num_env_steps_sampled_lifetime"
# What each iteration logs to MLflow: the name there -> the key in RLlib's (flattened) result.
METRICS = {
    "episode_return_mean": RETURN,
    "num_env_steps_sampled_lifetime": STEPS,
    "env_steps_per_s": "env_steps_per_s",
    "episode_len_mean": "env_runners/episode_len_mean",
}
# The trial's params in MLflow (its config is RLlib's whole AlgorithmConfig; the parent run
# holds rayflow's config).
PARAMS = ("env", "lr", "gamma", "train_batch_size", "minibatch_size", "num_epochs", "num_env_runners", "seed")


def check(cfg) -> None:
    """What the schema (rayflow.schema.workloads.Ppo) cannot know: the environment exists, and
    RLlib's own consistency checks of the algorithm's config pass."""
    w = cfg.workload
    try:
        gymnasium.spec(str(w.env))
    except (gymnasium.error.Error, ImportError, ModuleNotFoundError) as err:
        raise ConfigError("workload.env", f"not a Gymnasium environment: {err}") from None
    rllib_log = logging.getLogger("ray.rllib")
    level, rllib_log.level = rllib_log.level, logging.ERROR  # its "new API stack" notice is not an error
    try:  # RLlib's own consistency checks, before anything starts
        algo_config(cfg, gpu=False).validate()
    except (ValueError, TypeError) as err:
        raise ConfigError("workload", f"RLlib rejects this PPO config: {str(err).strip().splitlines()[0]}") from None
    finally:
        rllib_log.setLevel(level)


def demand(cfg) -> list[Bundle]:
    """A trial: the algorithm with its learner (1 CPU, the GPU with compute=gpu) and its env
    runners (1 CPU each), placed together as RLlib's default resource request asks."""
    gpu = float(cfg.compute.gpus_per_trial or 0) if cfg.compute.device != "cpu" else 0.0
    algorithm = Bundle("the PPO algorithm and its learner", {"CPU": 1.0, "GPU": 1.0 if gpu else 0.0},
                       {"CPU": "workload", "GPU": "compute"})
    runners = int(cfg.workload.num_env_runners)
    if not runners:
        return [algorithm]
    return [algorithm, Bundle("an env runner", {"CPU": 1.0}, {"CPU": "workload.num_env_runners"},
                              count=runners, count_key="workload.num_env_runners")]


def algo_config(cfg, gpu: bool):
    """The PPOConfig the workload keys describe (also what scripts/bench.py runs directly)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    w = cfg.workload
    return (
        PPOConfig()
        .environment(str(w.env))
        .env_runners(num_env_runners=int(w.num_env_runners), num_envs_per_env_runner=int(w.num_envs_per_env_runner))
        .training(
            lr=float(w.lr), gamma=float(w.gamma), train_batch_size_per_learner=int(w.train_batch_size),
            minibatch_size=int(w.minibatch_size), num_epochs=int(w.num_epochs), vf_loss_coeff=float(w.vf_loss_coeff),
        )
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=list(w.hidden), fcnet_activation=str(w.activation), vf_share_layers=bool(w.vf_share_layers),
        ))
        .learners(num_learners=0, num_gpus_per_learner=1 if gpu else 0)  # the learner runs in the trial's actor
        .callbacks(StepRate)
        .debugging(seed=int(cfg.seed))
    )


class StepRate(RLlibCallback):
    """Adds env_steps_per_s: env steps sampled in the iteration per wall second since the last one
    (or since the algorithm was built, for the first iteration and after a restore); and the
    learner's device and device_name."""

    def on_algorithm_init(self, *, algorithm, **kwargs):
        algorithm._rayflow_clock = time.perf_counter()

    def on_train_result(self, *, algorithm, result, **kwargs):
        now = time.perf_counter()
        steps = result.get("env_runners", {}).get("num_env_steps_sampled")
        last = getattr(algorithm, "_rayflow_clock", None)
        if steps is not None and last is not None and now > last:
            result["env_steps_per_s"] = steps / (now - last)
        algorithm._rayflow_clock = now
        if getattr(algorithm, "_rayflow_device", None) is None:  # asked of the learner, once
            found = [r.get() for r in algorithm.learner_group.foreach_learner(_learner_device) if r.ok]
            algorithm._rayflow_device = found[0] if found else None
        if algorithm._rayflow_device:
            result["device"], result["device_name"] = algorithm._rayflow_device


def _learner_device(learner) -> tuple[str, str]:
    """(device type, device name) of the parameters of the learner's RLModule, in the process that
    holds it (the trial's Algorithm actor, num_learners=0): the GPU's model on CUDA, else "cpu"."""
    import torch

    for module_id in learner.module.keys():
        for param in learner.module[module_id].parameters():
            if param.device.type == "cuda":
                return "cuda", torch.cuda.get_device_name(param.device)
    return "cpu", "cpu"


class Progress(tune.Callback):
    """One line per iteration on the terminal (Tune's own table would print RLlib's whole config)."""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        runners = result.get("env_runners", {})
        print(f"[rayflow] {trial} lr={trial.config.get('lr'):g} iter {result.get('training_iteration')}: "
              f"return {runners.get('episode_return_mean', float('nan')):.1f}, "
              f"env steps {int(result.get(STEPS) or 0)}, {result.get('env_steps_per_s', float('nan')):.0f}/s", flush=True)


def stop_criteria(w) -> dict:
    stop = {RETURN: w.stop.episode_return_mean, STEPS: w.stop.env_steps, "training_iteration": w.stop.iterations}
    return {k: v for k, v in stop.items() if v is not None}


@dataclass
class PPOSummary:
    best_config: dict
    best_return: float | None
    steps_at_best: int | None
    best_checkpoint: str | None
    trials: int
    errored: int
    interrupted: bool
    devices: list[str]
    goal: float | None
    error: str | None = None  # the first errored trial's error, one line

    def parent_metrics(self) -> dict:
        if self.best_return is None:
            return {}
        return {"episode_return_mean": self.best_return, "num_env_steps_sampled_lifetime": self.steps_at_best}

    def table(self) -> str:
        lines = ["", "== rayflow results (RLlib PPO) =="]
        lines += [f"best lr: {self.best_config.get('lr')}"] if self.best_config else []
        if self.best_return is not None:
            lines.append(f"best episode_return_mean {self.best_return:.1f} after {self.steps_at_best} env steps")
            if self.goal is not None:
                lines.append(f"goal {self.goal:g}: {'reached' if self.best_return >= self.goal else 'NOT reached'}")
        lines.append(f"trials: {self.trials} ({self.errored} errored)")
        return "\n".join(lines)


def summarize(results, interrupted: bool, goal: float | None, gpu: bool) -> PPOSummary:
    from rayflow.errors import first_error_line

    best_return, steps, best = None, None, None
    for result in results:
        frame = result.metrics_dataframe
        if frame is None or RETURN not in frame or frame[RETURN].dropna().empty:
            continue
        row = frame.loc[frame[RETURN].idxmax()]
        if best_return is None or row[RETURN] > best_return:
            best_return, steps, best = float(row[RETURN]), int(row[STEPS]), result
    checkpoint = best.checkpoint.path if best is not None and best.checkpoint else None
    return PPOSummary(
        best_config={"lr": best.config.get("lr")} if best is not None else {},
        best_return=best_return, steps_at_best=steps, best_checkpoint=checkpoint,
        trials=len(results), errored=results.num_errors, interrupted=interrupted,
        devices=["cuda" if gpu else "cpu"], goal=goal,
        error=first_error_line(results.errors[0]) if results.errors else None,
    )


def run(cfg, ctx):
    from rayflow.tuning import TuneJob, run_tune

    w = cfg.workload
    gpu = float(cfg.compute.gpus_per_trial or 0) > 0
    config = algo_config(cfg, gpu)
    space = config.to_dict()
    if w.lr_grid is not None:
        space["lr"] = tune.grid_search([float(v) for v in w.lr_grid])
    job = TuneJob(
        trainable=config.algo_class,
        param_space=space,
        metric=RETURN,
        mode="max",
        num_samples=1,
        resources=None,  # the Algorithm asks Tune for its own and its env runners' resources
        max_failures=int(w.max_failures),
        checkpoint_frequency=int(w.checkpoint_every),
        checkpoint_at_end=True,
        stop=stop_criteria(w),
        reuse_actors=False,
        callbacks=[Progress(), *[cb for cb in [ctx.tracker.trial_callback(METRICS, None, PARAMS)] if cb]],
        verbose=0,
    )
    results, interrupted = run_tune(job, ctx.experiment_dir, resume=ctx.resume)
    goal = w.stop.episode_return_mean
    return summarize(results, interrupted, float(goal) if goal is not None else None, gpu)
