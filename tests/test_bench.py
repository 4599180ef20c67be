"""scripts/bench.py's benchmarks in their smoke form (`--smoke`): each subcommand run as a user runs
it, from a folder of its own, at the least size that still goes through both sides' whole path,
so that none rots when rayflow changes under it. The figures measure nothing; what is checked is
that it ends well with one JSON line holding what a reader of the benchmark relies on.

The GPU benchmarks run on the CPU here (`--device cpu`, `--compute cpu`). spark-cluster and
vm-cluster have their smoke runs in tests/test_spark.py and tests/test_vm.py (kuberay-cluster in
tests/test_kuberay_local.py), inside those modules'
machine-wide turn (tests/conftest.py, TAKE_TURNS): a Spark or fake_multinode cluster started beside
theirs interferes. object-storage's runs in tests/test_storage.py, against that module's store: its
run on the store is the one whose experiment that test checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


def run_bench(rayflow, name: str, *options: str, keys: tuple[str, ...], timeout: float) -> dict:
    """`python scripts/bench.py NAME --smoke OPTIONS` in the test's own folder (the `rayflow`
    fixture's, which fails the test on Ray daemons left running): its one JSON line, checked to
    hold `keys` besides `name` and `"smoke": true`. A run past `timeout` is stopped (SIGTERM,
    then SIGKILL) and fails."""
    argv = [sys.executable, str(BENCH), name, "--smoke", *options]
    proc = subprocess.Popen(
        argv,
        cwd=rayflow.workdir,
        env=rayflow.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a run cut short leaves none of its children
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the bench stops its clusters on the way out
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv[1:])} ran past {timeout:g} s; its stderr ends:\n{err[-4000:]}")
    tail = f"its stderr ends:\n{err[-4000:]}"
    assert proc.returncode == 0, f"{' '.join(argv[1:])} exited {proc.returncode}; {tail}"
    lines = out.splitlines()
    assert len(lines) == 1, f"stdout is not one JSON line: {out[-2000:]!r}; {tail}"
    result = json.loads(lines[0])
    assert isinstance(result, dict) and result.get("name") == name, result
    assert result.get("smoke") is True, f"the line does not say it is a smoke run: {result}"
    missing = [key for key in keys if key not in result]
    assert not missing, f"no {missing} in {result}"
    return result


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and v > 0 for v in values)


def test_tune_overhead(rayflow):
    result = run_bench(
        rayflow,
        "tune-overhead",
        keys=("ratio", "plain_ratio", "wall_s", "plain_wall_s", "ideal_s", "start_s", "trials"),
        timeout=240,
    )
    assert positive(
        result["ratio"], result["plain_ratio"], result["wall_s"], result["plain_wall_s"]
    )
    assert result["trials"] == 2 and result["tracking"] == "mlflow"


def test_ddp_overhead(rayflow):
    result = run_bench(
        rayflow,
        "ddp-overhead",
        keys=("ratio", "rayflow_step_s", "raw_step_s", "rayflow_runs_s", "raw_runs_s", "epochs"),
        timeout=300,
    )
    assert positive(result["ratio"], result["rayflow_step_s"], result["raw_step_s"])
    assert len(result["rayflow_runs_s"]) == len(result["raw_runs_s"]) == 1


def test_ppo(rayflow):
    result = run_bench(
        rayflow,
        "ppo",
        keys=("ratio", "wall_s", "plain_wall_s", "env_steps", "plain_env_steps", "reached", "goal"),
        timeout=300,
    )
    assert positive(result["ratio"], result["wall_s"], result["plain_wall_s"])
    # one iteration a side, stopped by the env-step limit: no training to the goal
    assert positive(result["env_steps"], result["plain_env_steps"]) and result["reached"] is False


def test_hydra_launcher(rayflow):
    result = run_bench(
        rayflow,
        "hydra-launcher",
        keys=("ratio", "speedup", "wall_s", "basic_wall_s", "ideal_s", "jobs"),
        timeout=240,
    )
    assert positive(result["ratio"], result["speedup"], result["wall_s"], result["basic_wall_s"])


def test_hydra_sweeper(rayflow):
    result = run_bench(
        rayflow,
        "hydra-sweeper",
        keys=("ratio", "command_ratio", "ideal_s", "best", "asha_best", "asha_wall_ratio"),
        timeout=300,
    )
    assert positive(result["ratio"], result["command_ratio"], result["ideal_s"])
    # the same trials, in the same order: ASHA stops some, never finds a worse best than FIFO's
    assert result["asha_best"] >= result["best"] and result["batched_wall_s"] is None


def test_data_pipeline_on_the_cpu(rayflow):
    # The seed side is torchvision's pipeline: where torchvision is not installed, rayflow's alone.
    seed = importlib.util.find_spec("torchvision") is not None
    result = run_bench(
        rayflow,
        "data-pipeline",
        "--device",
        "cpu",
        *(() if seed else ("--rayflow-only",)),
        keys=(
            "ratio",
            "train_ratio",
            "pipeline_ratio",
            "rayflow_epoch_s",
            "seed_epoch_s",
            "rayflow_pipeline_s",
            "seed_pipeline_s",
            "device",
        ),
        timeout=180,
    )
    assert positive(result["rayflow_epoch_s"], result["rayflow_pipeline_s"])
    assert result["device"] == "cpu" and len(result["rayflow_epochs_s"]) == 2  # warm-up + 1
    if seed:
        assert positive(result["ratio"], result["seed_epoch_s"], result["seed_pipeline_s"])


def test_cifar_search_on_the_cpu(rayflow):
    # --against: the other side's line (as a GPU run's would be), for the ratio
    other = rayflow.workdir / "gpu.json"
    other.write_text(json.dumps({"compute": "gpu", "wall_s": 10.0, "trial_epochs": 1}) + "\n")
    result = run_bench(
        rayflow,
        "cifar-search",
        "--compute",
        "cpu",
        f"--workdir={rayflow.workdir / 'search'}",
        f"--against={other}",
        keys=("ratio", "wall_s", "trials", "errored", "trial_epochs", "best_val_accuracy"),
        timeout=240,
    )
    assert positive(result["ratio"], result["wall_s"]) and result["compute"] == "cpu"
    assert result["trials"] == 1 and result["errored"] == 0 and result["trial_epochs"] == 1
    assert result["against"]["compute"] == "gpu"
