"""rayflow's Python API in a real Jupyter notebook, next to the notebook's own SparkSession.

The notebook is built here with nbformat and executed cell by cell by a real IPython kernel
(ipykernel) through nbclient, as Jupyter would run it. The kernel runs this test's own
interpreter: its kernel spec, written into a temporary JUPYTER_PATH, names sys.executable,
and the first cell reports the kernel's sys.executable and sys.prefix back.

The notebook builds its own SparkSession (a `local-cluster` master: real Spark worker JVMs),
runs a cifar job on it with `backend=spark` (rayflow must use that session, not start one, and
never stop it), reads the RunResult, checks a dry run and a configuration error, runs a
two-job multirun on the same session, and finally checks that the session still works and
that rayflow left no Ray connection in the kernel. Every cell reports what it saw as an
`application/json` display output, which the test reads back from the executed notebook.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rayflow.testing.processes import wait_until
from tests.harness import REPO

pytest.importorskip("pyspark")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

KERNEL_NAME = "rayflow-test-python"
REPORT_MIME = "application/json"
STACKS = "kernel-stacks.txt"  # faulthandler's dump of a cell that hangs, in the kernel's cwd
ANSI = "\x1b["
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# One Ray worker node of 1 CPU (no autoscaling wait) on a one-worker local-cluster Spark, as
# test_spark.py's FIXED settings and its active-session test use.
FIXED = ["backend=spark", "backend.min_worker_nodes=1", "backend.max_worker_nodes=1"]

# (seconds the cell may take, source). `report(name, **values)` shows values as JSON output;
# __PARAMS__ becomes the test's settings (paths under its tmp folder) as a JSON string.
CELLS = [
    (
        60,
        """
        import json, os, sys
        from IPython.display import display

        PARAMS = json.loads(__PARAMS__)

        def _plain(value):
            if hasattr(value, "item"):  # numpy scalars
                return value.item()
            return str(value)

        def report(name, **values):
            payload = json.loads(json.dumps({"cell": name, **values}, default=_plain))
            display({"application/json": payload}, raw=True)

        # A cell that hangs shows where: the kernel's Python stacks, written to a file the test
        # reads, shortly before the test's timeout for that cell.
        import faulthandler

        _stacks = open(PARAMS["stacks"], "w")

        def _arm(info):
            faulthandler.dump_traceback_later(max(PARAMS["timeouts"].get(info.raw_cell, 60) - 15, 5), file=_stacks)

        get_ipython().events.register("pre_run_cell", _arm)
        get_ipython().events.register("post_run_cell", lambda result: faulthandler.cancel_dump_traceback_later())

        import rayflow
        report("kernel", executable=sys.executable, prefix=sys.prefix, pid=os.getpid(),
               cwd=os.getcwd(), rayflow_file=rayflow.__file__)
    """,
    ),
    (
        180,
        """
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local-cluster[1, 1, 1024]").appName("notebook")
                 .config("spark.executor.memory", "512m").getOrCreate())
        report("spark", count=spark.range(10).count(), master=spark.sparkContext.master,
               app_id=spark.sparkContext.applicationId)
    """,
    ),
    (
        300,
        """
        result = rayflow.run(*PARAMS["fixed"], *PARAMS["base"], "workload=cifar",
                             "workload.num_samples=2", "workload.max_epochs=2",
                             "workload.search_space.batch_size=[32]")
        result
    """,
    ),
    (
        60,
        """
        import ray
        from mlflow.tracking import MlflowClient

        trials = result.trials
        parent = MlflowClient(result.tracking_uri).get_run(result.mlflow_run_id)
        report("result", type=type(result).__name__, is_run_result=isinstance(result, rayflow.RunResult),
               workload=result.workload, best_config=result.best_config, best_metrics=result.best_metrics,
               experiment_dir=str(result.experiment_dir), experiment_dir_is_dir=result.experiment_dir.is_dir(),
               mlflow_experiment=result.mlflow_experiment, mlflow_run_id=result.mlflow_run_id,
               tracking_uri=str(result.tracking_uri), parent_status=parent.info.status,
               parent_tags={k: parent.data.tags.get(k) for k in ("backend", "workload", "mlflow.parentRunId")},
               trials_type=type(trials).__name__, trials_rows=len(trials), trials_columns=list(trials.columns),
               summary_table=result.summary.table(),
               ray_initialized=ray.is_initialized(), spark_count=spark.range(5).count(),
               active_session_is_ours=SparkSession.getActiveSession() is spark)
    """,
    ),
    (
        120,
        """
        import yaml

        spec = yaml.safe_load(rayflow.dry_run(*PARAMS["fixed"], *PARAMS["base"]))
        composed = rayflow.compose(*PARAMS["fixed"], "workload=cifar", "workload.num_samples=3")
        try:
            rayflow.run(*PARAMS["fixed"], *PARAMS["base"], "workload.num_samples=0")
        except rayflow.ConfigError as err:
            bad_input = {"key": err.key, "message": str(err)}
        else:
            bad_input = None
        report("dry_run", max_worker_nodes=spec["max_worker_nodes"],
               composed_backend=composed.backend.name, composed_num_samples=composed.workload.num_samples,
               bad_input=bad_input, ray_initialized=ray.is_initialized())
    """,
    ),
    (
        300,
        """
        results = rayflow.run(*PARAMS["fixed"], *PARAMS["base"], "workload=cifar", "workload.num_samples=1",
                              "workload.max_epochs=1", "workload.scheduler.reduction_factor=2,4", multirun=True)
    """,
    ),
    (
        60,
        """
        client = MlflowClient(results[0].tracking_uri)
        report("multirun", type=type(results).__name__, count=len(results),
               run_ids=[r.mlflow_run_id for r in results],
               parent_statuses=[client.get_run(r.mlflow_run_id).info.status for r in results],
               experiment_dirs=[str(r.experiment_dir) for r in results],
               experiment_dirs_are_dirs=[r.experiment_dir.is_dir() for r in results],
               trials_rows=[len(r.trials) for r in results],
               best_val_accuracy=[r.best_metrics.get("val_accuracy") for r in results])
    """,
    ),
    (
        60,
        """
        report("after", spark_count=spark.range(5).count(), spark_stopped=spark.sparkContext._jsc.sc().isStopped(),
               active_session_is_ours=SparkSession.getActiveSession() is spark, app_id=spark.sparkContext.applicationId,
               ray_initialized=ray.is_initialized())
    """,
    ),
    (
        60,
        """
        spark.stop()
        report("stopped", active_session=SparkSession.getActiveSession() is not None)
    """,
    ),
]


def notebook(params: dict):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": KERNEL_NAME,
        "display_name": "rayflow test",
        "language": "python",
    }
    sources = [(timeout, textwrap.dedent(source).strip()) for timeout, source in CELLS]
    params = {
        **params,
        "stacks": STACKS,
        "timeouts": {source: timeout for timeout, source in sources},
    }
    for timeout, source in sources:
        text = source.replace("__PARAMS__", repr(json.dumps(params)))
        nb.cells.append(nbformat.v4.new_code_cell(text, metadata={"rayflow_timeout_s": timeout}))
    nbformat.validate(nb)
    return nb


def kernel_spec(jupyter_path: Path) -> None:
    """A kernel spec naming this test's interpreter, found first through JUPYTER_PATH."""
    folder = jupyter_path / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rayflow test",
        "language": "python",
    }
    (folder / "kernel.json").write_text(json.dumps(spec))


def kernel_env(base: dict) -> dict:
    """The kernel's environment: the test's (as Rayflow gives subprocesses), as in an
    activated environment (Spark's executors start this python and find `ray` on PATH), and
    importing the rayflow this test imports."""
    import rayflow

    env = dict(base)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = sys.executable
    package_root = Path(rayflow.__file__).resolve().parents[1]
    # a checkout (editable install, or PYTHONPATH): the kernel imports it too
    if package_root == REPO:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def outputs_text(cell) -> str:
    """Everything a cell wrote to stdout and stderr, and its error, as the notebook shows it."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
    return "".join(parts)


def cell_stack(text: str) -> str:
    """From faulthandler's dump of every thread: the one that ran the cell, down to the cell's line."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x[0-9a-f]+)", text)
    running = [
        b
        for b in blocks
        if "interactiveshell.py" in b and re.match(r"(Current thread|Thread) 0x", b)
    ]
    if not running:
        return ""
    frames = [line for line in running[-1].splitlines()[1:] if line.startswith("  File ")]
    shell = next(i for i, line in enumerate(frames) if "interactiveshell.py" in line)
    return "\n".join(frames[:shell])  # most recent call first, down to the cell's own line


def reports(nb) -> dict[str, dict]:
    found = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "display_data" and REPORT_MIME in out.data:
                payload = dict(out.data[REPORT_MIME])
                found[payload.pop("cell")] = payload
    return found


def execute(nb, workdir: Path, env: dict) -> tuple[object, float]:
    """Run every cell in a fresh kernel; on a cell's error or timeout, fail with that cell's
    source, error and output. The kernel is shut down either way (nbclient's clean-up)."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,
        timeout_func=lambda cell: cell.metadata.get("rayflow_timeout_s", 60),
        startup_timeout=120,
        shutdown_kernel="graceful",
        record_timing=True,
        resources={"metadata": {"path": str(workdir)}},
    )
    started = time.monotonic()
    try:
        client.execute(env=env)
    except (CellExecutionError, CellTimeoutError) as err:
        nbformat.write(nb, workdir / "executed.ipynb")
        failed = next((c for c in reversed(nb.cells) if c.get("outputs")), None)
        text = outputs_text(failed) if failed is not None else ""
        message = f"a notebook cell failed ({type(err).__name__}):\n{err}\n--- the cell's output (tail) ---\n{text[-6000:]}"
        stacks = workdir / STACKS
        stack = cell_stack(stacks.read_text()) if stacks.exists() else ""
        if stack:
            message += f"\n--- where the cell was when it hung (faulthandler) ---\n{stack}"
        pytest.fail(ANSI_CODES.sub("", message), pytrace=False)  # IPython colours its tracebacks
    assert client.km is None, "nbclient did not shut the kernel down"
    nbformat.write(nb, workdir / "executed.ipynb")
    return nb, time.monotonic() - started


def test_notebook_runs_rayflow_on_its_own_spark_session(rayflow, tmp_path, monkeypatch):
    jupyter_path = tmp_path / "jupyter"
    kernel_spec(jupyter_path)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))
    # the connection file
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv[0] == sys.executable

    params = {"fixed": FIXED, "base": rayflow.base}
    env = {
        **kernel_env(rayflow.env),
        "IPYTHONDIR": str(tmp_path / "ipython"),
    }  # no profile in $HOME
    nb, took = execute(notebook(params), rayflow.workdir, env)
    print(f"\nnotebook executed in {took:.1f} s")
    seen = reports(nb)
    assert list(seen) == ["kernel", "spark", "result", "dry_run", "multirun", "after", "stopped"], (
        seen
    )

    # The kernel is this test's interpreter and imports this test's rayflow.
    import rayflow as package

    kernel = seen["kernel"]
    assert (kernel["executable"], kernel["prefix"]) == (sys.executable, sys.prefix), kernel
    assert kernel["rayflow_file"] == package.__file__ and kernel["cwd"] == str(rayflow.workdir)
    spark = seen["spark"]
    assert (spark["count"], spark["master"]) == (10, "local-cluster[1, 1, 1024]"), spark

    # The first run: a RunResult read from the same process, and the notebook's session used.
    result = seen["result"]
    assert result["is_run_result"] and result["workload"] == "cifar", result
    assert result["best_config"] and {"l1", "l2", "lr", "batch_size"} <= set(
        result["best_config"]
    ), result
    assert (
        0.0 <= result["best_metrics"]["val_accuracy"] <= 1.0
        and "val_loss" in result["best_metrics"]
    ), result
    assert (
        result["experiment_dir_is_dir"] and Path(result["experiment_dir"]).parent == rayflow.storage
    ), result
    assert result["mlflow_experiment"] == "cifar" and result["mlflow_run_id"], result
    assert result["parent_status"] == "FINISHED", result
    assert result["parent_tags"] == {
        "backend": "spark",
        "workload": "cifar",
        "mlflow.parentRunId": None,
    }, result
    assert result["trials_type"] == "DataFrame" and result["trials_rows"] == 2, result
    assert "val_accuracy" in result["summary_table"], result["summary_table"]
    assert (
        not result["ray_initialized"]
        and result["spark_count"] == 5
        and result["active_session_is_ours"]
    ), result
    run_cell = nb.cells[2]
    assert any(
        o.output_type == "execute_result" and "text/plain" in o.data for o in run_cell.outputs
    ), "the RunResult, the cell's last expression, has no text/plain form"

    # A dry run and a bad override in the same kernel: the spec names the notebook's session,
    # the error is an exception naming the key, nothing connects Ray.
    dry = seen["dry_run"]
    assert dry["max_worker_nodes"] == 1, dry  # setup_ray_cluster's arguments
    assert (dry["composed_backend"], dry["composed_num_samples"]) == ("spark", 3), dry
    assert dry["bad_input"] and dry["bad_input"]["key"] == "workload.num_samples", dry
    assert not dry["ray_initialized"], dry

    # A second job, a two-point multirun, on the same session after the first one's teardown.
    multi = seen["multirun"]
    assert multi["type"] == "list" and multi["count"] == 2, multi
    run_ids = [result["mlflow_run_id"], *multi["run_ids"]]
    assert len(set(run_ids)) == 3 and all(run_ids), multi
    assert multi["parent_statuses"] == ["FINISHED", "FINISHED"] and all(
        multi["experiment_dirs_are_dirs"]
    ), multi
    assert len({result["experiment_dir"], *multi["experiment_dirs"]}) == 3, multi
    assert multi["trials_rows"] == [1, 1] and all(
        v is not None for v in multi["best_val_accuracy"]
    ), multi

    # Afterwards the notebook's session still works and rayflow left no Ray connection.
    assert seen["after"] == {
        "spark_count": 5,
        "spark_stopped": False,
        "active_session_is_ours": True,
        "app_id": spark["app_id"],
        "ray_initialized": False,
    }, seen["after"]
    assert seen["stopped"] == {"active_session": False}

    # The three parent runs are in the notebook's MLflow store, read from outside the kernel.
    client, parents, children = rayflow.mlflow("cifar")
    assert sorted(p.info.run_id for p in parents) == sorted(run_ids)
    assert all(p.data.tags["backend"] == "spark" and p.info.status == "FINISHED" for p in parents)
    assert len(children[result["mlflow_run_id"]]) == 2
    for parent in parents:  # each job recorded the notebook's session as its Spark
        assert parent.data.tags["spark_session"] == "active SparkSession", parent.data.tags

    # nbclient shut the kernel down; its process is gone (Ray's and Spark's: the fixture).
    assert wait_until(lambda: not Path(f"/proc/{kernel['pid']}").exists(), timeout=30), (
        "the kernel is still running"
    )

    # What a person reads in the run cells: rayflow's own lines (the session it uses, each start-up
    # phase, every job's results table), plain text with no colour codes or \r redraws.
    run_output = outputs_text(run_cell)
    multi_output = outputs_text(nb.cells[5])
    for text in (run_output, multi_output):
        own = [line for line in text.splitlines() if "[rayflow]" in line or "rayflow:" in line]
        assert own and not [line for line in own if ANSI in line], own
        # a phase prints one line when it ends, not a ticker's redraws ("... 3 s, waiting for ...")
        assert not [line for line in own if re.search(r"\.\.\. \d+ s", line)], own
    assert "starting Spark (" not in run_output + multi_output
    assert "[rayflow] spark: using the active SparkSession" in run_output, run_output[:3000]
    assert multi_output.count("== rayflow results ==") == 2, multi_output[:3000]
