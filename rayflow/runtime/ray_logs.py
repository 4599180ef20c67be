"""Ray's own output on the driver: uncoloured off a terminal, settled before the results.

Ray colours its log records and its deduplicated worker logs whatever the stream
(`plain_ray_logs` drops the codes where stderr is not a terminal); it prints the worker logs still
on their way, and those its deduplicator holds back, only at ray.shutdown, below a run's results
(`settle_ray_logs` prints them first); and its workers' tracebacks as it stops them reach the
terminal (`shutdown_ray` leaves them out). Kept apart from the progress lines
(rayflow.runtime.progress), which are rayflow's own.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
from typing import TextIO

from rayflow.runtime import ray_internals
from rayflow.runtime.progress import interactive

# A terminal's colour and cursor codes (rayflow.runtime.verbosity reads the autoscaler's lines
# without them)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _PlainText(logging.Filter):
    """Drops colour codes from a log record (Ray colours its dashboard URL whatever the stream)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = ANSI.sub("", record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(ANSI.sub("", a) if isinstance(a, str) else a for a in record.args)
        # a trial's error: Ray colours the task's name in it
        if record.exc_info and not record.exc_text:
            record.exc_text = ANSI.sub("", logging.Formatter().formatException(record.exc_info))
        return True


class _PlainWriter:
    """A text stream that drops colour codes on their way to the stream it wraps: Ray colours
    the "[repeated Nx across cluster]" of its deduplicated worker logs whatever the stream."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(ANSI.sub("", text))

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
    arrived = [time.monotonic()]
    name = "rayflow_settle_logs"
    dispatcher = ray_internals.worker_log_dispatcher()
    dispatcher.add_handler(name, lambda data: arrived.__setitem__(0, time.monotonic()))
    deadline = time.monotonic() + max_s
    try:
        while time.monotonic() < deadline and time.monotonic() - arrived[0] < quiet_s:
            time.sleep(0.05)
    finally:
        dispatcher.remove_handler(name)
    _flush_deduplicated()


def _flush_deduplicated() -> None:
    """What ray.shutdown prints of the deduplicators (ray._private.worker.disconnect), now, under
    the dispatcher's lock: the log thread prints nothing meanwhile."""
    lock = ray_internals.worker_log_lock()
    ignore_prefix = ray_internals.ignore_worker_log_prefix()
    with lock:
        ray_internals.flush_worker_log_deduplicators(ignore_prefix)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def shutdown_ray() -> None:
    """ray.shutdown() of this driver, without showing what its workers print as Ray stops them
    (an actor's `__del__` cut short by the SIGTERM: a traceback ending in `SystemExit: 1`, under
    a run's results). What they printed before the stop is let through first (settle_ray_logs)."""
    import ray

    settle_ray_logs(quiet_s=0.2, max_s=LOGS_WAIT_MAX_S)
    # the handler ray.init(log_to_driver=True) adds, and ray.shutdown removes
    ray_internals.worker_log_dispatcher().remove_handler("ray_print_logs")
    ray.shutdown()


__all__ = ["ANSI", "plain_ray_logs", "settle_ray_logs", "shutdown_ray"]
