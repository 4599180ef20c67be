"""backend=spark with keep_cluster=true: a Ray-on-Spark cluster kept in a notebook kernel, joined by
the kernel's next run, seen by `rayflow status`, and shut down by its idle timer in the kernel.

The "kernel" is a Python process of its own, as a notebook's is: it calls rayflow.run(...) with a
user's trainable from a folder outside the package, then stays alive, reading commands on stdin.
Its HOME and XDG_CACHE_HOME are the test's, so the kept-cluster registry (and Ray's token) are the
test's alone; the `rayflow status` / `down` / `logs` commands run with the same. Real Spark (one local-mode JVM,
the cheapest master) and real Ray on Spark: two cluster starts and the 1-minute autostop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayflow.runtime.processes import pids_mentioning
from rayflow.testing.processes import ray_daemon_pids, wait_until

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

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


def test_a_cluster_kept_in_a_kernel_is_joined_seen_and_autostops_while_the_kernel_lives(tmp_path):
    started = time.monotonic()
    before = ray_daemon_pids()
    work = tmp_path / "notebook"  # the user's folder, outside the package
    work.mkdir()
    cache = tmp_path / "cache"  # the kept-cluster registry: the test's own
    env = dict(
        os.environ, HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(cache), PYTHONUNBUFFERED="1"
    )
    env.pop("RAY_AUTH_MODE", None)  # rayflow makes driver and cluster agree by itself
    env.pop("MLFLOW_TRACKING_URI", None)
    kernel = Kernel(work, env)
    try:
        assert "done" in kernel.says("KERNEL first", timeout=300), kernel.output()[-4000:]
        kernel.says("KERNEL ready", timeout=30)
        name = f"spark-{kernel.proc.pid}"
        [record] = (cache / "rayflow" / "clusters").glob("spark.*.json")
        where = json.loads(record.read_text())["where"]
        assert where["pid"] == str(kernel.proc.pid) and Path(where["temp_dir"]).is_dir()
        assert pids_mentioning(where["temp_dir"]), "the kept cluster's Ray nodes run"

        # `rayflow status` (another process, the same HOME) sees it idle, with its autostop
        rows = wait_until(lambda: [r for r in status(env) if r["state"] == "idle"], timeout=60)
        assert [(r["backend"], r["name"], r["autostop_idle_minutes"]) for r in rows] == [
            ("spark", name, 1)
        ], status(env)
        assert rows[0]["nodes"] == 2 and rows[0]["autostop_in_s"] <= 60
        # and so does rayflow.clusters() in the kernel itself
        kernel.send("status")
        [row] = json.loads(kernel.says("KERNEL status", timeout=60).split(" ", 2)[2])
        assert (row["name"], row["state"]) == (name, "idle")
        # `rayflow logs`: a Ray-on-Spark run is a driver in the kernel, no Ray Job: one line
        logs = rayflow_command(env, "logs", name)
        assert logs.returncode == 2 and "runs no Ray Jobs" in logs.stderr, logs.stderr
        assert len(logs.stderr.strip().splitlines()) == 1
        kernel.send(f"logs {name}")
        assert "ConfigError rayflow logs: " in kernel.says("KERNEL logs", timeout=60)

        # the kernel's next run joins it: no second setup_ray_cluster
        kernel.send("run second")
        assert "done" in kernel.says("KERNEL second", timeout=240), kernel.output()[-4000:]
        out = kernel.output()
        assert f"joining the Ray-on-Spark cluster {name} this process keeps" in out
        assert out.count("starting Ray on Spark") == 1, out[-4000:]
        last_run = time.monotonic()

        # nothing more: its idle timer shuts it down, the kernel still alive
        kernel.says("[rayflow] spark: shutting down the kept cluster", timeout=150)
        gone = wait_until(
            lambda: not pids_mentioning(where["temp_dir"]) and not (ray_daemon_pids() - before),
            timeout=60,
        )
        assert gone, (pids_mentioning(where["temp_dir"]), ray_daemon_pids() - before)
        print(f"\nautostop: cluster gone {time.monotonic() - last_run:.0f} s after the last run")
        assert kernel.proc.poll() is None and "idle for 1 min" in kernel.output()
        assert [(r["name"], r["state"]) for r in status(env)] == [(name, "gone")]
        assert status(env) == []
        done = rayflow_command(env, "status")
        assert done.returncode == 0 and done.stdout.strip() == "no kept clusters"

        # a new kept cluster, torn down by `rayflow down` from another process: its Ray nodes on
        # this machine at once, the rest (the SparkSession rayflow built) by the kernel's timer
        kernel.send("run third")
        assert "done" in kernel.says("KERNEL third", timeout=300), kernel.output()[-4000:]
        where = json.loads(record.read_text())["where"]
        assert pids_mentioning(where["temp_dir"])
        down = rayflow_command(env, "down", name)
        assert down.returncode == 0 and f"{name}: torn down" in down.stdout, down.stderr
        assert not pids_mentioning(where["temp_dir"])
        kernel.says(f"[rayflow] spark: shutting down the kept cluster {name} (its head", 30)
        assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60)
        assert kernel.proc.poll() is None and status(env) == []
    finally:
        kernel.close()
        print(f"test wall time: {time.monotonic() - started:.0f} s")
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60)
