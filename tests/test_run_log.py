"""A run's log file and the terminal's share of it (rayflow.runtime.run_log): Ray's own lines of
its worker processes told apart from the trials' own output, the libraries' INFO records of this
process, all kept (masked) in the file, and shown from verbose=1."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from rayflow.runtime import run_log
from rayflow.runtime.run_log import RAY_WORKER_INFO, WorkerLines

RAY = Path(__import__("ray").__file__).parent


@pytest.mark.parametrize("module, start", RAY_WORKER_INFO, ids=lambda v: str(v)[:40])
def test_each_known_line_is_still_logged_by_the_installed_ray(module, start):
    """A new Ray that moves or rewords a line fails here, not as a noisy run."""
    source = (RAY / module).read_text()
    assert "logger.info(" in source and start in source, (module, start)


def hidden(split):
    return [line for line, hide in split if hide]


def shown(split):
    return [line for line, hide in split if not hide]


def test_rays_lines_are_hidden_the_trials_own_are_not():
    lines = [
        "epoch 1 loss 0.8",  # the user's print
        "- (ip=a user's list) after their own line",
        "Checkpoint successfully created at: Checkpoint(filesystem=local, path=/x/checkpoint_000001)",
        "Restored on 10.0.0.2 from checkpoint: Checkpoint(filesystem=local, path=/x)",
        "Started training worker group of size 2: ",
        "- (ip=10.0.0.2, pid=11) world_rank=0, local_rank=0, node_rank=0",
        "- (ip=10.0.0.2, pid=12) world_rank=1, local_rank=1, node_rank=0",
        "[2026-11-29 01:00:03,786 E 22170 22209] core_worker.cc:2465: Actor with class name: 'X'",
        "[2026-11-29 01:00:03,786 W 22170 22209] gcs_client.cc:10: lost the GCS",
        "[2026-11-29 01:00:03,786 F 22170 22209] core_worker.cc:1: fatal: shown",
        "I saved my checkpoint successfully",  # the user's, resembling Ray's
    ]
    split = WorkerLines().split(7, lines)
    assert shown(split) == [*lines[:2], *lines[-2:]]
    assert len(hidden(split)) == 7


def test_a_continuation_is_hidden_only_after_rays_line_of_the_same_process():
    workers = WorkerLines()
    workers.split(1, ["Started training worker group of size 2: "])
    assert shown(workers.split(2, ["- (ip=1.2.3.4, pid=5) world_rank=0"])) == [
        "- (ip=1.2.3.4, pid=5) world_rank=0"
    ]
    assert hidden(workers.split(1, ["- (ip=1.2.3.4, pid=5) world_rank=1"]))


# As a trial's worker printed it when Ray stopped it (test_ray_examples, ax_example): Python puts a
# blank line before the frame of the signal handler that raised.
STOPPED_BLOCK = [
    "Exception ignored in: <function WeakSet.__init__.<locals>._remove at 0x7f0ddc0b6700>",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/_weakrefset.py", line 39, in _remove',
    "    def _remove(item, selfref=ref(self)):",
    "",
    '  File "ray/_private/worker.py", line 1063, in sigterm_handler',
    "    raise_sys_exit_with_custom_error_message(",
    "SystemExit: 1",
]


def test_an_exception_ignored_as_a_worker_stops_is_hidden_even_across_batches():
    workers = WorkerLines()
    first = workers.split(3, ["before", *STOPPED_BLOCK[:5]])
    assert first == [("before", False)]  # the block is held until it says how it ends
    rest = workers.split(3, [*STOPPED_BLOCK[5:], "after"])
    assert hidden(rest) == STOPPED_BLOCK and shown(rest) == ["after"]


def test_an_exception_ignored_for_another_reason_is_shown():
    block = [*STOPPED_BLOCK[:-1], "ValueError: the user's bug"]
    assert shown(WorkerLines().split(3, block)) == block


def test_an_unfinished_block_is_shown_at_the_end():
    workers = WorkerLines()
    workers.split(3, STOPPED_BLOCK[:2])
    assert workers.held() == STOPPED_BLOCK[:2]


@pytest.mark.parametrize("verbose, on_terminal", [(0, ["WARNING"]), (1, ["INFO", "WARNING"])])
def test_the_libraries_info_goes_to_the_file_and_from_verbose_1_to_the_terminal(
    tmp_path, monkeypatch, verbose, on_terminal
):
    import io

    import mlflow  # noqa: F401  (their loggers' handlers, as a run has them)
    import ray  # noqa: F401

    terminal = io.StringIO()
    for name in run_log.LIBRARY_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler):
                monkeypatch.setattr(handler, "stream", terminal)

    path = tmp_path / "rayflow.log"
    with run_log.run_log(path, verbose) as log:
        logging.getLogger("ray.tune.tune").info("Wrote the latest version")
        logging.getLogger("ray.tune.tune").warning("a trial is slow")
        logging.getLogger("ray.tune.logger.logger").warning("Remote file not found: x")
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables")
        logging.getLogger("ray.tune.tune").info("token=s3cr3t-value-123")
    printed = terminal.getvalue()
    assert ("Wrote the latest version" in printed) == ("INFO" in on_terminal), printed
    assert ("Creating initial MLflow" in printed) == ("INFO" in on_terminal), printed
    assert ("Remote file not found" in printed) == bool(verbose)
    assert "a trial is slow" in printed
    kept = path.read_text()
    assert all(
        what in kept
        for what in ("Wrote the latest", "a trial is slow", "Remote file", "Creating initial")
    )
    assert "s3cr3t-value-123" not in kept and "token=" in kept  # masked in the file too
    assert log.hidden == (0 if verbose else 4)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # nothing of the run's left on the loggers
    assert not any(
        isinstance(h, run_log._ToFile) or any(isinstance(f, run_log._Quiet) for f in h.filters)
        for name in run_log.LIBRARY_LOGGERS
        for h in logging.getLogger(name).handlers
    )


def test_what_propagates_to_the_root_logger_is_held_back_but_the_users_own_is_not(tmp_path):
    """Hydra's job logging prints through the root logger: matplotlib's INFO (a fresh node's
    "generated new fontManager") goes to the file only at verbose=0; the user's own INFO is shown."""
    import io

    terminal = io.StringIO()
    root = logging.getLogger()
    handler, level = logging.StreamHandler(terminal), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        path = tmp_path / "rayflow.log"
        with run_log.run_log(path, 0):
            logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
            logging.getLogger("matplotlib.font_manager").warning("findfont: Font family not found")
            logging.getLogger("my_app").info("epoch 1 done")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    printed = terminal.getvalue()
    assert "generated new fontManager" not in printed and "findfont" in printed, printed
    assert "epoch 1 done" in printed
    assert "generated new fontManager" in path.read_text()
    assert not handler.filters and not [
        h for h in logging.getLogger("matplotlib").handlers if isinstance(h, run_log._ToFile)
    ]


def test_a_link_in_the_logs_place_is_not_followed(tmp_path, capfd):
    target = tmp_path / "someone-elses"
    target.write_text("theirs\n")
    os.symlink(target, tmp_path / "rayflow.log")
    with run_log.run_log(tmp_path / "rayflow.log", 0) as log:
        logging.getLogger("ray.tune").info("a line")
    assert target.read_text() == "theirs\n" and log.path is None
    assert "no log file for this run" in capfd.readouterr().err


@pytest.mark.parametrize("verbose", [0, 1])
def test_worker_lines_reach_the_file_and_the_terminal_by_verbosity(tmp_path, capfd, verbose):
    """The printer that replaces Ray's, fed a batch as Ray's log monitor sends one."""
    log = run_log.RunLog(tmp_path / "rayflow.log", verbose)
    batch = {
        "lines": ["epoch 1", "Checkpoint successfully created at: Checkpoint(path=/x)"],
        "pid": 4711,
        "ip": "10.0.0.2",
        "is_err": True,
        "actor_name": "ImplicitFunc",
        "task_name": "",
        "job": "01000000",
    }
    log._worker_batch(batch, ignore_prefix=False)
    log.close()
    from ray._private import ray_logging

    ray_logging.stderr_deduplicator.flush()
    err = capfd.readouterr().err
    assert "epoch 1" in err and ("Checkpoint successfully" in err) == bool(verbose), err
    assert (
        "(ImplicitFunc pid=4711, ip=10.0.0.2) Checkpoint successfully"
        in (tmp_path / "rayflow.log").read_text()
    )


def test_the_log_is_not_signed_so_appending_to_it_does_not_break_a_resume(tmp_path):
    from rayflow.results.signing import RUN_LOG, files_now

    (tmp_path / "result.json").write_text("{}")
    (tmp_path / RUN_LOG).write_text("a line\n")
    assert set(files_now(str(tmp_path))) == {"result.json"}


@pytest.mark.parametrize("verbose", [0, 1])
def test_a_del_cut_short_as_the_driver_stops_goes_to_the_file(tmp_path, capsys, verbose):
    """`Exception ignored in ... SystemExit` of an object's __del__ in the driver (an RLlib learner
    group's, as a run stops): off the terminal at verbose=0, in the log; a bug's own exception in
    a __del__ still goes to Python's hook (here pytest's)."""
    seen = []

    class Stops:
        def __del__(self):
            raise SystemExit(1)

    saved = sys.unraisablehook
    sys.unraisablehook = seen.append  # what would print "Exception ignored in"
    try:
        with run_log.run_log(tmp_path / "rayflow.log", verbose):
            Stops()  # collected at once: its __del__ raises
    finally:
        sys.unraisablehook = saved
    kept = (tmp_path / "rayflow.log").read_text() if verbose == 0 else ""
    assert (len(seen) == 0) == (verbose == 0) and ("SystemExit(1)" in kept) == (verbose == 0)
