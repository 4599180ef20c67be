"""What the long waits print while they last: start-up phases and their ticker.

On an interactive stderr (a terminal) a phase opens one line, `[rayflow] spark: starting
Spark (local[2])...`, that a ticker thread redraws in place (\\r) after a few seconds with the
time spent and what it still waits on, and that ends as `... done in 17.2 s`. On any other
stderr (a pipe, a file, a CI log, a Ray worker's log) each phase prints exactly one line, when it
ends, with its time: no \\r, no ticker. A download's phase, with its bytes and rate, is
rayflow.runtime.transfer; Ray's own output on the driver is rayflow.runtime.ray_logs, and how
much a run prints is rayflow.runtime.verbosity.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO, TypeVar

TICK_AFTER_S = 2.0  # a phase shorter than this never ticks
TICK_EVERY_S = 1.0


def interactive(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default: sys.stderr) is a terminal that can take \\r redraws."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or not a real file
        return False


def _width(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return (columns or 120) - 1  # the last column would wrap, and \r redraws one line only


def _fit(head: str, tail: str, width: int) -> str:
    """head + tail within width, shortening the head (what) rather than the numbers."""
    if len(head) + len(tail) <= width:
        return head + tail
    keep = max(0, width - len(tail) - 1)
    return (head[:keep] + "…" + tail)[:width]


def note(text: str, backend: str, stream: TextIO | None = None) -> None:
    """One line, on any stderr."""
    stream = sys.stderr if stream is None else stream
    print(f"[rayflow] {backend}: {text}", file=stream, flush=True)


_PhaseT = TypeVar("_PhaseT", bound="Phase")  # a Phase's `with` gives the phase itself (Transfer)


class Phase:
    """One step of a long wait: `with phase("starting Spark (local[2])", "spark") as p:`.

    p.status(text or callable) says what it waits on now (shown by the ticker); p.done(text)
    replaces the end line's `{what}... done`
    (`applied RayCluster x` -> `applied RayCluster x in 0.3 s`).
    """

    def __init__(
        self,
        what: str,
        backend: str,
        stream: TextIO | None = None,
        tick_after_s: float = TICK_AFTER_S,
        tick_every_s: float = TICK_EVERY_S,
    ):
        self.what = what
        self.prefix = f"[rayflow] {backend}: "
        self.stream = sys.stderr if stream is None else stream
        self.tty = interactive(self.stream)
        self.tick_after_s, self.tick_every_s = tick_after_s, tick_every_s
        self.detail: str | Callable[[], str] | None = None
        self.result: str | None = None
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._live = False  # our line is on the screen, unfinished (the next redraw overwrites it)
        self._at_line_start = True  # what others printed meanwhile ended its line
        self._guard: _LineGuard | None = None

    def status(self, detail: str | Callable[[], str] | None) -> None:
        self.detail = detail

    def done(self, result: str) -> None:
        self.result = result

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _detail(self) -> str:
        detail = self.detail() if callable(self.detail) else self.detail
        return f", {detail}" if detail else ""

    def live(self) -> tuple[str, str]:
        """The redrawn line as (what, numbers): the ticker shortens `what` to fit the terminal."""
        return f"{self.prefix}{self.what}...", f" {self.elapsed:.0f} s{self._detail()}"

    def end_line(self, error: BaseException | None) -> str:
        t = self.elapsed
        if error is not None:
            verb = "failed" if isinstance(error, Exception) else "stopped"
            return f"{self.prefix}{self.what}... {verb} after {t:.1f} s"
        if self.result:
            return f"{self.prefix}{self.result} in {t:.1f} s"
        return f"{self.prefix}{self.what}... done in {t:.1f} s"

    def _draw(self, text: str, end: str = "") -> None:
        with self._lock:
            # Over our own line (or an empty one); after another's unfinished line, below it.
            start = "\r\033[K" if self._live or self._at_line_start else "\n"
            try:
                self.stream.write(start + text + end)
                self.stream.flush()
            except (ValueError, OSError):  # the terminal went away: progress is not worth an error
                pass
            self._live, self._at_line_start = not end, True

    def _make_room(self, text: str) -> None:
        """Another's output is about to reach the terminal (Tune's boxes, a trial's prints): our
        unfinished line is cleared first, so that theirs starts at the line's start; the ticker
        draws ours again under it, once their line has ended."""
        if self._live:
            # the terminal went away: progress is not worth an error
            with contextlib.suppress(ValueError, OSError):
                self.stream.write("\r\033[K")
            self._live = False
        if text:
            self._at_line_start = text.endswith("\n")

    def redraw(self) -> None:
        if self.tty and not self._stop.is_set() and self._at_line_start:
            # Broad on purpose: whatever a status callable (the caller's) raises, a progress line
            # must not end the run
            try:
                head, tail = self.live()
            except Exception:  # noqa: BLE001
                head, tail = f"{self.prefix}{self.what}...", f" {self.elapsed:.0f} s"
            self._draw(_fit(head, tail, _width(self.stream)))

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_every_s):
            if self.elapsed >= self.tick_after_s:
                self.redraw()

    def __enter__(self: _PhaseT) -> _PhaseT:
        self.started = time.monotonic()
        if self.tty:
            self._guard = _LineGuard(self)
            self._draw(_fit(f"{self.prefix}{self.what}...", "", _width(self.stream)))
            self._ticker = threading.Thread(target=self._tick, name="rayflow-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, exc_type, error, tb) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        line = self.end_line(error)
        if self._guard is not None:
            self._guard.remove()
            self._guard = None
        if self.tty:
            self._draw(line, "\n")
        else:
            print(line, file=self.stream, flush=True)


class _GuardedStream:
    """sys.stdout or sys.stderr while a phase's line is live on the terminal: what is written
    through it first clears that line (Phase._make_room)."""

    def __init__(self, stream: TextIO, phase: Phase):
        self._stream, self._phase, self.active = stream, phase, True

    def write(self, text: str) -> int:
        if not self.active:
            return self._stream.write(text)
        with self._phase._lock:
            self._phase._make_room(text)
            return self._stream.write(text)

    def __getattr__(self, name: str):  # flush, isatty, fileno, encoding
        return getattr(self._stream, name)


class _LineGuard:
    """While a phase's line is live on a terminal: sys.stdout, sys.stderr and the streams of
    Ray's log handlers (which hold the stderr of their set-up) go through _GuardedStream."""

    def __init__(self, phase: Phase):
        self.streams = {
            name: _GuardedStream(getattr(sys, name), phase) for name in ("stdout", "stderr")
        }
        for name, guarded in self.streams.items():
            setattr(sys, name, guarded)
        guards = {id(g._stream): g for g in self.streams.values()}
        self.handlers = [
            (h, h.stream, guards[id(h.stream)])
            for h in logging.getLogger("ray").handlers
            if isinstance(h, logging.StreamHandler) and id(h.stream) in guards
        ]
        for handler, _, guarded in self.handlers:
            handler.stream = guarded

    def remove(self) -> None:
        for name, guarded in self.streams.items():
            guarded.active = False  # a stream someone kept a reference to passes text through
            if getattr(sys, name) is guarded:  # else another swapped it since: theirs to put back
                setattr(sys, name, guarded._stream)
        for handler, original, guarded in self.handlers:
            if handler.stream is guarded:
                handler.stream = original


def phase(what: str, backend: str, stream: TextIO | None = None, **kwargs) -> Phase:
    """A context manager that prints a phase of a long wait (see Phase)."""
    return Phase(what, backend, stream, **kwargs)


__all__ = ["Phase", "interactive", "note", "phase"]
