"""rayflow as a Python call, for notebooks (Databricks, Jupyter) and scripts.

The same product as `python -m rayflow`: the same overrides and Hydra composition, the same
preflight of every job before any starts, the same run, output and teardown. What differs is
what a caller gets: a RunResult instead of a table alone, exceptions instead of exit codes
(ConfigError with its `.key`, RunFailed, RunInterrupted), and the process left as it was
found, so the next call in the same kernel starts clean: environment variables, signal
handlers, Ray's auth config and connection, the pooled cluster, a recorded signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from omegaconf import DictConfig

from rayflow.config import ConfigError
from rayflow.result import RunResult

_HANDLED = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def _composed(call):
    """Hydra's and OmegaConf's composition errors as rayflow's one-line ConfigError."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rayflow.cli import one_line

    try:
        return call()
    except (HydraException, OmegaConfBaseException) as err:
        raise one_line(err) from None
    finally:
        GlobalHydra.instance().clear()


def compose(*overrides: str) -> DictConfig:
    """The config `python -m rayflow OVERRIDES` composes, for inspection (nothing is checked)."""
    from rayflow.cli import compose_config

    return _composed(lambda: compose_config(*map(str, overrides)))


def dry_run(*overrides: str) -> str:
    """The cluster spec (YAML, secrets masked) that `run(*overrides)` would start or join, after
    the full preflight. Starts nothing."""
    from rayflow.session import check_config, spec_text

    cfg = compose(*overrides, "dry_run=true")
    return _composed(lambda: spec_text(check_config(cfg)))


def run(*overrides: str, multirun: bool = False) -> RunResult | list[RunResult]:
    """Run the job `python -m rayflow OVERRIDES` runs (`-m OVERRIDES` with multirun=True: one
    job per point of the sweep, sharing one cluster, a list of results) in this process.

    Raises ConfigError before anything starts, RunFailed when a trial or the cluster fails,
    and RunInterrupted (a KeyboardInterrupt) on Ctrl-C or a kernel interrupt, after tearing
    down what it started; the experiment stays resumable (`err.result.resume()`).
    """
    from rayflow.cli import _sweep_points
    from rayflow.session import check_config, run_job

    _not_connected_to_ray()
    points = _composed(lambda: _sweep_points(list(map(str, overrides)), multirun))
    configs = []
    for point in points:  # every job's preflight before the first starts, as the CLI does
        cfg = compose(*point)
        _composed(lambda: check_config(cfg))
        if cfg.dry_run:
            raise ConfigError("dry_run", "use rayflow.dry_run(...) for the spec; run() runs the job")
        configs.append(cfg)
    results = []
    with _process_state_restored():
        for point, cfg in zip(points, configs):
            results.append(run_job(cfg, overrides=point, keep_cluster=multirun))
    return results if multirun else results[0]


def _not_connected_to_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        raise ConfigError("backend", "this Python process is already connected to Ray (ray.init); rayflow "
                          "connects and disconnects itself: call ray.shutdown() first (a cluster it "
                          "joined keeps running; run on it with backend=attach backend.address=...)")


@contextlib.contextmanager
def _process_state_restored():
    """Put back what a job changes in the process, however it ends (a notebook kernel lives on)."""
    from rayflow.backends.base import reset_termination
    from rayflow.cluster_pool import POOL

    env = dict(os.environ)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _HANDLED} if main else {}
    reset_termination()
    try:
        yield
    finally:
        POOL.release()  # the cluster of the last job of a multirun, or of a job that failed
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # a backend's teardown left the driver connected
            ray.shutdown()
        changed = {k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)}
        for key in changed:
            if key in env:
                os.environ[key] = env[key]
            else:
                os.environ.pop(key, None)
        if "RAY_AUTH_MODE" in changed and "ray._raylet" in sys.modules:
            sys.modules["ray._raylet"].Config.initialize("")  # Ray's C++ config re-reads the mode
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        reset_termination()


__all__ = ["compose", "dry_run", "run"]
