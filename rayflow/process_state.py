"""What a job changes in this process, and how it is put back: the terminating signals it turns
into an exception (so every teardown's `finally` runs), the environment it sets for one job, and
Ray's auth mode. A notebook kernel outlives many jobs, so each is undone (rayflow.api)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

from rayflow.errors import Terminated

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


_received: list[int] = []


def raise_terminated(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Terminated(128 + signum)


def termination_exit_code() -> int | None:
    """128 + the terminating signal this job received, if any. Ray's C++ calls (ray.wait) turn
    the SystemExit our handler raises into SystemExit(1), so the code is kept here as well."""
    return 128 + _received[-1] if _received else None


def reset_termination() -> None:
    """Forget a signal an earlier job in this process received (a multirun, a notebook)."""
    _received.clear()


def apply_auth_mode(mode: str) -> None:
    """Export RAY_AUTH_MODE for this driver and everything it starts.

    Ray reads the mode into its C++ config when it is first imported; a driver that
    imported ray earlier (a notebook, a test) would keep the old mode and then fail with
    InvalidAuthToken against the cluster it just started, so the config is re-read, as
    Ray's own token setup does.
    """
    os.environ["RAY_AUTH_MODE"] = mode
    reread_ray_config()


def reread_ray_config() -> None:
    """Make an imported Ray re-read its C++ config (the auth mode) from the environment."""
    if "ray._raylet" in sys.modules:
        sys.modules["ray._raylet"].Config.initialize("")


@contextlib.contextmanager
def scoped_env(values: dict[str, str]):
    """Set environment variables for one job and put back what was there (notebooks, multirun)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
