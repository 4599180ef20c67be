"""Ray on Spark's head node is ended whole: a process its launcher leaves behind (here one that
ignores SIGTERM, as a `ray start --block` did once in the suite) is stopped by rayflow's undo
step, and nothing else is touched. No Spark or Ray: the tree is a stand-in of the same shape."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil

from rayflow.backends.spark.processes import end_head, tree

# The launcher: starts a child that ignores SIGTERM, and on SIGTERM exits without it, as Ray on
# Spark's start_ray_node does once its grace period is over.
LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True);"
        " time.sleep(600)"], stdout=subprocess.PIPE)
    child.stdout.readline()  # its handler is in place
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_head_process_that_ignores_sigterm_is_gone_after_the_stop():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    head = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(head.stdout.readline()))
        known = tree(head.pid)  # read when the head has started, as rayflow does
        head.terminate()  # shutdown_ray_cluster() sends SIGTERM and waits for nothing
        end_head(head, known, timeout=10, grace=1)
        assert head.poll() is not None  # (143, or SIGTERM's own if the stop's second lands at exit)
        assert not child.is_running(), "the head's child outlived the stop"
        assert bystander.poll() is None, "a process the head did not start was stopped"
    finally:
        for process in (head, bystander):
            process.kill()
            process.wait()
