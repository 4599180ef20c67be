"""kuberay_schema: KubeRay's own samples validate (positive control), the shipped schemas are
what scripts/kuberay_crds.py extracts, and each kind of mistake is reported at its path.

The samples and CRDs come from <repo>/../shared/kuberay-crd (or $RAYFLOW_KUBERAY_CRD_DIR);
tests that need them skip without it. The negative cases build their own manifests.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import pytest
import yaml

from rayflow.backends.kuberay import crd as kuberay_schema
from rayflow.backends.kuberay.crd import schema_errors, with_defaults

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = Path(os.environ.get("RAYFLOW_KUBERAY_CRD_DIR") or REPO.parent / "shared" / "kuberay-crd")
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
needs_crd_dir = pytest.mark.skipif(
    not CRD_DIR.is_dir(),
    reason=f"KubeRay CRDs and samples not found at {CRD_DIR} (set RAYFLOW_KUBERAY_CRD_DIR)",
)


def ray_objects_of_samples() -> list:
    """One param per RayCluster/RayJob document of the samples (the files hold other kinds too)."""
    if not CRD_DIR.is_dir():
        return [pytest.param(None, id="no-samples", marks=needs_crd_dir)]
    params = []
    for sample in sorted((CRD_DIR / "samples").glob("*.yaml")):
        for index, doc in enumerate(yaml.safe_load_all(sample.read_text())):
            if (
                isinstance(doc, dict)
                and doc.get("kind") in CRD_FILES
                and doc.get("apiVersion") == "ray.io/v1"
            ):
                params.append(pytest.param(doc, id=f"{sample.name}#{index}"))
    return params


@pytest.mark.parametrize("manifest", ray_objects_of_samples())
def test_kuberay_samples_validate(manifest):
    before = copy.deepcopy(manifest)
    assert schema_errors(manifest) == []
    assert manifest == before


@needs_crd_dir
@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_shipped_schemas_are_what_the_script_extracts(kind):
    spec = importlib.util.spec_from_file_location(
        "kuberay_crds_script", REPO / "scripts" / "kuberay_crds.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    extracted_kind, schema = script.extract_v1_schema(CRD_DIR / CRD_FILES[kind])
    assert extracted_kind == kind
    assert kuberay_schema._schema(kind) == schema


def pod_template(**container_fields) -> dict:
    container = {
        "name": "ray",
        "image": "rayproject/ray:2.60.0",
        "resources": {
            "limits": {"cpu": 2, "memory": "8Gi"},
            "requests": {"cpu": "500m", "memory": "2Gi"},
        },
    }
    return {
        "metadata": {"labels": {"app.kubernetes.io/name": "rayflow"}},
        "spec": {"containers": [{**container, **container_fields}]},
    }


def ray_cluster() -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": "rayflow-run",
            "namespace": "ml",
            "labels": {"rayflow.io/run": "abc-1"},
        },
        "spec": {
            "rayVersion": "2.60.0",
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": pod_template(),
            },
            "workerGroupSpecs": [
                {
                    "groupName": "cpu",
                    "replicas": 2,
                    "minReplicas": 0,
                    "maxReplicas": 4,
                    "rayStartParams": {},
                    "template": pod_template(),
                }
            ],
        },
    }


def ray_job() -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rayflow-job"},
        "spec": {"entrypoint": "python -m rayflow", "rayClusterSpec": ray_cluster()["spec"]},
    }


def errors_at(manifest: dict, path: str) -> list[str]:
    errors = schema_errors(manifest)
    found = [e for e in errors if e.startswith(path + ": ")]
    assert found, f"no error at {path}; got {errors}"
    return found


def test_small_manifests_are_valid():
    assert schema_errors(ray_cluster()) == []
    assert schema_errors(ray_job()) == []


def test_misspelt_spec_field():
    manifest = ray_cluster()
    manifest["spec"]["enableInTreeAutoscalling"] = True
    assert errors_at(manifest, "spec.enableInTreeAutoscalling") == [
        "spec.enableInTreeAutoscalling: unknown field (KubeRay v1.7.0's RayCluster has no such field)"
    ]


def test_misspelt_field_deep_in_a_pod_template():
    manifest = ray_job()
    manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
        "imagePullPolicyy"
    ] = "Always"
    [error] = errors_at(
        manifest,
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].imagePullPolicyy",
    )
    assert "RayJob has no such field" in error


def test_quantity_with_a_space():
    manifest = ray_cluster()
    manifest["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
        "limits"
    ]["memory"] = "5 Gi"
    assert schema_errors(manifest) == [
        "spec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.memory: '5 Gi' is not a Kubernetes quantity"
    ]


@pytest.mark.parametrize("cpu", [2, "2", "500m", "1.5"])
def test_int_or_string_quantities_pass(cpu):
    manifest = ray_cluster()
    manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "cpu"
    ] = cpu
    assert schema_errors(manifest) == []


@pytest.mark.parametrize("cpu", [1.5, True, "5Gi\n", "2 "])
def test_int_or_string_rejects_floats_bools_and_trailing_whitespace(cpu):
    # "5Gi\n" passes a naive Python `$`; Go's RE2 `$` only matches at the very end.
    manifest = ray_cluster()
    manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "cpu"
    ] = cpu
    errors_at(manifest, "spec.headGroupSpec.template.spec.containers[0].resources.limits.cpu")


def test_ray_start_params_are_strings():
    manifest = ray_cluster()
    manifest["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    assert schema_errors(manifest) == [
        "spec.headGroupSpec.rayStartParams.num-cpus: must be a string, got int 0"
    ]


@pytest.mark.parametrize("replicas", ["2", 2.0, False, 2**31])
def test_replicas_must_be_an_int32(replicas):
    manifest = ray_cluster()
    manifest["spec"]["workerGroupSpecs"][0]["replicas"] = replicas
    errors_at(manifest, "spec.workerGroupSpecs[0].replicas")


@pytest.mark.parametrize("field, value", [("upscalingMode", "Fast"), ("version", "v3")])
def test_autoscaler_enums(field, value):
    manifest = ray_cluster()
    manifest["spec"]["autoscalerOptions"] = {field: value}
    [error] = errors_at(manifest, f"spec.autoscalerOptions.{field}")
    assert repr(value) in error


def test_missing_required_field_without_default():
    manifest = ray_cluster()
    del manifest["spec"]["workerGroupSpecs"][0]["groupName"]
    assert schema_errors(manifest) == ["spec.workerGroupSpecs[0].groupName: required field missing"]
    del manifest["spec"]["headGroupSpec"]
    errors_at(manifest, "spec.headGroupSpec")


def test_required_fields_with_defaults_may_be_left_out():
    # workerGroupSpecs[].minReplicas and maxReplicas are required, yet defaulted (0 and
    # 2147483647) before the API server checks `required`: leaving them out is valid.
    manifest = ray_cluster()
    for field in ("minReplicas", "maxReplicas"):
        del manifest["spec"]["workerGroupSpecs"][0][field]
    assert schema_errors(manifest) == []
    group = with_defaults(manifest)["spec"]["workerGroupSpecs"][0]
    assert (group["minReplicas"], group["maxReplicas"]) == (0, 2147483647)
    # An explicit null is pruned and then defaulted as well.
    manifest["spec"]["workerGroupSpecs"][0]["minReplicas"] = None
    assert schema_errors(manifest) == []


@pytest.mark.parametrize(
    "api_version, kind",
    [("ray.io/v1alpha1", "RayCluster"), ("ray.io/v1", "RayService"), ("v1", "Pod"), (None, None)],
)
def test_wrong_api_version_or_kind_is_one_error(api_version, kind):
    manifest = ray_cluster()
    manifest["apiVersion"], manifest["kind"] = api_version, kind
    [error] = schema_errors(manifest)
    assert error.startswith("apiVersion/kind: ") and repr(kind) in error
    with pytest.raises(ValueError):
        with_defaults(manifest)


def test_pod_template_metadata_keeps_only_what_the_crd_declares():
    manifest = ray_cluster()
    metadata = manifest["spec"]["headGroupSpec"]["template"]["metadata"]
    metadata.update(creationTimestamp=None, generateName="x-")
    assert sorted(schema_errors(manifest)) == [
        f"spec.headGroupSpec.template.metadata.{field}: unknown field (embedded metadata in KubeRay v1.7.0's "
        "RayCluster keeps only annotations, finalizers, labels, name, namespace; the API server would drop it)"
        for field in ("creationTimestamp", "generateName")
    ]


def test_root_metadata_is_checked_as_object_meta():
    manifest = ray_cluster()
    manifest["metadata"] = {
        "name": "Rayflow_Run",
        "namespace": "ML",
        "labels": {"team": "a" * 64, "bad key!": "x"},
        "annotations": {"note": 1},
        "uid2": "x",
    }
    errors = schema_errors(manifest)
    assert "metadata.uid2: unknown field (not a field of Kubernetes ObjectMeta)" in errors
    assert "metadata.annotations.note: must be a string, got int 1" in errors
    manifest["metadata"]["annotations"] = {"note": "fine"}
    del manifest["metadata"]["uid2"]
    for path in (
        "metadata.name",
        "metadata.namespace",
        "metadata.labels.team",
        "metadata.labels[bad key!]",
    ):
        errors_at(manifest, path)
    manifest["metadata"] = {"labels": {"a": "b"}}
    errors_at(manifest, "metadata.name")


def test_status_and_unknown_root_fields_are_refused():
    manifest = ray_cluster()
    manifest.update(status={"state": "ready"}, specs={})
    errors_at(manifest, "status")
    errors_at(manifest, "specs")


def test_list_map_keys_must_be_unique():
    manifest = ray_cluster()
    containers = manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    containers.append(copy.deepcopy(containers[0]))
    [error] = errors_at(manifest, "spec.headGroupSpec.template.spec.containers[1]")
    assert "duplicate" in error


def test_with_defaults_fills_defaults_without_touching_its_input():
    manifest = ray_job()
    before = copy.deepcopy(manifest)
    stored = with_defaults(manifest)
    assert manifest == before
    assert stored["spec"]["submissionMode"] == "K8sJobMode"
    group = stored["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["numOfHosts"], group["priority"]) == (1, 0)
    assert (
        stored["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
            "name"
        ]
        == "ray"
    )
    # The copy shares nothing with the input: editing it deep down leaves the input alone.
    stored["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
        "image"
    ] = "other"
    stored["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = "1"
    assert manifest == before


def test_schema_errors_does_not_mutate_its_input():
    manifest = ray_cluster()
    manifest["spec"]["workerGroupSpecs"][0]["minReplicas"] = None
    manifest["spec"]["enableInTreeAutoscalling"] = True
    before = copy.deepcopy(manifest)
    schema_errors(manifest)
    assert manifest == before


def test_every_pattern_of_both_schemas_compiles_as_re2_would():
    patterns = set()

    def collect(node):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                patterns.add(node["pattern"])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for kind in CRD_FILES:
        collect(kuberay_schema._schema(kind))
    assert patterns
    for pattern in patterns:
        regex = kuberay_schema._python_regex(pattern)
        assert "$" not in regex.pattern.replace("\\$", "")  # Python's `$` also matches before "\n"
    with pytest.raises(ValueError):
        kuberay_schema._python_regex(r"^[[:alpha:]]+$")
