"""The interface every backend implements, shaped like Hydra's launcher plugins.

A backend turns the `backend:` config section into a running Ray cluster and back:
`render` says what it would start (YAML), `start` starts or joins it and returns its
address, `stop` stops whatever `start` started and may be called any number of times.
Used as a context manager it always stops what it started: on success, on an exception,
on Ctrl-C and on SIGTERM/SIGHUP (turned into SystemExit so `finally` blocks run).
Heavy imports (ray, pyspark, kubernetes) belong inside the methods.
"""

from __future__ import annotations

import abc
import os
import signal
import sys
import threading
from typing import Any

from omegaconf import DictConfig

_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(SystemExit):
    """Raised in the main thread when the process receives SIGTERM or SIGHUP."""


_received: list[int] = []


def _raise_terminated(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Terminated(128 + signum)


def termination_exit_code() -> int | None:
    """128 + the terminating signal received, if any. Ray's C++ calls (ray.wait) turn the
    SystemExit our handler raises into SystemExit(1), so the code is kept here as well."""
    return 128 + _received[-1] if _received else None


def apply_auth_mode(mode: str) -> None:
    """Export RAY_AUTH_MODE for this driver and everything it starts.

    Ray reads the mode into its C++ config when it is first imported; a driver that
    imported ray earlier (a notebook, a test) would keep the old mode and then fail with
    InvalidAuthToken against the cluster it just started, so the config is re-read, as
    Ray's own token setup does.
    """
    os.environ["RAY_AUTH_MODE"] = mode
    if "ray._raylet" in sys.modules:
        sys.modules["ray._raylet"].Config.initialize("")


class ClusterBackend(abc.ABC):
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg  # the whole run config; backends read cfg.backend
        self.address: str | None = None
        self._old_handlers: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return str(self.cfg.backend.name)

    def check(self) -> None:
        """Preflight: raise ConfigError for bad `backend.*` keys; must start nothing."""

    def tags(self) -> dict:
        """Tags for the invocation's MLflow parent run (beyond the spec)."""
        return {}

    def metrics(self) -> dict:
        """Metrics for the parent run once the cluster is up (start-up timings, say)."""
        return {}

    def cluster_gpus(self) -> float | None:
        """GPUs the cluster would offer, when known before it starts (None: ask it later)."""
        return None

    @abc.abstractmethod
    def render(self) -> str:
        """The cluster spec this backend starts or joins, as YAML text."""

    @abc.abstractmethod
    def start(self) -> str:
        """Start (or join) the cluster, connect this driver to it, return its address."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Disconnect, and stop what start() started. Idempotent."""

    def _catch_termination(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in _TERMINATING:
                previous = signal.signal(sig, _raise_terminated)
                self._old_handlers.setdefault(sig, previous)

    def __enter__(self) -> "ClusterBackend":
        apply_auth_mode(str(self.cfg.ray_auth_mode))  # driver, cluster and workers agree
        self._catch_termination()
        try:
            self.address = self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        # ray.init installs a C++ SIGTERM handler that aborts the driver without cleanup:
        # take the signal back so SIGTERM unwinds through finally blocks and stop().
        self._catch_termination()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.stop()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()
