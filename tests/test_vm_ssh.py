"""backend=vm provider=local for real: Ray's cluster launcher (`ray up` through Ray's SDK) over
SSH to two hosts that are network namespaces on this machine (tests/ssh_hosts.py), the run
submitted to the head as a Ray Job through an SSH tunnel to the head's loopback-only dashboard,
tracking into a real `mlflow server` on the bridge address, token auth on (the token private on
every node), a second run of the same cluster name refused while the first holds it. The head runs no trials (0 CPUs): they must land on the worker host. Afterwards
no Ray process is alive in any host; SshHosts then removes every namespace, link and process.
The same hosts (made once for the module) then take a cluster YAML written by hand, as a user
writes one for `ray up`, through backend.cluster_yaml.

Slow: ~2 minutes per run (ray up, a worker joining, the job, ray down, ray stop on the worker).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from rayflow.testing.processes import wait_until
from tests.harness.mlflow_server import mlflow_server as served_mlflow
from tests.harness.ssh_hosts import SshHosts, unavailable_reason

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def made_hosts():
    """Two hosts for the module's runs (each run brings its cluster up and down on them)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with SshHosts(2) as made:
        yield made
    assert not made.leftovers()  # no namespace, link, process or folder of the hosts


@pytest.fixture
def hosts(made_hosts):
    yield made_hosts
    # Ray's processes (the hosts' sshd sessions of user `rayhost` are not Ray)
    left = {
        pid: cmd
        for i in range(2)
        for pid, cmd in made_hosts.pids_in_host(i).items()
        if any(
            mark in cmd
            for mark in ("raylet", "gcs_server", "site-packages/ray/", "ray::", "ray start")
        )
    }
    assert not left, f"Ray left in a host: {left}"


@pytest.fixture
def shared_dir():
    """A folder every host sees at the same path (the hosts have their own /tmp, /home, /root):
    what an NFS mount is to real hosts, for Tune's experiment folder and the data set."""
    folder = Path(tempfile.mkdtemp(prefix="rf-shared-", dir="/var/tmp"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def mlflow_server(hosts, tmp_path):
    with served_mlflow(tmp_path, host=hosts.bridge_ip) as (url, _):
        yield url


def test_ray_up_over_ssh_runs_the_job_on_the_worker_host(
    hosts, shared_dir, mlflow_server, tmp_path
):
    head, worker = hosts.ips
    env = hosts.launcher_env()  # its own HOME: a token made for this cluster, not the machine's
    env.pop("MLFLOW_TRACKING_URI", None)
    started = time.monotonic()
    cluster = [
        sys.executable,
        "-m",
        "rayflow",
        "backend=vm",
        "backend.provider=local",
        f"backend.head_ip={head}",
        f"backend.worker_ips=[{worker}]",
        f"backend.ssh_user={hosts.user}",
        f"backend.ssh_private_key={hosts.key_path}",
        "backend.min_worker_nodes=1",
        "backend.max_worker_nodes=1",
        "backend.worker.cpu.num_cpus=1",
        "backend.cluster_name=rayflow-ssh-test",
        "ray_auth_mode=token",
    ]
    logs = tmp_path / "run.out", tmp_path / "run.err"
    proc = subprocess.Popen(
        [
            *cluster,
            f"tracking.uri={mlflow_server}",
            f"storage_path={shared_dir / 'ray_results'}",
            f"data.root={shared_dir / 'data'}",
            "data.synthetic=true",
            "data.synthetic_train_size=1000",
            "data.synthetic_test_size=100",
            "workload.num_samples=2",
            "workload.max_epochs=1",
        ],
        cwd=tmp_path,
        env=env,
        stdout=open(logs[0], "w"),
        stderr=open(logs[1], "w"),
        text=True,
    )
    try:
        assert wait_until(
            lambda: "submitted job" in logs[0].read_text() or proc.poll() is not None, timeout=600
        ), logs[1].read_text()[-3000:]
        # Clusters have owners: while this run holds the cluster, a second run of the same name is
        # refused before it runs anything: by this user's record (the same HOME), and without one
        # (another HOME, as another user or machine) because the provider sees a live head of the name
        for home, why in (
            (env["HOME"], "in use by another run of yours"),
            (str(tmp_path / "another-home"), "running (local) that no run of yours kept"),
        ):
            second = subprocess.run(
                [*cluster, "tracking=none", "data.synthetic=true"],
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
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=300)
    out = subprocess.CompletedProcess(
        proc.args, proc.returncode, logs[0].read_text(), logs[1].read_text()
    )
    print(f"\nray up -> job -> ray down over SSH: {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "== rayflow results ==" in out.stdout and "submitted job" in out.stdout

    # every trial ran on the worker host (the head has 0 CPUs)
    results = list((shared_dir / "ray_results").glob("cifar-*/*/result.json"))
    assert len(results) == 2
    ips = {
        json.loads(line)["node_ip"]
        for path in results
        for line in path.read_text().splitlines()
        if line.strip()
    }
    assert ips == {worker}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("cifar").experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "vm"
    assert parent.data.metrics["cluster_nodes_peak"] == 2
    assert len(runs) == 3
    token = (Path(env["HOME"]) / ".ray" / "auth_token").read_text().strip()
    # the token travelled by file, never printed
    assert token and token not in out.stdout + out.stderr
    for ip in hosts.ips:  # and is private on every node (rsync made ~/.ray 0755; Ray writes 0644)
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


def test_a_hand_written_cluster_yaml_runs_the_job_and_leaves_nothing(hosts, shared_dir, tmp_path):
    head, worker = hosts.ips
    cluster_yaml = tmp_path / "my-hosts.yaml"
    cluster_yaml.write_text(
        USER_WRITTEN.format(head=head, worker=worker, user=hosts.user, key=hosts.key_path)
    )
    env = hosts.launcher_env()
    common = [
        sys.executable,
        "-m",
        "rayflow",
        "backend=vm",
        f"backend.cluster_yaml={cluster_yaml}",
        "tracking=none",
    ]
    dry = subprocess.run(
        [*common, "dry_run=true"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    assert "rayflow adds" in dry.stderr and "RAY_UP_enable_autoscaler_v2=0" in dry.stderr
    # the head's dashboard on its loopback only: nothing reaches HEAD:8265 over the network
    head_start = [c for c in yaml.safe_load(dry.stdout)["head_start_ray_commands"] if "--head" in c]
    assert head_start and all("--dashboard-host=127.0.0.1" in c for c in head_start)
    started = time.monotonic()
    # as a notebook runs it: rayflow.run(...) returns the RunResult the job on the head sent back
    python_call = (
        "import json, sys, rayflow\nr = rayflow.run(*sys.argv[1:])\n"
        "print('RESULT', json.dumps({'type': type(r).__name__, 'best_metrics': r.best_metrics, "
        "'experiment_dir': str(r.experiment_dir), 'trials': len(r.trials)}))\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            python_call,
            *common[3:],
            f"storage_path={shared_dir / 'ray_results'}",
            f"data.root={shared_dir / 'data'}",
            "data.synthetic=true",
            "data.synthetic_train_size=1000",
            "data.synthetic_test_size=100",
            "workload.num_samples=1",
            "workload.max_epochs=1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(
        f"\nray up (a hand-written file) -> job -> ray down over SSH: {time.monotonic() - started:.1f} s"
    )
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
    assert result["experiment_dir"].startswith(str(shared_dir / "ray_results"))
    [result] = list((shared_dir / "ray_results").glob("cifar-*/*/result.json"))
    ips = {json.loads(line)["node_ip"] for line in result.read_text().splitlines() if line.strip()}
    assert ips == {worker}  # the head has 0 CPUs: the trial ran on the worker host
