"""Quiet by default (`verbose`): a small run prints rayflow's lines and the results block, no Tune
status tables (they come back with verbose=2), and nothing of Ray's after the results; rayflow's
live line on a terminal never shares a line with another's output; the autoscaler's lines on a
submitted run are one line per scale event."""

from __future__ import annotations

import io
import re
import sys
import time

import pytest

from rayflow.runtime import progress
from rayflow.runtime.verbosity import autoscaler_line, autoscaler_lines, level, tune_verbose

# Lines Tune's own output prints (ray.tune.experimental.output): its status table and its boxes.
TUNE_TABLE = re.compile(
    r"^(Trial status:|Current time:|│|╭|╰|Trial \S+ (started|completed|finished))"
)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """The lines a terminal shows for `text`: \\r goes back to the line's start, ESC[K clears to
    its end, other characters overwrite."""
    lines, line, col = [], [], 0
    i = 0
    while i < len(text):
        if text.startswith("\033[K", i):
            del line[col:]
            i += 3
            continue
        ch = text[i]
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("".join(line))
            line, col = [], 0
        else:
            line[col : col + 1] = [ch]
            col += 1
        i += 1
    return lines + (["".join(line)] if line else [])


# --- the key ------------------------------------------------------------------------------------


def test_verbose_levels_map_onto_tunes_own():
    assert [level(v) for v in (False, True, 0, 1, 2, 3, None)] == [0, 2, 0, 1, 2, 3, 0]
    # rayflow's 0 and 1 keep Tune silent; 2 is Tune's default (tables, start and end boxes); 3 every result
    assert [tune_verbose(v) for v in (False, 0, 1, 2, True, 3)] == [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize("value", ["4", "-1", "loud", "2.5"])
def test_a_verbose_out_of_range_is_one_line_naming_the_key(value):
    from rayflow.errors import ConfigError
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.preflight import plan_job

    with pytest.raises(ConfigError) as caught:
        plan_job(compose_config(f"verbose={value}", "dry_run=true"), [])
    assert caught.value.key == "verbose" and "from 0 to 3, true or false" in str(caught.value)


def test_the_default_is_quiet(default_config):
    assert default_config.verbose == 0


# --- a live line on a terminal and another's output ---------------------------------------------


def test_a_line_printed_while_a_phase_ticks_starts_a_line_of_its_own(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", term)
    with progress.phase(
        "waiting for the first result", "tune", stream=term, tick_after_s=0, tick_every_s=0.01
    ):
        time.sleep(0.05)  # the live line is drawn, and redrawn
        print("╭── Trial a config ──╮")  # Tune's box, as verbose=2 prints it
        print("│ lr   0.01          │")
        time.sleep(0.05)  # the ticker draws the live line again, under the box
    shown = screen(term.getvalue())
    assert "╭── Trial a config ──╮" in shown and "│ lr   0.01          │" in shown, shown
    assert re.fullmatch(
        r"\[rayflow\] tune: waiting for the first result\.\.\. done in \d+\.\d s", shown[-1]
    ), shown
    assert sys.stdout is term  # put back


def test_an_unfinished_line_of_anothers_is_not_wiped(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", term)
    with progress.phase("waiting", "tune", stream=term, tick_after_s=0, tick_every_s=0.01):
        sys.stdout.write("downloading 10%")
        time.sleep(0.05)  # no redraw over it
    shown = screen(term.getvalue())
    assert shown[0] == "downloading 10%" and shown[-1].startswith(
        "[rayflow] tune: waiting... done in"
    ), shown


# --- the autoscaler ------------------------------------------------------------------------------

# What a small vm run's job log showed of the autoscaler (Ray 2.x, autoscaler v1 and v2).
AUTOSCALER_LOG = """\
(autoscaler +2s) Tip: use `ray status` to view detailed cluster status. To disable these messages, set RAY_SCHEDULER_EVENTS=0.
(autoscaler +2s) Adding 1 node(s) of type rayflow_worker_cpu.
(autoscaler +3s) Resized to 4 CPUs.
(pid=4711) epoch 1 loss 0.8
(autoscaler +9s) Error: No available node types can fulfill resource request {'CPU': 64.0}. Add suitable node types to this cluster to resolve this issue.
(autoscaler +1m4s) Adding 2 node(s) of type rayflow_worker_gpu.
(autoscaler +1m5s) Resized to 8 CPUs, 2 GPUs.
(autoscaler +3m) Removing 2 nodes of type rayflow_worker_cpu (idle).
(autoscaler +3m) Resized to 4 CPUs.
(autoscaler +3m1s) Failed to launch 1 node(s) of type rayflow_worker_cpu. (InsufficientInstanceCapacity): no capacity in us-east-1a
\x1b[36m(autoscaler +3m1s)\x1b[0m Restarting 1 nodes of type rayflow_worker_gpu (lost contact with raylet).
""".splitlines()


def test_the_autoscalers_lines_are_one_line_per_scale_event():
    assert autoscaler_lines(AUTOSCALER_LOG) == [
        "[rayflow] autoscaler: launched 1 worker (cpu)",
        "(pid=4711) epoch 1 loss 0.8",  # not the autoscaler's: as it is
        AUTOSCALER_LOG[4],  # why a run waits: as it is
        "[rayflow] autoscaler: launched 2 workers (gpu)",
        "[rayflow] autoscaler: stopping 2 workers (cpu, idle)",
        # a launch that failed, with Ray's reason: it says why a run waits
        "[rayflow] autoscaler: failed to launch 1 worker (cpu, InsufficientInstanceCapacity): "
        "no capacity in us-east-1a",
        "[rayflow] autoscaler: restarting 1 worker (gpu, lost contact with raylet)",
    ]


def test_verbose_shows_the_autoscalers_own_lines():
    assert autoscaler_lines(AUTOSCALER_LOG, verbose=1) == AUTOSCALER_LOG
    assert (
        autoscaler_line("(autoscaler +1s) Adding 3 node(s) of type ray.worker.default.")
        == "[rayflow] autoscaler: launched 3 workers (ray.worker.default)"
    )


def test_a_submitted_runs_streamed_log_summarises_the_autoscaler(monkeypatch):
    from rayflow.orchestrator.job_logs import LogStream as _LogStream

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    _LogStream(None, "job")._write("\n".join(AUTOSCALER_LOG[:4]) + "\n")
    assert out.getvalue().splitlines() == [
        "[rayflow] autoscaler: launched 1 worker (cpu)",
        "(pid=4711) epoch 1 loss 0.8",
    ]


# --- a small run, as a user runs it (one run for the default's assertions) -----------------------


def _after_results(lines: list[str]) -> list[str]:
    [start] = [i for i, line in enumerate(lines) if line.startswith("== rayflow results")]
    return lines[start:]


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory, data_root) -> list[str]:
    """The lines of a small default run, stdout and stderr together in the order they came."""
    from tests.harness.cli import Rayflow

    cli = Rayflow(tmp_path_factory.mktemp("quiet"), data_root)
    # Ray's default: its held-back `[repeated Nx]` lines are what this checks
    cli.env.pop("RAY_DEDUP_LOGS", None)
    proc, log = cli.start("workload.num_samples=2", "workload.max_epochs=1", "tracking=none")
    try:
        proc.wait(timeout=300)
    finally:
        proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    return text.splitlines()


def test_a_small_run_prints_no_tune_tables_and_nothing_of_rays_after_its_results(quiet_run):
    shown = "\n".join(quiet_run)
    assert not [line for line in quiet_run if TUNE_TABLE.match(line)], shown
    after = _after_results(quiet_run)
    assert not [
        line for line in after if "repeated" in line or "(pid=" in line or line.startswith("(")
    ], shown
    assert len(quiet_run) <= 40, shown


def test_verbose_2_brings_tunes_tables_back(rayflow):
    # a one-report function is enough for Tune's tables, and costs a trial, not a cifar search
    (rayflow.workdir / "objective.py").write_text(
        "def objective(config):\n    return {'loss': 0.5}\n"
    )
    out = rayflow.run(
        "workload=tune",
        "workload.trainable=objective:objective",
        "workload.metric=loss",
        "workload.mode=min",
        "workload.num_samples=1",
        "tracking=none",
        "backend.include_dashboard=false",
        "verbose=2",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [line for line in out.stdout.splitlines() if TUNE_TABLE.match(line)], out.stdout


def _without_worker_exit_noise(lines: list[str]) -> list[str]:
    """Lines less Ray's own noise from a worker it shuts down under load: its SIGTERM handler
    raises SystemExit inside a weakref callback, which Python prints as "Exception ignored in:"
    and a traceback, each line prefixed "(name pid=N)". Ray's, at shutdown; not the run's."""
    kept, worker = [], None
    for line in lines:
        found = re.match(r"(\(\S+ pid=\d+\)) ?(.*)", line)
        if found and found.group(2).startswith("Exception ignored in"):
            worker = found.group(1)
            continue
        if worker and line.startswith(worker):
            if found and found.group(2).startswith("SystemExit"):
                worker = None
            continue
        worker = None
        kept.append(line)
    return kept


def test_a_notebook_cell_gets_a_few_lines_for_four_trials(rayflow, tmp_path, monkeypatch):
    """rayflow.run in a real kernel (nbclient), as test_notebook runs one: Tune's notebook
    tables (about 100 lines for 4 trials) are off; what is left is rayflow's own lines and the
    results block."""
    nb_helpers = pytest.importorskip("tests.test_notebook")
    nbformat = nb_helpers.nbformat
    jupyter_path = tmp_path / "jupyter"
    nb_helpers.kernel_spec(jupyter_path)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_path))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": nb_helpers.KERNEL_NAME,
        "display_name": "rayflow test",
        "language": "python",
    }
    args = [*rayflow.base, "workload.num_samples=4", "workload.max_epochs=1", "tracking=none"]
    nb.cells.append(nbformat.v4.new_code_cell("import rayflow", metadata={"rayflow_timeout_s": 60}))
    nb.cells.append(
        nbformat.v4.new_code_cell(
            f"result = rayflow.run(*{args!r})", metadata={"rayflow_timeout_s": 300}
        )
    )
    env = {**nb_helpers.kernel_env(rayflow.env), "IPYTHONDIR": str(tmp_path / "ipython")}
    env.pop("RAY_DEDUP_LOGS", None)
    nb, _ = nb_helpers.execute(nb, rayflow.workdir, env)
    lines = [line for line in nb_helpers.outputs_text(nb.cells[1]).splitlines() if line.strip()]
    lines = _without_worker_exit_noise(lines)
    assert not [line for line in lines if TUNE_TABLE.match(line) or "Trial status" in line], lines
    assert len(lines) <= 30, "\n".join(lines)
    tables = [
        o
        for o in nb.cells[1].outputs  # Tune's HTML tables in a kernel
        if o.output_type == "display_data" and o.data.get("text/html", "").strip()
    ]
    assert not tables, tables[:2]


# --- MLflow's store setup (issue 44): its INFO lines only from verbose=1 -------------------------

_STORE_SCRIPT = """
import sys
from omegaconf import OmegaConf
from rayflow.runtime.run_log import quiet_libraries
from rayflow.tracking.tracker import Tracker
cfg = OmegaConf.create({"verbose": int(sys.argv[1]), "tracking": {
    "enabled": True, "uri": "sqlite:///" + sys.argv[2], "experiment": "quiet"}})
with quiet_libraries(int(sys.argv[1]), Tracker(cfg).libraries):  # as rayflow.orchestrator.session runs a job
    Tracker(cfg).client.get_experiment_by_name("quiet")
"""


@pytest.mark.parametrize("verbose, shown", [(0, False), (1, True)])
def test_mlflow_store_setup_lines_only_when_verbose(tmp_path, verbose, shown):
    """A fresh SQLite store's "Creating initial MLflow database tables..." (and alembic's lines)
    are not shown at the default verbosity; verbose=1 shows them."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _STORE_SCRIPT, str(verbose), str(tmp_path / "db.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    printed = out.stdout + out.stderr
    info = [line for line in printed.splitlines() if re.search(r"\bINFO\b.*(mlflow|alembic)", line)]
    assert bool(info) == shown, printed


def test_rays_launcher_prints_plain_records_where_stdout_is_not_a_terminal(capsys):
    """`ray up` through Ray's SDK (backend=vm): Ray's cli_logger colours its records whatever the
    stream and, in its record style, prints its verbose lines too; within launcher_output it
    prints as `ray up` does on a terminal, without the colour codes."""
    import colorful
    from ray.autoscaler._private.cli_logger import cli_logger

    from rayflow.backends.vm.commands import launcher_output

    before = colorful.colorful.colormode
    colorful.colorful.colormode = colorful.terminal.ANSI_8_COLORS  # as TERM=xterm in a pipe
    try:
        cli_logger.labeled_value("Cluster", "coloured")
        with launcher_output():
            cli_logger.labeled_value("Cluster", "rayflow-abc")
            cli_logger.verbose("Running `uptime` on 10.0.0.2")
        cli_logger.labeled_value("Cluster", "coloured again")
        printed = capsys.readouterr().out.splitlines()
    finally:
        colorful.colorful.colormode = before
    assert "\x1b[" in printed[0]  # what Ray does without it, and again after it
    assert printed[1].endswith(" -- Cluster: rayflow-abc") and len(printed) == 3, printed
    assert "\x1b[" in printed[2]
