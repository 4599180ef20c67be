"""backend=kuberay on the real stack (tests/harness/kube_local.py) with what users bring: their
own Tune function (the job's working_dir, uploaded through the API server's service proxy), their
own RayCluster manifest, a RayCluster someone else applied, a trainable that fails, and the
job-submission contract every submitting backend passes. Runs on the worker that runs
test_kuberay_local (tests/conftest.py's SAME_WORKER): the two share that worker's stack.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from rayflow.testing.backends import JobSubmissionSuite
from rayflow.testing.processes import wait_until
from tests.harness.examples import USER_TUNE, copy_example

SMALL_CIFAR = [
    "workload.num_samples=2",
    "workload.max_epochs=1",
    "workload.scheduler.grace_period=1",
]

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


class FirstSeen:
    """The first version of a RayCluster seen while a run goes on (it is gone after)."""

    def __init__(self, stack, name: str):
        self.stack, self.name, self.seen = stack, name, None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while self.seen is None and not self.done.wait(0.5):
            found = [
                c
                for c in self.stack.get("rayclusters")["items"]
                if c["metadata"]["name"] == self.name
            ]
            self.seen = found[0] if found else None

    def __enter__(self) -> FirstSeen:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=30)


def _parent(mlflow_url: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_url)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return client, parent, children


def _driver_log(client, parent, folder: Path) -> str:
    """The job's driver log the parent MLflow run keeps (job/driver.log)."""
    return Path(
        client.download_artifacts(parent.info.run_id, "job/driver.log", str(folder))
    ).read_text()


@pytest.mark.slow
def test_the_users_manifest_runs_their_tune_function_and_only_what_was_applied_is_deleted(
    rayflow, local_kube
):
    """examples/tune-pbt from its folder, on the platform team's RayCluster, through rayflow.run's
    path (session.run_jobs): the folder is the job's working_dir, the job comes back as a
    RunResult, its driver log is in the parent MLflow run, the ConfigMap is left to the user,
    and the RayCluster was asked of the API server (dry run) before it was applied."""
    stack = local_kube
    rayflow.env.update(stack.env())
    copy_example("tune-pbt", rayflow.workdir)
    path = rayflow.workdir / "team-ray.yaml"
    path.write_text(USER_MANIFEST)
    with FirstSeen(stack, "team-ray") as applied:
        out = rayflow.run_jobs(
            [
                *stack.backend(f"backend.manifest={path}"),
                *USER_TUNE,
                f"tracking.uri={stack.mlflow_url}",
                "tracking.experiment=kuberay-own-manifest",
                f"storage_path={stack.s3.uri('own-manifest')}",
            ],
            timeout=400,
        )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    [result] = rayflow.run_results(out)
    client, parent, children = _parent(stack.mlflow_url, "kuberay-own-manifest")
    assert parent.info.status == "FINISHED" and parent.data.tags["backend"] == "kuberay"
    assert parent.data.params["workload.trainable"] == "train:objective" and len(children) == 2
    assert (result["type"], result["mlflow_run_id"], result["trials"]) == (
        "RunResult",
        parent.info.run_id,
        2,
    )
    assert "loss" in result["best_metrics"] and "lr" in result["best_config"], result
    log = _driver_log(client, parent, rayflow.workdir)
    assert "== rayflow results ==" in log and "[rayflow-result]" not in log
    assert "leaves ConfigMap/team-settings to you: kubectl apply" in out.stderr
    for line in (
        "the API server accepts RayCluster default/team-ray (server-side dry run)",
        "applied RayCluster default/team-ray",
        "== rayflow results ==",
        "deleted RayCluster default/team-ray and its pods",
    ):
        assert line in text, (line, text[-3000:])
    created = applied.seen
    assert created is not None, "the RayCluster was never seen"
    labels = created["metadata"]["labels"]
    assert labels["team"] == "ml" and labels["app.kubernetes.io/managed-by"] == "rayflow"
    assert created["spec"]["authOptions"] == {"mode": "token"}
    assert created["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 1
    assert not stack.get("configmaps", "--field-selector=metadata.name=team-settings")["items"]
    assert wait_until(lambda: not stack.left("team-ray"), timeout=60), stack.left("team-ray")


@pytest.mark.slow
def test_a_failed_job_on_a_raycluster_someone_else_applied(rayflow, local_kube):
    """Issue 43: a RayCluster rayflow did not make is joined only when the user trusts it by its
    uid (backend.join_uid), and never deleted. The user's trainable raises there: exit 1, the
    job's last lines on this terminal, and its whole driver log in the parent MLflow run."""
    stack, name = local_kube, "team-ray"
    rayflow.env.update(stack.env())
    foreign = yaml.safe_load(USER_MANIFEST.split("---")[0])
    foreign["spec"]["authOptions"] = {"mode": "token"}
    path = rayflow.workdir / "foreign.yaml"
    path.write_text(yaml.safe_dump(foreign))
    stack.kube.kubectl("apply", "-f", str(path))
    try:
        uid = stack.get("raycluster", name)["metadata"]["uid"]
        (rayflow.workdir / "boom.py").write_text(
            "def objective(config):\n    raise ValueError('boom: the trainable failed')\n"
        )
        out = rayflow.run(
            *stack.backend(
                f"backend.manifest={path}", "backend.keep_cluster=true", f"backend.join_uid={uid}"
            ),
            "workload=tune",
            "workload.trainable=boom:objective",
            "workload.metric=loss",
            "workload.mode=min",
            "workload.num_samples=1",
            "workload.search_space={lr: {uniform: [0.1, 0.2]}}",
            f"tracking.uri={stack.mlflow_url}",
            "tracking.experiment=kuberay-boom",
            f"storage_path={stack.s3.uri('boom')}",
            timeout=400,
        )
        text = out.stdout + out.stderr
        assert out.returncode == 1, text[-4000:]
        assert f"reusing the existing RayCluster default/{name} as it is" in out.stdout, text[
            -3000:
        ]
        assert "you trust it by its uid (backend.join_uid); rayflow leaves it running" in text
        assert "deleted RayCluster" not in text
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("rayflow: error: the job on backend=kuberay ended FAILED: "), last
        shown = out.stderr[out.stderr.index("[rayflow] the last ") :]
        assert "lines of job raysubmit_" in shown and "job/driver.log" in shown
        assert "boom: the trainable failed" in shown
        assert stack.get("raycluster", name)["metadata"]["uid"] == uid
    finally:
        stack.kube.kubectl("delete", "raycluster", name, "--ignore-not-found")
    client, parent, _ = _parent(stack.mlflow_url, "kuberay-boom")
    assert parent.info.status == "FAILED"
    log = _driver_log(client, parent, rayflow.workdir)
    assert "ValueError: boom: the trainable failed" in log and "1 trial(s) errored" in log
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)


def test_no_kubeconfig_is_one_line(rayflow, tmp_path):
    out = rayflow.run(
        "backend=kuberay",
        f"backend.kubeconfig={tmp_path / 'nope'}",
        "tracking=none",
        "storage_shared=true",
        timeout=120,
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("rayflow: error: backend.kubeconfig: no usable Kubernetes credentials")


class TestKubeRayContract(JobSubmissionSuite):
    """The job-submission contract every submitting backend passes (vm's too)."""

    name = "kuberay"
    owns_cluster = True

    @pytest.fixture(autouse=True)
    def _stack(self, local_kube, monkeypatch):
        self._local_kube = local_kube
        for key, value in local_kube.env().items():
            monkeypatch.setenv(key, value)
        yield
        assert wait_until(lambda: not local_kube.left("contract"), timeout=60), (
            "the backend must delete what it applied"
        )

    def overrides(self):
        return [
            *self._local_kube.backend("backend.cluster_name=contract"),
            f"storage_path={self._local_kube.s3.uri('contract')}",
        ]
