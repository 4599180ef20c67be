"""backend=vm provider=local for real: Ray's cluster launcher (`ray up` through Ray's SDK) over
SSH to two hosts that are network namespaces on this machine (tests/ssh_hosts.py), each with its
own /tmp, home, Ray sessions and results folders: separate machines that share only the installed
software. The run is submitted to the head as a Ray Job through an SSH tunnel to the head's
loopback-only dashboard, tracks into a real `mlflow server` and keeps its experiment in an
S3-compatible store (moto, scripts/servers/s3.py), both on the bridge address; token auth on
(the token private on every node); a second run of the same cluster name refused while the first
holds it; interrupted, torn down, resumed on a new cluster as printed, a node lost meanwhile.
Afterwards no Ray process is alive in any host; SshHosts then removes every namespace, link and
process. The same hosts (made once for the module) then take a cluster YAML written by hand, as a
user writes one for `ray up`, through backend.cluster_yaml, with a folder every host sees (an NFS
mount, declared with storage_shared=true).

Slow: ~2 minutes per cluster (ray up, a worker joining, the job, ray down, ray stop on the worker).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from rayflow.testing.processes import wait_until
from scripts.servers.mlflow import mlflow_server as served_mlflow
from scripts.servers.s3 import S3Server
from tests.harness.ssh_hosts import SshHosts, unavailable_reason

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# Hosts 0-2 for the runs that bring their cluster up and down (a head and two workers, so a trial
# whose worker is lost has another to go on); hosts 3-4 for the cluster kept meanwhile.
RUN_HOSTS, KEPT_HOSTS = (0, 1, 2), (3, 4)


@pytest.fixture(scope="module")
def made_hosts():
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SshHosts(5) as made:
        yield made
    assert not made.leftovers()  # no namespace, link, process or folder of the hosts


def _ray_in(made_hosts, hosts: tuple[int, ...]) -> dict[int, str]:
    """Ray's processes in those hosts (the hosts' sshd sessions of user `rayhost` are not Ray)."""
    marks = ("raylet", "gcs_server", "site-packages/ray/", "ray::", "ray start")
    return {
        pid: cmd
        for i in hosts
        for pid, cmd in made_hosts.pids_in_host(i).items()
        if any(mark in cmd for mark in marks)
    }


@pytest.fixture
def hosts(made_hosts):
    yield made_hosts
    left = _ray_in(made_hosts, RUN_HOSTS)
    assert not left, f"Ray left in a host: {left}"


@pytest.fixture
def mlflow_server(hosts, tmp_path):
    with served_mlflow(tmp_path, host=hosts.bridge_ip) as (url, _):
        yield url


@pytest.fixture
def s3(hosts):
    """An S3-compatible store (moto) on the bridge address: the hosts and this machine reach it."""
    with S3Server(host=hosts.bridge_ip, bucket="rayflow-runs") as server:
        yield server


def _cluster(hosts) -> list[str]:
    head, *workers = [hosts.ips[i] for i in RUN_HOSTS]
    return [
        sys.executable,
        "-m",
        "rayflow",
        "backend=vm",
        "backend.provider=local",
        f"backend.head_ip={head}",
        f"backend.worker_ips=[{','.join(workers)}]",
        f"backend.ssh_user={hosts.user}",
        f"backend.ssh_private_key={hosts.key_path}",
        "backend.min_worker_nodes=2",
        "backend.max_worker_nodes=2",
        "backend.worker.cpu.num_cpus=1",  # the head has none: one trial per worker host
        "backend.cluster_name=rayflow-ssh-test",
        "ray_auth_mode=token",
    ]


# Two trials of 24 epochs, each checkpointing every epoch; ASHA stops none (grace = max_epochs).
# Enough for the resumed run to have epochs left to lose a node in: the first run is interrupted
# once Tune's state reaches the bucket, which Tune uploads less often the longer an upload takes:
# seen after 5 epochs on a quiet machine, and in fresh-clone runs under load after 12 or more.
EPOCHS = 24
CIFAR = [
    "data.synthetic=true",
    "data.synthetic_train_size=1000",
    "data.synthetic_test_size=100",
    "workload.num_samples=2",
    f"workload.max_epochs={EPOCHS}",
    f"workload.scheduler.grace_period={EPOCHS}",
]


def _start(argv: list[str], env: dict, cwd: Path, name: str):
    logs = cwd / f"{name}.out", cwd / f"{name}.err"
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=open(logs[0], "w"), stderr=open(logs[1], "w"), text=True
    )
    return proc, logs


def _ended(proc, logs, timeout: float) -> subprocess.CompletedProcess:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=300)
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, logs[0].read_text(), logs[1].read_text()
    )


def _checkpoints(s3, prefix: str) -> set[str]:
    """The trial checkpoint folders in the bucket under `prefix` (`trial/checkpoint_00000N`)."""
    return {
        "/".join(key.split("/")[-3:-1])
        for key in s3.objects(prefix)
        if key.split("/")[-2].startswith("checkpoint_")
    }


def _refused_while_held(cluster: list[str], env: dict, tmp_path: Path) -> None:
    """Clusters have owners: while a run holds the cluster, a second run of the same name is
    refused before it runs anything: by this user's record (the same HOME), and without one
    (another HOME, as another user or machine) because the provider sees a live head of the
    name."""
    for home, why in (
        (env["HOME"], "in use by another run of yours"),
        (str(tmp_path / "another-home"), "running (local) that no run of yours kept"),
    ):
        second = subprocess.run(
            [*cluster, "tracking=none", "storage_shared=true", "data.synthetic=true"],
            cwd=tmp_path,
            env={**env, "HOME": home},
            capture_output=True,
            text=True,
            timeout=300,
        )
        last = second.stderr.strip().splitlines()[-1:]
        assert second.returncode == 2 and last[0].startswith(
            f"rayflow: error: backend.cluster_name: a cluster named 'rayflow-ssh-test' is {why}"
        ), second.stdout[-2000:] + second.stderr[-2000:]
        assert "creating cluster" not in second.stdout + second.stderr


def _results(s3, prefix: str) -> list[dict]:
    """Every row the trials reported, from their result.json files in the bucket."""
    return [
        json.loads(line)
        for key in s3.objects(prefix)
        if key.endswith("/result.json")
        for line in s3.read(key).decode().splitlines()
        if line.strip()
    ]


def _a_trial(cmdline: str) -> bool:
    """A trial's process: a Ray worker running Tune's actor of a function trainable (its title
    `ray::ImplicitFunc.train`)."""
    return cmdline.startswith("ray::ImplicitFunc")


def _nothing_kept_on_the_hosts(hosts) -> None:
    """The hosts are separate machines: no experiment folder in their results folders, and no
    checkpoint file anywhere on their own disks (their homes, their /tmp with Ray's sessions)."""
    for ip in [hosts.ips[i] for i in RUN_HOSTS]:
        found = hosts.ssh(
            ip,
            "ls -A ~/ray_results 2>/dev/null; find ~ /tmp -path '*checkpoint_0*' -type f "
            "2>/dev/null | head -5",
            timeout=30,
        )
        assert found.stdout.strip() == "", (ip, found.stdout)


def _clusters_cli(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def hand_written(made_hosts, tmp_path_factory):
    """A user's own cluster YAML for hosts 3-4, run from Python as a notebook runs it, with the
    cluster kept and a one-minute autostop: the first test looks at it, the module's other runs
    go on (on hosts 0-2) while it idles, the last finds it stopped by the watcher on its head."""
    work = tmp_path_factory.mktemp("hand-written")
    shared = Path(tempfile.mkdtemp(prefix="rf-shared-", dir="/var/tmp"))
    shared.chmod(0o777)  # every host sees /var/tmp's folder: an NFS mount to them
    head, worker = (made_hosts.ips[i] for i in KEPT_HOSTS)
    cluster_yaml = work / "my-hosts.yaml"
    cluster_yaml.write_text(
        USER_WRITTEN.format(head=head, worker=worker, user=made_hosts.user, key=made_hosts.key_path)
    )
    env = made_hosts.launcher_env()
    common = [sys.executable, "-m", "rayflow", "backend=vm", f"backend.cluster_yaml={cluster_yaml}"]
    common.append("tracking=none")
    ran = {"env": env, "work": work, "head": head, "worker": worker, "shared": shared}
    try:
        ran["dry"] = subprocess.run(
            [*common, "dry_run=true"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        started = time.monotonic()
        # as a notebook runs it: rayflow.run(...) returns the RunResult the job on the head sent
        ran["out"] = subprocess.run(
            [
                sys.executable,
                "-c",
                PYTHON_CALL,
                *common[3:],
                "backend.keep_cluster=true",
                "backend.autostop_idle_minutes=1",
                f"storage_path={shared / 'ray_results'}",
                "storage_shared=true",
                f"data.root={shared / 'data'}",
                "data.synthetic=true",
                "data.synthetic_train_size=1000",
                "data.synthetic_test_size=100",
                "workload.num_samples=1",
                "workload.max_epochs=1",
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        print(f"\nray up (a hand-written file) -> job, kept: {time.monotonic() - started:.1f} s")
        yield ran
    finally:
        if _ray_in(made_hosts, KEPT_HOSTS):  # never left running, whatever failed
            _clusters_cli(env, work, "down", "my-hosts", "--force")
        shutil.rmtree(shared, ignore_errors=True)


PYTHON_CALL = (
    "import json, sys, rayflow\nr = rayflow.run(*sys.argv[1:])\n"
    "print('RESULT', json.dumps({'type': type(r).__name__, 'best_metrics': r.best_metrics, "
    "'experiment_dir': str(r.experiment_dir), 'trials': len(r.trials)}))\n"
)


def test_a_hand_written_cluster_yaml_runs_the_job_and_keeps_its_cluster(hand_written):
    dry, out = hand_written["dry"], hand_written["out"]
    head, worker, shared = hand_written["head"], hand_written["worker"], hand_written["shared"]
    assert dry.returncode == 0, dry.stderr
    assert "rayflow adds" in dry.stderr and "RAY_UP_enable_autoscaler_v2=0" in dry.stderr
    # the head's dashboard on its loopback only: nothing reaches HEAD:8265 over the network
    head_start = [c for c in yaml.safe_load(dry.stdout)["head_start_ray_commands"] if "--head" in c]
    assert head_start and all("--dashboard-host=127.0.0.1" in c for c in head_start)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "== rayflow results ==" in out.stdout and "submitted job" in out.stdout
    # submitted through the SSH tunnel's local end, never to the head's address in clear
    assert f"through an SSH tunnel to {head} (http://127.0.0.1:" in out.stdout + out.stderr
    assert f"{head}:8265" not in out.stdout + out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.split(" ", 1)[1])
    assert (
        result["type"] == "RunResult"
        and result["trials"] == 1
        and "val_accuracy" in result["best_metrics"]
    ), result
    # the head's folder (shared here)
    assert result["experiment_dir"].startswith(str(shared / "ray_results"))
    [result] = list((shared / "ray_results").glob("cifar-*/*/result.json"))
    ips = {json.loads(line)["node_ip"] for line in result.read_text().splitlines() if line.strip()}
    assert ips == {worker}  # the head has 0 CPUs: the trial ran on the worker host
    # kept: `rayflow status` lists it (asked through an SSH tunnel), `logs` reads its job
    assert "autostop: my-hosts stops itself after 1 idle minute" in out.stdout
    status = _clusters_cli(hand_written["env"], hand_written["work"], "status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    [row] = json.loads(status.stdout)
    assert (row["name"], row["state"], row["jobs"]) == ("my-hosts", "idle", 1), row
    assert row["nodes"] == 2 and row["autostop_idle_minutes"] == 1, row
    log = _clusters_cli(hand_written["env"], hand_written["work"], "logs", "my-hosts")
    assert log.returncode == 0 and "== rayflow results ==" in log.stdout, log.stderr[-2000:]


def test_separate_machines_keep_the_experiment_in_a_bucket_it_outlives_the_cluster_and_a_lost_node(
    hosts, s3, mlflow_server, tmp_path
):
    """Three SSH hosts that share nothing but the installed software (each its own /tmp, home,
    Ray sessions and results folders): a folder for storage_path is refused up front; with s3://
    the cifar run (a trial on each worker host) keeps every checkpoint and Tune's state in the
    bucket, is interrupted, the cluster goes, and `resume=` as printed continues it on a new
    cluster from the bucket; meanwhile the raylet of a worker host running a trial is killed, and
    its trial restarts from its last checkpoint."""
    head, *workers = [hosts.ips[i] for i in RUN_HOSTS]
    env = {**hosts.launcher_env(), **s3.env()}  # its own HOME: a token made for this cluster
    env.pop("MLFLOW_TRACKING_URI", None)
    cluster = _cluster(hosts)
    started = time.monotonic()

    # 1. a folder of one machine: refused before anything starts
    local = subprocess.run(
        [*cluster, "tracking=none", *CIFAR],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert local.returncode == 2, local.stderr[-2000:]
    last = local.stderr.strip().splitlines()[-1]
    assert last.startswith("rayflow: error: storage_path: ") and "separate machines" in last
    assert "s3://" in last and "creating cluster" not in local.stdout + local.stderr

    # 2. on S3: interrupted once a trial has a checkpoint there and Tune's state is saved
    proc, logs = _start(
        [*cluster, f"tracking.uri={mlflow_server}", f"storage_path={s3.uri('runs')}", *CIFAR],
        env,
        tmp_path,
        "first",
    )
    try:
        assert wait_until(
            lambda: "submitted job" in logs[0].read_text() or proc.poll() is not None, timeout=600
        ), logs[1].read_text()[-3000:]
        _refused_while_held(cluster, env, tmp_path)
        assert wait_until(
            lambda: (
                proc.poll() is not None
                or (
                    bool(_checkpoints(s3, "runs/"))
                    and any("experiment_state" in k for k in s3.objects("runs/"))
                )
            ),
            timeout=600,
            interval=1,
        ), logs[1].read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
    finally:
        first = _ended(proc, logs, timeout=600)
    assert first.returncode == 130, first.stdout[-3000:] + first.stderr[-3000:]
    command = first.stderr.split("Continue it on a new cluster with: ")[-1].splitlines()[0]
    assert command.startswith(f"python -m rayflow resume={s3.uri('runs/cifar-')}"), first.stderr
    kept = _checkpoints(s3, "runs/")
    assert kept and not [k for k in s3.objects("runs/") if k.endswith(".rayflow.lock")]
    _nothing_kept_on_the_hosts(hosts)

    # 3. resume= as printed, on a new cluster; a worker host's raylet killed mid-run. The command
    # carries this run's backend keys (a resume takes them from its command line only), but the
    # key file's path, which output masks as a secret: the resume asks for it by name first.
    printed = [*cluster[:3], *shlex.split(command)[3:]]
    asked = subprocess.run(
        printed, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert asked.returncode == 2 and asked.stderr.strip().splitlines()[-1].startswith(
        "rayflow: error: backend.ssh_private_key: the experiment's run was given it"
    ), asked.stderr[-2000:]
    proc, logs = _start(
        [*printed, f"backend.ssh_private_key={hosts.key_path}"],
        env,
        tmp_path,
        "resumed",
    )
    try:
        # a trial running on each worker host again, each with two epochs or more to go (under
        # load, a trial killed in its last moments was seen to finish first), then the second
        # host's node lost
        assert wait_until(
            lambda: (
                proc.poll() is not None
                or (
                    all(any(map(_a_trial, hosts.pids_in_host(i).values())) for i in (1, 2))
                    and max((r["epoch"] for r in _results(s3, "runs/")), default=0) <= EPOCHS - 2
                )
            ),
            timeout=600,
            interval=0.5,
        ), logs[1].read_text()[-3000:]
        raylets = [p for p, cmd in hosts.pids_in_host(2).items() if "raylet" in cmd.split()[0]]
        assert raylets and proc.poll() is None, (hosts.pids_in_host(2), logs[1].read_text()[-3000:])
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
    finally:
        out = _ended(proc, logs, timeout=900)
    print(
        f"\nray up -> interrupt -> ray down -> resume -> node lost over SSH: {time.monotonic() - started:.1f} s"
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "== rayflow results ==" in out.stdout
    # a fresh host's first plot (matplotlib's font cache) and MLflow's own run links stay in the
    # run's log: rayflow's "MLflow:" line says where the run is
    for noise in ("generated new fontManager", "View run", "View experiment"):
        assert noise not in out.stdout + out.stderr, noise
    # the trial on the lost node failed, and was restarted (from its last checkpoint)
    assert re.search(r"^trials restarted: 1 \(each from its last checkpoint", out.stdout, re.M)
    assert f"experiment: {shlex.split(command)[3].split('=', 1)[1]}" in out.stdout

    # the restored trials went on from their checkpoints: their first epoch after a restore is
    # past 1, and the experiment's results are in the bucket only
    rows = _results(s3, "runs/")
    restored = [r for r in rows if r.get("iterations_since_restore") == 1 and r["epoch"] > 1]
    assert restored and {r["epoch"] for r in rows} >= {1, EPOCHS}, rows
    # the head has no CPU for trials (the trial on the lost host may have reported nothing there)
    reported_from = {r["node_ip"] for r in rows}
    assert reported_from and reported_from <= set(workers), (reported_from, workers)
    _nothing_kept_on_the_hosts(hosts)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("cifar").experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]  # one, resumed
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "vm"
    assert parent.data.tags["experiment_dir"].startswith(s3.uri("runs/cifar-"))
    assert parent.data.tags["best_checkpoint"].startswith(s3.uri("runs/cifar-"))
    assert parent.data.metrics["trial_restarts"] == 1
    assert len(runs) == 3  # the parent and one nested run per trial, continued on resume
    token = (Path(env["HOME"]) / ".ray" / "auth_token").read_text().strip()
    secret = s3.secret_key
    for text in (first.stdout + first.stderr, out.stdout + out.stderr):
        # the token travelled by file, the store's secret by the job's environment: never printed
        assert token and token not in text and secret not in text
    for ip in (
        head,
        *workers,
    ):  # and is private on every node (rsync made ~/.ray 0755; Ray writes 0644)
        modes = hosts.ssh(ip, "stat -c %a ~/.ray ~/.ray/auth_token", timeout=20)
        assert modes.stdout.split() == ["700", "600"], (ip, modes.stdout, modes.stderr)
    # submitted through the SSH tunnel's local end, never to the head's address in clear
    assert f"through an SSH tunnel to {head} (http://127.0.0.1:" in out.stdout + out.stderr


# A cluster YAML as a user writes it for `ray up` (Ray's local example, filled in), not rayflow's:
# no token, no RAY_AUTH_MODE, no setup, the dashboard left to Ray's default.
USER_WRITTEN = """\
cluster_name: my-hosts
max_workers: 1
provider:
  type: local
  head_ip: {head}
  worker_ips: [{worker}]
auth:
  ssh_user: {user}
  ssh_private_key: {key}
# these hosts have no default route: without --node-ip-address Ray advertises 127.0.0.1
head_start_ray_commands:
  - ray stop
  - ray start --head --port=6379 --autoscaling-config=~/ray_bootstrap_config.yaml --num-cpus=0 --node-ip-address={head}
worker_start_ray_commands:
  - ray stop
  - ray start --address=$RAY_HEAD_IP:6379 --num-cpus=1 --node-ip-address=$(hostname -I | cut -d' ' -f1)
"""


def test_the_kept_cluster_on_ssh_hosts_stopped_itself(hand_written, made_hosts):
    """Last in the module: its head's watcher ran `ray stop` on the worker host over SSH and
    then on itself, with no rayflow process of the test alive; `status` says it is gone."""
    assert wait_until(lambda: not _ray_in(made_hosts, KEPT_HOSTS), timeout=240), _ray_in(
        made_hosts, KEPT_HOSTS
    )
    env, work = hand_written["env"], hand_written["work"]
    out = _clusters_cli(env, work, "status", "--json")
    assert [(r["name"], r["state"]) for r in json.loads(out.stdout)] == [("my-hosts", "gone")]
    assert _clusters_cli(env, work, "status").stdout.strip() == "no kept clusters"
