"""backend=kuberay offline: config -> RayCluster / RayJob manifest, checked by KubeRay's rules.

Nothing is applied: every rendered variant (and backends/kuberay/*.yaml) must pass the
operator's validation.go rules (kuberay_checks.operator_errors) and KubeRay's CRD schema
(kuberay_schema.schema_errors; those tests skip until that module is present).
"""

from __future__ import annotations

import copy
import sys
from decimal import Decimal
from importlib.metadata import version

import pytest
import yaml

from rayflow.backends import backend_for
from rayflow.backends.kuberay import checks as kuberay_checks
from rayflow.backends.kuberay import manifest as km
from rayflow.backends.kuberay import resources as kuberay_resources
from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config
from tests.harness import REPO

RAY_VERSION = version("ray")
PY = f"{sys.version_info.major}{sys.version_info.minor}"
SECRET = "rayflow-test-token-3f9c1d77e2b84a05"
GIB = 2**30

VARIANTS = {
    "cpu": (),
    "gpu": ("compute=gpu",),
    "v1": ("backend.autoscaler_version=v1",),
    "no-autoscaling": ("backend.enable_in_tree_autoscaling=false",),
    "auth-disabled": ("ray_auth_mode=disabled",),
    "rayjob": ("backend.mode=rayjob",),
    "rayjob-gpu": ("backend.mode=rayjob", "compute=gpu"),
    "nodeport": ("backend.service_type=NodePort", "+backend.head.node_selector.pool=ray"),
}


def backend(*overrides: str):
    return backend_for(compose_config("backend=kuberay", *overrides))


def manifest(*overrides: str, labels: dict | None = None) -> dict:
    return backend(*overrides).manifest(labels)


def cluster(m: dict) -> dict:
    return km.cluster_of(m)


def groups(m: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in cluster(m)["workerGroupSpecs"]}


def container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]


def base_manifests() -> dict[str, dict]:
    return {
        p.name: yaml.safe_load(p.read_text())
        for p in sorted((REPO / "backends" / "kuberay").glob("*.yaml"))
    }


# --- rendering ---------------------------------------------------------------------------------


def test_cpu_only_cluster():
    m = manifest(labels={"rayflow.io/run": "abc123"})
    assert (m["apiVersion"], m["kind"]) == ("ray.io/v1", "RayCluster")
    assert m["metadata"] == {
        "name": "rayflow",
        "namespace": "default",
        "labels": {"app.kubernetes.io/managed-by": "rayflow", "rayflow.io/run": "abc123"},
    }
    spec = m["spec"]
    assert spec["rayVersion"] == RAY_VERSION
    head = spec["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"} and head["serviceType"] == "ClusterIP"
    ray_head = container(head)
    assert (
        ray_head["name"] == "ray-head"
        and ray_head["image"] == f"rayproject/ray:{RAY_VERSION}-py{PY}"
    )
    assert {p["name"]: p["containerPort"] for p in ray_head["ports"]} == {
        "gcs-server": 6379,
        "dashboard": 8265,
        "client": 10001,
    }
    assert (
        ray_head["resources"]["requests"]
        == ray_head["resources"]["limits"]
        == {"cpu": "1", "memory": "4Gi"}
    )
    assert list(groups(m)) == ["cpu"]
    cpu = groups(m)["cpu"]
    assert (cpu["replicas"], cpu["minReplicas"], cpu["maxReplicas"]) == (0, 0, 2)
    assert (
        container(cpu)["name"] == "ray-worker"
        and container(cpu)["image"] == f"rayproject/ray:{RAY_VERSION}-py{PY}"
    )
    assert container(cpu)["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert (
        "nvidia.com/gpu" not in yaml.safe_dump(m) and "tolerations" not in cpu["template"]["spec"]
    )


def test_gpu_group_with_compute_gpu():
    m = manifest("compute=gpu", "backend.min_worker_nodes=1")
    assert list(groups(m)) == ["cpu", "gpu"]
    cpu, gpu = groups(m)["cpu"], groups(m)["gpu"]
    assert (cpu["minReplicas"], gpu["minReplicas"], gpu["replicas"], gpu["maxReplicas"]) == (
        0,
        1,
        1,
        2,
    )  # min goes to the group the run uses
    assert container(gpu)["resources"]["limits"] == {
        "cpu": "4",
        "memory": "16Gi",
        "nvidia.com/gpu": "1",
    }
    assert "nvidia.com/gpu" not in container(gpu)["resources"]["requests"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu[
        "template"
    ]["spec"]["tolerations"]
    assert container(gpu)["image"].endswith("-gpu") and not container(cpu)["image"].endswith("-gpu")
    assert not container(m["spec"]["headGroupSpec"])["image"].endswith("-gpu")


def test_a_group_a_user_adds_is_rendered():
    m = manifest('+backend.worker_groups.big={cpu: "8", memory: 32Gi}')
    big = groups(m)["big"]
    assert (big["minReplicas"], big["maxReplicas"]) == (0, 2)
    assert container(big)["resources"]["limits"] == {"cpu": "8", "memory": "32Gi"}


@pytest.mark.parametrize("autoscaler", ["v1", "v2"])
def test_autoscaler_version_and_restart_policy(autoscaler):
    spec = manifest(f"backend.autoscaler_version={autoscaler}")["spec"]
    assert (
        spec["enableInTreeAutoscaling"] is True
        and spec["autoscalerOptions"]["version"] == autoscaler
    )
    assert (
        spec["autoscalerOptions"]["resources"]["requests"]
        == spec["autoscalerOptions"]["resources"]["limits"]
        == {"cpu": "500m", "memory": "512Mi"}
    )
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in spec["workerGroupSpecs"]
    ]
    assert [p.get("restartPolicy") for p in pods] == (
        ["Never"] * len(pods) if autoscaler == "v2" else [None] * len(pods)
    )


def test_token_auth_never_puts_the_token_in_the_manifest(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", SECRET)
    m = manifest("ray_auth_mode=token")
    assert m["spec"]["authOptions"] == {"mode": "token"}
    text = backend("ray_auth_mode=token").render().text
    assert SECRET not in text and "RAY_AUTH_TOKEN" not in text
    assert "authOptions" not in manifest("ray_auth_mode=disabled")["spec"]


def test_rayjob_mode():
    m = manifest("backend.mode=rayjob", "compute=gpu")
    assert m["kind"] == "RayJob"
    spec = m["spec"]
    assert {k: v for k, v in spec.items() if k != "rayClusterSpec"} == {
        "submissionMode": "InteractiveMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": 60,
        "activeDeadlineSeconds": 86400,
        "preRunningDeadlineSeconds": 900,
    }
    assert spec["rayClusterSpec"] == manifest("compute=gpu")["spec"]


# --- the autoscaling vocabulary ----------------------------------------------------------------


@pytest.mark.parametrize("minutes, seconds", [(1.0, 60), (1.5, 90), (0, 0), (0.01, 1), (10, 600)])
def test_idle_minutes_become_whole_seconds(minutes, seconds):
    assert (
        manifest(f"backend.autoscale_idle_timeout_minutes={minutes}")["spec"]["autoscalerOptions"][
            "idleTimeoutSeconds"
        ]
        == seconds
    )


@pytest.mark.parametrize(
    "overrides, mode",
    [
        (("backend.autoscale_upscaling_speed=1.0",), "Conservative"),
        (("backend.autoscale_upscaling_speed=0.5",), "Conservative"),
        (("backend.autoscale_upscaling_speed=2",), "Default"),
        (
            ("backend.autoscale_upscaling_speed=0.5", "backend.upscaling_mode=Aggressive"),
            "Aggressive",
        ),
    ],
)
def test_upscaling_speed_becomes_upscaling_mode(overrides, mode):
    assert manifest(*overrides)["spec"]["autoscalerOptions"]["upscalingMode"] == mode


def test_autoscaling_table_keys_exist_and_the_docs_show_it():
    conf = {
        name: yaml.safe_load((REPO / "conf" / "backend" / f"{name}.yaml").read_text())
        for name in ("kuberay", "spark", "vm")
    }
    readme = (
        REPO / "docs" / "backends" / "index.md"
    ).read_text()  # the docs table, kept equal to the code
    for key, spark, vm, kuberay, ray in km.autoscaling_table():
        assert key in conf["kuberay"], key
        if spark == key:
            assert key in conf["spark"], key
        if key.startswith(("min_worker", "max_worker", "autoscale_")):
            assert key in conf["vm"], key
        assert f"| `{key}` | {spark} | {vm} | {kuberay} | {ray} |" in readme, key
    options = manifest()["spec"]["autoscalerOptions"]
    assert {
        row.kuberay.split()[0].removeprefix("autoscalerOptions.")
        for row in km.AUTOSCALING
        if row.kuberay.startswith("autoscalerOptions.")
    } == set(options) - {"resources"}


# --- image and rayVersion ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, image, ray",
    [
        ((), f"rayproject/ray:{RAY_VERSION}-py{PY}", RAY_VERSION),
        (("backend.ray_version=2.55.0",), f"rayproject/ray:2.55.0-py{PY}", "2.55.0"),
        (
            ("backend.image=rayproject/ray:2.52.0-py311-gpu",),
            "rayproject/ray:2.52.0-py311-gpu",
            "2.52.0",
        ),
        (
            ("backend.image=registry.local:5000/team/ray:2.53.1",),
            "registry.local:5000/team/ray:2.53.1",
            "2.53.1",
        ),
        (
            ("backend.image=registry.local:5000/team/rayflow:latest",),
            "registry.local:5000/team/rayflow:latest",
            RAY_VERSION,
        ),
    ],
)
def test_ray_version_matches_the_image(overrides, image, ray):
    b = backend(*overrides)
    b.check()
    spec = b.manifest()["spec"]
    assert spec["rayVersion"] == ray and container(spec["headGroupSpec"])["image"] == image


def test_ray_version_against_the_image_tag_is_refused():
    with pytest.raises(ConfigError) as err:
        backend("backend.image=rayproject/ray:2.52.0-py311", "backend.ray_version=2.60.0").check()
    assert err.value.key == "backend.ray_version"


# --- overrides ---------------------------------------------------------------------------------


def test_overrides_merge_last_and_null_deletes():
    m = manifest(
        "+backend.overrides.spec.headGroupSpec.serviceType=NodePort",
        "+backend.overrides.spec.autoscalerOptions.upscalingMode=null",
        "+backend.overrides.metadata.annotations={team: ml}",
    )
    assert m["spec"]["headGroupSpec"]["serviceType"] == "NodePort"
    assert (
        "upscalingMode" not in m["spec"]["autoscalerOptions"]
        and m["spec"]["autoscalerOptions"]["version"] == "v2"
    )
    assert m["metadata"]["annotations"] == {"team": "ml"} and m["metadata"]["name"] == "rayflow"
    assert container(m["spec"]["headGroupSpec"])["ports"]  # siblings of merged keys stay


# --- capacity ----------------------------------------------------------------------------------


def test_capacity_cpu_and_gpu():
    assert (
        backend().capacity({"CPU"})
        == [{"CPU": 0, "GPU": 0}] + [{"CPU": 2, "GPU": 0, "memory": 4 * GIB}] * 2
    )
    assert (
        backend("compute=gpu", "backend.worker_groups.gpu.max_replicas=3").capacity({"GPU"})
        == [{"CPU": 0, "GPU": 0}] + [{"CPU": 4, "GPU": 1, "memory": 16 * GIB}] * 3
    )


def test_capacity_rounds_up_like_the_operator_and_follows_overrides():
    # Quantity.Value() rounds up: 1500m CPU -> num-cpus 2; 1.5Gi memory stays whole bytes.
    nodes = backend(
        "backend.worker_groups.cpu.cpu=1500m",
        "backend.worker_groups.cpu.memory=1.5Gi",
        "backend.head.num_cpus=1",
    ).capacity({"CPU"})
    assert nodes[0] == {"CPU": 1, "GPU": 0} and nodes[1] == {
        "CPU": 2,
        "GPU": 0,
        "memory": 1.5 * GIB,
    }
    forced = backend("+backend.overrides.spec.headGroupSpec.rayStartParams.num-cpus='3'").capacity(
        {"CPU"}
    )
    assert forced[0]["CPU"] == 3


def test_capacity_is_none_for_a_quantity_that_does_not_parse():
    section = compose_config("backend=kuberay").backend
    section.worker_groups.cpu.memory = "5 Gi"
    assert kuberay_resources.capacity(section, False) is None


@pytest.mark.parametrize("text", ["500m", "4Gi", "1.5", "2e3", "1E-2", ".5Ki", "12k", "100M", "3"])
def test_quantities_parse_as_rays_kuberay_autoscaler_parses_them(text):
    from ray.autoscaler._private.kuberay.utils import parse_quantity

    assert kuberay_resources.parse_quantity(text) == Decimal(parse_quantity(text))


@pytest.mark.parametrize("text", ["5 Gi", "4GB", "", "1.2.3", "Gi", "-"])
def test_what_kubernetes_refuses_is_not_a_quantity(text):
    assert kuberay_resources.parse_quantity(text) is None


# --- the operator's rules and the CRD schema ---------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_passes_check_and_the_operator_rules(variant):
    from rayflow.errors import ConfigError

    b = backend(*VARIANTS[variant])
    if variant == "auth-disabled":  # issue 43: refused (the pod network reaches the head), yet
        with pytest.raises(ConfigError, match="^ray_auth_mode: disabled, but with backend=kuberay"):
            b.check()
    else:
        b.check()
    assert kuberay_checks.operator_errors(b.manifest()) == []  # its manifest renders as KubeRay's


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_base_manifests_pass_the_operator_rules(name):
    assert kuberay_checks.operator_errors(base_manifests()[name]) == []


def _set(m: dict, path: str, value) -> dict:
    m = copy.deepcopy(m)
    *parents, leaf = path.split(".")
    node = m
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[leaf] = value
    return m


@pytest.mark.parametrize(
    "path, value, where",
    [
        ("metadata.name", "x" * 54, "backend.cluster_name"),
        ("metadata.name", "Bad_Name", "backend.cluster_name"),
        ("spec.workerGroupSpecs.0.minReplicas", 5, "backend.worker_groups.cpu.min_replicas"),
        ("spec.workerGroupSpecs.0.maxReplicas", -1, "backend.worker_groups.cpu.max_replicas"),
        ("spec.headGroupSpec.resources", {"CPU": "1"}, "spec.headGroupSpec.resources"),
        (
            "spec.workerGroupSpecs.0.rayStartParams",
            {"labels": "a=b"},
            "spec.workerGroupSpecs[cpu].rayStartParams.labels",
        ),
        (
            "spec.workerGroupSpecs.0.template.spec.restartPolicy",
            "OnFailure",
            "spec.workerGroupSpecs[cpu].template.spec.restartPolicy",
        ),
        ("spec.rayVersion", "2.51.0", "backend.ray_version"),
        ("spec.autoscalerOptions.idleTimeoutSeconds", -1, "backend.autoscale_idle_timeout_minutes"),
    ],
)
def test_operator_rules_on_a_broken_manifest(path, value, where):
    errors = kuberay_checks.operator_errors(_set(manifest(), path, value))
    assert errors and errors[0][0] == where, errors  # the operator stops at its first error


def test_rayjob_rules_on_a_broken_manifest():
    job = manifest("backend.mode=rayjob")
    assert [
        e[0]
        for e in kuberay_checks.operator_errors(_set(job, "spec.shutdownAfterJobFinishes", False))
    ] == ["backend.rayjob.ttl_seconds_after_finished"]
    assert [e[0] for e in kuberay_checks.operator_errors(_set(job, "spec.backoffLimit", 2))] == [
        "spec.backoffLimit"
    ]
    assert [e[0] for e in kuberay_checks.operator_errors(_set(job, "metadata.name", "x" * 48))] == [
        "backend.cluster_name"
    ]


def test_v1_allows_any_restart_policy():
    m = _set(
        manifest("backend.autoscaler_version=v1"),
        "spec.headGroupSpec.template.spec.restartPolicy",
        "Always",
    )
    assert kuberay_checks.operator_errors(m) == []


@pytest.fixture
def schema_errors():
    return pytest.importorskip("rayflow.backends.kuberay.crd").schema_errors


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_passes_the_crd_schema(variant, schema_errors):
    assert schema_errors(manifest(*VARIANTS[variant], labels={"rayflow.io/run": "abc123"})) == []


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_base_manifests_pass_the_crd_schema(name, schema_errors):
    assert schema_errors(base_manifests()[name]) == []


def test_the_commented_gpu_group_passes_the_crd_schema(schema_errors):
    text = (REPO / "backends" / "kuberay" / "raycluster.yaml").read_text()
    start = text.index("    # - groupName: gpu")
    uncommented = text[:start] + "\n".join(
        line.replace("    # ", "    ", 1) for line in text[start:].splitlines()
    )
    m = yaml.safe_load(uncommented)
    assert [g["groupName"] for g in m["spec"]["workerGroupSpecs"]] == ["cpu", "gpu"]
    assert schema_errors(m) == [] and kuberay_checks.operator_errors(m) == []


def test_a_misspelt_override_is_a_schema_error_of_backend_overrides(schema_errors):
    with pytest.raises(ConfigError) as err:
        backend("+backend.overrides.spec.enableInTreeAutoscalling=true").check()
    assert err.value.key == "backend.overrides" and "enableInTreeAutoscalling" in str(err.value)


# --- the CLI -----------------------------------------------------------------------------------


def test_dry_run_prints_the_manifest(rayflow):
    out = rayflow.run("backend=kuberay", "dry_run=true", "compute=cpu", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # exactly the manifest: `| kubectl apply -f -` takes it
    [printed] = list(yaml.safe_load_all(out.stdout))
    assert printed["kind"] == "RayCluster" and set(printed) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    }
    assert printed["spec"]["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
