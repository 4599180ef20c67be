"""The undo stack the local Kubernetes' parts share: each step registers its undo once it has
succeeded; stopping unwinds them newest first, past a failing one, and then says what failed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable


class Stack:
    """A context manager over `start()` and `stop()`: a failed start stops what it had started.
    Subclasses (dataclasses) start in `start()` and register with `undo(what, fn)`."""

    error: type[Exception] = RuntimeError

    def undo(self, what: str, fn: Callable[[], None]) -> None:
        self.__dict__.setdefault("_steps", []).append((what, fn))

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        steps, failed = self.__dict__.setdefault("_steps", []), []
        while steps:
            what, fn = steps.pop()
            try:
                fn()
            except (OSError, subprocess.SubprocessError, RuntimeError) as err:
                failed.append(f"{what}: {err}")
        if failed:
            raise self.error(f"stopping {type(self).__name__}: " + "; ".join(failed))

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
