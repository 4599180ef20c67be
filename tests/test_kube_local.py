"""scripts/kube_local: how the real control plane is built (the go.mod that replaces kubernetes'
staging modules, a folder per set of versions, a failure naming its module), its certificates
(each identity's subject as the API server's authorizers read it, private files), and the control
plane itself run from the built binaries: the real operator and scheduler at work, the Node
authorizer's refusal."""

from __future__ import annotations

import stat

import pytest

from scripts.kube_local import build
from scripts.kube_local.pki import make_pki

# The head and the replace block of kubernetes' own go.mod (v1.36.3), shortened
UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
)
"""


def test_each_staging_module_is_replaced_by_its_published_release():
    go_mod = build.kubernetes_go_mod(UPSTREAM, "v1.36.3")
    assert "require k8s.io/kubernetes v1.36.3" in go_mod
    assert "\tk8s.io/api => k8s.io/api v0.36.3" in go_mod
    assert "\tk8s.io/client-go => k8s.io/client-go v0.36.3" in go_mod
    # an example module nothing built imports, not published at every release
    assert "sample-cli-plugin" not in go_mod and "./staging" not in go_mod


def test_another_set_of_versions_builds_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    here = build.build_dir()
    other = build.build_dir({**build.VERSIONS, "kuberay": "v1.5.0"})
    assert here != other and here.parent == other.parent == tmp_path / "rayflow" / "kube"
    assert build.build_dir() == here  # the same versions: the same folder, reused


def test_a_failed_build_names_its_module_and_ends_with_the_compilers_words():
    err = build.BuildFailed(
        "github.com/ray-project/kuberay/ray-operator",
        "\n".join(f"line {i}" for i in range(50)) + "\n403 Forbidden",
    )
    text = str(err)
    assert text.startswith("building github.com/ray-project/kuberay/ray-operator failed:")
    assert text.endswith("403 Forbidden") and "line 10" not in text


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki") / "pki", ("127.0.0.1", "10.89.0.1"), ("a", "b"))


def _cert(pki, name):
    from cryptography import x509

    return x509.load_pem_x509_certificate((pki / f"{name}.crt").read_bytes())


def test_every_identity_is_signed_by_the_ca_with_the_subject_the_authorizers_read(pki):
    from cryptography.x509.oid import NameOID

    ca = _cert(pki, "ca")

    def subject(name):
        cert = _cert(pki, name)
        cert.verify_directly_issued_by(ca)
        read = cert.subject.get_attributes_for_oid
        return read(NameOID.COMMON_NAME)[0].value, [
            a.value for a in read(NameOID.ORGANIZATION_NAME)
        ]

    assert subject("admin") == ("rayflow-admin", ["system:masters"])
    assert subject("controller-manager") == ("system:kube-controller-manager", [])
    assert subject("scheduler") == ("system:kube-scheduler", [])
    assert subject("node-a") == ("system:node:a", ["system:nodes"])
    assert subject("node-b") == ("system:node:b", ["system:nodes"])
    assert subject("etcd-client") == ("kube-apiserver-etcd-client", [])


def test_the_api_servers_certificate_names_what_a_pod_dials(pki):
    import ipaddress

    from cryptography import x509

    sans = _cert(pki, "apiserver").extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert {str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.89.0.1",
    }
    assert "kubernetes.default.svc" in sans.value.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("10.89.0.1") in sans.value.get_values_for_type(x509.IPAddress)


def test_keys_are_private(pki):
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    for path in pki.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


# --- the control plane itself (the binaries built by scripts/setup.sh --test where Go is) ---------

RAYCLUSTER = {
    "apiVersion": "ray.io/v1",
    "kind": "RayCluster",
    "metadata": {"name": "small", "namespace": "default"},
    "spec": {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray-head",
                            "image": "rayproject/ray:2.60.0",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                        }
                    ]
                }
            },
        }
    },
}


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    import json
    import shutil

    from scripts.kube_local.control_plane import ControlPlane
    from tests.harness.needs import need

    bin_dir = build.build_dir() / "bin"
    need(
        all((bin_dir / b).is_file() for b in build.BINARIES),
        f"the control plane built in {bin_dir} (`bash scripts/setup.sh --test` builds it where Go is"
        f"{'' if shutil.which('go') else '; no `go` on PATH'})",
    )
    folder = tmp_path_factory.mktemp("control-plane")
    with ControlPlane(folder, bin_dir, nodes=("a", "b")) as plane:
        (folder / "raycluster.json").write_text(json.dumps(RAYCLUSTER))
        yield plane
    assert all(p.poll() is not None for p in plane.procs.values())


def _as_node(plane, method: str, path: str, body: dict | None = None):
    """A request of Node `a`'s own identity (its client certificate), as its kubelet makes it."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    pki = plane.folder / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "node-a.crt"), str(pki / "node-a.key"))
    request = urllib.request.Request(
        plane.server + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/strategic-merge-patch+json"}
        if method == "PATCH"
        else {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_raycluster_gets_its_head_pod_from_the_real_operator_scheduled_on_a_ready_node(
    control_plane,
):
    import datetime
    import json

    from rayflow.testing.processes import wait_until

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert _as_node(control_plane, "POST", "/api/v1/nodes", {"metadata": {"name": "a"}})[0] == 201
    capacity = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}
    status = {"capacity": capacity, "allocatable": capacity}
    status["conditions"] = [{**ready, "lastHeartbeatTime": now, "lastTransitionTime": now}]
    code, _ = _as_node(control_plane, "PATCH", "/api/v1/nodes/a/status", {"status": status})
    assert code == 200

    control_plane.kubectl(
        "apply", "--server-side", "-f", str(control_plane.folder / "raycluster.json")
    )

    def head_scheduled():
        pods = json.loads(
            control_plane.kubectl("get", "pods", "-l", "ray.io/node-type=head", "-o", "json")
        )
        return [p for p in pods["items"] if p["spec"].get("nodeName") == "a"]

    [head] = wait_until(head_scheduled, timeout=60, interval=0.5) or [None]
    assert head is not None, control_plane.kubectl("get", "events", "-A")
    owner = head["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("RayCluster", "small")
    # what the operator made beside it, each an Event of its own
    events = control_plane.kubectl(
        "get", "events", "-o", "custom-columns=R:.reason", "--no-headers"
    )
    assert {"CreatedHeadPod", "CreatedService", "Scheduled"} <= set(events.split()), events
    # its kubelet may read the pod bound to it, as the Node authorizer allows
    code, listed = _as_node(control_plane, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Da")
    assert code == 200 and [p["metadata"]["name"] for p in listed["items"]] == [
        head["metadata"]["name"]
    ]


def test_a_node_may_not_read_what_no_pod_of_its_uses(control_plane):
    control_plane.kubectl("create", "configmap", "someone-elses", "--from-literal=k=v")
    code, answer = _as_node(
        control_plane, "GET", "/api/v1/namespaces/default/configmaps/someone-elses"
    )
    assert (
        code == 403 and 'User "system:node:a" cannot get resource "configmaps"' in answer["message"]
    )


# --- the process kubelet's pure parts -------------------------------------------------------------


def test_a_containers_environment_is_built_as_the_kubelet_builds_it():
    from scripts.kube_local.containers import MissingEnv, argv, environment, expand

    assert expand("$(A)/$(B)/$$(A)/$(UNKNOWN)", {"A": "a", "B": "b"}) == "a/b/$(A)/$(UNKNOWN)"
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"ray.io/group": "g"}},
        "spec": {"nodeName": "node-1"},
        "status": {"podIP": "10.0.0.5"},
    }
    secrets = {("Secret", "s", "k"): "v"}
    container = {
        "env": [
            {"name": "ONE", "value": "1"},
            {"name": "TWO", "value": "$(ONE)+1"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "GROUP",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}},
            },
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {
                "name": "GONE",
                "valueFrom": {"secretKeyRef": {"name": "x", "key": "k", "optional": True}},
            },
        ],
        "command": ["sh", "-c"],
        "args": ["echo $(TWO) $(IP)"],
    }
    env = environment(pod, container, lambda *ref: secrets.get(ref), {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "ONE": "1",
        "TWO": "1+1",
        "IP": "10.0.0.5",
        "GROUP": "g",
        "S": "v",
    }
    assert argv(container, env) == ["sh", "-c", "echo 1+1 10.0.0.5"]
    missing = {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}]}
    with pytest.raises(MissingEnv, match='secret "x" or its key "k" not found'):
        environment(pod, missing, lambda *ref: None, {})


def test_the_pods_hosts_name_ready_endpoints_of_each_service():
    from scripts.kube_local.hosts import addresses, hosts_text

    services = [
        {"metadata": {"namespace": "default", "name": "head-svc"}, "spec": {}},
        {
            "metadata": {"namespace": "other", "name": "web"},
            "spec": {"publishNotReadyAddresses": True},
        },
    ]

    def piece(ns, service, ip, ready):
        return {
            "metadata": {"namespace": ns, "labels": {"kubernetes.io/service-name": service}},
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
        }

    found = addresses(
        services,
        [
            piece("default", "head-svc", "10.0.0.20", True),
            piece("default", "head-svc", "10.0.0.21", False),  # not ready: not named
            piece("other", "web", "10.0.0.30", False),  # published though not ready
            piece("default", "nobodys", "10.0.0.40", True),  # no such Service
        ],
    )
    assert found == {("default", "head-svc"): ["10.0.0.20"], ("other", "web"): ["10.0.0.30"]}
    text = hosts_text("default", "p", "10.0.0.5", found).splitlines()
    assert text[:2] == ["127.0.0.1\tlocalhost", "10.0.0.5\tp"]
    assert (
        "10.0.0.20\thead-svc.default.svc.cluster.local head-svc.default.svc head-svc.default "
        "head-svc" in text
    )
    # another namespace's Service: by its qualified names only (no search path reaches it)
    assert "10.0.0.30\tweb.other.svc.cluster.local web.other.svc web.other" in text


def test_two_volumes_under_one_folder_the_machine_lacks_are_both_seen(tmp_path):
    """KubeRay's Ray token (Kubernetes token auth) and the API access volume both mount under
    /var/run/secrets, which this machine lacks: the first one's overlay takes the second, which a
    second overlay would have hidden. Nothing is written to the machine's own /var/run."""
    import os
    import shutil
    import subprocess

    from scripts.kube_local import net
    from scripts.kube_local.podfs import Mount, PodFolder, container_argv
    from tests.harness.needs import need

    tools = ("ip", "nsenter", "unshare", "tini")
    need(os.geteuid() == 0, "root (namespaces and mounts) for a container of the process kubelet")
    need(all(shutil.which(t) for t in tools), f"{', '.join(tools)} for the process kubelet")
    need(not os.path.exists("/var/run/secrets"), "a machine without /var/run/secrets")
    folder = PodFolder(tmp_path, "uid")
    targets = {
        "ray-token": "/var/run/secrets/ray.io/serviceaccount",
        "kube-api-access": "/var/run/secrets/kubernetes.io/serviceaccount",
    }
    for name in targets:
        (folder.volume(name) / "token").write_text(name)
    mounts = [Mount(folder.volume(name), target, True) for name, target in targets.items()]
    command = ["cat", *(f"{target}/token" for target in targets.values())]
    ns = "rfkt-podfs"
    net.run(["ip", "netns", "add", ns])
    try:
        argv = container_argv(ns, folder, "pod", "/home/ray", mounts, command)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        net.del_netns(ns)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ray-tokenkube-api-access"
    assert not os.path.exists("/var/run/secrets")
