"""What a job sets in this process's environment, and how it is put back: variables for one job,
and Ray's auth mode, which an imported Ray must re-read. A notebook kernel outlives many jobs, so
each is undone (rayflow.api)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from rayflow.runtime import ray_internals


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
    ray_internals.reread_config_if_imported()


@contextlib.contextmanager
def scoped_env(values: dict[str, str]) -> Iterator[None]:
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
