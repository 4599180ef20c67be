"""backend=vm with provider=fake_multinode: Ray's real autoscaler adding and removing worker
nodes as processes on this machine, and the run submitted to the head as a Ray Job.

Slow: a head takes ~12 s and each scale-up ~14 s on 2 cores.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest
import yaml
from hydra.test_utils.launcher_common_tests import LauncherTestSuite

from rayflow.runtime.processes import pids_mentioning
from rayflow.testing.backends import JobSubmissionSuite, LifecycleSuite
from rayflow.testing.processes import ray_daemon_pids, wait_until
from tests.harness.cli import Rayflow
from tests.harness.examples import USER_TUNE, copy_example
from tests.harness.hydra_app import KeptCluster, SweepApp, jobs_came_home, sweep_comes_home
from tests.harness.node_loss import NodeKiller

pytestmark = pytest.mark.slow

# The cluster: a head with 0 CPUs, a 1-CPU worker type, 0 to 2 workers.
FAKE = [
    "backend=vm",
    "backend.provider=fake_multinode",
    "backend.worker.cpu.num_cpus=1",
    "backend.min_worker_nodes=0",
    "backend.max_worker_nodes=2",
    "backend.autoscale_idle_timeout_minutes=1",
]


# A Tune run as small as a run gets: one trial of the user's own function, one result.
ONE_TRIAL = [
    "workload=tune",
    "workload.trainable=objective:objective",
    "workload.metric=loss",
    "workload.mode=min",
    "tracking.uri=sqlite:///mlflow.db",
]


def _cli(runner: Rayflow, *args: str) -> subprocess.CompletedProcess:
    """`rayflow status|down|logs ...` in the runner's folder and environment."""
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=runner.workdir,
        env=runner.env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _status(runner: Rayflow) -> dict[str, dict]:
    out = _cli(runner, "status", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    return {row["name"]: row for row in json.loads(out.stdout)}


def _submit(dashboard: str, entrypoint: str) -> str:
    """A Ray Job submitted as any Ray user does, with this user's token."""
    import urllib.request

    from rayflow.security.auth import auth_token

    request = urllib.request.Request(
        f"{dashboard}/api/jobs/",
        data=json.dumps({"entrypoint": entrypoint}).encode(),
        headers={"Authorization": f"Bearer {auth_token()}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["submission_id"]


@pytest.fixture(scope="module")
def idle_cluster(tmp_path_factory, data_root):
    """A cluster kept with a one-minute autostop by a run that has ended, in a registry of the
    module's own ($XDG_CACHE_HOME). The first test uses it; the module's other tests run while it
    idles; the last finds it stopped by its own watcher, with no client of it alive."""
    runner = Rayflow(tmp_path_factory.mktemp("kept"), data_root)
    runner.env["XDG_CACHE_HOME"] = str(runner.workdir / "cache")
    (runner.workdir / "objective.py").write_text(
        "def objective(config):\n    return {'loss': 0.5}\n"
    )
    name = ["backend.cluster_name=rf-idle"]
    first = runner.run(
        *FAKE, *name, "backend.keep_cluster=true", "backend.autostop_idle_minutes=1", *ONE_TRIAL
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    runner.kept = {"first": first, "name": name, "temp_dir": None}
    yield runner
    if runner.kept["temp_dir"] and pids_mentioning(runner.kept["temp_dir"]):
        _cli(runner, "down", "rf-idle", "--force")  # never left running, whatever failed
        pytest.fail("the idle kept cluster did not stop itself")


def test_a_kept_cluster_is_listed_joined_by_name_and_its_job_log_read(idle_cluster):
    """Kept: `status` lists it idle with its autostop counting down; a second run that names it
    joins it; `logs` prints that run's job log (its results table, not rayflow's signed line)."""
    runner = idle_cluster
    assert "autostop: rf-idle stops itself after 1 idle minute" in runner.kept["first"].stdout
    row = _status(runner)["rf-idle"]
    assert row["backend"] == "vm" and row["state"] == "idle" and row["autostop_idle_minutes"] == 1
    assert 0 < row["autostop_in_s"] <= 60 and row["nodes"] >= 1 and row["jobs"] == 1
    second = runner.run(*FAKE, *runner.kept["name"], *ONE_TRIAL)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    joined = re.search(r"joining the kept cluster rf-idle \((/\S+)\)", second.stdout)
    assert joined and "starting a fake_multinode head" not in second.stdout
    runner.kept["temp_dir"] = joined.group(1)
    assert _status(runner)["rf-idle"]["jobs"] == 2
    log = _cli(runner, "logs", "rf-idle")
    assert log.returncode == 0 and "== rayflow results ==" in log.stdout, log.stderr[-2000:]
    assert "[rayflow-result]" not in log.stdout
    # a job of the user's own, straight through the Jobs API: the cluster is in use meanwhile
    job = _submit(_status(runner)["rf-idle"]["address"], "echo from-the-job; sleep 8")
    refused = _cli(runner, "down", "rf-idle")
    assert refused.returncode == 2 and re.fullmatch(
        f"rayflow: error: rayflow down: rf-idle is in use \\(job {job} (pending|running)\\): "
        "wait for it, or tear it down anyway with --force",
        refused.stderr.strip(),
    ), refused.stderr
    followed = _cli(runner, "logs", "rf-idle", job, "--follow")  # returns once the job ends
    assert followed.returncode == 0 and "from-the-job" in followed.stdout, followed.stderr
    table = _cli(runner, "status").stdout.splitlines()
    assert table[0].split() == [
        "BACKEND",
        "NAME",
        "STATE",
        "NODES",
        "UP",
        "IDLE",
        "AUTOSTOP",
        "NODE-SECONDS",
        "JOBS",
    ]


class TestVM(LifecycleSuite, JobSubmissionSuite):
    name = "vm"
    owns_cluster = True
    # the graceful stop, then the SIGKILL sweep behind it
    teardown_faults = [
        ("stop the fake cluster's processes",),
        ("kill what is left of the fake cluster",),
    ]

    def overrides(self):
        return FAKE


# The cifar job's trials: 5 epochs of 4000 images, about 0.5 s an epoch after a first of about
# 3 s (the trial's process starting) on 2 cores, a checkpoint every epoch. A node is killed under
# a trial that has checkpointed and has epochs to go (NodeKiller).
CIFAR_EPOCHS = 5


@pytest.fixture(scope="module")
def vm_jobs(tmp_path_factory, data_root):
    """A ddp, a user's Tune and a cifar job submitted in turn from one process (session.run_jobs):
    they share one fake_multinode cluster started from a cluster YAML file (a dry run's output fed
    back as backend.cluster_yaml), which scales 0 -> 2 workers for them and is torn down after.

    Issue "node loss", on the same cluster (a cluster of its own would cost a minute more): while
    the cifar job runs, the worker node under one of its trials dies once that trial has
    checkpointed; the run must still succeed. What was killed is `runner.node_loss`
    (`runner.node_loss_error` says why nothing was).

    The cifar job comes last because the fake provider never replaces a dead node while a job
    asks for its resources: Ray's autoscaler leaves the node in the provider's list (its
    unhealthy-node check skips the fake provider's nodes, tagged `uninitialized` for good), so it
    is removed only once idle for autoscale_idle_timeout_minutes, and Ray Train's
    request_resources (the ddp job) counts it as one of the two CPUs asked for: killed before
    the ddp job, the node was never removed nor replaced and ddp waited for its second worker
    forever."""
    before = ray_daemon_pids()
    runner = Rayflow(tmp_path_factory.mktemp("vm-jobs"), data_root)
    copy_example("tune-pbt", runner.workdir)  # the user's own project
    # The cluster is a file, as a user keeps one: the dry run's output of FAKE, handed back.
    dry = runner.run(*FAKE, "dry_run=true", "tracking=none")
    assert dry.returncode == 0, dry.stderr
    (runner.workdir / "cluster.yaml").write_text(dry.stdout)
    cluster = ["backend=vm", f"backend.cluster_yaml={runner.workdir / 'cluster.yaml'}"]
    # run_jobs blocks; the killer watches the cifar trials' folders meanwhile (the cifar preset's
    # trainable is train_cifar; fake nodes write to this machine's storage path).
    killer = NodeKiller(runner.storage, "*/train_cifar_*", last=CIFAR_EPOCHS)
    killer.start()
    try:
        out = runner.run_jobs(
            [*cluster, "workload=ddp", "workload.epochs=2"],
            [*cluster, *USER_TUNE],
            [
                *cluster,
                "workload.num_samples=4",
                f"workload.max_epochs={CIFAR_EPOCHS}",
                f"workload.scheduler.grace_period={CIFAR_EPOCHS}",  # ASHA stops no trial
                "workload.reuse_actors=false",
                "data.synthetic_train_size=4000",
                # the preset's workload.max_failures=2: a failed trial restarts from its checkpoint
            ],
            timeout=900,
        )
    finally:
        killer.cancel()
        killer.join(timeout=60)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runner.dry_run = dry.stdout
    runner.node_loss, runner.node_loss_error = killer.loss, killer.error
    yield runner, out
    # the killed node's processes included: none may outlive the cluster's teardown
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), (
        "the shared fake cluster was left running"
    )


def test_the_users_tune_function_goes_with_the_job(vm_jobs):
    """The project folder is the job's working_dir: the job's driver imports train:objective from
    Ray's copy of it, the trials on the worker nodes too (the head has no CPU for them)."""
    runner, out = vm_jobs
    client, parents, children = runner.mlflow("tune")
    [parent] = parents
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "vm"
    assert (
        parent.data.params["workload.trainable"] == "train:objective"
        and "best_loss" in parent.data.metrics
    )
    trials = children[parent.info.run_id]
    assert len(trials) == 2 and all(
        t.info.status == "FINISHED" and "accuracy" in t.data.metrics for t in trials
    )
    assert {"learning_curves.png", "search.png"} <= set(runner.plots(client, parent))


def test_cifar_as_a_job_scales_out_and_lands_in_mlflow(vm_jobs):
    runner, out = vm_jobs
    assert (
        out.stdout.count("[rayflow] starting the vm cluster") == 1
        and out.stdout.count("[rayflow] reusing the vm cluster") == 2
    )
    assert (
        out.stdout.count("[rayflow] submitted job raysubmit_") == 3
        and "== rayflow results ==" in out.stdout
    )
    client, parents, children = runner.mlflow("cifar")
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "vm"
    # the head and 2 autoscaled workers (scaled out for the ddp job before it)
    assert parent.data.metrics["cluster_nodes_peak"] >= 3
    assert parent.data.metrics["cluster_node_seconds"] > 0
    assert len(children[parent.info.run_id]) == 4
    # the cluster file as applied: the dry run's document, rendered the same when handed back
    spec = client.download_artifacts(parent.info.run_id, "cluster/spec.yaml", str(runner.workdir))
    assert (
        yaml.safe_load(open(spec))["available_node_types"]
        == yaml.safe_load(runner.dry_run)["available_node_types"]
    )


def test_each_submitted_job_returns_its_run_result(vm_jobs):
    """run_jobs (rayflow.run's path) returns for a job on the head the RunResult a local run
    returns: the numbers, the trials and the MLflow parent run the job wrote."""
    runner, out = vm_jobs
    ddp, tune, cifar = runner.run_results(out)
    for result, experiment in ((cifar, "cifar"), (ddp, "ddp"), (tune, "tune")):
        _, parents, _ = runner.mlflow(experiment)
        assert result["type"] == "RunResult" and result["mlflow_run_id"] == parents[0].info.run_id
        # fake nodes share this machine's files
        assert result["experiment_dir"].startswith(str(runner.storage))
    assert (
        cifar["trials"] == 4
        and "val_accuracy" in cifar["best_metrics"]
        and "lr" in cifar["best_config"]
    ), cifar
    assert tune["trials"] == 2 and "loss" in tune["best_metrics"] and "lr" in tune["best_config"], (
        tune
    )
    # one row per epoch of the one Train run
    assert ddp["trials"] == 2 and "val_accuracy" in ddp["best_metrics"], ddp
    assert out.stdout.count("== rayflow results") == 3  # the table once per job, not again here
    assert "[rayflow-result]" not in out.stdout  # the job's line for this side is not shown


def test_ddp_as_a_job_puts_two_train_workers_on_two_autoscaled_nodes(vm_jobs):
    runner, out = vm_jobs
    client, parents, children = runner.mlflow("ddp")
    assert parents[0].info.status == "FINISHED" and parents[0].data.tags["backend"] == "vm"
    assert parents[0].data.metrics["cluster_nodes_peak"] >= 3


def test_a_worker_node_lost_mid_trial_restarts_its_trial_from_its_checkpoint(vm_jobs):
    """Issue "node loss": a worker node dies (its processes SIGKILLed) while its trial runs, once
    the trial has checkpointed. Tune retries the trial (workload.max_failures) on another node
    from its last checkpoint, and the job ends as if nothing happened: every trial finished."""
    runner, out = vm_jobs
    loss = runner.node_loss
    assert loss is not None, runner.node_loss_error
    # the whole node went: its raylet, its agents, its log monitor, the trial's process
    killed = " ".join(loss.killed.values())
    assert {loss.raylet_pid, loss.trial_pid} <= set(loss.killed), loss
    assert all(
        name in killed for name in ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "log_monitor.py")
    ), loss
    assert loss.checkpoints and len(loss.checkpoints) < CIFAR_EPOCHS, loss

    # What Tune printed for the failure, the trial named by its id (result.json's rows carry it).
    rows = [json.loads(line) for line in (loss.trial_dir / "result.json").read_text().splitlines()]
    trial_id = rows[0]["trial_id"]
    assert f"Trial task failed for trial train_cifar_{trial_id}" in out.stdout, out.stdout[-5000:]

    # The trial's rows: those of the killed process, then those of the restarted one, which
    # began after the epoch of the checkpoint it was restored from, not at epoch 1 again.
    before = [row for row in rows if row["pid"] == loss.trial_pid]
    after = rows[len(before) :]
    assert before and after and loss.trial_pid not in {row["pid"] for row in after}, rows
    assert [row["epoch"] for row in before] == list(range(1, len(before) + 1)), rows
    assert after[0]["iterations_since_restore"] == 1  # Tune counts it as a restore
    # Tune registers a checkpoint once the trial's `save` task has returned, a round trip after
    # the result that carried it (TuneController._schedule_trial_save -> _on_saving_result): a
    # node lost in between restarts the trial from the checkpoint before its last. Either way
    # it goes on from a checkpoint it had written, and trains no epoch before that one again.
    restored_epoch = after[0]["epoch"] - 1
    assert len(before) - 1 <= restored_epoch <= len(before) and restored_epoch >= 1, rows
    restored = before[restored_epoch - 1]["checkpoint_dir_name"]
    assert restored in loss.checkpoints, (restored, loss.checkpoints)
    epochs = [row["epoch"] for row in after]
    assert epochs == list(range(restored_epoch + 1, CIFAR_EPOCHS + 1)), rows

    # In MLflow, as for the others: the trial's run FINISHED, each epoch's val_loss logged as
    # the trial reported it (an epoch trained again after the restore, again).
    client, parents, children = runner.mlflow("cifar")
    [parent] = parents
    assert parent.info.status == "FINISHED"
    trials = children[parent.info.run_id]
    assert len(trials) == 4 and all(t.info.status == "FINISHED" for t in trials), trials
    [run] = [t for t in trials if t.data.tags.get("trial_id") == trial_id]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_loss")]
    assert sorted(steps) == sorted(row["epoch"] for row in rows), steps

    # Last: the results table counts the restart (that line is new in rayflow's report).
    assert "trials restarted: 1" in out.stdout, out.stdout[-3000:]


def test_sigterm_during_the_job_stops_it_and_tears_down(rayflow):
    before = ray_daemon_pids()
    proc, log = rayflow.start(
        *FAKE,
        "workload.num_samples=2",
        "workload.max_epochs=30",
        "workload.scheduler.grace_period=30",
    )
    assert wait_until(
        lambda: "submitted job" in log.read_text() and rayflow.checkpoints(),
        timeout=300,
        interval=0.5,
    ), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=180) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert "stopping job" in log.read_text()
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60)


def test_a_file_tracking_uri_is_refused_for_a_cloud_provider(rayflow):
    out = rayflow.run("backend=vm", "backend.provider=aws", "tracking.uri=sqlite:///mlflow.db")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("rayflow: error: tracking.uri: ")


def test_sigterm_while_the_head_starts_leaves_nothing(rayflow):
    before = ray_daemon_pids()
    proc, log = rayflow.start(*FAKE, "workload.num_samples=1", "workload.max_epochs=1")
    assert wait_until(
        lambda: "starting a fake_multinode head" in log.read_text(), timeout=120, interval=0.1
    ), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=180) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), (
        "the half-started head was left"
    )


def test_two_runs_with_one_cluster_name_leave_each_other_intact_and_a_wrong_token_is_one_line(
    tmp_path, monkeypatch
):
    """Clusters have owners, on one real cluster: while a run holds its (kept) cluster, a second
    run of the same name is refused in one line before it starts anything; once the first ended,
    a later run that names it joins it and leaves it running; `rayflow down` stops it.
    The head asks for the token too: a client holding another one gets one line, not a traceback
    (a process of its own: Ray caches the token a process read first)."""
    import os
    import subprocess
    import sys

    from rayflow.backends import backend_for
    from rayflow.backends.kept import records as kept_records
    from rayflow.backends.vm import state
    from rayflow.backends.vm.start import wait_for_dashboard
    from rayflow.orchestrator.cluster import running
    from rayflow.orchestrator.compose import compose_config

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its clusters' records
    before = ray_daemon_pids()
    client = (
        "import sys\nfrom rayflow.orchestrator.submission import JobError, run_as_job\n"
        "try:\n    run_as_job(sys.argv[1], ['python', '-c', 'print(1)'], {})\n"
        "except JobError as err:\n    print('JOBERROR', err)\n"
    )
    owned = [*FAKE, "backend.cluster_name=rf-owned", "ray_auth_mode=token"]
    with running(backend_for(compose_config(*owned, "backend.keep_cluster=true"))) as first:
        out = subprocess.run(
            [sys.executable, "-c", client, first.address],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="not-the-cluster-token"),
            cwd=tmp_path,
        )
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "rayflow",
                *owned,
                "tracking=none",
                "data.synthetic=true",
                f"data.root={tmp_path / 'data'}",
                f"storage_path={tmp_path}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert (
            second.stderr.strip()
            .splitlines()[-1]
            .startswith(
                "rayflow: error: backend.cluster_name: a cluster named 'rf-owned' is in use"
            )
        )
        assert "starting a fake_multinode head" not in second.stdout + second.stderr
        wait_for_dashboard(first.address, 5, "the first run's cluster")  # left intact
        kept = first.teardown_command
    lines = [line for line in out.stdout.splitlines() if line.startswith("JOBERROR ")]
    assert len(lines) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert (
        lines[0].startswith("JOBERROR the Jobs API at http://127.0.0.1:")
        and "not-the-cluster-token" not in lines[0]
    )
    try:
        # kept: the first run left it running
        wait_for_dashboard(first.address, 5, "the kept cluster")
        with running(
            backend_for(compose_config(*owned))
        ) as joined:  # names it: joins it, and never stops it
            assert joined.address == first.address
        wait_for_dashboard(first.address, 5, "the joined cluster")
        assert state.read("rf-owned")["kept"] and state.read("rf-owned")["holder"] is None
        # `rayflow down` tears it down by its record, as the run that kept it would have
        down = subprocess.run(
            [sys.executable, "-m", "rayflow", "down", "rf-owned"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert down.returncode == 0 and down.stdout.strip() == "[rayflow] rf-owned: torn down", (
            down.stdout + down.stderr
        )
    finally:  # whatever failed above: the command every error path prints
        subprocess.run(
            [sys.executable, "-m", "rayflow.backends.vm.teardown", kept.rsplit(" ", 1)[-1]],
            timeout=120,
        )
    assert (
        wait_until(lambda: not (ray_daemon_pids() - before), timeout=60)
        and state.read("rf-owned") is None
        and kept_records() == []  # rayflow status lists it no more
    )


# hydra/launcher=rayflow on fake_multinode: the sweep goes to the head as a Ray Job. A cluster name of
# its own: a vm cluster is found again by its name (the others here are `rayflow`).
LAUNCHER = [
    "hydra.launcher.backend=vm",
    "hydra.launcher.cluster_name=rf-launcher",
    "hydra.launcher.worker={cpu: {num_cpus: 1}}",
]


class TestHydraLauncherOnVM(KeptCluster, LauncherTestSuite):
    """Hydra's own LauncherTestSuite, unchanged, on one fake_multinode cluster kept for the class
    (one worker from the start; the sweep below scales out from none)."""

    @pytest.fixture
    def overrides(self) -> list[str]:
        return [*LAUNCHER, "hydra.launcher.min_worker_nodes=1", "hydra.launcher.max_worker_nodes=1"]


def test_a_hydra_app_outside_the_repository_sweeps_on_vm(tmp_path):
    # no worker to begin with, and none on the head: the jobs' demand makes Ray's autoscaler add them
    out = sweep_comes_home(
        tmp_path / "app",
        [*LAUNCHER, "hydra.launcher.min_worker_nodes=0", "hydra.launcher.max_worker_nodes=2"],
    )
    # The head has no CPU and no worker runs at first: the jobs finishing is the autoscaler adding
    # workers. (Its event lines, summarised unless verbose, reach the job's log only at times
    # before the job ends: they are not asserted.)
    assert out.returncode == 0


def test_ctrl_c_stops_a_search_on_the_head_and_its_printed_resume_finishes_it_there(tmp_path):
    """hydra/sweeper=rayflow on backend=vm: the search's driver is a Ray Job on the head, which
    composes each trial's job from the app's config files shipped with it. Ctrl-C while it runs:
    the job is stopped, the cluster torn down, and the line printed is the sweep's own resume,
    never rayflow's command line. That resume, on a new cluster, finishes the search: every
    trial's job comes home."""

    app = SweepApp(tmp_path / "app")
    before = ray_daemon_pids()
    search = [
        "hydra.sweeper.backend=vm",
        "hydra.sweeper.cluster_name=rf-search",
        "hydra.sweeper.worker={cpu: {num_cpus: 1}}",
        "hydra.sweeper.min_worker_nodes=1",
        "hydra.sweeper.max_worker_nodes=1",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.max_concurrent=1",
        "steps=10",
        "step_s=0.5",
    ]
    log = tmp_path / "sweep.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            app.argv(*search), cwd=app.folder, env=app.env, stdout=out, stderr=out
        )
    try:
        reports = app.sweep_dir / "search"  # a trial has begun to report (it is being written)
        assert wait_until(
            lambda: any(reports.glob("*/result.json")) or proc.poll() is not None, timeout=300
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    said = log.read_text()
    assert "the job was stopped" in said, said[-3000:]
    hint = said.split("Continue the search with the same command and: ")[-1].splitlines()[0]
    assert hint == f"hydra.sweep.dir={app.sweep_dir} hydra.sweeper.resume=true", said[-3000:]
    assert "rayflow resume=" not in said  # rayflow's own command line would not continue it
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), "left running"

    out = app.run(*search, *hint.split(), timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs_came_home(app, 3)
    assert wait_until(lambda: not (ray_daemon_pids() - before), timeout=60), "left running"


def test_the_vm_cluster_benchmark_runs_in_its_smoke_form(rayflow):
    """`scripts/bench.py vm-cluster --smoke` (tests/test_bench.py runs the other benchmarks): here,
    in this module's turn, beside no other fake_multinode or Spark cluster."""
    from tests.test_bench import positive, run_bench

    result = run_bench(
        rayflow,
        "vm-cluster",
        keys=(
            "ratio",
            "head_ready_s",
            "scale_up_s",
            "scale_down_after_idle_s",
            "vm_run_s",
            "local_run_s",
            "submission_added_s",
        ),
        timeout=600,
    )
    assert positive(result["ratio"], result["head_ready_s"], result["vm_run_s"])
    assert positive(result["local_run_s"])
    # a smoke run waits for no autoscaling: those figures are left unmeasured, and say so
    assert result["scale_up_s"] is None and result["scale_down_after_idle_s"] is None, result


def test_the_idle_kept_cluster_stopped_itself_with_no_client_alive(idle_cluster):
    """Last in the module: a minute after its last job the watcher on the cluster tore it down;
    no rayflow process of the test was alive meanwhile. `status` says it is gone, then forgets
    it; its last job's log is still there, from MLflow."""
    runner = idle_cluster
    temp_dir = runner.kept["temp_dir"]
    assert temp_dir, "the first test did not get as far as the join"
    assert wait_until(lambda: not pids_mentioning(temp_dir), timeout=180)
    rows = _status(runner)
    assert rows["rf-idle"]["state"] == "gone", rows
    assert "rf-idle" not in _status(runner)
    log = _cli(runner, "logs", "rf-idle")
    assert log.returncode == 0 and "== rayflow results ==" in log.stdout, log.stderr[-2000:]
