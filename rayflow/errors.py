"""Every exception rayflow raises for users or catches between its layers, in one place.

What a user can fix is one of these, printed by the CLI as one line
(`rayflow: error: <key>: <message>`) with its exit code; anything else is a bug in rayflow
and keeps its traceback. `rayflow.run` raises them as they are.

| exception        | when                                                  | CLI exit |
| ---------------- | ----------------------------------------------------- | -------- |
| ConfigError      | bad input, found before anything starts               | 2        |
| ClusterError     | the cluster could not be started or reached           | 1        |
| DataError        | the data could not be fetched or read                 | 1        |
| JobError         | the Jobs API refused a submitted run, or went away    | 1        |
| RunFailed        | the run started, and trials or the job failed         | 1        |
| RunInterrupted   | Ctrl-C / a kernel interrupt, after teardown           | 130      |
| Terminated       | SIGTERM / SIGHUP, after teardown                      | 128 + N  |
"""

from __future__ import annotations

from typing import Any, overload


class ConfigError(ValueError):
    """Bad user input. `key` is the dotted config key (or override) at fault."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class ClusterError(RuntimeError):
    """The cluster could not be started or reached, for a reason the user can act on (an image
    that cannot be pulled, a pod nothing can schedule, a head that does not start, credentials
    refused): one line, exit 1."""


class DataError(RuntimeError):
    """The data set could not be fetched, verified or read: one line, exit 1."""


class JobError(RuntimeError):
    """The Jobs API refused or could not be reached (a wrong token, a head that went away, a
    package too big to upload): one line for the user, as the CLI prints it."""


class RunFailed(RuntimeError):
    """The run started but could not finish: trials errored, or a demand could never be placed.
    The CLI prints the message as one line and exits 1. `.result`: what the run left (resumable)."""

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (a notebook's interrupt) stopped the run; what it started is torn down and its
    state saved: `.result.resume()` continues it. The CLI prints the message and exits 130."""

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


class Terminated(SystemExit):
    """Raised in the main thread when the process receives SIGTERM or SIGHUP; its code is
    128 + the signal's number. A SystemExit, so every `finally` (teardown) runs."""


@overload
def first_error_line(error: BaseException | str) -> str: ...


@overload
def first_error_line(error: BaseException | str | None) -> str | None: ...


def first_error_line(error: BaseException | str | None) -> str | None:
    """The line of a trial's error a user acts on: the exception itself, the last line of a
    remote traceback (Ray wraps a trial's exception in RayTaskError with the whole traceback)."""
    if error is None:
        return None
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


__all__ = [
    "ClusterError",
    "ConfigError",
    "DataError",
    "JobError",
    "RunFailed",
    "RunInterrupted",
    "Terminated",
    "first_error_line",
]
