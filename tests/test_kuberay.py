"""backend=kuberay's client path: `python -m rayflow backend=kuberay` against a Kubernetes API
emulator served over real HTTP on loopback (tests/kube_emulator.py), driven by the real,
unpatched `kubernetes` client; the operator's part (head pod, Secret, Service, conditions,
events) is played by tests/kube_operator.py, and the dashboard behind the API server's service
proxy is a real local Ray head serving the Jobs API with token auth. A real Kubernetes cluster
with the KubeRay operator runs the same cycle in test_kuberay_cluster.py (marker `kuberay`).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from rayflow.runtime.processes import stop_processes_mentioning
from rayflow.testing.backends import JobSubmissionSuite
from rayflow.testing.processes import wait_until
from scripts.servers.mlflow import mlflow_server as served_mlflow
from tests.harness.cli import Rayflow
from tests.harness.examples import USER_TUNE, copy_example
from tests.harness.kube_emulator import KubeEmulator
from tests.harness.kube_head import free_ports
from tests.harness.kube_operator import GPU_MESSAGE, HOLD_FINALIZER, FakeKubeRayOperator

pytest.importorskip("kmock")


def _free_port() -> int:
    return free_ports(1)[0]


class RayHead:
    """A real Ray head with its dashboard and token auth: what the head pod would run."""

    def __init__(self):
        self.token = secrets.token_hex(24)
        # short: Ray's socket paths stay < 108 chars
        self.temp_dir = tempfile.mkdtemp(prefix="rf-kr-")
        self.dashboard_url = f"http://127.0.0.1:{_free_port()}"

    def start(self) -> None:
        bin_dir = Path(
            sys.executable
        ).parent  # jobs run `python`: this venv's, as the image's would be
        env = dict(
            os.environ,
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        )
        env.pop("MLFLOW_TRACKING_URI", None)
        port, agent, client, metrics, runtime_env = free_ports(5)
        subprocess.run(
            [
                str(bin_dir / "ray"),
                "start",
                "--head",
                f"--port={port}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=2",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_url.rsplit(':', 1)[1]}",
                f"--temp-dir={self.temp_dir}",
                "--disable-usage-stats",
                f"--dashboard-agent-listen-port={agent}",
                f"--ray-client-server-port={client}",
                f"--metrics-export-port={metrics}",
                f"--runtime-env-agent-port={runtime_env}",
            ],
            check=True,
            env=env,
            capture_output=True,
            timeout=120,
        )

    def stop(self) -> None:
        stop_processes_mentioning(self.temp_dir)


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    try:
        head.start()
        yield head
    finally:
        head.stop()


@pytest.fixture
def emulator():
    with KubeEmulator() as emu:
        yield emu


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    with served_mlflow(tmp_path_factory.mktemp("mlflow-server")) as (url, _):
        yield url


def kuberay(emulator: KubeEmulator, *more: str) -> list[str]:
    return [
        "backend=kuberay",
        f"backend.kubeconfig={emulator.kubeconfig_path}",
        "backend.job_pip=[]",
        "backend.start_timeout_s=60",
        "backend.delete_timeout_s=20",
        # The emulator's pods are one Ray head on this machine: its disk is every "pod's" (what
        # a volume every pod mounts is to a real cluster).
        "storage_shared=true",
        *more,
    ]


SMALL_CIFAR = [
    "workload.num_samples=2",
    "workload.max_epochs=1",
    "workload.scheduler.grace_period=1",
]


def _gone(emulator: KubeEmulator) -> bool:
    return (
        not emulator.objects("rayclusters")
        and not emulator.objects("pods")
        and not emulator.objects("rayjobs")
    )


# --- a kept cluster that stops itself ---------------------------------------------------------------

AUTOSTOPPED = "rf-autostop"


@pytest.fixture(scope="module")
def autostopping(tmp_path_factory, data_root):
    """A RayCluster kept with a one-minute autostop by a run that has ended. Its head is a Ray head
    in a pod's mount namespace, with the service account rayflow renders for it mounted as the
    kubelet mounts it, reaching the emulator over TLS as in-cluster clients do. The first test
    looks at it; the module's other tests (on their own emulator and head) run while it idles;
    the last finds that its head deleted it."""
    from tests.harness import kube_head

    reason = kube_head.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with KubeEmulator(tls=True) as emu:
        head = kube_head.PodRayHead.for_emulator(emu, "default", f"{AUTOSTOPPED}-rayflow-autostop")
        head.start()
        try:
            with FakeKubeRayOperator(emu, head.dashboard_url, head.token):
                runner = Rayflow(tmp_path_factory.mktemp("kept-kuberay"), data_root)
                runner.env["XDG_CACHE_HOME"] = str(runner.workdir / "cache")  # its own registry
                (runner.workdir / "objective.py").write_text(
                    "def objective(config):\n    return {'loss': 0.5}\n"
                )
                runner.kept_run = [
                    *kuberay(emu, f"backend.cluster_name={AUTOSTOPPED}"),
                    "workload=tune",
                    "workload.trainable=objective:objective",
                    "workload.metric=loss",
                    "workload.mode=min",
                    "tracking=none",
                ]
                first = runner.run(
                    *runner.kept_run,
                    "backend.keep_cluster=true",
                    "backend.autostop_idle_minutes=1",
                    timeout=400,
                )
                runner.head = head
                yield emu, runner, first
        finally:
            head.stop()


def test_a_kept_raycluster_runs_its_head_as_an_account_that_may_delete_only_it(autostopping):
    """Kept: its head runs as the rendered account, whose Role allows exactly get and delete on
    it; `status` lists it idle with its autostop; a second run that names it joins it; `logs`."""
    emu, runner, first = autostopping
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert f"autostop: {AUTOSTOPPED} stops itself after 1 idle minute" in first.stdout
    cluster = emu.get("rayclusters", "default", AUTOSTOPPED)
    head_pod = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head_pod["serviceAccountName"] == f"{AUTOSTOPPED}-rayflow-autostop"
    [role] = emu.objects("roles")
    assert role["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": [AUTOSTOPPED],
            "verbs": ["get", "delete"],
        }
    ]
    # owned by the RayCluster: Kubernetes removes them with it
    for plural in ("serviceaccounts", "roles", "rolebindings"):
        [obj] = emu.objects(plural)
        assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [
            cluster["metadata"]["uid"]
        ]
    [row] = json.loads(_clusters(runner, "status", "--json").stdout)
    assert (row["name"], row["state"], row["autostop_idle_minutes"]) == (AUTOSTOPPED, "idle", 1)
    # a run of this user's that names it and keeps it joins it (by its uid in this user's
    # registry and the proof on it) and leaves it running; `logs` reads that run's job
    second = runner.run(*runner.kept_run, "backend.keep_cluster=true", timeout=400)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert f"reusing the existing RayCluster default/{AUTOSTOPPED}" in second.stdout
    assert (
        emu.get("rayclusters", "default", AUTOSTOPPED)["metadata"]["uid"]
        == (cluster["metadata"]["uid"])
    )
    log = _clusters(runner, "logs", AUTOSTOPPED)
    assert "== rayflow results ==" in log.stdout and "[rayflow-result]" not in log.stdout


def _clusters(rayflow, *args: str) -> subprocess.CompletedProcess:
    """`rayflow status|logs|down ...` as the user runs them, in the runner's environment."""
    out = subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=rayflow.workdir,
        env=rayflow.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


@pytest.mark.slow
def test_the_users_tune_function_goes_with_the_job(ray_head, rayflow, emulator, mlflow_server):
    """examples/tune-pbt run from its folder: the folder is the job's working_dir, uploaded through
    the API server's service proxy to the head, where the job imports train:objective."""
    from mlflow.tracking import MlflowClient

    copy_example("tune-pbt", rayflow.workdir)
    with FakeKubeRayOperator(emulator, ray_head.dashboard_url, ray_head.token):
        out = rayflow.run(
            *kuberay(emulator),
            *USER_TUNE,
            "tracking.experiment=kuberay-tune",
            f"tracking.uri={mlflow_server}",
            timeout=400,
        )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "== rayflow results ==" in out.stdout and "best loss" in out.stdout
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("kuberay-tune")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "kuberay"
    assert parent.data.params["workload.trainable"] == "train:objective"
    assert (
        len([r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]) == 2
    )
    assert wait_until(lambda: _gone(emulator), timeout=10)


USER_MANIFEST = """\
# What a platform team hands over: its RayCluster, and a ConfigMap its pods would mount.
apiVersion: ray.io/v1
kind: RayCluster
metadata:
  name: team-ray
  labels: {team: ml}
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    rayStartParams: {num-cpus: "2"}
    template:
      spec:
        containers:
          - name: ray-head
            image: rayproject/ray:2.60.0-py311
            resources: &pod
              limits: {cpu: "2", memory: 4Gi}
              requests: {cpu: "2", memory: 4Gi}
  workerGroupSpecs:
    - groupName: pool
      replicas: 0
      minReplicas: 0
      maxReplicas: 1
      template:
        spec:
          containers: [{name: ray-worker, image: rayproject/ray:2.60.0-py311, resources: *pod}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: team-settings}
data: {region: eu}
"""


@pytest.mark.slow
def test_a_users_own_manifest_runs_and_only_what_was_applied_is_deleted(
    ray_head, rayflow, emulator, mlflow_server
):
    """Through rayflow.run's path (session.run_jobs): the job on the user's cluster comes back as a
    RunResult, and its driver log is in the parent MLflow run."""
    from mlflow.tracking import MlflowClient

    path = rayflow.workdir / "team-ray.yaml"
    path.write_text(USER_MANIFEST)
    applied: list[dict] = []
    emulator.add_listener(
        lambda kind, plural, old, new: (
            applied.append(new) if plural == "rayclusters" and new and not old else None
        )
    )
    with FakeKubeRayOperator(emulator, ray_head.dashboard_url, ray_head.token):
        out = rayflow.run_jobs(
            [
                *kuberay(emulator, f"backend.manifest={path}"),
                *SMALL_CIFAR,
                f"tracking.uri={mlflow_server}",
                "tracking.experiment=kuberay-own-manifest",
            ],
            timeout=400,
        )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    [result] = rayflow.run_results(out)
    client = MlflowClient(mlflow_server)
    [parent] = client.search_runs(
        [client.get_experiment_by_name("kuberay-own-manifest").experiment_id],
        "tags.backend = 'kuberay'",
    )
    assert (
        result["type"] == "RunResult"
        and result["mlflow_run_id"] == parent.info.run_id
        and result["trials"] == 2
    )
    assert "val_accuracy" in result["best_metrics"] and "lr" in result["best_config"], result
    log = Path(
        client.download_artifacts(parent.info.run_id, "job/driver.log", str(rayflow.workdir))
    ).read_text()
    assert (
        "== rayflow results ==" in log
        and "[rayflow-result]" not in log
        and ray_head.token not in log
    )
    assert "leaves ConfigMap/team-settings to you: kubectl apply" in out.stderr
    for line in (
        "the API server accepts RayCluster default/team-ray (server-side dry run)",
        "applied RayCluster default/team-ray",
        "== rayflow results ==",
        "deleted RayCluster default/team-ray and its pods",
    ):
        assert line in text, (line, text[-3000:])
    [created] = applied
    assert (
        created["metadata"]["labels"]["team"] == "ml"
        and created["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rayflow"
    )
    assert (
        created["spec"]["authOptions"] == {"mode": "token"}
        and created["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 1
    )
    writes = [
        r
        for r in emulator.requests
        if r.method in ("PATCH", "POST", "PUT") and "/rayclusters" in r.path
    ]
    # asked first, then applied
    assert writes[0].query.get("dryRun") == "All" and writes[1].query.get("dryRun") is None
    assert not [r for r in emulator.requests if "configmaps" in r.path], (
        "the ConfigMap is the user's to apply"
    )
    assert wait_until(lambda: _gone(emulator), timeout=10)


@pytest.mark.slow
def test_a_failed_jobs_log_outlives_its_cluster_and_its_last_lines_are_shown(
    ray_head, rayflow, emulator, mlflow_server
):
    """The user's trainable raises on the head: exit 1, the job's last lines on this terminal, and
    its whole driver log in the parent MLflow run once the cluster is deleted."""
    from mlflow.tracking import MlflowClient

    (rayflow.workdir / "boom.py").write_text(
        "def objective(config):\n    raise ValueError('boom: the trainable failed')\n"
    )
    with FakeKubeRayOperator(emulator, ray_head.dashboard_url, ray_head.token):
        out = rayflow.run(
            *kuberay(emulator),
            "workload=tune",
            "workload.trainable=boom:objective",
            "workload.metric=loss",
            "workload.mode=min",
            "workload.num_samples=1",
            "workload.search_space={lr: {uniform: [0.1, 0.2]}}",
            f"tracking.uri={mlflow_server}",
            "tracking.experiment=kuberay-boom",
            timeout=400,
        )
    assert out.returncode == 1, (out.stdout + out.stderr)[-4000:]
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("rayflow: error: the job on backend=kuberay ended FAILED: ")
    )
    shown = out.stderr[out.stderr.index("[rayflow] the last ") :]
    assert (
        "lines of job raysubmit_" in shown
        and "job/driver.log" in shown
        and "boom: the trainable failed" in shown
    )
    assert wait_until(lambda: _gone(emulator), timeout=10)
    client = MlflowClient(mlflow_server)
    [parent] = [
        r
        for r in client.search_runs([client.get_experiment_by_name("kuberay-boom").experiment_id])
        if "mlflow.parentRunId" not in r.data.tags
    ]
    assert parent.info.status == "FAILED"
    log = Path(
        client.download_artifacts(parent.info.run_id, "job/driver.log", str(rayflow.workdir))
    ).read_text()
    assert "ValueError: boom: the trainable failed" in log and "1 trial(s) errored" in log


def test_the_api_servers_refusal_in_the_server_side_dry_run_is_one_line_and_nothing_is_created(
    rayflow, emulator
):
    from tests.harness.kube_emulator import api_error

    def policy(plural: str, obj: dict) -> None:  # an admission webhook of the user's cluster
        if plural == "rayclusters" and "team" not in obj["metadata"].get("labels", {}):
            raise api_error(
                403,
                "Forbidden",
                'admission webhook "labels.policy.example" denied the request: label team is required',
            )

    emulator.call(emulator.handler.admission.append, policy)
    out = rayflow.run(*kuberay(emulator), "tracking=none", timeout=120)
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert (
        len(errors) == 1
        and "Kubernetes refused to accept RayCluster default/rayflow in a server-side dry run "
        '(nothing was applied): 403 admission webhook "labels.policy.example" denied the request: label team is required'
        in errors[0]
    ), out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not emulator.objects("rayclusters")
    assert not [
        r for r in emulator.requests if r.method == "PATCH" and r.query.get("dryRun") != "All"
    ]


@pytest.mark.slow
def test_an_existing_raycluster_rayflow_did_not_make_is_reused_and_never_deleted(
    ray_head, rayflow, emulator
):
    """Issue 43: joined only when the user trusts it by its uid (backend.join_uid)."""
    # applied by someone else: no managed-by label of rayflow's
    foreign = yaml.safe_load(USER_MANIFEST.split("---")[0])
    foreign["metadata"]["namespace"], foreign["spec"]["authOptions"] = "default", {"mode": "token"}
    path = rayflow.workdir / "team-ray.yaml"
    path.write_text(USER_MANIFEST)
    with FakeKubeRayOperator(emulator, ray_head.dashboard_url, ray_head.token):
        uid = emulator.put(foreign)["metadata"]["uid"]
        out = rayflow.run(
            *kuberay(
                emulator,
                f"backend.manifest={path}",
                "backend.keep_cluster=true",
                f"backend.join_uid={uid}",
            ),
            *SMALL_CIFAR,
            "tracking=none",
            timeout=400,
        )
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        assert "reusing the existing RayCluster default/team-ray as it is" in out.stdout, (
            out.stdout + out.stderr
        )[-3000:]
        assert "you trust it by its uid (backend.join_uid); rayflow leaves it running" in out.stdout
        assert "deleted RayCluster" not in out.stdout + out.stderr
        assert emulator.get("rayclusters", "default", "team-ray") is not None
        emulator.delete("rayclusters", "default", "team-ray")


class TestKubeRayContract(JobSubmissionSuite):
    """The job-submission contract every submitting backend passes (vm's too), on the emulator."""

    name = "kuberay"
    owns_cluster = True

    @pytest.fixture(autouse=True)
    def _cluster(self, ray_head, emulator):
        self._emulator = emulator
        with FakeKubeRayOperator(emulator, ray_head.dashboard_url, ray_head.token):
            yield
        assert _gone(emulator), "the backend must delete what it applied"

    def overrides(self):
        return kuberay(self._emulator)


# --- failing fast, in one line ----------------------------------------------------------------------

# The causes the real stack (tests/test_kuberay_local.py) cannot make on purpose: an operator's
# InvalidRayClusterSpec for a spec that passes the CRD, and a GPU no node has (its Nodes have none)
FAIL_FAST = [
    ("unschedulable", ["backend.schedule_grace_s=2", "compute=gpu"], "FailedScheduling for "),
    ("invalid_spec", [], "(InvalidRayClusterSpec): The RayCluster spec is invalid"),
]


@pytest.mark.parametrize("scenario,more,expected", FAIL_FAST, ids=[f[0] for f in FAIL_FAST])
def test_what_keeps_the_head_down_fails_fast_in_one_line(
    rayflow, emulator, scenario, more, expected
):
    started = time.monotonic()
    with FakeKubeRayOperator(
        emulator, None, "unused-token", scenario=scenario, head_ready_after_s=0.5
    ):
        out = rayflow.run(*kuberay(emulator, *more), "tracking=none", timeout=120)
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert len(errors) == 1 and expected in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    if scenario == "unschedulable":
        assert GPU_MESSAGE.split(".")[0] in errors[0]
    assert time.monotonic() - started < 45, "a fail-fast cause must not wait for start_timeout_s"
    assert "deleted RayCluster default/rayflow" in out.stdout
    assert wait_until(lambda: _gone(emulator), timeout=10)


def test_a_rayjob_the_operator_refuses_fails_fast_in_one_line(rayflow, emulator):
    """The operator's refusal of a RayJob is a status, not an API error (here written as KubeRay does)."""
    import threading

    def refuse() -> None:
        if wait_until(
            lambda: emulator.get("rayjobs", "default", "rayflow") is not None,
            timeout=60,
            interval=0.2,
        ):
            emulator.patch(
                "rayjobs",
                "default",
                "rayflow",
                {
                    "status": {
                        "jobDeploymentStatus": "ValidationFailed",
                        "reason": "ValidationFailed",
                        "message": "The RayJob spec is invalid default/rayflow: a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished",
                    }
                },
            )

    operator = threading.Thread(target=refuse, daemon=True)
    operator.start()
    out = rayflow.run(*kuberay(emulator, "backend.mode=rayjob"), "tracking=none", timeout=120)
    operator.join(timeout=5)
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert (
        len(errors) == 1
        and "KubeRay marked RayJob default/rayflow ValidationFailed: The RayJob spec is invalid"
        in errors[0]
    )
    assert wait_until(lambda: _gone(emulator), timeout=10)


def test_a_gpu_worker_that_cannot_be_scheduled_does_not_block_the_head_wait(emulator):
    """`state: ready` waits for every worker pod; the head wait only needs HeadPodReady."""
    import ray

    from rayflow.backends.kuberay.kube import Kube
    from rayflow.backends.kuberay.manifest import render
    from rayflow.backends.kuberay.wait import wait_for_head
    from rayflow.orchestrator.compose import compose_config

    manifest = render(
        compose_config("backend=kuberay", "compute=gpu", "backend.min_worker_nodes=1").backend,
        True,
        "disabled",
        ray.__version__,
        "3.11",
        {},
    )
    with FakeKubeRayOperator(
        emulator, None, scenario="worker_unschedulable", head_ready_after_s=0.5
    ):
        kube = Kube("default", emulator.kubeconfig_path)
        kube.apply(manifest)
        head = wait_for_head(kube, lambda: "rayflow", timeout_s=20, grace_s=1, poll_s=0.2)
        assert head["metadata"]["name"].startswith("rayflow-head-")
        assert (
            emulator.get("rayclusters", "default", "rayflow").get("status", {}).get("state")
            != "ready"
        )
        kube.delete("RayCluster", "rayflow")
        kube.close()


def test_a_finalizer_that_holds_the_cluster_is_reported_by_name(rayflow, emulator):
    with FakeKubeRayOperator(
        emulator, None, "unused-token", scenario="stuck_finalizer", head_ready_after_s=60
    ):
        out = rayflow.run(
            *kuberay(emulator, "backend.start_timeout_s=3", "backend.delete_timeout_s=3"),
            "tracking=none",
            timeout=120,
        )
    assert out.returncode == 1
    assert "was not ready within 3 s" in out.stderr
    assert (
        f"held by finalizer(s) {HOLD_FINALIZER}" in out.stderr
        and "rayflow: warning: teardown step failed" in out.stderr
    )


def test_no_kubeconfig_is_one_line(rayflow, tmp_path):
    out = rayflow.run(
        "backend=kuberay",
        f"backend.kubeconfig={tmp_path / 'nope'}",
        "tracking=none",
        "storage_shared=true",
        timeout=120,
    )
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("rayflow: error: backend.kubeconfig: no usable Kubernetes credentials")
    )


def test_dry_run_prints_the_manifest_without_a_token(rayflow, emulator):
    out = rayflow.run(*kuberay(emulator), "dry_run=true", "tracking=none", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "kind: RayCluster" in out.stdout and "mode: token" in out.stdout
    assert "auth_token" not in out.stdout and "RAY_AUTH_TOKEN" not in out.stdout
    assert not emulator.objects("rayclusters"), "a dry run applies nothing"


def test_a_kept_clusters_dry_run_prints_the_rbac_of_its_autostop(rayflow, emulator):
    """`dry_run=true ... | kubectl apply -f -` applies what a run would: with keep_cluster, the
    RayCluster whose head runs as its autostop account, then that account, its Role (get and
    delete on that RayCluster only) and the RoleBinding."""
    out = rayflow.run(
        *kuberay(emulator, "backend.keep_cluster=true"), "dry_run=true", "tracking=none"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    cluster, account, role, binding = yaml.safe_load_all(out.stdout)
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == account["metadata"]["name"] == "rayflow-rayflow-autostop"
    assert role["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": ["rayflow"],
            "verbs": ["get", "delete"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rayflow-rayflow-autostop", "namespace": "default"}
    ]
    assert not emulator.objects("rayclusters"), "a dry run applies nothing"


def test_the_kept_raycluster_was_deleted_by_its_own_head(autostopping):
    """Last in the module: a minute after its job the watcher on the head deleted the RayCluster
    through the API server as its service account (no rayflow client alive); its RBAC went with
    it; `rayflow status` says it is gone."""
    emu, runner, _ = autostopping
    assert wait_until(
        lambda: emu.get("rayclusters", "default", AUTOSTOPPED) is None, timeout=180
    ), _watcher_log(runner.head)
    deletes = [r for r in emu.requests if r.method == "DELETE" and AUTOSTOPPED in r.path]
    assert [r.user for r in deletes] == [
        f"system:serviceaccount:default:{AUTOSTOPPED}-rayflow-autostop"
    ]
    assert wait_until(lambda: not emu.objects("roles") and not emu.objects("pods"), timeout=30)
    [row] = json.loads(_clusters(runner, "status", "--json").stdout)
    assert (row["name"], row["state"]) == (AUTOSTOPPED, "gone")


def _watcher_log(head) -> str:
    """What the autostop watcher on `head` printed (for a failure's message)."""
    import urllib.request

    headers = {"Authorization": f"Bearer {head.token}"}
    with urllib.request.urlopen(
        urllib.request.Request(f"{head.dashboard_url}/api/jobs/", headers=headers), timeout=30
    ) as answer:
        jobs = [j["submission_id"] for j in json.loads(answer.read()) if j.get("submission_id")]
    logs = []
    for job in jobs:
        url = f"{head.dashboard_url}/api/jobs/{job}/logs"
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as a:
            logs.append(f"--- {job}\n" + json.loads(a.read())["logs"][-3000:])
    return "\n".join(logs)
