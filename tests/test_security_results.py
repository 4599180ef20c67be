"""What comes back from a cluster, and what goes to it (issue 30): a submitted job's result is data
on one authenticated channel (rayflow.security.result_channel), a launcher job's outputs unpack only into
its own folder, and nothing of the run's overrides or secrets is on the job's command line.

No cluster: the functions are fed the logs and archives a hostile cluster could send, and
run_submitted runs against a stand-in Jobs API client (the whole submission path but the HTTP)."""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from rayflow.errors import RunFailed
from rayflow.results.run_result import (
    RESULT_MARKER,
    RunResult,
    returned_result,
    without_result_line,
)
from rayflow.security import result_channel

KEY = bytes(range(32))
SECRET = "hunter2-SECRET"


class Plant:
    """Unpickling this creates a file: proof that a line was (not) unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def pickled(path: Path) -> str:
    return base64.b64encode(pickle.dumps(Plant(path))).decode("ascii")


def signed(marker: str, data, key: bytes = KEY) -> str:
    return result_channel.signed_line(marker, data, key)


def result_data(run_id: str = "run-1") -> dict:
    return {
        "status": "FINISHED",
        "experiment_dir": "/head/exp",
        "mlflow_experiment_id": "7",
        "mlflow_run_id": run_id,
        "summary": None,
        "trials": None,
    }


def base() -> RunResult:
    return RunResult("tune", None, Path("/here"))


# --- the result line -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        RESULT_MARKER + json.dumps(result_data("forged")),  # the old format: no MAC
        RESULT_MARKER
        + "0" * 64
        + " "
        + json.dumps(result_data("forged")),  # a MAC under another key
        signed(RESULT_MARKER, result_data("forged"), key=b"k" * 32),
    ],
    ids=["no-mac", "wrong-mac", "other-key"],
)
def test_a_forged_result_line_is_ignored_with_one_warning(line, capsys):
    result, status = returned_result(f"trial output\n{line}\n", base(), KEY)
    assert (status, result.mlflow_run_id) == (None, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rayflow: warning: ignored 1 line(s)"), err


def test_the_last_signed_line_wins_over_forged_ones_after_it(capsys):
    log = f"{signed(RESULT_MARKER, result_data('mine'))}\n{RESULT_MARKER}{'f' * 64} {json.dumps(result_data('forged'))}\n"
    result, status = returned_result(log, base(), KEY)
    assert (status, result.mlflow_run_id, str(result.experiment_dir)) == (
        "FINISHED",
        "mine",
        "/head/exp",
    )


def test_a_pickled_result_line_is_never_unpickled(tmp_path):
    from rayflow.launcher.submit import MARKER, read_result

    planted = tmp_path / "pwned"
    log = f"{RESULT_MARKER}{pickled(planted)}\n{MARKER}{pickled(planted)}\n"
    assert returned_result(log, base(), KEY)[1] is None
    assert read_result(log, KEY) is None
    assert not planted.exists()


@pytest.mark.parametrize("separator", ["\u2028", "\x85", "\x1c", "\x0b", "\r"])
def test_a_marker_smuggled_after_a_line_separator_is_not_a_line(separator):
    """A task prints `text<sep>[rayflow-result] ...`: str.splitlines() would make the marker start a
    line; the channel splits on "\\n" only, so it is the task's line (shown to the user as it is)."""
    line = f"(trial pid=1) loss=0.1{separator}{signed(RESULT_MARKER, result_data('smuggled'))}"
    result, status = returned_result(f"{line}\n", base(), KEY)
    assert (status, result.mlflow_run_id) == (None, None)
    assert without_result_line(f"{line}\n") == f"{line}\n"


def test_another_writers_text_run_into_the_line_does_not_void_it(tmp_path, monkeypatch):
    """Ray's log thread in the driver prints workers' lines while the result goes out: the line is
    written in one go on a line of its own, and text run onto its end is not part of what is signed."""
    out = tmp_path / "driver.log"
    with open(out, "w") as stream:
        monkeypatch.setattr("sys.stdout", stream)
        # a line of theirs, its newline still to come
        stream.write("(autoscaler +9s) Resized to 1 CPUs.")
        result_channel.emit(signed(RESULT_MARKER, result_data("run-1")))
    log = out.read_text() + "\n"
    result, status = returned_result(log, base(), KEY)
    assert (status, result.mlflow_run_id) == ("FINISHED", "run-1")
    appended = signed(RESULT_MARKER, result_data("run-2")) + "(autoscaler +9s) Adding 2 node(s).\n"
    result, status = returned_result(appended, base(), KEY)
    assert result.mlflow_run_id == "run-2"


def test_the_key_leaves_the_drivers_environment_and_its_workers_job_config(monkeypatch):
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    config = {
        "runtime_env": {"env_vars": {result_channel.KEY_ENV: KEY.hex(), "A": "1"}},
        "metadata": {},
    }
    monkeypatch.setenv(result_channel.KEY_ENV, KEY.hex())
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, json.dumps(config))
    monkeypatch.setattr(result_channel._TAKEN, "key", None)
    assert result_channel.take_key() == KEY
    assert result_channel.KEY_ENV not in os.environ
    assert json.loads(os.environ[RAY_JOB_CONFIG_JSON_ENV_VAR])["runtime_env"]["env_vars"] == {
        "A": "1"
    }
    assert result_channel.signed_line(RESULT_MARKER, {"a": 1}) == signed(RESULT_MARKER, {"a": 1})


def test_a_job_without_a_key_prints_no_line_anyone_would_believe(monkeypatch):
    from rayflow.results.run_result import result_line

    monkeypatch.setattr(result_channel._TAKEN, "key", None)
    line = result_line(RunResult("tune", None, Path("/nowhere")), "FINISHED")
    assert not line.startswith(RESULT_MARKER)


# --- a submitted run, end to end but for the HTTP ------------------------------------------------------


class FakeBackend:
    from rayflow.backends import Traits

    name, traits = "vm", Traits(submits_jobs=True)


def fake_handle():
    from rayflow.backends import ClusterHandle, Submission

    return ClusterHandle("vm", address="http://127.0.0.1:1", submission=Submission())


class FakeCluster:
    backend, spec = FakeBackend(), "{}\n"

    def __init__(self):
        self.handle = fake_handle()

    def acquire(self):
        return self.handle, False


@pytest.fixture
def submit(monkeypatch, tmp_path):
    """run_submitted against a stand-in Jobs API whose job ends `status` with the log `job_log(env)`
    (env: the job's env_vars, so a test can sign as the real driver would). Returns (call, seen)."""
    import ray.job_submission

    from rayflow.orchestrator import remote_run
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.preflight import Plan
    from rayflow.workloads import workload_for

    seen: dict = {}

    def call(status: str, job_log, *overrides: str):
        class Client:
            def __init__(self, url, headers=None):
                pass

            def submit_job(self, **kwargs):
                seen.update(kwargs)
                request = Path(kwargs["runtime_env"]["py_modules"][1]) / "request.json"
                seen["request"] = json.loads(request.read_text())
                seen["request_mode"] = request.stat().st_mode & 0o777
                return "raysubmit_1"

            async def tail_job_logs(self, job_id):
                yield job_log(seen["runtime_env"]["env_vars"])

            def get_job_status(self, job_id):
                return SimpleNamespace(value=status)

            def get_job_info(self, job_id):
                return SimpleNamespace(message="", entrypoint=seen["entrypoint"])

            def get_job_logs(self, job_id):
                return job_log(seen["runtime_env"]["env_vars"])

        monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
        # no MLflow here: the RunResult whose run the log would go to is kept for the test
        monkeypatch.setattr(
            remote_run,
            "keep_driver_log",
            lambda cfg, spec, tracker, result, *a: seen.update(kept=result),
        )
        cfg = compose_config(
            "backend=vm", f"storage_path={tmp_path}", "workload.working_dir=null", *overrides
        )
        plan = Plan(
            ["backend=vm", *overrides], cfg, FakeBackend(), workload_for(cfg.workload), [], None
        )
        return remote_run.run_submitted(plan, FakeCluster())

    return call, seen


def _signed_result(env: dict) -> str:
    return signed(
        RESULT_MARKER, result_data("from-the-job"), bytes.fromhex(env[result_channel.KEY_ENV])
    )


def test_a_succeeded_job_returns_its_signed_result(submit, capsys):
    call, seen = submit
    result = call("SUCCEEDED", lambda env: f"== rayflow results ==\n{_signed_result(env)}\n")
    assert result.mlflow_run_id == "from-the-job" and str(result.experiment_dir) == "/head/exp"
    assert RESULT_MARKER.strip() not in capsys.readouterr().out  # the line is not shown


def test_a_failed_jobs_valid_looking_line_is_not_read(submit, capsys):
    """A FAILED job's result line, forged or signed, gives no result: its last lines are shown.
    Its signed line says only where its MLflow parent run is (its log goes there)."""
    call, seen = submit
    with pytest.raises(RunFailed) as failed:
        call(
            "FAILED",
            lambda env: (
                f"Traceback ...\nValueError: boom\n{RESULT_MARKER}{json.dumps(result_data('forged'))}\n"
            ),
        )
    # nothing of the log became a result
    assert failed.value.result is None and seen["kept"].mlflow_run_id is None
    err = capsys.readouterr().err
    assert (
        "[rayflow] the last 2 lines of job raysubmit_1" in err
        and "ValueError: boom" in err
        and "forged" not in err
    )
    with pytest.raises(RunFailed) as failed:
        call("FAILED", lambda env: f"ValueError: boom\n{_signed_result(env)}\n")
    assert failed.value.result is None and seen["kept"].mlflow_run_id == "from-the-job"
    assert seen["kept"].summary is None and str(seen["kept"].experiment_dir) != "/head/exp"


def test_the_jobs_command_line_holds_no_override_and_no_secret(submit, monkeypatch):
    """ps on the head, JobInfo.entrypoint and the dashboard show the entrypoint: a fixed command.
    The overrides, the tracking URI's password among them (from MLFLOW_TRACKING_URI too), go in
    the request file shipped with the job."""
    call, seen = submit
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:{SECRET}@mlflow.example:5000")
    call(
        "SUCCEEDED",
        _signed_result,
        "workload.num_samples=3",
        "+workload.api_token=tok-VALUE",
        "tracking=mlflow",
    )
    assert seen["entrypoint"].endswith("-m rayflow.job_entry") and seen["entrypoint"].split()[
        0
    ] in ("python",)
    for value in (SECRET, "num_samples", "tok-VALUE", "backend=", "tracking.uri", "mlflow.example"):
        assert value not in seen["entrypoint"], seen["entrypoint"]
    overrides = seen["request"]["overrides"]
    assert (
        overrides[0] == "backend=attach"
        and "workload.num_samples=3" in overrides
        and "+workload.api_token=tok-VALUE" in overrides
    )
    assert f"tracking.uri=http://alice:{SECRET}@mlflow.example:5000" in overrides
    assert seen["request_mode"] == 0o600
    assert SECRET not in json.dumps(seen["runtime_env"]["env_vars"])


def test_the_streamed_output_and_the_last_lines_are_masked(submit, capsys):
    call, _ = submit
    leak = f"connecting to https://bob:{SECRET}@db.example/x?token={SECRET}"
    with pytest.raises(RunFailed):
        call("FAILED", lambda env: f"{leak}\nboom\n")
    out, err = capsys.readouterr()
    assert "https://bob:***@db.example" in out and SECRET not in out  # the stream
    assert "boom" in err and SECRET not in err  # the last lines


def test_print_last_lines_masks_and_splits_on_newlines_only(capsys):
    from rayflow.orchestrator.job_logs import print_last_lines

    print_last_lines(f"a\u2028b\nhttp://u:{SECRET}@h/\n", "raysubmit_2")
    err = capsys.readouterr().err
    assert "the last 2 lines" in err and SECRET not in err and "http://u:***@h/" in err


def test_repr_of_a_run_result_masks_the_tracking_uri():
    result = RunResult(
        "tune",
        None,
        Path("/x"),
        tracking_uri=f"http://alice:{SECRET}@mlflow.example",
        mlflow_run_id="r",
    )
    assert SECRET not in repr(result) and "alice:***@mlflow.example" in repr(result)


def test_a_tracking_server_gone_costs_the_stored_log_not_the_result(capsys):
    from mlflow.exceptions import MlflowException

    from rayflow.orchestrator.remote_run import keep_driver_log as _keep_driver_log

    class Gone:
        def log_text(self, *a):
            raise MlflowException(
                "API request to http://127.0.0.1:9/api/2.0/mlflow/... failed: Connection refused"
            )

    tracker = SimpleNamespace(
        enabled=True, client=Gone(), absolute_uri=f"http://u:{SECRET}@127.0.0.1:9"
    )
    result = RunResult("tune", None, Path("/x"), mlflow_run_id="run-1")
    assert _keep_driver_log(None, "", tracker, result, "log\n", "raysubmit_3") is None
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("rayflow: warning: the job's log was not stored in MLflow")
        and SECRET not in err[0]
    )


# --- the launcher's sweep ----------------------------------------------------------------------------


def _hydra_return(status: str, value):
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    ret = JobReturn(
        overrides=["lr=0.1"],
        cfg=OmegaConf.create({"lr": 0.1, "tag": "${lr}"}),
        hydra_cfg=OmegaConf.create(
            {
                "hydra": {
                    "job": {"name": "my_app", "num": 3},
                    "runtime": {"output_dir": "/n"},
                    "sweep": {"dir": "/n"},
                }
            }
        ),
        working_dir="/n",
        task_name="my_app",
        status=JobStatus[status],
    )
    ret.return_value = value
    return ret


def test_a_launcher_jobs_end_travels_as_json():
    import numpy as np
    from hydra.core.utils import JobStatus

    from rayflow.launcher.jobs import Finished
    from rayflow.launcher.submit import MARKER, read_result, result_line

    finished = [
        Finished(
            0,
            _hydra_return("COMPLETED", {"loss": np.float32(0.5)}),
            b"tar",
            "/n/0",
            ["big.bin (70 MiB)"],
        ),
        Finished(1, _hydra_return("COMPLETED", object())),
        Finished(2, _hydra_return("FAILED", ValueError("lr=1 is too large"))),
        Finished(3, _hydra_return("FAILED", type("AppError", (Exception,), {})("custom"))),
        Finished(4, error="not started: job #2 failed and hydra.launcher.on_failure=stop"),
    ]
    result_channel._TAKEN.key = KEY
    try:
        line = result_line(finished)
    finally:
        result_channel._TAKEN.key = None
    assert line.startswith(MARKER) and "\n" not in line
    back = read_result(f"job output\n{line}\n", KEY)
    assert (
        back[0].job_return.return_value == {"loss": 0.5}
        and back[0].files == b"tar"
        and back[0].left_out == ["big.bin (70 MiB)"]
    )
    assert (
        back[0].job_return.cfg == {"lr": 0.1, "tag": 0.1}
        and back[0].job_return.hydra_cfg.hydra.job.num == 3
    )
    assert back[1].job_return.return_value.startswith("<object object at")  # not JSON: its repr
    assert back[2].job_return.status == JobStatus.FAILED
    with pytest.raises(ValueError, match="lr=1 is too large"):
        back[2].job_return.return_value
    # no type looked up outside builtins
    with pytest.raises(RuntimeError, match="AppError: custom"):
        back[3].job_return.return_value
    assert back[4].job_return is None and back[4].error.startswith("not started")


def test_a_failed_sweep_job_is_not_read_and_a_pickled_line_not_unpickled(
    monkeypatch, tmp_path, capsys
):
    from rayflow.launcher import submit
    from rayflow.orchestrator.submission import JobOutcome

    planted = tmp_path / "pwned"
    settings = SimpleNamespace(
        max_concurrent=None, on_failure="continue", schedule_timeout_s=60.0, auth_mode="token"
    )

    def outcome(status: str, line: str):
        monkeypatch.setattr(
            "rayflow.orchestrator.submission.run_as_job",
            lambda *a, **k: JobOutcome(status, "", "raysubmit_9", f"x\n{line}\n"),
        )
        with pytest.raises(RunFailed, match=f"the sweep's job on backend=vm ended {status}"):
            submit.submit_batch(fake_handle(), None, [], settings)

    outcome("SUCCEEDED", submit.MARKER + pickled(planted))  # the old format, from anyone
    outcome("FAILED", signed(submit.MARKER, []))  # even a line that would verify: the job failed
    assert not planted.exists()


def _tar(*members: tuple[str, str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, data.decode()
                tar.addfile(info)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, data.decode()
                tar.addfile(info)
            elif kind == "device":
                info.type = tarfile.CHRTYPE
                tar.addfile(info)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "members",
    [
        [("escape", "symlink", b"../../outside"), ("escape/x.txt", "file", b"pwned")],
        [("link", "hardlink", b"/etc/passwd")],
        [("dev", "device", b"")],
        [("../outside/x.txt", "file", b"pwned")],
        [("a/../../outside/x.txt", "file", b"pwned")],
        [("/tmp/abs-outside.txt", "file", b"pwned")],
    ],
    ids=["symlink", "hardlink", "device", "dotdot", "inner-dotdot", "absolute"],
)
def test_an_archive_that_pack_could_not_make_is_refused(members, tmp_path):
    from rayflow.launcher.outputs import UnsafeArchive, unpack

    job_dir = tmp_path / "sweep" / "0"
    with pytest.raises(UnsafeArchive, match="a job's outputs"):
        unpack(_tar(*members), str(job_dir))
    assert not (tmp_path / "outside").exists() and not Path("/tmp/abs-outside.txt").exists()
    assert not any(p.is_symlink() for p in tmp_path.rglob("*"))


def test_a_symlink_already_in_the_output_folder_is_not_followed(tmp_path):
    from rayflow.launcher.outputs import UnsafeArchive, unpack

    job_dir, outside = tmp_path / "sweep" / "0", tmp_path / "outside"
    outside.mkdir()
    job_dir.mkdir(parents=True)
    (job_dir / "logs").symlink_to(outside)
    (job_dir / "result.txt").symlink_to(outside / "result.txt")
    for name in ("logs/run.log", "result.txt"):
        with pytest.raises(UnsafeArchive):
            unpack(_tar((name, "file", b"pwned")), str(job_dir))
    assert list(outside.iterdir()) == []


def test_an_archive_over_the_limit_is_refused(tmp_path):
    from rayflow.launcher.outputs import UnsafeArchive, pack, unpack

    (tmp_path / "node").mkdir()
    for i in range(3):
        (tmp_path / "node" / f"f{i}.bin").write_bytes(b"x" * 1000)
    archive, _ = pack(str(tmp_path / "node"))
    with pytest.raises(UnsafeArchive, match="more than"):
        unpack(archive, str(tmp_path / "a"), limit=2500)
    with pytest.raises(UnsafeArchive, match="more than 2 files"):
        unpack(archive, str(tmp_path / "b"), max_members=2)
    assert (
        unpack(archive, str(tmp_path / "c")) == 3
        and (tmp_path / "c" / "f2.bin").read_bytes() == b"x" * 1000
    )


def test_files_a_job_wrote_in_its_working_directory_land_in_its_own_folder(
    tmp_path, monkeypatch, capsys
):
    """hydra.job.chdir=false on a node: what the job wrote in its scratch working directory comes
    back under its output folder, never into the launching process's directory."""
    from rayflow.launcher.jobs import Finished, HydraJob
    from rayflow.launcher.launch import CWD_FOLDER, _job_return
    from rayflow.launcher.outputs import pack

    (tmp_path / "node" / "out").mkdir(parents=True)
    (tmp_path / "node" / "out" / "my_app.log").write_text("log")
    (tmp_path / "node" / "main.py").write_text("print('replaced your code')")
    files, _ = pack(str(tmp_path / "node" / "out"))
    cwd_files, _ = pack(str(tmp_path / "node"), skip=str(tmp_path / "node" / "out"))
    cwd, local_dir = tmp_path / "here", tmp_path / "here" / "sweep" / "0"
    cwd.mkdir()
    (cwd / "main.py").write_text("mine")
    ret = _hydra_return("COMPLETED", 1)
    job = HydraJob(
        0,
        [],
        SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(cwd / "sweep")))),
        {},
        "job #0 (lr=0.1)",
    )
    _job_return(
        job, Finished(0, ret, files, "/n", [], cwd_files=cwd_files), str(local_dir), str(cwd)
    )
    assert (cwd / "main.py").read_text() == "mine"
    assert (local_dir / "my_app.log").read_text() == "log" and (
        local_dir / CWD_FOLDER / "main.py"
    ).is_file()
    assert f"{local_dir / CWD_FOLDER}" in capsys.readouterr().err
