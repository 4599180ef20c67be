"""The terminating signals, while a cluster lives: SIGTERM and SIGHUP become `Terminated` (a
SystemExit), so every teardown's `finally` runs, as Ctrl-C's KeyboardInterrupt does. A notebook
kernel outlives many jobs: the handlers it had are put back when the cluster goes (rayflow.api)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rayflow.errors import Terminated

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class _SignalLog:
    """The terminating signals this process received. Process-wide: a signal is delivered to the
    process, and its handler is called with nothing but the signal and a frame, so what it
    records can belong to no object of a run; its one instance is `_LOG`."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def record(self, signum: int) -> None:
        self.received.append(signum)

    def exit_code(self) -> int | None:
        return 128 + self.received[-1] if self.received else None

    def clear(self) -> None:
        self.received.clear()


_LOG = _SignalLog()


def raise_terminated(signum: int, frame: Any) -> None:
    _LOG.record(signum)
    raise Terminated(128 + signum)


def termination_exit_code() -> int | None:
    """128 + the terminating signal this job received, if any. Ray's C++ calls (ray.wait) turn
    the SystemExit our handler raises into SystemExit(1), so the code is kept here as well."""
    return _LOG.exit_code()


def reset_termination() -> None:
    """Forget a signal an earlier job in this process received (a multirun, a notebook)."""
    _LOG.clear()


class Terminations:
    """Turns the terminating signals into `Terminated` from `catch()` until `restore()` puts back
    the handlers found first. Only the main thread may set handlers: elsewhere both do nothing."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def catch(self) -> None:
        """(Again:) ray.init installs a C++ SIGTERM handler that aborts the driver without clean-up;
        catching once more after it takes the signal back."""
        if threading.current_thread() is threading.main_thread():
            for sig in TERMINATING:
                self._previous.setdefault(sig, signal.signal(sig, raise_terminated))

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@contextlib.contextmanager
def terminations_raise() -> Iterator[Terminations]:
    """SIGTERM and SIGHUP raise `Terminated` while the block runs (`.catch()` again after something
    took them over); the handlers found are put back when it ends."""
    terminations = Terminations()
    terminations.catch()
    try:
        yield terminations
    finally:
        terminations.restore()
