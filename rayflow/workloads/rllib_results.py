"""What every RLlib run of rayflow adds to the algorithm and reads from its results: the env-step
rate and the learner's device in each result (StepRate), a line per iteration (Progress), the
metrics its MLflow runs record, and the summary (RLlibSummary)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ray import tune
from ray.rllib.callbacks.callbacks import RLlibCallback

RETURN = "env_runners/episode_return_mean"
STEPS = "num_env_steps_sampled_lifetime"
# What each iteration logs to MLflow: the name there -> the key in RLlib's (nested) result.
METRICS = {
    "episode_return_mean": RETURN,
    "num_env_steps_sampled_lifetime": STEPS,
    "env_steps_per_s": "env_steps_per_s",
    "episode_len_mean": "env_runners/episode_len_mean",
}


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
            found = [
                r.get() for r in algorithm.learner_group.foreach_learner(_learner_device) if r.ok
            ]
            algorithm._rayflow_device = found[0] if found else None
        if algorithm._rayflow_device:
            result["device"], result["device_name"] = algorithm._rayflow_device


def _learner_device(learner) -> tuple[str, str]:
    """(device type, device name) of the parameters of the learner's RLModule, in the process that
    holds it (the trial's Algorithm actor, num_learners=0): the GPU's model on CUDA, else "cpu"."""
    import torch

    # a MultiRLModule: it has keys() but no __iter__, so `in learner.module` would not iterate ids
    for module_id in learner.module.keys():  # noqa: SIM118
        for param in learner.module[module_id].parameters():
            if param.device.type == "cuda":
                return "cuda", torch.cuda.get_device_name(param.device)
    return "cpu", "cpu"


class Progress(tune.Callback):
    """One line per iteration on the terminal (Tune's own table would print RLlib's whole
    config)."""

    def __init__(self, keys: tuple[str, ...] = ("lr",)):
        self.keys = keys

    def on_trial_result(self, iteration, trials, trial, result, **info):
        runners = result.get("env_runners", {})
        shown = " ".join(
            f"{k}={trial.config.get(k):g}"
            if isinstance(trial.config.get(k), (int, float))
            else f"{k}={trial.config.get(k)}"
            for k in self.keys
        )
        mean = runners.get("episode_return_mean")
        # absent until an episode has ended (a long episode, or a short first iteration)
        ret = f"{mean:.1f}" if mean is not None else "n/a (no episode has ended yet)"
        print(
            f"[rayflow] {trial} {shown + ' ' if shown else ''}iter "
            f"{result.get('training_iteration')}: return {ret}, env steps "
            f"{int(result.get(STEPS) or 0)}, {result.get('env_steps_per_s', float('nan')):.0f}/s",
            flush=True,
        )


@dataclass
class RLlibSummary:
    best_config: dict  # the best trial's values of the grid's keys
    best_return: float | None
    steps_at_best: int | None
    best_checkpoint: str | None
    trials: int
    errored: int
    interrupted: bool
    devices: list[str]
    goal: float | None
    error: str | None = None  # the first errored trial's error, one line
    algorithm: str = "RLlib"
    iterations: int = 0  # the most any trial ran
    keys: tuple[str, ...] = field(default_factory=tuple)

    def _no_return_line(self) -> str:
        from rayflow.workloads.tune_summary import no_success_line

        if self.iterations and not self.errored and not self.interrupted:
            # iterations ran, and none ended an episode: RLlib's return is the mean over ended
            # episodes, so there is none to report yet (not an error: more iterations end some)
            return (
                f"no episode ended in {self.iterations} iteration(s) of {self.trials} trial(s): "
                "no return yet (more iterations: workload.stop.training_iteration)"
            )
        return no_success_line(self.trials, self.errored, self.error, self.interrupted, "a return")

    @property
    def best_metrics(self) -> dict:
        return self.parent_metrics()

    def parent_metrics(self) -> dict:
        if self.best_return is None:
            return {}
        return {
            "episode_return_mean": self.best_return,
            "num_env_steps_sampled_lifetime": self.steps_at_best,
        }

    def table(self) -> str:
        lines = ["", f"== rayflow results (RLlib {self.algorithm}) =="]
        if self.best_return is None:  # no trial reported a return: no best to show
            return "\n".join([*lines, self._no_return_line()])
        lines += [f"best {k}: {v}" for k, v in self.best_config.items()]
        if self.best_return is not None:
            lines.append(
                f"best episode_return_mean {self.best_return:.1f} "
                f"after {self.steps_at_best} env steps"
            )
            if self.goal is not None:
                lines.append(
                    f"goal {self.goal:g}: "
                    f"{'reached' if self.best_return >= self.goal else 'NOT reached'}"
                )
        lines.append(f"trials: {self.trials} ({self.errored} errored)")
        return "\n".join(lines)


def summarize(
    results,
    interrupted: bool,
    goal: float | None,
    gpu: bool,
    keys: tuple[str, ...] = ("lr",),
    algorithm: str = "RLlib",
) -> RLlibSummary:
    from rayflow.errors import first_error_line
    from rayflow.results.storage import checkpoint_uri

    best_return, steps, best, iterations = None, None, None, 0
    for result in results:
        frame = result.metrics_dataframe
        if frame is not None and "training_iteration" in frame:
            iterations = max(iterations, int(frame["training_iteration"].max()))
        if frame is None or RETURN not in frame or frame[RETURN].dropna().empty:
            continue
        row = frame.loc[frame[RETURN].idxmax()]
        if best_return is None or row[RETURN] > best_return:
            best_return, steps, best = float(row[RETURN]), int(row[STEPS]), result
    checkpoint = checkpoint_uri(best.checkpoint) if best is not None and best.checkpoint else None
    return RLlibSummary(
        best_config={k: best.config.get(k) for k in keys} if best is not None else {},
        best_return=best_return,
        steps_at_best=steps,
        best_checkpoint=checkpoint,
        trials=len(results),
        errored=results.num_errors,
        interrupted=interrupted,
        devices=["cuda" if gpu else "cpu"],
        goal=goal,
        error=first_error_line(results.errors[0]) if results.errors else None,
        algorithm=algorithm,
        keys=keys,
        iterations=iterations,
    )
