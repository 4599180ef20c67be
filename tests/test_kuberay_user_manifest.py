"""backend=kuberay backend.manifest=PATH offline: the user's own RayCluster/RayJob file, as rayflow
reads it, puts its keys on top of it, validates it and prints it (dry_run: exactly the manifest).

KubeRay's own samples (../shared/kuberay-crd/samples, found as tests/test_kuberay_schema.py finds
them) each render through backend.manifest and round-trip through a dry run, or are refused in
the one line their stated reason gives. The apply, the run and the delete on the Kubernetes
emulator are in tests/test_kuberay.py (they share its Ray head).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rayflow.backends import backend_for
from rayflow.errors import ConfigError
from rayflow.orchestrator.cluster import spec_text
from rayflow.orchestrator.compose import compose_config
from tests.test_kuberay_schema import CRD_DIR, needs_crd_dir

# The samples rayflow refuses, and the reason (the start of the line's message after the file).
REFUSED_SAMPLES = {
    "ray-cluster-agc-gatewayapi.yaml": "holds no RayCluster or RayJob document (found: Gateway/",
    "ray-cluster-alb-ingress.yaml": "holds no RayCluster or RayJob document (found: Ingress/",
    "ray-cluster.tpu-v4-multihost.yaml": "holds the placeholder ${grafana_host}: fill it in",
    "ray-cluster.tpu-v4-singlehost.yaml": "holds the placeholder ${grafana_host}: fill it in",
    "ray-job.use-existing-raycluster.yaml": "has no spec.rayClusterSpec (it runs on an existing RayCluster)",
}
# Samples without token auth on a Ray older than 2.52 (or no rayVersion): rayflow's added token
# auth is refused as the operator would; with ray_auth_mode=disabled they render (and are refused).
TOKEN_NEEDS_NEWER_RAY = {
    "ray-cluster-label-selector.yaml",
    "ray-cluster.embed-grafana.yaml",
    "ray-cluster.verl.yaml",
    "ray-cluster.kai-gpu-sharing.yaml",
    "ray-cluster.kai-scheduler.yaml",
    "ray-job.batch-inference.yaml",
}


def backend(*overrides: str):
    return backend_for(compose_config("backend=kuberay", *overrides))


def refusal(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        backend(*overrides).check()
    assert "\n" not in str(err.value)
    return err.value


def write(folder: Path, name: str, *documents: dict | str) -> str:
    path = folder / name
    path.write_text(
        "---\n".join(
            d if isinstance(d, str) else yaml.safe_dump(d, sort_keys=False) for d in documents
        )
    )
    return str(path)


def round_trip(folder: Path, *overrides: str) -> tuple[str, str]:
    """(the dry run's spec, the spec of that spec fed back as backend.manifest)."""
    first = backend(*overrides)
    first.check()
    printed = spec_text(first)  # what dry_run=true writes to stdout
    again = backend(*overrides, f"backend.manifest={write(folder, 'printed.yaml', printed)}")
    again.check()
    return printed, spec_text(again)


# --- KubeRay's samples --------------------------------------------------------------------------------


def samples() -> list:
    if not CRD_DIR.is_dir():
        return [pytest.param(None, id="no-samples", marks=needs_crd_dir)]
    return [pytest.param(p, id=p.name) for p in sorted((CRD_DIR / "samples").glob("*.yaml"))]


@pytest.mark.parametrize("sample", samples())
def test_kuberays_samples_render_and_round_trip_or_are_refused_in_one_line(sample, tmp_path):
    if sample.name in REFUSED_SAMPLES:
        err = refusal(f"backend.manifest={sample}")
        assert err.key == "backend.manifest" and str(err).startswith(
            f"backend.manifest: {sample}: "
        )
        assert REFUSED_SAMPLES[sample.name] in str(err)
        return
    auth = "ray_auth_mode=token"
    if sample.name in TOKEN_NEEDS_NEWER_RAY:
        err = refusal(f"backend.manifest={sample}", auth)
        assert "authOptions.mode is 'token'" in str(err) and "rayVersion >= 2.52.0" in str(err)
        # issue 43: auth off is no way out (refused, naming ray_auth_mode); it still renders
        auth = "ray_auth_mode=disabled"
        assert refusal(f"backend.manifest={sample}", auth).key == "ray_auth_mode"
    b = backend(f"backend.manifest={sample}", auth)
    if auth == "ray_auth_mode=token":
        b.check()
    manifest = b.manifest()
    documents = [d for d in yaml.safe_load_all(sample.read_text()) if d]
    [original] = [d for d in documents if d["kind"] in ("RayCluster", "RayJob")]
    assert (
        manifest["kind"] == original["kind"]
        and manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rayflow"
    )
    if original["metadata"].get("name"):
        assert manifest["metadata"]["name"] == original["metadata"]["name"]
    others = [f"{d['kind']}/{d['metadata']['name']}" for d in documents if d is not original]
    notes = "\n".join(b.render().notes)
    assert all(other in notes for other in others), notes  # each document left out is named
    if manifest["kind"] == "RayJob":
        assert (
            manifest["spec"]["submissionMode"] == "InteractiveMode"
            and "entrypoint" not in manifest["spec"]
        )
    printed = spec_text(b)
    again = backend(f"backend.manifest={write(tmp_path, 'printed.yaml', printed)}", auth)
    if auth == "ray_auth_mode=token":
        again.check()
    assert spec_text(again) == printed


# --- rayflow's own dry runs fed back ------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides", [(), ("compute=gpu",), ("backend.mode=rayjob",)], ids=["default", "gpu", "rayjob"]
)
def test_a_dry_run_fed_back_as_the_manifest_renders_the_same(tmp_path, overrides):
    printed, again = round_trip(tmp_path, *overrides)
    assert again == printed


def test_the_cli_dry_run_round_trips_and_prints_only_the_manifest(rayflow, tmp_path):
    first = rayflow.run(
        "backend=kuberay", "dry_run=true", "tracking=none", "backend.mode=rayjob", timeout=120
    )
    assert first.returncode == 0, first.stderr[-2000:]
    [manifest] = list(yaml.safe_load_all(first.stdout))
    assert manifest["kind"] == "RayJob" and set(manifest) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
    }
    path = write(tmp_path, "rayjob.yaml", first.stdout)
    second = rayflow.run(
        "backend=kuberay", "dry_run=true", "tracking=none", f"backend.manifest={path}", timeout=120
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout == first.stdout
    assert "rayflow: backend.manifest: labels app.kubernetes.io/managed-by=rayflow" in second.stderr


# --- a file written by hand ---------------------------------------------------------------------------

HAND_WRITTEN = """\
apiVersion: ray.io/v1alpha1
kind: RayCluster
metadata:
  name: team-ray
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    rayStartParams: {num-cpus: "0"}
    template:
      spec:
        containers:
          - name: ray-head
            image: rayproject/ray:2.60.0-py311
            resources: &pod {limits: {cpu: "2", memory: 4Gi}, requests: {cpu: "2", memory: 4Gi}}
  workerGroupSpecs:
    - groupName: cpu-pool
      replicas: 1
      minReplicas: 0
      maxReplicas: 5
      template:
        spec:
          containers: [{name: ray-worker, image: rayproject/ray:2.60.0-py311, resources: *pod}]
    - groupName: a100
      replicas: 0
      minReplicas: 0
      maxReplicas: 2
      template:
        spec:
          containers:
            - name: ray-worker
              image: rayproject/ray:2.60.0-py311-gpu
              resources: {limits: {cpu: "8", memory: 32Gi, nvidia.com/gpu: "1"}}
---
apiVersion: v1
kind: Secret
metadata: {name: team-registry}
"""


@pytest.fixture
def hand_written(tmp_path) -> str:
    return write(tmp_path, "team.yaml", HAND_WRITTEN)


def groups(manifest: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}


def test_anchors_v1alpha1_and_what_rayflow_adds(hand_written):
    b = backend(f"backend.manifest={hand_written}")
    b.check()
    m = b.manifest({"rayflow.io/run": "abc123"})
    assert m["apiVersion"] == "ray.io/v1" and m["metadata"]["namespace"] == "default"
    assert m["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "rayflow",
        "rayflow.io/run": "abc123",
    }
    assert m["spec"]["authOptions"] == {"mode": "token"}
    assert groups(m)["cpu-pool"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "2",
        "memory": "4Gi",
    }
    notes = b.render().notes
    assert any("ray.io/v1alpha1; applied as ray.io/v1" in n for n in notes)
    assert any("leaves Secret/team-registry to you: kubectl apply" in n for n in notes)
    assert (
        "authOptions"
        not in backend(f"backend.manifest={hand_written}", "ray_auth_mode=disabled").manifest()[
            "spec"
        ]
    )
    assert b.teardown_command() == "kubectl delete raycluster team-ray -n default"
    assert (
        b.capacity({"CPU"})
        == [{"CPU": 0, "GPU": 0}] + [{"CPU": 2, "GPU": 0, "memory": 4 * 2**30}] * 5
    )


def test_precedence_manifest_then_keys_that_differ_from_the_default_then_overrides(hand_written):
    def cpu_pool(*overrides: str) -> dict:
        return groups(backend(f"backend.manifest={hand_written}", *overrides).manifest())[
            "cpu-pool"
        ]

    assert cpu_pool()["maxReplicas"] == 5  # the manifest's
    # 2 is the packaged default: not "set"
    assert cpu_pool("backend.max_worker_nodes=2")["maxReplicas"] == 5
    assert cpu_pool("backend.max_worker_nodes=3")["maxReplicas"] == 3
    assert (
        cpu_pool("backend.max_worker_nodes=3", "+backend.overrides.metadata.annotations.team=ml")[
            "maxReplicas"
        ]
        == 3
    )
    m = backend(
        f"backend.manifest={hand_written}",
        "backend.cluster_name=renamed",
        "backend.autoscaler_version=v1",
        "+backend.overrides.spec.headGroupSpec.serviceType=NodePort",
    ).manifest()
    assert m["metadata"]["name"] == "renamed" and m["spec"]["autoscalerOptions"] == {
        "version": "v1"
    }
    assert m["spec"]["headGroupSpec"]["serviceType"] == "NodePort"


def test_compute_gpu_chooses_the_group_that_requests_gpus(hand_written, tmp_path):
    m = backend(
        f"backend.manifest={hand_written}", "compute=gpu", "backend.min_worker_nodes=1"
    ).manifest()
    assert (groups(m)["a100"]["minReplicas"], groups(m)["a100"]["replicas"]) == (1, 1)
    assert groups(m)["cpu-pool"]["minReplicas"] == 0
    cpu_only = yaml.safe_load(HAND_WRITTEN.split("---")[0])
    cpu_only["spec"]["workerGroupSpecs"].pop()
    err = refusal(f"backend.manifest={write(tmp_path, 'cpu.yaml', cpu_only)}", "compute=gpu")
    assert "compute=gpu, but no worker group of RayCluster/team-ray requests nvidia.com/gpu" in str(
        err
    )


# --- refusals, one line each -------------------------------------------------------------------------


def _cluster() -> dict:
    return yaml.safe_load(HAND_WRITTEN.split("---")[0])


def _misspelt() -> dict:
    m = _cluster()
    m["spec"]["enableInTreeAutoscalling"] = True
    return m


def _placeholder() -> dict:
    m = _cluster()
    m["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = (
        "<your-registry>/ray:2.60.0"
    )
    return m


def _min_above_max() -> dict:
    m = _cluster()
    m["spec"]["workerGroupSpecs"][0]["minReplicas"] = 6
    return m


def _namespaced() -> dict:
    m = _cluster()
    m["metadata"]["namespace"] = "ml"
    return m


REFUSALS = [
    ("missing", None, (), "no such file"),
    ("not-yaml", "kind: RayCluster\nspec: [unclosed\n", (), "is not YAML: "),
    (
        "no-ray-document",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
        (),
        "holds no RayCluster or RayJob document (found: ConfigMap/x)",
    ),
    (
        "two-ray-documents",
        [_cluster(), _cluster()],
        (),
        "holds 2 RayCluster/RayJob documents (RayCluster/team-ray, RayCluster/team-ray)",
    ),
    (
        "crd-violation",
        _misspelt(),
        (),
        "RayCluster/team-ray: spec.enableInTreeAutoscalling: unknown field",
    ),
    (
        "placeholder",
        _placeholder(),
        (),
        "containers[ray-head].image: '<your-registry>/ray:2.60.0' holds the placeholder <your-registry>",
    ),
    (
        "operator-rule",
        _min_above_max(),
        (),
        "worker group cpu-pool has minReplicas 6 greater than maxReplicas 5 (the KubeRay operator refuses it)",
    ),
    (
        "namespace-conflict",
        _namespaced(),
        ("backend.namespace=prod",),
        "is in namespace ml, but backend.namespace=prod",
    ),
    (
        "pods-are-the-manifests",
        _cluster(),
        ("backend.worker_groups.cpu.cpu=8",),
        "backend.worker_groups.cpu.cpu is set, but with backend.manifest",
    ),
    (
        "unknown-api-version",
        {**_cluster(), "apiVersion": "ray.io/v2"},
        (),
        "apiVersion 'ray.io/v2' is not one KubeRay v1.7.0 serves",
    ),
]


@pytest.mark.parametrize(
    "name, content, overrides, expected", REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_a_bad_manifest_is_refused_in_one_line(tmp_path, name, content, overrides, expected):
    path = tmp_path / f"{name}.yaml"
    if content is not None:
        path.write_text(
            content
            if isinstance(content, str)
            else yaml.safe_dump_all(content if isinstance(content, list) else [content])
        )
    err = refusal(f"backend.manifest={path}", *overrides)
    assert err.key == "backend.manifest" and str(err).startswith(f"backend.manifest: {path}: "), (
        str(err)
    )
    assert expected in str(err), str(err)


def test_an_override_that_breaks_the_schema_is_the_overrides_fault(hand_written):
    err = refusal(
        f"backend.manifest={hand_written}",
        "+backend.overrides.spec.headGroupSpec.serviceTyp=NodePort",
    )
    assert err.key == "backend.overrides" and "spec.headGroupSpec.serviceTyp: unknown field" in str(
        err
    )


def test_a_manifest_namespace_is_kept_and_a_rayjob_runs_interactive(tmp_path):
    assert (
        backend(f"backend.manifest={write(tmp_path, 'ns.yaml', _namespaced())}").manifest()[
            "metadata"
        ]["namespace"]
        == "ml"
    )
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "nightly"},
        "spec": {
            "entrypoint": "python train.py",
            "backoffLimit": 2,
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": copy.deepcopy(_cluster()["spec"]),
        },
    }
    b = backend(
        f"backend.manifest={write(tmp_path, 'job.yaml', job)}",
        "backend.rayjob.ttl_seconds_after_finished=30",
    )
    b.check()
    spec = b.manifest()["spec"]
    assert (
        spec["submissionMode"] == "InteractiveMode"
        and "entrypoint" not in spec
        and "backoffLimit" not in spec
    )
    assert spec["ttlSecondsAfterFinished"] == 30
    assert any(
        "K8sJobMode -> InteractiveMode" in n and "spec.entrypoint" in n for n in b.render().notes
    )
