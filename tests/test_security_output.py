"""What rayflow prints, reads back and loads (issue 43, part "output"), without a cluster: auth
off refused on every backend by one rule naming ray_auth_mode, text from a cluster, a log or a
store printed as data (its escape sequences shown, never acted on), job logs read with a size
cap, checkpoints loaded with torch's safe loader, and no secret in Hydra's parse errors."""

from __future__ import annotations

import json
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from rayflow.errors import ClusterError, ConfigError
from rayflow.testing.processes import ray_daemon_pids

# --- 1. one auth rule, by exposure: auth off is refused on every backend -----------------------

AUTH_OFF = {
    # the dashboard on loopback, as issue 30 allowed: the GCS, raylet and agents are not
    "local": (["backend.dashboard_host=127.0.0.1"], "with backend=local "),
    "fake_multinode": (["backend=vm"], "with provider=fake_multinode "),
    "vm on aws": (["backend=vm", "backend.provider=aws"], "with provider=aws "),
    "spark": (["backend=spark"], "Ray on Spark's dashboard listens on all interfaces"),
    "kuberay ClusterIP": (
        ["backend=kuberay", "backend.service_type=ClusterIP"],
        "listen on the pod network",
    ),
    "attach on loopback": (
        ["backend=attach", "backend.address=127.0.0.1:6379"],
        "backend=attach joins (127.0.0.1:6379)",
    ),
    # the key named first, not backend.overrides (issue 43's "also open")
    "vm overrides": (
        [
            "backend=vm",
            "backend.provider=aws",
            "+backend.overrides={head_start_ray_commands: ['ray start --head "
            "--dashboard-host=0.0.0.0']}",
        ],
        "with provider=aws ",
    ),
}


@pytest.mark.parametrize("name", list(AUTH_OFF))
def test_auth_off_is_refused_naming_ray_auth_mode_before_anything_starts(name, tmp_path):
    from rayflow.orchestrator.preflight import preflight

    if name == "spark":
        pytest.importorskip("pyspark")
    overrides, where = AUTH_OFF[name]
    before = ray_daemon_pids()
    with pytest.raises(ConfigError) as refused:
        preflight([*overrides, "ray_auth_mode=disabled", f"storage_path={tmp_path / 'r'}"], False)
    line = str(refused.value)
    assert refused.value.key == "ray_auth_mode" and "\n" not in line
    assert line.startswith("ray_auth_mode: disabled, but ") and where in line
    assert "keep ray_auth_mode=token" in line  # what to do instead
    assert ray_daemon_pids() == before and not (tmp_path / "r").exists()


def test_auth_off_from_the_cli_is_one_line_exit_2_and_nothing_started(rayflow):
    out = rayflow.run("ray_auth_mode=disabled", "backend.dashboard_host=127.0.0.1", timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = [line for line in out.stderr.splitlines() if line.strip()]
    assert line.startswith("rayflow: error: ray_auth_mode: disabled, but with backend=local ")
    assert not rayflow.storage.exists() and "Traceback" not in out.stderr


def test_the_launcher_refuses_auth_off_naming_its_own_key():
    from rayflow.launcher.settings import Settings, check_backend, rayflow_config

    settings = Settings("local", "disabled", {}, None, None, "raise", 60.0, {})
    with pytest.raises(ConfigError) as refused:
        check_backend(rayflow_config(settings, gpu=False))
    assert refused.value.key == "hydra.launcher.ray_auth_mode"


# --- 2. printed text is data ------------------------------------------------------------------

# OSC 52 (write the clipboard), clear the screen, a carriage return over the line, a one-byte CSI,
# a right-to-left override, a bell and a backspace
ESCAPES = "a\x1b]52;c;ZWNobyBwd25lZA==\x07b\x1b[2Jc\rd\x9b31me\u202ef\x08g"
SHOWN = r"a\x1b]52;c;ZWNobyBwd25lZA==\x07b\x1b[2Jc\x0dd\x9b31me\u202ef\x08g"


def assert_inert(text: str) -> None:
    """No control character but newline and tab, and the escapes shown as text."""
    assert SHOWN in text
    assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in text)
    assert "\u202e" not in text


def test_printable_escapes_controls_and_keeps_newlines_tabs_and_text():
    from rayflow.security.printable import printable

    assert printable(ESCAPES) == SHOWN
    assert printable("epoch\t1\nloss é 😀 ✓\n") == "epoch\t1\nloss é 😀 ✓\n"


def test_a_streamed_job_log_is_shown_escaped(capsys):
    from rayflow.orchestrator.job_logs import LogStream

    class Client:
        async def tail_job_logs(self, job_id):
            yield f"step 1 {ESCAPES}\n"
            yield f"token=hunter2 {ESCAPES}"  # the last line, without its newline

    stream = LogStream(Client(), "raysubmit_1")
    stream.start()
    stream.join(timeout=30)
    out = capsys.readouterr().out
    assert_inert(out)
    assert "step 1 " in out and "hunter2" not in out  # masked first, then made printable


def test_a_failed_jobs_last_lines_are_shown_escaped(capsys):
    from rayflow.orchestrator.job_logs import print_last_lines

    print_last_lines(f"ok\n{ESCAPES}\n", "raysubmit_1")
    assert_inert(capsys.readouterr().err)


def _command(monkeypatch, capsys, argv, **calls):
    """`rayflow status|logs ...` with rayflow.orchestrator.clusters' calls given: (code, out,
    err)."""
    from rayflow import commands
    from rayflow.orchestrator import clusters

    for name, call in calls.items():
        monkeypatch.setattr(clusters, name, call)
    with pytest.raises(SystemExit) as exited:
        commands.main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return exited.value.code, out.out, out.err


def test_status_shows_a_clusters_name_and_detail_escaped(monkeypatch, capsys):
    from rayflow.orchestrator.clusters import ClusterStatus

    row = ClusterStatus("kuberay", f"n{ESCAPES}", "unreachable", detail=f"the head said {ESCAPES}")
    code, out, _ = _command(monkeypatch, capsys, ["status"], clusters=lambda: [row])
    assert code == 0 and out.count(SHOWN) == 3  # the name in the table and the note, the detail
    assert_inert(out)


def test_rayflow_logs_prints_the_log_escaped(monkeypatch, capsys):
    code, out, _ = _command(
        monkeypatch, capsys, ["logs", "rayflow"], logs=lambda *a: f"epoch 1\n{ESCAPES}\n"
    )
    assert code == 0 and out.startswith("epoch 1\n")
    assert_inert(out)


def test_an_error_line_quoting_a_cluster_is_escaped(monkeypatch, capsys):
    def unreachable(*args):
        raise ClusterError(f"the head answered {ESCAPES}")

    code, out, err = _command(monkeypatch, capsys, ["logs", "rayflow"], logs=unreachable)
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("rayflow: error: the head answered ")
    assert_inert(err)


def test_the_first_line_of_an_answer_is_escaped():
    from rayflow.orchestrator.job_logs import first_line

    shown = first_line(RuntimeError(f"{ESCAPES}\nmore"))
    assert shown.startswith(r"a\x1b]52;c;ZWNobyBwd25lZA==\x07b\x1b[2J") and "more" not in shown
    assert shown.isprintable()


def test_the_launchers_job_lines_are_escaped(capsys):
    from rayflow.launcher.launch import _say

    _say(f"[rayflow] hydra job #1 failed: {ESCAPES}")
    assert_inert(capsys.readouterr().err)


# --- 3. job logs read with a size cap -----------------------------------------------------------


@pytest.fixture
def jobs_api():
    """A loopback HTTP server answering as Ray's Jobs API does: its version, and a job's log (the
    `logs` attribute set by the test) as one JSON document."""
    import ray

    served = SimpleNamespace(logs="", sent=0)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/api/version":
                body = json.dumps({"version": "4", "ray_version": ray.__version__}).encode()
            elif self.path == "/api/jobs/raysubmit_big/logs":
                body = json.dumps({"logs": served.logs}).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for at in range(0, len(body), 1 << 16):
                    self.wfile.write(body[at : at + (1 << 16)])
                    served.sent = at + (1 << 16)
            except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield served
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _log(lines: int) -> str:
    return "".join(f'line {i:07d} \\ "quoted" é\n' for i in range(lines))


def test_a_job_log_over_the_cap_keeps_its_end_and_says_what_was_left_out(jobs_api, monkeypatch):
    from ray.job_submission import JobSubmissionClient

    from rayflow.orchestrator import job_logs

    monkeypatch.setattr(job_logs, "LOG_CAP_BYTES", 64 * 2**10)
    jobs_api.logs = _log(40_000)  # about 1.1 MiB
    log = job_logs.bounded_log(JobSubmissionClient(jobs_api.url), "raysubmit_big", [])
    note, _, kept = log.partition("\n")
    assert (
        note.startswith("[rayflow] the first ")
        and "MiB of job raysubmit_big's log are left out" in note
    )
    assert len(kept.encode()) <= 64 * 2**10
    assert jobs_api.logs.endswith(kept) and kept.startswith("line ")  # whole lines, the end
    assert "line 0000000" not in log and "line 0039999" in log


def test_a_job_log_past_what_rayflow_reads_is_never_read_whole(jobs_api, monkeypatch):
    from ray.job_submission import JobSubmissionClient

    from rayflow.orchestrator import job_logs

    monkeypatch.setattr(job_logs, "LOG_CAP_BYTES", 64 * 2**10)
    monkeypatch.setattr(job_logs, "LOG_READ_MAX_BYTES", 512 * 2**10)
    jobs_api.logs = _log(400_000)  # about 11 MiB
    log = job_logs.bounded_log(JobSubmissionClient(jobs_api.url), "raysubmit_big", [])
    assert "it goes on past what rayflow reads" in log.partition("\n")[0]
    kept = log.partition("\n")[2]
    assert kept and kept.endswith("\n") and kept in jobs_api.logs
    assert "line 0399999" not in log  # its end was never read
    assert len(log.encode()) < 64 * 2**10 + 200


def test_a_small_job_log_is_read_as_it_is(jobs_api):
    from ray.job_submission import JobSubmissionClient

    from rayflow.orchestrator import job_logs

    jobs_api.logs = _log(10) + "no newline at the end ✓"
    assert (
        job_logs.bounded_log(JobSubmissionClient(jobs_api.url), "raysubmit_big", [])
        == jobs_api.logs
    )


def test_the_mlflow_copy_of_a_log_is_read_from_its_end(tmp_path, monkeypatch):
    from rayflow.orchestrator import cluster_logs, job_logs

    monkeypatch.setattr(job_logs, "LOG_CAP_BYTES", 4096)
    path = tmp_path / "driver.log"
    path.write_text(_log(5000))
    text = cluster_logs.tail_of_file(path, "raysubmit_1")
    note, _, kept = text.partition("\n")
    assert "left out" in note and len(kept.encode()) <= 4096
    assert path.read_text().endswith(kept) and kept.startswith("line ")
    path.write_text("short\n")
    assert cluster_logs.tail_of_file(path, "raysubmit_1") == "short\n"


# --- 4. checkpoints: torch's safe loader --------------------------------------------------------


class _Planted:
    """What a checkpoint.pt someone planted unpickles to: a call that writes a file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickled_checkpoint_that_would_run_code_is_refused_unrun(tmp_path):
    import torch

    from rayflow.workloads.presets.cifar_train import load_checkpoint, read_checkpoint
    from rayflow.workloads.presets.models import Net

    marker = tmp_path / "ran"
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    torch.save({"model": _Planted(str(marker)), "epoch": 3}, folder / "checkpoint.pt")
    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(pickle.UnpicklingError, match="refused by torch's safe loader"):
        load_checkpoint(str(folder), net, optimizer)
    with pytest.raises(pickle.UnpicklingError):  # ddp's _restore reads it the same way
        read_checkpoint(str(folder / "checkpoint.pt"))
    assert not marker.exists()
    # what the safe loader kept from running: a plain torch.load would have
    torch.load(folder / "checkpoint.pt", weights_only=False)
    assert marker.exists()


def test_the_presets_checkpoints_load_with_the_safe_loader(tmp_path):
    import torch

    from rayflow.workloads.presets import ddp_loop
    from rayflow.workloads.presets.cifar_train import (
        load_checkpoint,
        read_checkpoint,
        save_checkpoint,
    )
    from rayflow.workloads.presets.models import Net

    net = Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    save_checkpoint(str(tmp_path), net, optimizer, 4)
    again = Net()
    assert load_checkpoint(str(tmp_path), again, torch.optim.SGD(again.parameters(), lr=0.1)) == 4
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), again.parameters(), strict=True))
    factor = ddp_loop.lr_factor({"warmup_epochs": 1, "epochs": 2, "lr_schedule": "cosine"}, 3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    ddp_loop._save(str(tmp_path), 2, net, optimizer, scheduler, scaler)
    state = read_checkpoint(str(tmp_path / "checkpoint.pt"))
    assert state["epoch"] == 2 and set(state) == {
        "epoch",
        "model",
        "optimizer",
        "scheduler",
        "scaler",
    }


# --- 5. secrets in Hydra's parse errors ---------------------------------------------------------

UNPARSABLE = [
    ("+workload.hf_token=[hunter2Qx9a", "workload.hf_token", "hunter2Qx9a"),
    ('backend.password="hunter2Qx9b', "backend.password", "hunter2Qx9b"),
    ("+x.api_key={a: hunter2Qx9c", "x.api_key", "hunter2Qx9c"),
    ("+workload.env={HF_TOKEN: [hunter2Qx9d", "workload.env", "hunter2Qx9d"),
]


@pytest.mark.parametrize("override,key,secret", UNPARSABLE, ids=[u[1] for u in UNPARSABLE])
def test_an_unparsable_override_names_its_key_and_shows_no_secret(override, key, secret):
    from rayflow.orchestrator.preflight import preflight
    from rayflow.security.redaction import masked_message

    with pytest.raises(ConfigError) as refused:
        preflight([override, "tracking=none"], False)
    shown = masked_message(refused.value)
    assert refused.value.key == key and shown.startswith(f"{key}: cannot parse its value")
    assert "hunter2" not in shown and secret[-4:] not in shown and "\n" not in shown


def test_an_unparsable_override_of_a_plain_key_keeps_hydras_words():
    from rayflow.orchestrator.preflight import preflight

    with pytest.raises(ConfigError, match=r"^workload\.lr: cannot parse its value: .*'\[0\.1'"):
        preflight(["+workload.lr=[0.1", "tracking=none"], False)


def test_the_cli_prints_an_unparsable_secret_override_without_it(rayflow):
    out = rayflow.run("+workload.hf_token=[hunter2Qx9a", "dry_run=true", timeout=120)
    assert out.returncode == 2
    [line] = [line for line in out.stderr.splitlines() if line.strip()]
    assert line.startswith("rayflow: error: workload.hf_token: cannot parse its value (a [ left")
    assert "hunter2" not in out.stdout + out.stderr
