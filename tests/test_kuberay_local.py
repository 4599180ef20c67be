"""backend=kuberay on the real stack (tests/harness/kube_local.py): a real kube-apiserver, etcd,
controller-manager and scheduler, the real KubeRay operator, Ray's own KubeRay autoscaler in the
head pod, and pods run as processes by scripts/kube_local's kubelet, each with its own network
namespace and disk. The run goes through `python -m rayflow backend=kuberay` as a user's does.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from rayflow.testing.processes import wait_until

SMALL_CIFAR = [
    "workload.num_samples=2",
    "workload.max_epochs=1",
    "workload.scheduler.grace_period=1",
]


def _cli(rayflow, stack, *args: str) -> subprocess.CompletedProcess:
    """`rayflow status|logs|down ...` as the user runs them."""
    out = subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=rayflow.workdir,
        env={**rayflow.env, **stack.env()},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


class PodWatch:
    """The pods of a RayCluster seen while a run goes on, by name (their last state seen)."""

    def __init__(self, stack, cluster: str):
        self.stack, self.cluster, self.seen = stack, cluster, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.done.wait(1.0):
            pods = self.stack.get("pods", "-l", f"ray.io/cluster={self.cluster}")["items"]
            self.seen.update({p["metadata"]["name"]: p for p in pods})

    def __enter__(self) -> PodWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=30)

    def workers(self) -> list[dict]:
        return [
            p for p in self.seen.values() if p["metadata"]["labels"]["ray.io/node-type"] == "worker"
        ]


def _until_submitted(log: Path) -> None:
    """Until the run started in the background has submitted its job (its log says so)."""
    assert wait_until(
        lambda: "[rayflow] submitted job" in log.read_text(), timeout=240, interval=0.5
    ), log.read_text()[-3000:]


def _ray_token(stack, cluster: str) -> str:
    """The Ray token the operator put in the cluster's Secret (token auth)."""
    import base64

    secret = stack.get("secret", cluster)
    return base64.b64decode(secret["data"]["auth_token"]).decode()


def _jobs(stack, cluster: str, token: str) -> list[dict]:
    """The head's Jobs API, through the API server's service proxy, as the administrator."""
    import requests

    pki = stack.kube.plane.folder / "pki"
    answer = requests.get(
        f"{stack.kube.plane.server}/api/v1/namespaces/default/services/"
        f"{cluster}-head-svc:dashboard/proxy/api/jobs/",
        cert=(str(pki / "admin.crt"), str(pki / "admin.key")),
        verify=str(pki / "ca.crt"),
        headers={"X-Ray-Authorization": f"Bearer {token}"},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()


def _operator_events(stack, cluster: str) -> list[tuple[str, str]]:
    return [
        (e["reason"], e["message"])
        for e in stack.events("RayCluster")
        if e["involvedObject"]["name"] == cluster
    ]


# --- a kept cluster that stops itself (started first: the module's other tests run while it idles)

AUTOSTOPPED = "autostop"


@pytest.fixture(scope="module")
def autostopping(tmp_path_factory, data_root, local_kube):
    """A RayCluster kept with a one-minute autostop by a run that has ended: its head's watcher
    runs as the ServiceAccount rayflow rendered, with the token the process kubelet projected,
    against the real API server and its RBAC."""
    from tests.harness.cli import Rayflow

    runner = Rayflow(tmp_path_factory.mktemp("kept-kuberay"), data_root)
    runner.env.update(local_kube.env())
    runner.env["XDG_CACHE_HOME"] = str(runner.workdir / "cache")  # its own registry
    (runner.workdir / "objective.py").write_text(
        "def objective(config):\n    return {'loss': 0.5}\n"
    )
    runner.kept_run = [
        *local_kube.backend(f"backend.cluster_name={AUTOSTOPPED}", "backend.keep_cluster=true"),
        "workload=tune",
        "workload.trainable=objective:objective",
        "workload.metric=loss",
        "workload.mode=min",
        "tracking=none",
        f"storage_path={local_kube.s3.uri(AUTOSTOPPED)}",
    ]
    first = runner.run(*runner.kept_run, "backend.autostop_idle_minutes=1", timeout=400)
    yield runner, first


def test_a_kept_clusters_account_may_delete_only_it(autostopping, local_kube):
    """Its head runs as the rendered account; the real RBAC authorizer lets that account's token
    delete nothing but its own RayCluster: another's delete is the API server's 403."""
    runner, first = autostopping
    stack = local_kube
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert f"autostop: {AUTOSTOPPED} stops itself after 1 idle minute" in first.stdout
    account = f"{AUTOSTOPPED}-rayflow-autostop"
    [head] = stack.pods(AUTOSTOPPED, "head")
    assert head["spec"]["serviceAccountName"] == account
    # someone else's RayCluster (suspended: no pods), and the account's own token
    other = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "someone-elses"},
        "spec": {
            "suspend": True,
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}
                },
            },
        },
    }
    path = runner.workdir / "other.json"
    path.write_text(json.dumps(other))
    stack.kube.kubectl("apply", "-f", str(path))
    token = stack.kube.kubectl("create", "token", account).strip()
    plane = stack.kube.plane
    as_account = [  # the token alone: no client certificate of the admin's beside it
        str(stack.kube.bin_dir / "kubectl"),
        "--kubeconfig=/dev/null",
        f"--server={plane.server}",
        f"--certificate-authority={plane.folder / 'pki' / 'ca.crt'}",
        f"--token={token}",
    ]
    denied = subprocess.run(
        [*as_account, "delete", "raycluster", "someone-elses"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    assert (
        f'User "system:serviceaccount:default:{account}" cannot delete resource "rayclusters"'
        in denied.stderr
    )
    stack.kube.kubectl("delete", "raycluster", "someone-elses")


def test_a_kept_cluster_is_listed_idle_joined_by_the_next_run_and_its_log_read(
    autostopping, local_kube
):
    """`status` lists it idle with its autostop; its account, Role (get and delete on it alone)
    and RoleBinding are owned by it, so Kubernetes deletes them with it; a run of this user's
    that names it and keeps it joins it (its uid in this user's registry, the proof on it) and
    leaves it running; `logs` reads that run's job."""
    runner, _ = autostopping
    stack = local_kube
    uid = stack.get("raycluster", AUTOSTOPPED)["metadata"]["uid"]
    [row] = [
        r
        for r in json.loads(_cli(runner, stack, "status", "--json").stdout)
        if r["name"] == AUTOSTOPPED
    ]
    assert (row["state"], row["autostop_idle_minutes"]) == ("idle", 1), row
    # rayflow's three objects (the operator makes the autoscaler's own beside them)
    account = f"{AUTOSTOPPED}-rayflow-autostop"
    owned = {kind: stack.get(kind, account) for kind in ("serviceaccount", "role", "rolebinding")}
    for obj in owned.values():
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid], obj["metadata"]
    assert owned["role"]["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": [AUTOSTOPPED],
            "verbs": ["get", "delete"],
        }
    ]
    second = runner.run(*runner.kept_run, timeout=400)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert f"reusing the existing RayCluster default/{AUTOSTOPPED}" in second.stdout
    assert stack.get("raycluster", AUTOSTOPPED)["metadata"]["uid"] == uid
    log = _cli(runner, stack, "logs", AUTOSTOPPED)
    assert "== rayflow results ==" in log.stdout and "[rayflow-result]" not in log.stdout


@pytest.mark.slow
def test_a_search_scales_worker_pods_up_and_down_through_the_real_operator(rayflow, local_kube):
    """Seed 002: the RayCluster starts with no worker; Ray's autoscaler (v2, in the head pod)
    raises the group's replicas, the operator creates the pod, it joins the head through the
    head Service's name; once idle, the autoscaler names it in workersToDelete and the operator
    deletes it. Kept, the cluster is listed, its job's log read, and `down` deletes it."""
    stack, name = local_kube, "scale"
    rayflow.env.update(stack.env())
    with PodWatch(stack, name) as watch:
        out = rayflow.run(
            *stack.backend(
                f"backend.cluster_name={name}",
                "backend.keep_cluster=true",
                "backend.autostop_idle_minutes=0",
                "backend.autoscale_idle_timeout_minutes=0.25",
            ),
            *SMALL_CIFAR,
            f"tracking.uri={stack.mlflow_url}",
            f"storage_path={stack.s3.uri('scale')}",
            timeout=600,
        )
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-4000:]
        assert "[rayflow] autoscaler: launched 1 worker (cpu)" in text, text[-3000:]
        assert "View run" not in text  # MLflow's own link: rayflow's "MLflow:" line says it
        # token auth: the operator made the Secret the run read Ray's token from
        assert f"reading the Ray token from its Secret ({name})... done" in text
        # idle: the autoscaler asks for the pod's deletion by name, the operator deletes it
        assert wait_until(lambda: not stack.pods(name, "worker"), timeout=120), stack.pods(
            name, "worker"
        )
    [worker] = watch.workers()
    [owner] = worker["metadata"]["ownerReferences"]
    cluster = stack.get("raycluster", name)
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "RayCluster",
        name,
        cluster["metadata"]["uid"],
    )
    worker_name = worker["metadata"]["name"]
    events = _operator_events(stack, name)
    assert ("CreatedWorkerPod", f"Created worker Pod default/{worker_name}") in events, events
    assert any(r == "DeletedWorkerPod" and worker_name in m for r, m in events), events
    # the checkpoints are in the bucket (the pods share no disk)
    assert any("/checkpoint_000000/" in key for key in stack.s3.objects("scale/")), "no checkpoint"
    # MLflow (a server on the bridge, which the head pod reached): what the cluster cost
    from mlflow.tracking import MlflowClient

    client = MlflowClient(stack.mlflow_url)
    experiment = client.get_experiment_by_name("cifar")
    [parent] = [
        r
        for r in client.search_runs([experiment.experiment_id])
        if "mlflow.parentRunId" not in r.data.tags and r.data.tags.get("backend") == "kuberay"
    ]
    assert parent.data.metrics["cluster_nodes_peak"] == 2
    for metric in ("cluster_node_seconds", "cluster_start_s"):
        assert metric in parent.data.metrics, metric
    spec = Path(client.download_artifacts(parent.info.run_id, "cluster/spec.yaml")).read_text()
    assert "kind: RayCluster" in spec and "enableInTreeAutoscaling: true" in spec
    # created with rayflow's field manager, labelled as rayflow's and this run's
    labels = cluster["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "rayflow" and labels["rayflow.io/run"]
    fields = stack.get("raycluster", name, "--show-managed-fields")["metadata"]["managedFields"]
    managers = {m["manager"] for m in fields}
    assert "rayflow" in managers, managers
    # the Ray token (the operator's Secret) is in no output, artifact, param or tag
    token = _ray_token(stack, name)
    assert token not in text and token not in spec
    assert token not in str(parent.data.params) + str(parent.data.tags)
    # the Jobs API was reached through the API server's service proxy, and the job's command
    # line is fixed (no override, no URI in it: ps on the head, JobInfo.entrypoint)
    assert f"dashboard of {name} reachable through proxy" in text
    entrypoints = [
        j["entrypoint"]
        for j in _jobs(stack, name, token)
        if (j.get("metadata") or {}).get("submitted_by") == "rayflow"
    ]
    assert entrypoints and all(
        e.endswith("-m rayflow.job_entry") and "=" not in e for e in entrypoints
    ), entrypoints
    # kept: listed, its job's log read, then deleted by `down` with its pods
    [row] = [
        r for r in json.loads(_cli(rayflow, stack, "status", "--json").stdout) if r["name"] == name
    ]
    assert row["state"] in ("idle", "running"), row
    log = _cli(rayflow, stack, "logs", name)
    assert "== rayflow results ==" in log.stdout
    _cli(rayflow, stack, "down", name)
    assert wait_until(lambda: not stack.get("pods", "-l", f"ray.io/cluster={name}")["items"], 60)
    assert not [c for c in stack.get("rayclusters")["items"] if c["metadata"]["name"] == name]


# --- failing fast, in the real components' words ------------------------------------------------

FAIL_FAST = [
    # the process kubelet's ErrImagePull for an image outside its allow-list
    ("image_pull", ["backend.image=registry.invalid/ray:2.60.0"], "cannot pull its image "),
    # the real scheduler's FailedScheduling: no node has 64 CPUs
    ("no_cpu", ["backend.head.cpu=64", "backend.schedule_grace_s=2"], "Insufficient cpu"),
    # a Ray that cannot start (`ray start` refuses the value): in a pod that is never restarted
    # (autoscaler v2's restartPolicy) it ends for good; in one that is, it crash-loops
    (
        "exits",
        ["+backend.overrides.spec.headGroupSpec.rayStartParams.object-store-memory=lots"],
        # with the last line of its log, which the rendered terminationMessagePolicy keeps
        "'s container ray-head exited with code 2 (Error): ",
    ),
    (
        "crash_loop",
        [
            "backend.autoscaler_version=v1",
            "+backend.overrides.spec.headGroupSpec.rayStartParams.object-store-memory=lots",
        ],
        "keeps crashing (CrashLoopBackOff, ",
    ),
    # a rule of the operator's own that rayflow's offline checks do not copy (they copy those of
    # KubeRay's validation.go a user is likely to meet): its InvalidRayClusterSpec Event
    (
        "invalid_spec",
        ["+backend.overrides.spec.headGroupSpec.rayStartParams.redis-username=someone"],
        "(InvalidRayClusterSpec): The RayCluster spec is invalid default/ff-invalid-spec: "
        "cannot set redis username",
    ),
]


@pytest.mark.parametrize("scenario,more,expected", FAIL_FAST, ids=[f[0] for f in FAIL_FAST])
def test_what_keeps_the_head_down_fails_fast_in_one_line(
    rayflow, local_kube, scenario, more, expected
):
    stack, name = local_kube, f"ff-{scenario.replace('_', '-')}"
    rayflow.env.update(stack.env())
    out = rayflow.run(
        *stack.backend(f"backend.cluster_name={name}", *more),
        "tracking=none",
        f"storage_path={stack.s3.uri(name)}",
        timeout=240,
    )
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert len(errors) == 1 and expected in errors[0], out.stderr[-3000:]
    if scenario == "exits":  # `ray start`'s own refusal, quoted
        assert "object-store-memory" in errors[0].split("(Error): ", 1)[1], errors
    assert "Traceback" not in out.stderr
    assert f"deleted RayCluster default/{name}" in out.stdout
    assert wait_until(lambda: not stack.get("pods", "-l", f"ray.io/cluster={name}")["items"], 60)


def test_a_taint_no_head_tolerates_fails_fast_in_the_schedulers_words(rayflow, local_kube):
    """Both Nodes tainted NoSchedule (as a team reserves its nodes): the real scheduler's
    FailedScheduling names the untolerated taint, and the run ends in one line within the grace."""
    stack, name = local_kube, "ff-taint"
    rayflow.env.update(stack.env())
    taint = "rayflow.test/reserved=team:NoSchedule"
    stack.kube.kubectl("taint", "nodes", "--all", taint)
    try:
        out = rayflow.run(
            *stack.backend(f"backend.cluster_name={name}", "backend.schedule_grace_s=2"),
            "tracking=none",
            f"storage_path={stack.s3.uri(name)}",
            timeout=240,
        )
    finally:
        stack.kube.kubectl("taint", "nodes", "--all", f"{taint}-")
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert len(errors) == 1 and "FailedScheduling" in errors[0], out.stderr[-3000:]
    assert "2 node(s) had untolerated taint" in errors[0], errors  # v1.36 names no key
    assert "Traceback" not in out.stderr
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)


def test_a_rayjob_the_operator_refuses_fails_fast_in_one_line(rayflow, local_kube):
    """The operator's refusal of a RayJob is a status (ValidationFailed), not an API error: here
    deletionRules beside shutdownAfterJobFinishes, which the CRD's CEL rules let through."""
    stack, name = local_kube, "rj-refused"
    rayflow.env.update(stack.env())
    rule = "{policy: DeleteCluster, condition: {jobStatus: SUCCEEDED}}"
    out = rayflow.run(
        *stack.backend(
            f"backend.cluster_name={name}",
            "backend.mode=rayjob",
            f"+backend.overrides.spec.deletionStrategy.deletionRules=[{rule}]",
        ),
        "tracking=none",
        f"storage_path={stack.s3.uri(name)}",
        timeout=240,
    )
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
    assert len(errors) == 1 and (
        f"KubeRay marked RayJob default/{name} ValidationFailed: The RayJob spec is invalid: "
        "spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules are mutually "
        "exclusive" in errors[0]
    ), out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert wait_until(lambda: not stack.get("rayjobs")["items"], timeout=60)
    assert not stack.left(name)


def test_a_gpu_worker_that_cannot_be_scheduled_does_not_block_the_head_wait(local_kube):
    """`state: ready` waits for every worker pod; the head wait needs only HeadPodReady. The
    real scheduler leaves the GPU worker Pending (no Node has nvidia.com/gpu)."""
    import ray

    from rayflow.backends.kuberay.kube import Kube
    from rayflow.backends.kuberay.manifest import render
    from rayflow.backends.kuberay.wait import wait_for_head
    from rayflow.orchestrator.compose import compose_config

    stack, name = local_kube, "gpu-worker"
    section = compose_config(
        *stack.backend(f"backend.cluster_name={name}", "backend.min_worker_nodes=1"),
        "compute=gpu",
    ).backend
    manifest = render(section, True, "disabled", ray.__version__, "3.11", {})
    kube = Kube("default", str(stack.kubeconfig))
    try:
        kube.apply(manifest)
        head = wait_for_head(kube, lambda: name, timeout_s=120, grace_s=1, poll_s=0.5)
        assert head["metadata"]["name"].startswith(f"{name}-head-")
        [worker] = stack.pods(name, "worker")
        assert worker["status"]["phase"] == "Pending", worker["status"]
        [scheduled] = [c for c in worker["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert "nvidia.com/gpu" in scheduled["message"], scheduled
        assert stack.get("raycluster", name).get("status", {}).get("state") != "ready"
    finally:
        kube.delete("RayCluster", name)
        kube.close()
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)


def test_a_finalizer_that_holds_the_cluster_is_reported_by_name(rayflow, local_kube):
    """A finalizer of someone else's (a policy controller's, say) keeps the RayCluster after
    rayflow's delete: the teardown names it and goes on, and the run ends in its own error."""
    stack, name = local_kube, "held"
    rayflow.env.update(stack.env())
    try:
        out = rayflow.run(
            *stack.backend(
                f"backend.cluster_name={name}",
                "backend.start_timeout_s=3",
                "backend.delete_timeout_s=3",
                "+backend.overrides.metadata.finalizers=[example.com/hold]",
            ),
            "tracking=none",
            f"storage_path={stack.s3.uri(name)}",
            timeout=120,
        )
        assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
        assert "was not ready within 3 s" in out.stderr, out.stderr[-3000:]
        assert "held by finalizer(s) example.com/hold" in out.stderr, out.stderr[-3000:]
        assert "rayflow: warning: teardown step failed" in out.stderr
        assert stack.get("raycluster", name)["metadata"]["deletionTimestamp"]
    finally:  # the finalizer's owner lets go
        if stack.left(name)[:1] == [f"raycluster/{name}"]:
            stack.kube.kubectl(
                "patch",
                "raycluster",
                name,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
            )
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)


# --- teardown, and what a dry run promises --------------------------------------------------------


def test_ctrl_c_mid_run_leaves_no_cluster_pod_service_or_secret(rayflow, local_kube):
    """Ctrl-C while the job runs: rayflow stops the job and deletes the RayCluster; the real
    garbage collector takes what the operator made with it (pods, the head Service, the auth
    Secret). (SIGTERM takes the same path: rayflow.testing's contract suite and test_vm.py send it.)"""
    stack, name = local_kube, "ctrl-c"
    rayflow.env.update(stack.env())
    proc, log = rayflow.start(
        *stack.backend(f"backend.cluster_name={name}"),
        "workload.num_samples=1",
        "workload.max_epochs=1000",
        "workload.scheduler.grace_period=1000",
        "tracking=none",
        f"storage_path={stack.s3.uri(name)}",
    )
    try:
        _until_submitted(log)
        assert stack.left(name), "the run made its cluster"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "stopping job" in text and f"deleted RayCluster default/{name}" in text, text[-3000:]
    assert wait_until(lambda: not stack.left(name), timeout=60), stack.left(name)


def test_a_dry_run_is_validated_by_the_api_server_and_applies_as_printed(rayflow, local_kube):
    stack, name = local_kube, "dry"
    rayflow.env.update(stack.env())
    out = rayflow.run(
        *stack.backend(f"backend.cluster_name={name}", "backend.keep_cluster=true"),
        "dry_run=true",
        "tracking=none",
        f"storage_path={stack.s3.uri(name)}",
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"accepts RayCluster default/{name} (server-side dry run; nothing was applied)" in (
        out.stderr
    )
    assert "auth_token" not in out.stdout and "RAY_AUTH_TOKEN" not in out.stdout
    # kept: the RayCluster whose head runs as its autostop account, that account, its Role (get
    # and delete on that RayCluster only) and the RoleBinding
    cluster, account, role, binding = yaml.safe_load_all(out.stdout)
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == account["metadata"]["name"] == f"{name}-rayflow-autostop"
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    assert role["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": [name],
            "verbs": ["get", "delete"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "default"}
    ]
    # the printed documents, as printed, pass the API server's own dry run (schema, CEL, RBAC
    # kinds, admission), and nothing is created
    applied = subprocess.run(
        [str(stack.kube.bin_dir / "kubectl"), f"--kubeconfig={stack.kubeconfig}"]
        + ["apply", "--dry-run=server", "-f", "-"],
        input=out.stdout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    assert f"raycluster.ray.io/{name} created (server dry run)" in applied.stdout, applied.stdout
    assert not stack.left(name)


def test_what_the_api_server_refuses_fails_the_dry_run_in_its_words(rayflow, local_kube):
    """The CRD's CEL rule on spec.managedBy, which rayflow's offline checks do not evaluate: the
    real API server's 422, in one line; a run refuses it before anything is created."""
    stack, name = local_kube, "cel"
    rayflow.env.update(stack.env())
    bad = stack.backend(f"backend.cluster_name={name}", "+backend.overrides.spec.managedBy=me")
    for extra in (["dry_run=true"], []):
        out = rayflow.run(
            *bad, *extra, "tracking=none", f"storage_path={stack.s3.uri(name)}", timeout=120
        )
        assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
        [error] = [line for line in out.stderr.splitlines() if line.startswith("rayflow: error:")]
        assert "422" in error and "the managedBy field value must be either" in error, error
        assert "Traceback" not in out.stderr
        assert not stack.left(name)


@pytest.mark.slow
def test_a_worker_pod_deleted_mid_run_is_replaced_and_its_trial_restored(rayflow, local_kube):
    """The pod running the trial is deleted (`kubectl delete pod`): the operator makes a new one
    to hold the group's replicas, the trial fails with its node, and Tune restores it from its
    last checkpoint, in the bucket, on the new pod."""
    # epochs of a second or two: the pod goes with most of them still to run
    stack, name, epochs = local_kube, "lost", 16
    rayflow.env.update(stack.env())
    with PodWatch(stack, name) as watch:
        proc, log = rayflow.start(
            *stack.backend(f"backend.cluster_name={name}"),
            "workload.num_samples=1",
            f"workload.max_epochs={epochs}",
            f"workload.scheduler.grace_period={epochs}",
            "data.synthetic_train_size=4000",
            "tracking=none",
            f"storage_path={stack.s3.uri(name)}",
        )
        try:
            # two epochs checkpointed in the bucket: the worker pod goes
            assert wait_until(
                lambda: (
                    proc.poll() is not None
                    or any("/checkpoint_000001/" in k for k in stack.s3.objects(f"{name}/"))
                ),
                timeout=400,
                interval=1,
            ), log.read_text()[-3000:]
            assert proc.poll() is None, log.read_text()[-3000:]
            running = wait_until(
                lambda: [
                    p for p in stack.pods(name, "worker") if p["status"]["phase"] == "Running"
                ],
                timeout=60,
            )
            assert running, (stack.phases(), stack.operator_said(name), log.read_text()[-3000:])
            [worker] = running
            stack.kube.kubectl("delete", "pod", worker["metadata"]["name"], "--wait=false")
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert re.search(r"^trials restarted: 1 \(each from its last checkpoint", text, re.M), text
    # a second worker pod, the operator's, held the restored trial
    assert len(watch.workers()) >= 2, sorted(watch.seen)
    rows = [
        json.loads(line)
        for key in stack.s3.objects(f"{name}/")
        if key.endswith("/result.json")
        for line in stack.s3.read(key).decode().splitlines()
        if line.strip()
    ]
    restored = [r for r in rows if r.get("iterations_since_restore") == 1 and r["epoch"] > 1]
    assert restored and max(r["epoch"] for r in rows) == epochs, rows


def test_the_kept_raycluster_was_deleted_by_its_own_head(autostopping, local_kube):
    """Last in the module: idle for its minute, the head's watcher deleted its RayCluster (as the
    account the real RBAC authorizer allows that), and the pods went with it; `status` says it
    is gone."""
    runner, _ = autostopping
    assert wait_until(
        lambda: (
            not [
                c
                for c in local_kube.get("rayclusters")["items"]
                if c["metadata"]["name"] == AUTOSTOPPED
            ]
        ),
        timeout=240,
        interval=2,
    ), "the kept cluster is still there"
    assert wait_until(lambda: not local_kube.left(AUTOSTOPPED), timeout=60)
    [row] = [
        r
        for r in json.loads(_cli(runner, local_kube, "status", "--json").stdout)
        if r["name"] == AUTOSTOPPED
    ]
    assert row["state"] == "gone", row


@pytest.mark.slow
def test_a_rayjobs_cluster_goes_when_its_job_ends_though_the_client_died(rayflow, local_kube):
    """mode=rayjob: the real operator tracks the job rayflow submitted (InteractiveMode, spec.jobId)
    and, with shutdownAfterJobFinishes and its TTL, deletes the RayCluster once the job ends, even
    when the client that started it was killed (SIGKILL: no teardown of its own ran)."""
    stack, name = local_kube, "rj"
    rayflow.env.update(stack.env())
    proc, log = rayflow.start(
        *stack.backend(
            f"backend.cluster_name={name}",
            "backend.mode=rayjob",
            "backend.rayjob.ttl_seconds_after_finished=5",
        ),
        *SMALL_CIFAR,
        "tracking=none",
        f"storage_path={stack.s3.uri(name)}",
    )
    try:
        _until_submitted(log)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert f"applied RayJob default/{name}" in log.read_text()
    job = stack.get("rayjob", name)
    assert job["spec"]["submissionMode"] == "InteractiveMode"
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["jobId"].startswith("raysubmit_")
    cluster = job["status"]["rayClusterName"]

    def finished() -> dict | None:
        status = stack.get("rayjob", name).get("status") or {}
        return status if status.get("jobDeploymentStatus") == "Complete" else None

    status = wait_until(finished, timeout=400, interval=2)
    assert status and status["jobStatus"] == "SUCCEEDED", (
        stack.get("rayjob", name)["status"],
        stack.operator_said(name),
    )
    # the TTL after the job's end, then the operator deletes the cluster, its pods with it
    assert wait_until(lambda: not stack.left(cluster), timeout=120), stack.left(cluster)
    stack.kube.kubectl("delete", "rayjob", name)


def test_a_folder_of_this_machine_is_refused_before_anything_starts(rayflow, local_kube):
    """The pods share no disk: a local storage_path would lose every checkpoint but the head's."""
    stack = local_kube
    rayflow.env.update(stack.env())
    out = rayflow.run(*stack.backend("backend.cluster_name=local-path"), "tracking=none")
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("rayflow: error: storage_path: ") and "s3://" in last, last
    assert not stack.left("local-path")


def test_the_operators_own_submitter_job_runs_on_the_process_kubelet(local_kube, tmp_path):
    """A RayJob in K8sJobMode (KubeRay's default, which rayflow's own RayJobs do not use): the
    operator makes a Kubernetes Job whose pod submits the entrypoint to the head; the real Job
    controller and the process kubelet run it to completion, and the operator deletes the cluster
    after the job (shutdownAfterJobFinishes)."""
    stack, name = local_kube, "submitter"
    head = {"name": "ray-head", "image": "rayproject/ray:2.60.0"}
    head["resources"] = {"limits": {"cpu": "1", "memory": "2Gi"}}
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -c 'import ray; ray.init(); print(ray.get(ray.remote(lambda: 6 * 7).remote()))'",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 0,
            "rayClusterSpec": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [head]}},
                },
            },
        },
    }
    path = tmp_path / "rayjob.json"
    path.write_text(json.dumps(job))
    stack.kube.kubectl("apply", "-f", str(path))
    try:

        def done() -> dict | None:
            status = stack.get("rayjob", name).get("status") or {}
            return status if status.get("jobDeploymentStatus") in ("Complete", "Failed") else None

        status = wait_until(done, timeout=300, interval=2)
        assert status and status.get("jobStatus") == "SUCCEEDED", (
            stack.get("rayjob", name)["status"],
            stack.operator_said(name),
        )
        submitter = stack.get("job", name)  # the operator names its Job after the RayJob
        assert submitter["status"].get("succeeded") == 1, submitter["status"]
        pods = stack.get("pods", "-l", f"job-name={submitter['metadata']['name']}")["items"]
        assert pods and pods[0]["status"]["phase"] == "Succeeded", [p["status"] for p in pods]
        cluster = status["rayClusterName"]
        assert wait_until(lambda: not stack.left(cluster), timeout=120), stack.left(cluster)
    finally:
        stack.kube.kubectl("delete", "rayjob", name, "--ignore-not-found")


def test_a_hydra_apps_search_runs_as_a_job_on_the_head_and_its_jobs_come_home(local_kube, tmp_path):
    """hydra/sweeper=rayflow on backend=kuberay: the search's driver is a Ray Job on the head pod,
    composing each trial's job from the app's config files shipped with it; the trials run on
    worker pods, the experiment is in the bucket, and the trials' folders come home from it."""
    from tests.harness.hydra_app import search_comes_home

    stack = local_kube
    keys = [
        o.replace("backend.", "hydra.sweeper.", 1)
        for o in stack.backend("backend.cluster_name=search", "backend.max_worker_nodes=1")
        if o.startswith("backend.")
    ]
    search_comes_home(
        tmp_path / "app",
        [
            "hydra.sweeper.backend=kuberay",
            *keys,
            "hydra.sweeper.tracking=none",
            f"hydra.sweeper.storage_path={stack.s3.uri('search')}",
        ],
        env=stack.env(),
    )
    assert not stack.left("search")


def test_the_kuberay_cluster_benchmark_runs_in_its_smoke_form(local_kube):
    """scripts/bench.py kuberay-cluster --smoke: through scripts/kube-local.sh up (export lines
    only) and down (nothing left: no process, namespace or link of `rfk`), a head and one run
    on it. (`local_kube`: this worker's stack is up beside it, on its own names and subnet.)"""
    from tests.harness.kube_local import leftovers

    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "bench.py")]
        + ["kuberay-cluster", "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = json.loads(out.stdout)
    assert line["name"] == "kuberay-cluster" and line["smoke"] is True
    assert line["head_ready_s"] and line["dashboard_s"] >= line["head_ready_s"] - 1
    assert line["kuberay_run_s"] > 0 and line["local_run_s"] is None
    assert not leftovers("rfk", Path("/nonexistent")), leftovers("rfk", Path("/nonexistent"))
