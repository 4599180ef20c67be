"""A notebook kernel for tests: a Python process of its own that calls rayflow.run(...) with a
user's trainable from a folder outside the package, then stays alive, reading one command a line
on stdin (run TAG, status, logs NAME, exit) and answering each with one `KERNEL ...` line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rayflow.testing.processes import wait_until

# One Ray worker node in Spark's local mode (one JVM), as test_spark's LOCAL_MODE; kept, with a
# 1-minute autostop; a tiny Tune search of the user's own function.
OVERRIDES = [
    "backend=spark",
    "backend.master='local[1]'",
    "backend.num_cpus_worker_node=null",
    "backend.num_gpus_worker_node=null",
    "backend.min_worker_nodes=1",
    "backend.max_worker_nodes=1",
    "backend.keep_cluster=true",
    "backend.autostop_idle_minutes=1",
    "workload=tune",
    "workload.trainable=train:objective",
    "workload.metric=score",
    "workload.mode=max",
    "workload.search_space={x: {choice: [1, 2]}}",
    "workload.num_samples=1",
    "workload.stop={training_iteration: 2}",
    "tracking=none",
]

TRAINABLE = """\
from ray import tune


def objective(config):
    for step in range(5):
        tune.report({"score": config["x"] * (step + 1)})
"""

# The kernel: a first run at once, then one command a line (run TAG, status, logs NAME, exit);
# every answer is one `KERNEL ...` line of its output.
KERNEL = """\
import json, sys
import rayflow

overrides = json.loads(sys.argv[1])


def run(tag):
    try:
        result = rayflow.run(*overrides)
        print("KERNEL", tag, "done", json.dumps(result.best_metrics, default=str), flush=True)
    except Exception as err:
        print("KERNEL", tag, "failed", type(err).__name__, err, flush=True)


run("first")
print("KERNEL ready", flush=True)
for line in sys.stdin:
    command, _, arg = line.strip().partition(" ")
    if command == "run":
        run(arg)
    elif command == "status":
        rows = [row.as_dict() for row in rayflow.clusters()]
        print("KERNEL status", json.dumps(rows), flush=True)
    elif command == "logs":
        try:
            print("KERNEL logs", json.dumps(rayflow.logs(arg)), flush=True)
        except Exception as err:
            print("KERNEL logs", type(err).__name__, err, flush=True)
    elif command == "exit":
        break
"""


class Kernel:
    """The notebook kernel's process, its output in a file the test reads as it grows."""

    def __init__(self, work: Path, env: dict[str, str]):
        (work / "train.py").write_text(TRAINABLE)
        (work / "kernel.py").write_text(KERNEL)
        self.log = work / "kernel.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "kernel.py",
                json.dumps([*OVERRIDES, f"storage_path={work / 'runs'}"]),
            ],
            cwd=work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        return self.log.read_text()

    def says(self, line_start: str, timeout: float) -> str:
        """The first line of its output that starts with `line_start`, waiting up to `timeout`."""

        def found():
            assert self.proc.poll() is None, f"the kernel exited:\n{self.output()[-4000:]}"
            lines = [ln for ln in self.output().splitlines() if ln.startswith(line_start)]
            return lines[0] if lines else None

        line = wait_until(found, timeout=timeout, interval=0.5)
        assert line, f"no {line_start!r} within {timeout} s:\n{self.output()[-4000:]}"
        return line

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """Exit as a kernel shut down from Jupyter would: what it still keeps goes with it."""
        if self.proc.poll() is None:
            self.send("exit")
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def rayflow_command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def status(env: dict[str, str]) -> list[dict]:
    done = rayflow_command(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
