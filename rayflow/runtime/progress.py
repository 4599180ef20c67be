"""What the long waits print while they last: start-up phases, a ticker, download progress.

On an interactive stderr (a terminal) a phase opens one line, `[rayflow] spark: starting
Spark (local[2])...`, that a ticker thread redraws in place (\\r) after a few seconds with the
time spent and what it still waits on, and that ends as `... done in 17.2 s`; a download
redraws bytes, rate and time left, as torchvision's does. On any other stderr (a pipe, a file,
a CI log, a Ray worker's log) each phase prints exactly one line, when it ends, with its time:
no \\r, no ticker.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO, TypeVar

TICK_AFTER_S = 2.0  # a phase shorter than this never ticks
TICK_EVERY_S = 1.0
REDRAW_EVERY_S = 0.2  # a download redraws at most this often
RATE_WINDOW_S = 5.0  # the rate (and time left) of a download is over its last seconds


def interactive(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default: sys.stderr) is a terminal that can take \\r redraws."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or not a real file
        return False


def format_size(n: float) -> str:
    """Bytes in decimal units, as downloads are usually quoted: 170498071 -> '170.5 MB'."""
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000.0
        if n < 999.95 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    return format_size(bytes_per_s) + "/s"


def format_duration(seconds: float) -> str:
    """A short span for 'time left': '8 s', '2 min 05 s', '1 h 02 min'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def time_left(done: int, total: int | None, rate: float) -> float | None:
    """Seconds until `total` at `rate`; None when that cannot be known."""
    if not total or rate <= 0 or done > total:
        return None
    return (total - done) / rate


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


class Transfer(Phase):
    """A download:
    `with Transfer("downloading x.tar.gz", "data") as t: t.expect(total); t.update(n)...`.

    On a terminal: `[rayflow] data: downloading x.tar.gz: 76.5 MB / 170.5 MB (45%), 6.2 MB/s,
    15 s left`, redrawn; the end line (any stderr) gives the size and mean rate.
    """

    def __init__(self, what: str, backend: str, stream: TextIO | None = None, **kwargs):
        kwargs.setdefault("tick_after_s", 0.0)  # a stalled download shows its rate falling at once
        super().__init__(what, backend, stream, **kwargs)
        self.total: int | None = None
        self.bytes = 0
        self.transfer_s: float | None = None  # set when the bytes are all there
        self._window: collections.deque = collections.deque()
        self._drawn = 0.0

    def expect(self, total: int | None) -> None:
        self.total = total if total and total > 0 else None

    def update(self, n: int) -> None:
        self.bytes += n
        now = time.monotonic()
        self._window.append((now, self.bytes))
        while len(self._window) > 2 and now - self._window[0][0] > RATE_WINDOW_S:
            self._window.popleft()
        if self.tty and now - self._drawn >= REDRAW_EVERY_S:
            self._drawn = now
            self.redraw()

    def finished(self) -> None:
        """The bytes are all there (what follows, e.g. unpacking, is not transfer time)."""
        self.transfer_s = self.elapsed

    def rate(self) -> float:
        """Bytes per second over the last RATE_WINDOW_S (falling while nothing arrives)."""
        if self.transfer_s is not None:
            return self.mean_rate()
        if not self._window:
            return 0.0
        first_t, first_b = self._window[0]
        if len(self._window) == 1:
            first_t, first_b = self.started, 0
        span = time.monotonic() - first_t
        return (self.bytes - first_b) / span if span > 0 else 0.0

    def mean_rate(self) -> float:
        span = self.transfer_s if self.transfer_s is not None else self.elapsed
        return self.bytes / span if span > 0 else 0.0

    def summary(self) -> str:
        """'170.5 MB at 6.2 MB/s' (the mean rate of the transfer)."""
        return f"{format_size(self.bytes)} at {format_rate(self.mean_rate())}"

    def live(self) -> tuple[str, str]:
        if self.transfer_s is not None:  # unpacking, checking: a plain phase line from here
            return (
                f"{self.prefix}{self.what}: {self.summary()}",
                f"{self._detail()}... {self.elapsed:.0f} s",
            )
        rate = self.rate()
        if self.total:
            left = time_left(self.bytes, self.total, rate)
            numbers = (
                f" {format_size(self.bytes)} / {format_size(self.total)} "
                f"({100 * self.bytes // self.total}%), {format_rate(rate)}, "
                f"{format_duration(left) + ' left' if left is not None else 'time left unknown'}"
            )
        else:
            numbers = f" {format_size(self.bytes)}, {format_rate(rate)}, {self.elapsed:.0f} s"
        return f"{self.prefix}{self.what}:", numbers

    def end_line(self, error: BaseException | None) -> str:
        if error is None and self.result is None:
            return f"{self.prefix}{self.what}: {self.summary()}, done in {self.elapsed:.1f} s"
        if error is not None and self.bytes:
            return super().end_line(error) + f" ({format_size(self.bytes)} received)"
        return super().end_line(error)


__all__ = [
    "Phase",
    "Transfer",
    "format_duration",
    "format_rate",
    "format_size",
    "interactive",
    "level",
    "note",
    "phase",
    "plain_ray_logs",
    "settle_ray_logs",
    "shutdown_ray",
    "time_left",
    "tune_verbose",
    "autoscaler_line",
    "autoscaler_lines",
]


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _PlainText(logging.Filter):
    """Drops colour codes from a log record (Ray colours its dashboard URL whatever the stream)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = _ANSI.sub("", record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_ANSI.sub("", a) if isinstance(a, str) else a for a in record.args)
        # a trial's error: Ray colours the task's name in it
        if record.exc_info and not record.exc_text:
            record.exc_text = _ANSI.sub("", logging.Formatter().formatException(record.exc_info))
        return True


class _PlainWriter:
    """A text stream that drops colour codes on their way to the stream it wraps: Ray colours
    the "[repeated Nx across cluster]" of its deduplicated worker logs whatever the stream."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(_ANSI.sub("", text))

    def __getattr__(self, name: str):  # flush, isatty, fileno, encoding, a kernel's own attributes
        return getattr(self._stream, name)


@contextlib.contextmanager
def plain_ray_logs(stream: TextIO | None = None):
    """While a job runs, where stderr is not a terminal (a pipe, a CI log, a notebook cell):
    Ray's log records and the worker logs it prints on stdout/stderr without colour codes.
    (Its worker-log prefixes also follow RAY_COLOR_PREFIX=0.)"""
    if interactive(stream):
        yield
        return
    handlers = logging.getLogger("ray").handlers  # Ray's own stderr handler, set up on import
    plain = _PlainText()
    for handler in handlers:
        handler.addFilter(plain)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PlainWriter(sys.stdout), _PlainWriter(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for handler in handlers:
            handler.removeFilter(plain)


# --- how much a run prints (the root key `verbose`) ----------------------------------------------

QUIET, CLUSTER, TUNE_TABLES, TUNE_RESULTS = 0, 1, 2, 3  # what each level adds: rayflow.schema.root


def level(value) -> int:
    """The `verbose` key as a level: false is 0 (quiet), true is 2 (Tune's tables), an int
    itself."""
    if isinstance(value, bool):
        return TUNE_TABLES if value else QUIET
    return int(value or 0)


def tune_verbose(value) -> int:
    """Tune's own `verbose` for rayflow's level: 0 (silent) below 2, then Tune's 1 (status
    tables, trial start and end boxes) and 2 (a box per reported result)."""
    return max(0, level(value) - 1)


# --- Ray's worker logs before the results --------------------------------------------------------

LOGS_QUIET_S = 0.5  # no worker log line for this long: what the trials printed has arrived
LOGS_WAIT_MAX_S = 3.0  # a worker that keeps printing does not hold the results back longer


def settle_ray_logs(quiet_s: float = LOGS_QUIET_S, max_s: float = LOGS_WAIT_MAX_S) -> None:
    """Print what Ray still owes the driver's terminal before rayflow prints the results: the
    worker log lines on their way (waiting, at most max_s, until none has arrived for quiet_s),
    and the lines its deduplicator holds back (`[repeated 9x across cluster]`), which Ray itself
    prints only at ray.shutdown, below the results block. Nothing when this process is not
    connected to Ray (a submitted run's job prints them in its own log, before its results)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from ray._private import ray_logging, worker

    arrived = [time.monotonic()]
    name = "rayflow_settle_logs"
    ray_logging.global_worker_stdstream_dispatcher.add_handler(
        name, lambda data: arrived.__setitem__(0, time.monotonic())
    )
    deadline = time.monotonic() + max_s
    try:
        while time.monotonic() < deadline and time.monotonic() - arrived[0] < quiet_s:
            time.sleep(0.05)
    finally:
        ray_logging.global_worker_stdstream_dispatcher.remove_handler(name)
    _flush_deduplicated(ray_logging, worker)


def _flush_deduplicated(ray_logging, worker) -> None:
    """What ray.shutdown prints of the deduplicators (ray._private.worker.disconnect), now, under
    the dispatcher's lock: the log thread prints nothing meanwhile."""
    lock = (
        getattr(ray_logging.global_worker_stdstream_dispatcher, "_lock", None)
        or contextlib.nullcontext()
    )
    ignore_prefix = worker._should_ignore_worker_log_prefix(worker.global_worker)
    with lock:
        for leftover in ray_logging.stdout_deduplicator.flush():
            worker.print_worker_logs(leftover, sys.stdout, ignore_prefix)
        for leftover in ray_logging.stderr_deduplicator.flush():
            worker.print_worker_logs(leftover, sys.stderr, ignore_prefix)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def shutdown_ray() -> None:
    """ray.shutdown() of this driver, without showing what its workers print as Ray stops them
    (an actor's `__del__` cut short by the SIGTERM: a traceback ending in `SystemExit: 1`, under
    a run's results). What they printed before the stop is let through first (settle_ray_logs)."""
    import ray
    from ray._private import ray_logging

    settle_ray_logs(quiet_s=0.2, max_s=LOGS_WAIT_MAX_S)
    # the handler ray.init(log_to_driver=True) adds, and ray.shutdown removes
    ray_logging.global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
    ray.shutdown()


# --- the autoscaler's lines in a run's output ----------------------------------------------------

_AUTOSCALER = re.compile(r"^\(autoscaler \+[^)]*\) (.*)$")
# Ray's event lines (autoscaler v1 and v2): "Adding 1 node(s) of type ray.worker.cpu.",
# "Removing 2 nodes of type ray.worker.cpu (idle).",
# "Restarting 1 nodes of type x (lost contact with raylet)."
_SCALE = re.compile(
    r"^(Adding|Removing|Restarting|Failed to launch) (\d+) nodes?(?:\(s\))? of type (\S+?)\.?"
    r"(?: \(([^)]*)\))?\.?(?:: (.*))?$"
)
# What each says happened: "Adding" is a node the provider created (node_launcher.py), not one
# that joined, so a node launched and stopped between two samples of the peak (rayflow.runtime.
# node_usage) is counted here and not there.
_VERBS = {
    "Adding": "launched",
    "Removing": "stopping",
    "Restarting": "restarting",
    "Failed to launch": "failed to launch",
}


def autoscaler_line(line: str) -> str | None:
    """A line of a run's output as `verbose=0` shows it: not the autoscaler's, as it is; a scale
    event, one line (`[rayflow] autoscaler: launched 1 worker (ray.worker.cpu)`), a failed launch
    with its reason; an error or a warning of the autoscaler's (an infeasible request), as it is:
    it says why a run waits; the rest (`Resized to 8 CPUs.`, Ray's tip on `ray status`), None:
    left out."""
    match = _AUTOSCALER.match(_ANSI.sub("", line).rstrip("\r\n"))
    if match is None:
        return line
    text = match.group(1)
    scale = _SCALE.match(text)
    if scale:
        verb, count, node_type, why, reason = scale.groups()
        n = int(count)
        # rayflow's vm types: rayflow_worker_cpu, _gpu
        kind = node_type.removeprefix("rayflow_worker_")
        detail = ", ".join(filter(None, (kind, why)))
        workers = f"{n} worker{'s' if n != 1 else ''}"
        return f"[rayflow] autoscaler: {_VERBS[verb]} {workers} ({detail})" + (
            f": {reason}" if reason else ""
        )
    if text.startswith(("Error:", "Warning:", "No available node types")):
        return line
    return None


def autoscaler_lines(lines, verbose=0) -> list[str]:
    """The lines of a run's output with the autoscaler's summarised (autoscaler_line), unless
    `verbose` (the root key) asks for its own lines."""
    if level(verbose) >= CLUSTER:
        return list(lines)
    return [shown for shown in map(autoscaler_line, lines) if shown is not None]
