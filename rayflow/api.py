"""rayflow as a Python call, for notebooks (Databricks, Jupyter) and scripts.

The same product as `python -m rayflow`: the same overrides and Hydra composition, the same
preflight of every job before any starts, the same run, output and teardown. What differs is
what a caller gets: a RunResult instead of a table alone, exceptions instead of exit codes
(ConfigError with its `.key`, RunFailed, RunInterrupted), and the process left as it was
found, so the next call in the same kernel starts clean: environment variables, signal
handlers, Ray's auth config and connection, a recorded signal.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from typing import Any

from omegaconf import DictConfig

from rayflow.errors import ConfigError, RunFailed, RunInterrupted
from rayflow.results.run_result import RunResult


def compose(*overrides: str) -> DictConfig:
    """The config `python -m rayflow OVERRIDES` composes, for inspection (nothing is checked)."""
    from rayflow.orchestrator.compose import compose_config, config_errors

    with _masked_errors():
        return config_errors(lambda: compose_config(*map(str, overrides)))


def dry_run(*overrides: str) -> str:
    """The cluster spec (YAML, secrets masked) that `run(*overrides)` would start or join, after
    the full preflight. Starts nothing."""
    from rayflow.orchestrator.cluster import spec_text
    from rayflow.orchestrator.compose import config_errors
    from rayflow.orchestrator.preflight import plan_job

    cfg = compose(*overrides, "dry_run=true")
    with _masked_errors():
        plan = config_errors(lambda: plan_job(cfg, list(overrides)))
    return spec_text(plan.backend, plan.preload)


def run(
    *overrides: str, multirun: bool = False, **workload_keys: Any
) -> RunResult | list[RunResult]:
    """Run the job `python -m rayflow OVERRIDES` runs (`-m OVERRIDES` with multirun=True: one
    job per point of the sweep, every point, consecutive jobs sharing one cluster; a list of
    results) in this process.

    Keyword arguments set keys of the workload as Python values: `trainable=objective` (a
    function defined in the notebook), `train_loop=...`, `search_space={"lr": {"loguniform":
    [1e-4, 1e-1]}}`. They are the same keys as `workload.<key>=...` on the command line.

    Raises ConfigError before anything starts, RunFailed when a trial or the cluster fails,
    and RunInterrupted (a KeyboardInterrupt) on Ctrl-C or a kernel interrupt, after tearing
    down what it started; the experiment stays resumable (`err.result.resume()`).
    """
    from rayflow.orchestrator.preflight import preflight
    from rayflow.orchestrator.session import run_jobs

    _not_connected_to_ray()
    given = [*map(str, overrides), *(_workload_override(k, v) for k, v in workload_keys.items())]
    with _masked_errors():
        jobs = preflight(given, multirun)  # every job's checks before the first starts
    if any(job.cfg.dry_run for job in jobs):
        raise ConfigError("dry_run", "use rayflow.dry_run(...) for the spec; run() runs the job")
    with _process_state_restored():
        try:
            results = run_jobs(jobs)
        except (RunFailed, RunInterrupted) as err:
            if isinstance(err.result, RunResult):
                err.result.runner = run  # err.result.resume() continues it
                err.args = (notebook_hint(str(err), err.result, _in_main(given, workload_keys)),)
            raise
    done = [result for result in results if result is not None]  # None: a dry run's, refused above
    for result in done:
        result.runner = run
    return done if multirun else done[0]


def resume(path: str, *overrides: str, **workload_keys: Any) -> RunResult | list[RunResult]:
    """Continue the experiment at `path` (a folder or an object-store URI) in this process, as
    `run("resume=PATH", ...)`: after a kernel restart, give a trainable defined in the notebook
    again (`trainable=objective`), as the first run had it."""
    return run(f"resume={path}", *overrides, **workload_keys)


CLI_HINT = "Continue with: "


def notebook_hint(message: str, result: RunResult, in_main: bool) -> str:
    """A failure's message as rayflow.run raises it: what continues the run from the notebook
    (`err.result.resume()`, or `rayflow.resume(PATH)` after a restart) in place of the command
    line, which cannot import a trainable defined in the notebook's `__main__`; the command line
    is kept beside them where the trainable is importable by its module."""
    head, found, cli = message.partition(CLI_HINT)
    if not found:
        return message
    again = ", trainable=..." if in_main else ""
    restart = f"rayflow.resume({result.experiment!r}{again})"
    said = f"{CLI_HINT}err.result.resume(), or after a restart {restart}"
    return head + said + ("" if in_main else f"; from a shell: {cli}")


def _in_main(given: list[str], workload_keys: dict[str, Any]) -> bool:
    """Whether the run's code is defined in `__main__` (a notebook, a script run as a file)."""
    objects = [v for v in workload_keys.values() if callable(v)]
    return any(getattr(v, "__module__", None) == "__main__" for v in objects) or any(
        "__main__:" in o for o in given
    )


def clusters() -> list[Any]:
    """The clusters rayflow kept for this user (`rayflow status`), each asked as it is now: a list
    of rayflow.orchestrator.clusters.ClusterStatus (`.as_dict()` for plain data). A cluster found
    gone is listed once, as gone, and then forgotten."""
    from rayflow.orchestrator import clusters as kept

    with _masked_errors():
        return list(kept.clusters())


def down(name: str | None = None, force: bool = False) -> list[str]:
    """Tear down the kept cluster `name` (`NAME` or `BACKEND/NAME`; None: every one), what its
    run started and only that (`rayflow down`). ConfigError for a name rayflow did not keep, or a
    cluster a job is using unless `force`. The names torn down."""
    from rayflow.orchestrator import clusters as kept

    with _masked_errors():
        return kept.down(name, force=force)


def logs(name: str, job: str | None = None, follow: bool = False) -> str:
    """A kept cluster's job log (`rayflow logs`): `job`, else the last one; from MLflow once the
    cluster is gone. With `follow` it is printed as it grows, until the job ends."""
    from rayflow.orchestrator import clusters as kept

    with _masked_errors():
        return kept.logs(name, job, follow)


@contextlib.contextmanager
def _masked_errors():
    """A ConfigError quotes the input (Hydra's parse error holds the whole override): its message
    is masked, in place (same exception, same key), before a notebook shows it."""
    from rayflow.security.redaction import masked_message

    try:
        yield
    except ConfigError as err:
        err.args = (masked_message(err),)
        raise


def _workload_override(key: str, value: Any) -> str:
    """`workload.<key>=<value>` in Hydra's override grammar; a function or class is registered
    (rayflow.workloads.user_code) under the `module:name` the config then holds."""
    from rayflow.workloads.user_code import give

    if callable(value):  # quoted: a nested function's name holds "<locals>"
        return f"workload.{key}={_hydra_value(give(value), key)}"
    return f"workload.{key}={_hydra_value(value, f'workload.{key}')}"


_BARE_KEY = re.compile(r"[A-Za-z_][\w\-]*")


def _hydra_value(value: Any, key: str) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_hydra_value(v, key) for v in value) + "]"
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str) or not _BARE_KEY.fullmatch(k):
                raise ConfigError(
                    key,
                    f"a key {k!r} of this mapping is not a plain name (letters, digits, _ and -)",
                )
        return "{" + ", ".join(f"{k}: {_hydra_value(v, key)}" for k, v in value.items()) + "}"
    raise ConfigError(
        key,
        f"a {type(value).__name__} is not a config value "
        "(numbers, strings, lists and mappings are)",
    )


def _not_connected_to_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        raise ConfigError(
            "backend",
            "this Python process is already connected to Ray (ray.init); rayflow "
            "connects and disconnects itself: call ray.shutdown() first (a cluster it "
            "joined keeps running; run on it with backend=attach backend.address=...)",
        )


@contextlib.contextmanager
def _process_state_restored():
    """Put back what a job changes in the process, however it ends (a notebook kernel lives on)."""
    from rayflow.runtime.environment import reread_ray_config
    from rayflow.runtime.signals import TERMINATING, reset_termination

    env = dict(os.environ)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, *TERMINATING)} if main else {}
    reset_termination()
    try:
        yield
    finally:
        ray = sys.modules.get("ray")
        # a backend's teardown left the driver connected
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        changed = {k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)}
        for key in changed:
            if key in env:
                os.environ[key] = env[key]
            else:
                os.environ.pop(key, None)
        if "RAY_AUTH_MODE" in changed:
            reread_ray_config()
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        reset_termination()


__all__ = ["compose", "dry_run", "resume", "run"]
