"""workload=rllib: any algorithm of RLlib's registry on a Gymnasium environment, as a Ray Tune
experiment (RLlib's current API stack: env runners sample, a learner updates an RLModule).

    python -m rayflow workload=rllib workload.algorithm=DQN workload.env=CartPole-v1 \
        'workload.config={training: {lr: 5e-4}}' 'workload.grid={lr: [1e-4, 5e-4]}'

`workload.config` holds sections of the algorithm's config (`training`, `env_runners`,
`learners`, `rl_module`, ...), each applied as `config.<section>(**values)`; `grid` runs one
trial per value of a key of the algorithm's config (tune.grid_search). workload=ppo is this
workload with keys of its own (rayflow.workloads.presets.ppo), run by `run_config`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rayflow.errors import ConfigError
from rayflow.runtime.placement import Bundle
from rayflow.schema.values import to_container
from rayflow.workloads import user_code
from rayflow.workloads.rllib_results import (
    METRICS,
    RETURN,
    STEPS,
    Progress,
    RLlibSummary,
    StepRate,
    summarize,
)

KIND = "rllib"
# Sections of an AlgorithmConfig a user may set (its methods that take keyword settings).
SECTIONS = (
    "environment",
    "env_runners",
    "learners",
    "training",
    "evaluation",
    "offline_data",
    "multi_agent",
    "reporting",
    "checkpointing",
    "debugging",
    "fault_tolerance",
    "rl_module",
    "resources",
    "framework",
    "api_stack",
    "python_environment",
    "experimental",
)


def algorithm_class(name: str):
    """(Algorithm class, its default config) by RLlib's registry name."""
    from ray.rllib.algorithms.registry import ALGORITHMS

    if name not in ALGORITHMS:
        raise ConfigError(
            "workload.algorithm",
            f"unknown RLlib algorithm {name!r}; choose from {', '.join(sorted(ALGORITHMS))}",
        )
    return ALGORITHMS[name]()


def environment(value: str):
    """A Gymnasium id (registered, or `package.module:EnvId-v0` imports the module first), or
    `module:Class` of the user's."""
    import gymnasium

    _, _, attribute = value.partition(":")
    # module:Class, the user's (an id has "-v")
    if attribute and attribute.replace(".", "_").isidentifier():
        return user_code.load(value, "workload.env")
    try:
        gymnasium.spec(value)
    except (gymnasium.error.Error, ImportError) as err:
        raise ConfigError("workload.env", f"not a Gymnasium environment: {err}") from None
    return value


def algo_config(cfg, gpu: bool):
    """The algorithm's config the workload's keys describe."""
    w = cfg.workload
    _, config = algorithm_class(str(w.algorithm))
    config = config.environment(environment(str(w.env)))
    for section, values in (to_container(w.get("config")) or {}).items():
        if section not in SECTIONS:
            raise ConfigError(
                f"workload.config.{section}",
                f"not a section of {type(config).__name__}; sections: {', '.join(SECTIONS)}",
            )
        if not isinstance(values, dict):
            raise ConfigError(
                f"workload.config.{section}",
                f"must be a mapping of {section}() settings, got {values!r}",
            )
        try:
            config = getattr(config, section)(**values)
        except TypeError as err:
            raise ConfigError(
                f"workload.config.{section}",
                f"{type(config).__name__}.{section}() refuses it: {err}",
            ) from None
    if gpu:
        config = config.learners(num_gpus_per_learner=1)
    return config.callbacks(StepRate).debugging(seed=int(cfg.seed))


def validated(config, key: str = "workload.config") -> None:
    """RLlib's own consistency checks of an algorithm's config, before anything starts."""
    rllib_log = logging.getLogger("ray.rllib")
    level = rllib_log.level
    rllib_log.level = logging.ERROR  # its "new API stack" notice is not an error
    try:
        config.validate()
    except (ValueError, TypeError) as err:
        raise ConfigError(
            key, f"RLlib rejects this config: {str(err).strip().splitlines()[0]}"
        ) from None
    finally:
        rllib_log.setLevel(level)


def grid(config, value: dict | None) -> dict:
    """The grid's keys as tune.grid_search over the algorithm config's own keys."""
    from ray import tune

    space = {}
    known = config.to_dict()
    for key, values in (value or {}).items():
        if key not in known:
            raise ConfigError(
                f"workload.grid.{key}",
                f"not a key of {type(config).__name__} (e.g. lr, gamma, "
                "train_batch_size_per_learner)",
            )
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"workload.grid.{key}", f"must be a non-empty list of values, got {values!r}"
            )
        space[key] = tune.grid_search(values)
    return space


def _gpu(cfg) -> bool:
    return float(cfg.compute.gpus_per_trial or 0) > 0 if cfg.compute.device != "cpu" else False


def check(cfg) -> None:
    config = algo_config(cfg, gpu=False)
    validated(config)
    grid(config, to_container(cfg.workload.get("grid")))


def prepare(cfg, here: bool) -> None:
    """Nothing: the environment is the data."""


def worker_imports(cfg) -> tuple[str, ...]:
    env = str(cfg.workload.env)
    mine = (user_code.module_of(env),) if ":" in env else ()
    return ("torch", "ray.rllib.env.single_agent_env_runner", *mine)


def metrics(cfg) -> dict[str, str]:
    return METRICS


def params(cfg) -> tuple[str, ...]:
    return (
        "env",
        "lr",
        "gamma",
        "train_batch_size_per_learner",
        "num_env_runners",
        "seed",
        *(to_container(cfg.workload.get("grid")) or {}),
    )


def demand(cfg) -> list[Bundle]:
    """A trial: the algorithm with its learner (1 CPU, the GPU with compute=gpu) and its env
    runners (1 CPU each), placed together as RLlib's default resource request asks."""
    runners = int(algo_config(cfg, gpu=False).num_env_runners)
    algorithm = Bundle(
        f"the {cfg.workload.get('algorithm', 'RLlib')} algorithm and its learner",
        {"CPU": 1.0, "GPU": 1.0 if _gpu(cfg) else 0.0},
        {"CPU": "workload", "GPU": "compute"},
    )
    if not runners:
        return [algorithm]
    return [
        algorithm,
        Bundle(
            "an env runner",
            {"CPU": 1.0},
            {"CPU": "workload.config.env_runners.num_env_runners"},
            count=runners,
            count_key="workload.config.env_runners.num_env_runners",
        ),
    ]


def run_config(
    config,
    ctx,
    grid_space: dict,
    stop: dict | None,
    checkpoint_every: int,
    max_failures: int,
    gpu: bool,
    param_keys=None,
    shown_keys: tuple[str, ...] | None = None,
) -> RLlibSummary:
    """Run an algorithm config as a Tune experiment (one trial per grid point) and summarise it.
    `shown_keys`: the config keys the results name for the best trial (default: the grid's)."""
    from rayflow.workloads.tune_runner import TuneJob, run_tune

    shown = tuple(grid_space) if shown_keys is None else shown_keys
    callback = ctx.tracker.trial_callback(METRICS, None, param_keys, time_attr="training_iteration")
    job = TuneJob(
        trainable=config.algo_class,
        param_space={**config.to_dict(), **grid_space},
        metric=RETURN,
        mode="max",
        num_samples=1,
        resources=None,  # the Algorithm asks Tune for its own and its env runners' resources
        max_failures=max_failures,
        checkpoint_frequency=checkpoint_every,
        checkpoint_at_end=True,
        stop=stop,
        reuse_actors=False,
        metric_in_every_result=False,  # no episode ended: no return in that iteration's result
        callbacks=[Progress(shown), *([callback] if callback else [])],
        verbose=0,
    )
    results, interrupted = run_tune(job, ctx.experiment, resume=ctx.resume, env=ctx.node_env)
    goal = (stop or {}).get(RETURN)
    return summarize(
        results,
        interrupted,
        float(goal) if goal is not None else None,
        gpu,
        shown,
        config.algo_class.__name__,
    )


def run(cfg, ctx) -> RLlibSummary:
    w = cfg.workload
    gpu = _gpu(cfg)
    config = algo_config(cfg, gpu)
    return run_config(
        config,
        ctx,
        grid(config, to_container(w.get("grid"))),
        to_container(w.get("stop")) or None,
        int(w.checkpoint_every),
        int(w.max_failures),
        gpu,
        params(cfg),
    )


def figures(cfg, experiment_dir: Path) -> list:
    from rayflow.results.plots.curves import returns
    from rayflow.results.records import tune_trials

    goal = (to_container(cfg.workload.get("stop")) or {}).get(RETURN)
    name = str(cfg.workload.algorithm)
    return [
        (
            "returns.png",
            lambda: returns(
                tune_trials(experiment_dir), None if goal is None else float(goal), name
            ),
        )
    ]


__all__ = ["STEPS", "algo_config", "run_config"]
