"""A run's log file, and what the terminal shows of Ray's, MLflow's and alembic's own logging.

At `verbose=0` a run's terminal shows rayflow's lines, the trials' own output, and the libraries'
warnings and errors. The rest goes to the run's log file only (`rayflow.log` in the experiment
folder, and into the MLflow parent run), from `verbose=1` to the terminal too:
- in this process, the INFO records of the libraries' loggers (Ray's "Started a local Ray
  instance", Tune's "Wrote the latest version of all result files", PBT's exploit lines, MLflow's
  and alembic's table creation), and Tune's "Remote file not found" warning, one per trial a PBT
  exploit copies (SHOWN_FROM);
- of what Ray forwards from its workers (log_to_driver): the INFO lines Ray's own libraries log
  in trial and training processes (RAY_WORKER_INFO: a checkpoint saved or restored, a worker
  group started, a result reported), the lines of Ray's C++ core worker below FATAL (glog's
  "[time E pid tid] file.cc:N: ..."), and the `Exception ignored in ...` blocks of a `__del__`
  cut short by SystemExit or KeyboardInterrupt as Ray stops a worker.

Why worker lines are told apart by their text, on the driver: Ray prints its workers' lines in
this process, without their level (a worker's Ray logger writes "%(message)s"). Setting levels
inside the workers would take a runtime_env on every job (a setup hook), which costs trials
their prestarted workers and needs rayflow importable on an attached cluster's nodes; Ray's
LoggingConfig would also hide the trials' own INFO logging. So RAY_WORKER_INFO names each line
with the module of Ray that logs it, and a test checks that the installed Ray still does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from rayflow.runtime import ray_internals
from rayflow.security.redaction import mask_text

# Libraries that print through a stream handler of their own (their loggers do not propagate)
LIBRARY_LOGGERS = ("ray", "mlflow", "alembic")
# Libraries whose records go on to the root logger's handlers, which Hydra's job logging sets
# up: matplotlib's "generated new fontManager", on a machine's (a fresh node's) first plot
PROPAGATING_LOGGERS = ("matplotlib",)
# The least level a record of each logger (and its children: the longest name wins) needs to be
# shown at verbose=0
SHOWN_FROM = {
    "ray": logging.WARNING,
    "ray.tune.logger.logger": logging.ERROR,  # "Remote file not found": results written anew
    "mlflow": logging.WARNING,
    "alembic": logging.WARNING,
    "matplotlib": logging.WARNING,
}

# The INFO lines Ray's libraries log in trial and training processes, by the module (under ray/)
# that logs them, with the start of the line; and the lines a message goes on with.
RAY_WORKER_INFO = (
    ("train/_internal/storage.py", "Checkpoint successfully created at: "),
    ("train/v2/_internal/execution/storage.py", "Checkpoint successfully created at: "),
    ("tune/trainable/trainable.py", "Restored on "),
    ("train/torch/config.py", "Setting up process group for: "),
    ("train/torch/train_loop_utils.py", "Moving model to device: "),
    ("train/torch/train_loop_utils.py", "Wrapping provided model in "),
    ("train/v2/torch/train_loop_utils.py", "Moving model to device: "),
    ("train/v2/torch/train_loop_utils.py", "Wrapping provided model in "),
    ("train/v2/_internal/execution/scaling_policy/scaling_policy.py", "Requesting resources: "),
    (
        "train/v2/_internal/execution/worker_group/worker_group.py",
        "Attempting to start training worker group of size ",
    ),
    (
        "train/v2/_internal/execution/worker_group/worker_group.py",
        "Started training worker group of size ",
    ),
    ("train/v2/_internal/execution/context.py", "Reporting training result "),
)
_WORKER_INFO = re.compile("|".join(re.escape(start) for _, start in RAY_WORKER_INFO))
_GOES_ON = re.compile(r"- \(ip=")  # a worker group's members, one line each
# Ray's C++ core (glog): "[2026-11-29 01:00:03,786 E 22170 22209] core_worker.cc:2465: ..."
_CORE_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWE] \d+ \d+\] \S+:\d+: ")
_IGNORED = "Exception ignored in"
_STOPPED = re.compile(r"(SystemExit|KeyboardInterrupt)\b")
BLOCK_MAX = 200  # lines of an `Exception ignored` block held back before it is shown anyway


def shown_from(name: str) -> int:
    """The least level of SHOWN_FROM for a logger's records."""
    found = [k for k in SHOWN_FROM if name == k or name.startswith(k + ".")]
    return SHOWN_FROM[max(found, key=len)] if found else logging.NOTSET


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= shown_from(record.name)


class WorkerLines:
    """Which lines of a worker's output verbose=0 leaves off the terminal, one process at a time:
    a line of RAY_WORKER_INFO (with its continuation lines), a core-worker line, and an
    `Exception ignored` block that ends in SystemExit or KeyboardInterrupt (held until its last
    line says which)."""

    def __init__(self) -> None:
        self._going_on: set[object] = set()  # processes whose last line was hidden Ray INFO
        self._blocks: dict[object, list[str]] = {}

    def split(self, pid: object, lines: list[str]) -> list[tuple[str, bool]]:
        """`lines` of process `pid` as (line, hidden), in order (a block's once it has ended)."""
        out: list[tuple[str, bool]] = []
        for line in lines:
            block = self._blocks.get(pid)
            if block is not None:
                block.append(line)
                # a traceback's lines are indented (a blank one too: Python prints one before
                # the frame that raised, in a signal handler's); its last line is the exception
                in_block = not line.strip() or line.startswith((" ", "Traceback", _IGNORED))
                if not in_block or len(block) > BLOCK_MAX:
                    del self._blocks[pid]
                    stop = bool(_STOPPED.match(line))
                    out.extend((held, stop) for held in block)
                continue
            if line.startswith(_IGNORED):
                self._blocks[pid] = [line]
                continue
            continued = pid in self._going_on and _GOES_ON.match(line)
            if continued or _WORKER_INFO.match(line) or _CORE_LINE.match(line):
                self._going_on.add(pid)
                out.append((line, True))
            else:
                self._going_on.discard(pid)
                out.append((line, False))
        return out

    def held(self) -> list[str]:
        """The lines of blocks not yet ended (shown: nothing says they are a stop's)."""
        lines = [line for block in self._blocks.values() for line in block]
        self._blocks.clear()
        return lines


class RunLog:
    """The run's log file (appended to, masked), and the terminal's share of the libraries'
    logging and of Ray's worker lines; `hidden` counts the lines the terminal did not show."""

    def __init__(self, path: Path | None, verbose_level: int) -> None:
        self.path = path
        self.quiet = verbose_level < 1
        self.hidden = 0
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            self._file = _opened(path)
            self.path = path if self._file is not None else None
        self._workers = WorkerLines()
        self._rays_printer = None

    def write(self, line: str, hidden: bool = False) -> None:
        with self._lock:
            self.hidden += hidden and self.quiet
            if self._file is not None:
                self._file.write(mask_text(line.rstrip("\n")) + "\n")
                self._file.flush()

    # --- Ray's worker lines -------------------------------------------------------------------

    def take_worker_lines(self) -> None:
        """Ray's printer of its workers' lines (ray.init(log_to_driver=True)) replaced by this
        log's, once Ray is connected: every line into the file, the shown ones printed as Ray
        does (its deduplication included)."""
        dispatcher = ray_internals.worker_log_dispatcher()
        printers = ray_internals.worker_log_handlers("ray_print_logs")
        if not printers or self._rays_printer is not None:
            return  # not connected with log_to_driver, or taken already
        self._rays_printer = printers[0]
        ignore_prefix = ray_internals.ignore_worker_log_prefix()
        dispatcher.remove_handler("ray_print_logs")
        # by Ray's name: ray.shutdown removes it as it removes its own
        dispatcher.add_handler(
            "ray_print_logs", functools.partial(self._worker_batch, ignore_prefix=ignore_prefix)
        )

    def _worker_batch(self, data: dict, ignore_prefix: bool) -> None:
        lines, pid = list(data.get("lines") or []), data.get("pid")
        if pid == "autoscaler":  # the monitor's whole log: Ray prints its events only
            ray_internals.print_worker_lines(data, ignore_prefix)
            return
        # all of them shown from verbose=1; the raylet's and the autoscaler's always (an OOM
        # kill, a scale-up: rayflow.runtime.verbosity.autoscaler_lines summarises those)
        split = (
            self._workers.split(pid, lines)
            if self.quiet and str(pid).isdigit()
            else [(line, False) for line in lines]
        )
        who = data.get("actor_name") or data.get("task_name") or "worker"
        for line, hidden in split:
            self.write(f"({who} pid={pid}, ip={data.get('ip')}) {line}", hidden)
        shown = [line for line, hidden in split if not hidden]
        if shown:
            ray_internals.print_worker_lines({**data, "lines": shown}, ignore_prefix)

    def give_back_worker_lines(self) -> None:
        """Ray's own printer back, where this log's is still in place (the cluster outlives the
        job); what an unfinished `Exception ignored` block held, printed."""
        held = self._workers.held()
        if held:
            print("\n".join(held), file=sys.stderr)
        printer, self._rays_printer = self._rays_printer, None
        if printer is None:
            return
        if ray_internals.worker_log_handlers("ray_print_logs"):
            dispatcher = ray_internals.worker_log_dispatcher()
            dispatcher.remove_handler("ray_print_logs")
            dispatcher.add_handler("ray_print_logs", printer)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _opened(path: Path):
    """The log file for appending, not through a link someone put in its place; None (and a
    warning) where it cannot be."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        print(
            f"rayflow: warning: no log file for this run: {path}: {err.strerror}", file=sys.stderr
        )
        return None
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")


class _ToFile(logging.Handler):
    # its own, not the handler's: ray.init sets its format on every handler of Ray's logger
    FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def __init__(self, log: RunLog) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log.write(self.FORMAT.format(record), record.levelno < shown_from(record.name))


@contextlib.contextmanager
def run_log(path: Path | None, verbose_level: int, imports: Iterable[str] = ()) -> Iterator[RunLog]:
    """While a job runs in this process: the libraries' records and Ray's worker lines into the
    log file at `path` (None: none kept), and off the terminal below SHOWN_FROM at level 0.
    `imports`: the libraries the job uses that set their loggers' handlers up on import (MLflow,
    Ray): imported first, so that those handlers are there to be filtered. RunLog.take_worker_lines
    once Ray is connected."""
    for module in imports:
        importlib.import_module(module)
    log = RunLog(path, verbose_level)
    to_file, quiet = _ToFile(log), _Quiet()
    filtered: list[logging.Handler] = []
    saved_hook = sys.unraisablehook
    # The root logger's handlers print the propagating libraries' records (and the user's own,
    # which the filter passes: it holds back only the loggers of SHOWN_FROM).
    for name in (*LIBRARY_LOGGERS, ""):
        for handler in logging.getLogger(name).handlers if log.quiet else ():
            handler.addFilter(quiet)
            filtered.append(handler)
    for name in (*LIBRARY_LOGGERS, *PROPAGATING_LOGGERS):
        logging.getLogger(name).addHandler(to_file)

    def unraisable(info) -> None:
        # a __del__ cut short as the run stops (Ctrl-C, Ray stopping an actor)
        if log.quiet and isinstance(info.exc_value, (SystemExit, KeyboardInterrupt)):
            log.write(f"Exception ignored in: {info.object!r}: {info.exc_value!r}", hidden=True)
            return
        saved_hook(info)

    sys.unraisablehook = unraisable
    try:
        yield log
    finally:
        sys.unraisablehook = saved_hook
        if sys.modules.get("ray") is not None:
            log.give_back_worker_lines()
        for name in (*LIBRARY_LOGGERS, *PROPAGATING_LOGGERS):
            logging.getLogger(name).removeHandler(to_file)
        for handler in filtered:
            handler.removeFilter(quiet)
        log.close()


@contextlib.contextmanager
def quiet_libraries(verbose_level: int, imports: Iterable[str] = ()) -> Iterator[None]:
    """The libraries' records below SHOWN_FROM off the terminal at level 0, no file: for a
    process that submits a run (its job keeps the log) or only reads a store."""
    with run_log(None, verbose_level, imports):
        yield
