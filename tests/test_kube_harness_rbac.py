"""Self-tests of the emulator's service-account identities, RBAC and TLS (tests/harness/kube_rbac.py,
tests/harness/tls.py) and of the head pod's mount namespace (tests/harness/kube_head.py): what an
in-cluster client on the head pod (rayflow's idle autostop) meets, driven by the real `kubernetes`
client over HTTPS verified against the emulator's CA."""

from __future__ import annotations

import json
import os
import shlex
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path

import kubernetes
import pytest
from kubernetes.client import (
    ApiException,
    CoreV1Api,
    CustomObjectsApi,
    RbacAuthorizationV1Api,
    V1DeleteOptions,
    V1Preconditions,
)

from rayflow.testing.processes import wait_until
from tests.harness import REPO
from tests.harness.kube_emulator import KubeEmulator
from tests.harness.kube_head import SA_DIR, PodNamespace, PodRayHead, unavailable_reason

pytest.importorskip("kmock")

RC = ("ray.io", "v1", "default", "rayclusters")
SA = "rc-autostop"
SA_USER = f"system:serviceaccount:default:{SA}"


def raycluster(name: str) -> dict:
    image = "rayproject/ray:2.60.0"
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.60.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": image}]}},
            },
        },
    }


def owned_by(rc: dict) -> list[dict]:
    return [
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "name": rc["metadata"]["name"],
            "uid": rc["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def role(name: str, owner: list[dict]) -> dict:
    return {
        "metadata": {"name": f"{name}-autostop", "ownerReferences": owner},
        "rules": [
            {
                "apiGroups": ["ray.io"],
                "resources": ["rayclusters"],
                "resourceNames": [name],
                "verbs": ["get", "delete"],
            }
        ],
    }


def rolebinding(name: str, owner: list[dict]) -> dict:
    return {
        "metadata": {"name": f"{name}-autostop", "ownerReferences": owner},
        "subjects": [
            {"kind": "ServiceAccount", "name": f"{name}-autostop", "namespace": "default"}
        ],
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": f"{name}-autostop",
        },
    }


def https_client(emu: KubeEmulator, token: str) -> kubernetes.client.ApiClient:
    """What load_incluster_config builds: the HTTPS URL, the CA, the bearer token."""
    config = kubernetes.client.Configuration(host=emu.https_url)
    config.ssl_ca_cert = emu.ca_path
    config.api_key = {"BearerToken": f"Bearer {token}"}
    return kubernetes.client.ApiClient(config)


def refusal(err: ApiException) -> tuple[int, str, str]:
    body = json.loads(err.body)
    return err.status, body["reason"], body["message"]


@pytest.fixture
def emu():
    with KubeEmulator(tls=True, gc_delay_s=0.05) as emulator:
        yield emulator


@pytest.fixture
def admin(emu, tmp_path):
    """The admin's client over HTTPS (a kubeconfig naming the CA)."""
    client = kubernetes.config.new_client_from_config(
        config_file=emu.write_kubeconfig(tmp_path / "admin-https", https=True)
    )
    yield client
    client.close()


def test_a_service_account_may_delete_only_the_raycluster_its_role_names(emu, admin, tmp_path):
    from rayflow.backends.kuberay.kube import Kube

    custom, core, rbac = CustomObjectsApi(admin), CoreV1Api(admin), RbacAuthorizationV1Api(admin)
    rc = custom.create_namespaced_custom_object(*RC[:3], "rayclusters", raycluster("rc"))
    custom.create_namespaced_custom_object(*RC[:3], "rayclusters", raycluster("other"))
    owner = owned_by(rc)
    core.create_namespaced_service_account(
        "default", {"metadata": {"name": SA, "ownerReferences": owner}}
    )
    token = emu.service_account_token("default", SA)
    client = https_client(emu, token)
    as_sa = CustomObjectsApi(client)

    forbidden = (
        403,
        "Forbidden",
        f'rayclusters.ray.io "rc" is forbidden: User "{SA_USER}" cannot delete resource '
        f'"rayclusters" in API group "ray.io" in the namespace "default"',
    )
    with pytest.raises(ApiException) as e:  # no Role, no RoleBinding
        as_sa.delete_namespaced_custom_object(*RC, "rc")
    assert refusal(e.value) == forbidden
    rbac.create_namespaced_role("default", role("rc", owner))
    with pytest.raises(ApiException) as e:  # a Role alone grants nothing
        as_sa.delete_namespaced_custom_object(*RC, "rc")
    assert refusal(e.value) == forbidden
    rbac.create_namespaced_role_binding("default", rolebinding("rc", owner))

    # exactly that name, exactly those verbs
    assert as_sa.get_namespaced_custom_object(*RC, "rc")["metadata"]["uid"] == rc["metadata"]["uid"]
    for call, verb in (
        (lambda: as_sa.delete_namespaced_custom_object(*RC, "other"), "delete"),
        (lambda: as_sa.get_namespaced_custom_object(*RC, "other"), "get"),
        (lambda: as_sa.patch_namespaced_custom_object(*RC, "rc", {"metadata": {}}), "patch"),
    ):
        with pytest.raises(ApiException) as e:
            call()
        assert f'cannot {verb} resource "rayclusters"' in refusal(e.value)[2]
    with pytest.raises(ApiException) as e:  # not a verb of its Role
        as_sa.list_namespaced_custom_object(*RC)
    assert refusal(e.value)[2] == (
        f'rayclusters.ray.io is forbidden: User "{SA_USER}" cannot list resource "rayclusters" '
        f'in API group "ray.io" in the namespace "default"'
    )
    with pytest.raises(ApiException) as e:  # nor anything else of the namespace
        CoreV1Api(client).list_namespaced_pod("default")
    assert 'cannot list resource "pods" in API group ""' in refusal(e.value)[2]

    # the uid precondition: the server's 409 when the name is another object's now
    with pytest.raises(ApiException) as e:
        as_sa.delete_namespaced_custom_object(
            *RC, "rc", body=V1DeleteOptions(preconditions=V1Preconditions(uid="not-its-uid"))
        )
    assert refusal(e.value) == (
        409,
        "Conflict",
        'Operation cannot be fulfilled on rayclusters.ray.io "rc": Precondition failed: UID in '
        f"precondition: not-its-uid, UID in object meta: {rc['metadata']['uid']}",
    )

    # rayflow's own client, as the service account over HTTPS, deletes it by uid
    kube = Kube("default", emu.write_kubeconfig(tmp_path / "sa-https", token=token, https=True))
    assert kube.delete("RayCluster", "rc", uid=rc["metadata"]["uid"]) is True
    kube.close()
    [delete] = [r for r in emu.requests if r.method == "DELETE" and r.user == SA_USER][-1:]
    assert delete.path == "/apis/ray.io/v1/namespaces/default/rayclusters/rc"

    # the garbage collector takes what the RayCluster owned; the token dies with its account
    assert wait_until(
        lambda: (
            not any(
                emu.get(plural, "default", SA)
                for plural in ("serviceaccounts", "roles", "rolebindings")
            )
        ),
        timeout=5,
        interval=0.05,
    )
    assert emu.get("rayclusters", "default", "other") is not None
    with pytest.raises(ApiException) as e:
        as_sa.get_namespaced_custom_object(*RC, "other")
    assert e.value.status == 401
    client.close()


def test_unknown_tokens_are_401_and_the_plain_http_kubeconfig_still_works(emu):
    with pytest.raises(ApiException) as e:
        CustomObjectsApi(https_client(emu, "not-a-token")).list_namespaced_custom_object(*RC)
    assert refusal(e.value) == (401, "Unauthorized", "Unauthorized")
    # a service account's token before its ServiceAccount exists: the account lookup fails
    early = emu.service_account_token("default", "not-yet")
    with pytest.raises(ApiException) as e:
        CustomObjectsApi(https_client(emu, early)).list_namespaced_custom_object(*RC)
    assert e.value.status == 401
    plain = kubernetes.config.new_client_from_config(config_file=emu.kubeconfig_path)
    assert plain.configuration.host.startswith("http://127.0.0.1:")
    assert CustomObjectsApi(plain).list_namespaced_custom_object(*RC)["items"] == []
    plain.close()


def test_tls_is_verified_against_the_emulators_ca(emu):
    import urllib.request

    import urllib3

    # strict X.509 checks (Python 3.13's default) pass too
    context = ssl.create_default_context(cafile=emu.ca_path)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    req = urllib.request.Request(f"{emu.https_url}/version")
    req.add_header("Authorization", f"Bearer {emu.token}")
    with urllib.request.urlopen(req, context=context, timeout=10) as answer:
        assert answer.status == 200
    config = kubernetes.client.Configuration(host=emu.https_url)  # the machine's CAs only
    config.api_key = {"BearerToken": f"Bearer {emu.token}"}
    config.retries = 0
    with pytest.raises(urllib3.exceptions.HTTPError) as e:
        CoreV1Api(kubernetes.client.ApiClient(config)).list_namespaced_pod("default")
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)


def test_rbac_objects_are_validated_as_the_server_does(emu, admin):
    rbac = RbacAuthorizationV1Api(admin)
    bad = role("rc", [])
    bad["rules"][0]["verbs"] = []
    with pytest.raises(ApiException) as e:
        rbac.create_namespaced_role("default", bad)
    assert refusal(e.value) == (
        422,
        "Invalid",
        'Role.rbac.authorization.k8s.io "rc-autostop" is invalid: rules[0].verbs: Required '
        "value: verbs must contain at least one value",
    )
    rbac.create_namespaced_role_binding("default", rolebinding("rc", []))
    with pytest.raises(ApiException) as e:
        rbac.patch_namespaced_role_binding(
            "rc-autostop", "default", {"roleRef": {"name": "another"}}
        )
    assert "cannot change roleRef" in refusal(e.value)[2]
    # a binding to a Role that is not there: the authorizer says so after the refusal
    CoreV1Api(admin).create_namespaced_service_account("default", {"metadata": {"name": SA}})
    with pytest.raises(ApiException) as e:
        CustomObjectsApi(
            https_client(emu, emu.service_account_token("default", SA))
        ).get_namespaced_custom_object(*RC, "rc")
    assert refusal(e.value)[2].endswith(
        'in the namespace "default": RBAC: role.rbac.authorization.k8s.io "rc-autostop" not found'
    )
    # resourceNames and a list: only one that names the object by field selector matches
    watcher = role("rc", [])
    watcher["metadata"]["name"], watcher["rules"][0]["verbs"] = "rc-autostop", ["list", "watch"]
    rbac.create_namespaced_role("default", watcher)
    as_sa = CustomObjectsApi(https_client(emu, emu.service_account_token("default", SA)))
    assert (
        as_sa.list_namespaced_custom_object(*RC, field_selector="metadata.name=rc")["items"] == []
    )
    with pytest.raises(ApiException) as e:
        as_sa.list_namespaced_custom_object(*RC)
    assert refusal(e.value)[2].startswith("rayclusters.ray.io is forbidden: ")
    # a role binding's delete answers with a Status, a service account's with the object
    assert rbac.delete_namespaced_role_binding("rc-autostop", "default").status == "Success"
    gone = CoreV1Api(admin).delete_namespaced_service_account(SA, "default")
    assert gone.kind == "ServiceAccount" and gone.metadata.name == SA


# --- the head pod's mount namespace -----------------------------------------------------------------

IN_POD = textwrap.dedent(
    """
    import json, os, sys
    from rayflow.backends.kuberay.kube import Kube, in_cluster
    assert in_cluster(), "no in-cluster credentials"
    kube = Kube(open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read())
    print(json.dumps({
        "host": kube.configuration.host,
        "deleted": kube.delete("RayCluster", sys.argv[1], uid=sys.argv[2]),
    }))
    """
)


def test_a_process_in_the_pod_namespace_deletes_its_raycluster_in_cluster(emu, admin):
    """The in-cluster path itself: `kubernetes.config.load_incluster_config()` reads the token and
    CA at /var/run/secrets/kubernetes.io/serviceaccount and the KUBERNETES_SERVICE_* variables, in
    a mount namespace; the machine's /run never gets /run/secrets."""
    if reason := unavailable_reason():
        pytest.skip(reason)
    custom, rbac = CustomObjectsApi(admin), RbacAuthorizationV1Api(admin)
    rc = custom.create_namespaced_custom_object(*RC[:3], "rayclusters", raycluster("rc"))
    owner = owned_by(rc)
    CoreV1Api(admin).create_namespaced_service_account(
        "default", {"metadata": {"name": SA, "ownerReferences": owner}}
    )
    rbac.create_namespaced_role("default", role("rc", owner))
    rbac.create_namespaced_role_binding("default", rolebinding("rc", owner))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | emu.in_cluster_env()
    with PodNamespace(token=emu.service_account_token("default", SA), ca_path=emu.ca_path) as pod:
        listing = subprocess.run(
            pod.argv(["ls", SA_DIR]), capture_output=True, text=True, timeout=30, check=True
        )
        assert listing.stdout.split() == ["ca.crt", "namespace", "token"]
        out = subprocess.run(
            pod.argv([sys.executable, "-c", IN_POD, "rc", rc["metadata"]["uid"]]),
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout) == {"host": emu.https_url, "deleted": True}
    assert not os.path.exists("/run/secrets") and not os.path.exists(SA_DIR)
    assert not Path(pod.workdir).exists(), "the staged token stays on the machine"
    assert [r.user for r in emu.requests if r.method == "DELETE"] == [SA_USER]
    assert wait_until(lambda: not emu.objects("rolebindings"), timeout=5, interval=0.05)


def test_a_job_on_the_pod_ray_head_deletes_its_raycluster_in_cluster(emu, admin):
    """The autostop's path minus rayflow's watcher: a Ray job on the head pod, in its mount
    namespace and environment, deletes the RayCluster with the pod's service account."""
    if reason := unavailable_reason():
        pytest.skip(reason)
    from ray.job_submission import JobStatus, JobSubmissionClient

    custom, rbac = CustomObjectsApi(admin), RbacAuthorizationV1Api(admin)
    rc = custom.create_namespaced_custom_object(*RC[:3], "rayclusters", raycluster("rc"))
    owner = owned_by(rc)
    CoreV1Api(admin).create_namespaced_service_account(
        "default", {"metadata": {"name": SA, "ownerReferences": owner}}
    )
    rbac.create_namespaced_role("default", role("rc", owner))
    rbac.create_namespaced_role_binding("default", rolebinding("rc", owner))
    head = PodRayHead.for_emulator(emu, "default", SA)
    try:
        head.start()
        assert not head.pod.staged.exists(), "the staged token stays on the machine"
        raylet = head.raylet_pid()
        assert head.read_in_pod(f"{SA_DIR}/token") == head.sa_token
        assert head.read_in_pod(f"{SA_DIR}/ca.crt") == Path(emu.ca_path).read_text()
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{raylet}/environ").read_text().split("\0")
            if "=" in item
        )
        assert environ["KUBERNETES_SERVICE_PORT"] == str(emu.https_port)
        assert "KUBECONFIG" not in environ
        # read-only, as the kubelet's projected volume
        write = subprocess.run(
            head.nsenter_argv(["touch", f"{SA_DIR}/token"]), capture_output=True, timeout=30
        )
        assert write.returncode != 0
        jobs = JobSubmissionClient(
            head.dashboard_url, headers={"Authorization": f"Bearer {head.token}"}
        )
        job = jobs.submit_job(
            entrypoint=f"python -c {shlex.quote(IN_POD)} rc {rc['metadata']['uid']}"
        )
        assert wait_until(
            lambda: jobs.get_job_status(job).is_terminal(), timeout=60, interval=0.2
        ), jobs.get_job_logs(job)
        logs = jobs.get_job_logs(job)
        assert jobs.get_job_status(job) == JobStatus.SUCCEEDED, logs[-3000:]
        assert json.loads(logs.strip().splitlines()[-1]) == {
            "host": emu.https_url,
            "deleted": True,
        }
        assert [r.user for r in emu.requests if r.method == "DELETE"] == [SA_USER]
        assert not os.path.exists("/run/secrets")
    finally:
        head.stop()
    assert not head.pids()
