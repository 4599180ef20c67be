"""Many short `python -m rayflow` commands, each in a process of its own, forked from one process
that has already imported what they import (multiprocessing's forkserver).

A command refused by the preflight spends most of its second or two starting Python and
importing Hydra, pydantic, torch, Ray and MLflow; here that is paid once for all of them. Each
command still runs `rayflow/__main__.py` as `python -m rayflow` runs it (runpy, `sys.argv`), in
its own working directory and environment, with its own stdout, stderr and exit status.
`tests/test_bad_input.py` runs some rows both ways and compares what a user sees.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
from pathlib import Path

# What the preflight of every config group imports; a module left out is imported per command.
PRELOAD = ["rayflow.cli", "rayflow.orchestrator.preflight", "torch", "ray", "mlflow", "hydra"]

_context = multiprocessing.get_context("forkserver")
# What multiprocessing reports when the fork server could not send a child's exit status back
# (popen_forkserver: "perhaps the forkserver process itself got killed"; seen once in a full
# run, with the command's refusal already printed). rayflow itself never exits 255.
LOST = 255
_context.set_forkserver_preload(PRELOAD)


def _as_python_m(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: what `python -m rayflow ARGV` does, with its own folder and streams."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = argv  # runpy puts the module's file first, as `python -m` does
    runpy.run_module("rayflow", run_name="__main__", alter_sys=True)


def run_forked(
    argv: list[str], cwd: Path, env: dict[str, str], streams: Path, timeout: float
) -> subprocess.CompletedProcess:
    """`argv` as `Rayflow.argv` builds it (`python -m rayflow ...`), run in a forked process.
    Its stdout and stderr go through files in `streams`, a folder of the caller's; a command
    still running after `timeout` seconds is killed and raises subprocess.TimeoutExpired."""
    assert argv[1:3] == ["-m", "rayflow"], argv
    out, err = streams / "stdout", streams / "stderr"
    process = _context.Process(
        target=_as_python_m, args=(["rayflow", *argv[3:]], str(cwd), env, str(out), str(err))
    )
    process.start()
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise subprocess.TimeoutExpired(argv, timeout)
    if process.exitcode == LOST:  # not the command's status: run it again in a new interpreter
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    return subprocess.CompletedProcess(argv, process.exitcode, out.read_text(), err.read_text())
