"""backend=kuberay, issue 43: joining is by proof, not by name; the user's Kubernetes token goes
only to the API server it came from; the autostop's RBAC is bound only to rayflow's own account.

Driven against the Kubernetes emulator over real HTTP (tests/harness/kube_emulator.py) with the
fake operator, whose head "dashboard" behind the API server's service proxy is a recording
upstream: "never sent to it" is asserted on what that upstream and the emulator saw. No Ray head is
started. Another user is another cache ($XDG_CACHE_HOME: their own key and kept-cluster registry).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from tests.test_security_kuberay import K8S_AUTH, RecordingUpstream, backend, running

KEEP = ("backend.keep_cluster=true", "backend.autostop_idle_minutes=0")
ACCOUNT = "rayflow-rayflow-autostop"  # rayflow's own account for RayCluster default/rayflow


@pytest.fixture
def world(tmp_path, monkeypatch):
    """The emulator, the fake operator and the recording dashboard; this user's cache."""
    pytest.importorskip("kmock")
    from tests.harness.kube_emulator import KubeEmulator
    from tests.harness.kube_operator import FakeKubeRayOperator

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with KubeEmulator() as emulator, RecordingUpstream() as upstream:
        with FakeKubeRayOperator(
            emulator, f"http://127.0.0.1:{upstream.port}", "ray-token", head_ready_after_s=0.2
        ):
            yield emulator, upstream


def refused(emulator, *more: str):
    """The ConfigError a start with these overrides ends in (nothing started)."""
    from rayflow.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        running(backend(emulator, *more)).__enter__()
    assert "\n" not in str(raised.value)
    return raised.value


def reached_since(emulator, upstream, mark: tuple[int, int]) -> list[str]:
    """What reached the cluster's dashboard, its Secrets or a write since `mark`."""
    seen = [f"dashboard {path}" for _, path, _ in upstream.seen[mark[1] :]]
    for r in emulator.requests[mark[0] :]:
        if "/proxy" in r.path or "/secrets/" in r.path or r.method in ("DELETE", "PATCH", "PUT"):
            seen.append(f"{r.method} {r.path}")
    return seen


def mark(emulator, upstream) -> tuple[int, int]:
    return len(emulator.requests), len(upstream.seen)


# --- class 2: a RayCluster is joined only on proof ---------------------------------------------


@pytest.mark.parametrize("name", ["rayflow", "team-run"])
def test_another_users_kept_raycluster_of_your_name_is_never_joined(
    world, tmp_path, monkeypatch, name
):
    """Another user kept a RayCluster under the name yours would have (the default
    `default/rayflow`, and a chosen one), labelled and annotated as rayflow makes them. A run of
    yours, keeping its cluster or not, refuses it in one line naming backend.cluster_name: nothing
    of the run, no job, no secret, no token request, reaches its dashboard, and it is untouched."""
    emulator, upstream = world
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-user"))
    with running(backend(emulator, f"backend.cluster_name={name}", *KEEP)):
        pass
    theirs = emulator.get("rayclusters", "default", name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    before = mark(emulator, upstream)
    for keep in ((), KEEP):
        error = refused(emulator, f"backend.cluster_name={name}", *keep)
        assert error.key == "backend.cluster_name"
        assert f"RayCluster default/{name} already exists and no run of yours made and kept it" in (
            str(error)
        )
    assert reached_since(emulator, upstream, before) == []
    now = emulator.get("rayclusters", "default", name)["metadata"]
    assert [now.get(k) for k in ("uid", "labels", "annotations", "deletionTimestamp")] == [
        theirs["metadata"].get(k) for k in ("uid", "labels", "annotations", "deletionTimestamp")
    ]


def test_a_kept_cluster_tampered_with_or_made_again_is_not_joined_reached_or_deleted(world):
    """This user's kept RayCluster: a run with keep_cluster=false is refused (it would delete
    it). Its proof removed: status cannot reach it, `down` leaves it, a run refuses it. Deleted and
    made again by someone else with its name, labels and annotations copied: a run refuses it,
    `down` leaves it, `status` says yours is gone."""
    import rayflow
    from rayflow.errors import ClusterError

    emulator, upstream = world
    with running(backend(emulator, *KEEP)):
        pass
    mine = emulator.get("rayclusters", "default", "rayflow")
    error = refused(emulator)
    assert error.key == "backend.cluster_name" and "is a cluster you kept" in str(error)

    # the proof removed (someone with patch rights): same uid, no proof
    emulator.patch(
        "rayclusters",
        "default",
        "rayflow",
        {"metadata": {"annotations": {"rayflow.io/owner-proof": None}}},
    )
    before = mark(emulator, upstream)
    [row] = rayflow.clusters()
    assert row.state == "unreachable" and "not rayflow's proof that your run made it" in row.detail
    with pytest.raises(ClusterError, match="rayflow neither reaches nor deletes it"):
        rayflow.down("rayflow")
    assert "has the uid you kept but not rayflow's proof" in str(refused(emulator, *KEEP))
    assert reached_since(emulator, upstream, before) == []

    # made again under the name by someone else, its labels and annotations copied
    emulator.delete("rayclusters", "default", "rayflow")
    copied = copy.deepcopy(mine)
    copied["metadata"] = {
        key: mine["metadata"][key] for key in ("name", "namespace", "labels", "annotations")
    }
    again = emulator.put(copied)
    assert again["metadata"]["uid"] != mine["metadata"]["uid"]
    before = mark(emulator, upstream)
    error = refused(emulator, *KEEP)
    assert error.key == "backend.cluster_name"
    assert "is not the cluster you kept: yours is gone, and this one was made since" in str(error)
    with pytest.raises(ClusterError, match="is not the cluster you kept"):
        rayflow.down("rayflow")
    assert [(r.name, r.state) for r in rayflow.clusters()] == [("rayflow", "gone")]
    assert rayflow.clusters() == []
    assert reached_since(emulator, upstream, before) == []
    assert (
        emulator.get("rayclusters", "default", "rayflow")["metadata"]["uid"]
        == (again["metadata"]["uid"])
    )


def test_join_uid_is_the_users_explicit_trust_and_is_checked(world):
    """backend.join_uid: a uid (8-4-4-4-12 hex), with keep_cluster=true and mode=cluster, in one
    line before anything starts; a uid that names no object, or another one than is there now, is
    refused in one line naming it, and nothing is sent to the cluster."""
    from rayflow.backends import backend_for
    from rayflow.errors import ConfigError
    from rayflow.orchestrator.compose import compose_config

    emulator, upstream = world
    uid = "6f1c4b2e-8d3a-4f5b-9c7d-0e1f2a3b4c5d"
    for more, words in (
        (("backend.keep_cluster=true", "backend.join_uid=rayflow"), "8-4-4-4-12 hex"),
        ((f"backend.join_uid={uid}",), "needs backend.keep_cluster=true"),
        (("backend.mode=rayjob", "backend.keep_cluster=true", f"backend.join_uid={uid}"), "mode"),
    ):
        with pytest.raises(ConfigError, match=words) as bad:
            backend_for(compose_config("backend=kuberay", *more)).check()
        assert bad.value.key == "backend.join_uid"
    before = mark(emulator, upstream)
    error = refused(emulator, *KEEP, f"backend.join_uid={uid}")
    assert error.key == "backend.join_uid" and "there is no RayCluster default/rayflow to join" in (
        str(error)
    )
    assert emulator.objects("rayclusters") == [], "nothing was created"
    theirs = backend(emulator).manifest()
    emulator.put(theirs)
    error = refused(emulator, *KEEP, f"backend.join_uid={uid}")
    assert error.key == "backend.join_uid" and f"has another uid than {uid}" in str(error)
    assert reached_since(emulator, upstream, before) == []


def test_a_head_service_someone_else_made_under_its_name_gets_nothing(world):
    """A Service named as KubeRay names the head's (`<cluster>-head-svc`), made by someone else
    first: the run stops in one line, and neither the Ray token nor anything else reaches what it
    points at (the recording upstream); the cluster the run made is deleted."""
    from rayflow.errors import ClusterError

    emulator, upstream = world
    emulator.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "rayflow-head-svc", "namespace": "default"},
            "spec": {
                # the pods it reaches are whatever they say: here those the proxy reaches
                "selector": {"ray.io/cluster": "rayflow", "ray.io/node-type": "head"},
                "ports": [{"name": "dashboard", "port": 8265}],
            },
        }
    )
    emulator.proxy_to("default", "rayflow-head-svc", f"http://127.0.0.1:{upstream.port}")
    with pytest.raises(ClusterError, match="is not RayCluster default/rayflow's") as stopped:
        running(backend(emulator)).__enter__()
    assert "\n" not in str(stopped.value)
    assert upstream.seen == [], "nothing reached the squatter's pod"
    assert emulator.get("rayclusters", "default", "rayflow") is None


# --- the relay: the Kubernetes token goes only to the API server it came from -------------------


def test_kubernetes_token_auth_with_the_dashboard_reached_directly_is_refused_naming_the_key(
    tmp_path,
):
    from rayflow.backends import backend_for
    from rayflow.errors import ConfigError
    from rayflow.orchestrator.compose import compose_config

    manifest = tmp_path / "k8s-auth.yaml"
    manifest.write_text(
        "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: team-ray}\nspec:\n"
        "  rayVersion: '2.60.0'\n  authOptions: {mode: token, enableK8sTokenAuth: true}\n"
        "  headGroupSpec:\n    rayStartParams: {}\n    template:\n      spec:\n"
        "        containers: [{name: ray-head, image: 'rayproject/ray:2.60.0-py311', resources:"
        " {limits: {cpu: '1', memory: 2Gi}, requests: {cpu: '1', memory: 2Gi}}}]\n"
        "  workerGroupSpecs: []\n"
    )
    for source in (K8S_AUTH, [f"backend.manifest={manifest}"]):
        with pytest.raises(ConfigError, match="sends it only to the API server it came from") as e:
            backend_for(
                compose_config("backend=kuberay", *source, "backend.dashboard_access=service")
            ).check()
        assert e.value.key == "backend.dashboard_access"
        backend_for(compose_config("backend=kuberay", *source)).check()  # auto, proxy: fine


def test_a_relay_without_the_api_servers_credentials_cannot_carry_a_kubernetes_token():
    from rayflow.backends.kuberay.relay import DashboardRelay, to_service

    with pytest.raises(ValueError, match="must go through the API server"):
        DashboardRelay("http://rayflow-head-svc.default.svc:8265", k8s_token_auth=True)
    assert to_service("http://rayflow-head-svc.default.svc:8265").upstream_headers is None


def test_a_cluster_with_kubernetes_token_auth_is_reached_only_through_the_api_server(monkeypatch):
    """Whatever the cluster (a joined one's auth is only known at start): `service` is refused in
    one line, and `auto` inside a pod goes through the API server's service proxy with the
    kubeconfig's credentials, never to the head service's URL."""
    from rayflow.backends import ClusterHandle
    from rayflow.backends.kuberay import kube as kube_module
    from rayflow.backends.kuberay.cluster import _Applied
    from rayflow.errors import ConfigError
    from tests.test_security_kuberay import backend_for_check

    api = "http://127.0.0.1:6443"
    kube = SimpleNamespace(
        auth_headers=lambda: {"Authorization": "Bearer k8s"},
        configuration=SimpleNamespace(host=api),
        service_proxy_url=lambda svc, port: (
            f"{api}/api/v1/namespaces/default/services/{svc}:{port}/proxy"
        ),
    )
    manifest = backend_for_check(*K8S_AUTH).manifest()
    run = _Applied(ClusterHandle("kuberay"), "run-1", manifest, kube)
    service = backend_for_check("backend.dashboard_access=service")
    with pytest.raises(ConfigError) as refused_service:
        service._relay(run, "rayflow")
    assert refused_service.value.key == "backend.dashboard_access"
    monkeypatch.setattr(kube_module, "in_cluster", lambda: True)
    relay = backend_for_check()._relay(run, "rayflow")
    assert (
        relay.upstream
        == f"{api}/api/v1/namespaces/default/services/rayflow-head-svc:dashboard/proxy"
    )
    assert relay.k8s_token_auth and relay.upstream_headers() == {"Authorization": "Bearer k8s"}


def test_a_trusted_cluster_with_kubernetes_token_auth_and_direct_access_gets_nothing(world):
    """A RayCluster made outside rayflow, with Kubernetes token auth, trusted by its uid, with
    backend.dashboard_access=service: refused in one line before anything is sent to it."""
    emulator, upstream = world
    theirs = backend(emulator, *K8S_AUTH).manifest()
    theirs["metadata"]["labels"] = {"team": "ml"}  # made outside rayflow
    uid = emulator.put(theirs)["metadata"]["uid"]
    before = mark(emulator, upstream)
    error = refused(emulator, *KEEP, f"backend.join_uid={uid}", "backend.dashboard_access=service")
    assert error.key == "backend.dashboard_access"
    assert reached_since(emulator, upstream, before) == []
    assert not any(emulator.token in str(headers) for _, _, headers in upstream.seen)


# --- class 8: the autostop's RBAC on a ServiceAccount of rayflow's own --------------------------


def test_the_rendered_rbac_binds_only_rayflows_own_account(tmp_path):
    """Rendered: the head runs as `<cluster>-rayflow-autostop`, the only subject of the binding.
    A manifest (or overrides) that names the head's account, `default` or its own, keeps it and
    gets no RBAC at all: autostop is off, with one line saying why."""
    import yaml

    from tests.test_security_kuberay import TEAM_CLUSTER, backend_for_check

    cluster, account, role, binding = yaml.safe_load_all(
        backend_for_check("backend.keep_cluster=true").render().text
    )
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == account["metadata"]["name"] == ACCOUNT
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "default"}
    ]
    assert role["metadata"]["name"] == binding["roleRef"]["name"] == ACCOUNT
    path = tmp_path / "team.yaml"
    for named in ("default", "team-sa"):
        path.write_text(
            TEAM_CLUSTER.replace("serviceType: LoadBalancer", "serviceType: ClusterIP")
            .replace("env: [{name: RAY_AUTH_MODE, value: disabled}]", "env: []")
            .replace(
                "    template:\n      spec:\n",
                f"    template:\n      spec:\n        serviceAccountName: {named}\n",
            )
        )
        for b in (
            backend_for_check("backend.keep_cluster=true", f"backend.manifest={path}"),
            backend_for_check(
                "backend.keep_cluster=true",
                f"+backend.overrides.spec.headGroupSpec.template.spec.serviceAccountName={named}",
            ),
        ):
            [document] = list(yaml.safe_load_all(b.render().text))
            assert (
                document["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == named
            )
            [off] = [n for n in b.notes() if n.startswith("autostop is off")]
            assert f"as ServiceAccount '{named}'" in off and "an account of its own" in off


SQUATTED = {
    "ServiceAccount": {"apiVersion": "v1", "kind": "ServiceAccount"},
    "Role": {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
    },
    "RoleBinding": {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "subjects": [{"kind": "ServiceAccount", "name": "theirs", "namespace": "default"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "theirs"},
    },
}
PLURAL = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings"}


@pytest.mark.parametrize(
    "kind,race",
    [("ServiceAccount", False), ("Role", False), ("RoleBinding", False), ("Role", True)],
)
def test_an_autostop_object_rayflow_did_not_make_turns_autostop_off_and_is_untouched(
    world, monkeypatch, capsys, kind, race
):
    """Someone made a ServiceAccount, Role or RoleBinding of the autostop's name first: autostop is
    off, in one line saying why; that object is neither reused nor changed, and nothing is bound
    to it. Seen before the RayCluster is made (its head then does not run as that account), or
    only at the create, as a 409 (made in between: nothing more is created)."""
    from rayflow.backends.kuberay.kube import Kube

    emulator, _ = world
    theirs = emulator.put({**SQUATTED[kind], "metadata": {"name": ACCOUNT, "namespace": "default"}})
    if race:  # made between rayflow's look and its create
        look = Kube.read_object
        monkeypatch.setattr(
            Kube,
            "read_object",
            lambda self, kind, name: None if kind in PLURAL else look(self, kind, name),
        )
    with running(
        backend(emulator, "backend.keep_cluster=true", "backend.autostop_idle_minutes=5")
    ) as handle:
        assert handle.autostop is None
    err = capsys.readouterr().err
    [line] = [l for l in err.splitlines() if "autostop is off" in l]
    assert line.startswith(
        f"rayflow: warning: autostop is off: {kind} default/{ACCOUNT} already exists and this run "
        "did not make it"
    )
    assert emulator.get(PLURAL[kind], "default", ACCOUNT) == theirs, "left exactly as it was"
    assert not emulator.objects("rolebindings") or kind == "RoleBinding"
    head = emulator.get("rayclusters", "default", "rayflow")["spec"]["headGroupSpec"]["template"]
    if not race:
        assert head["spec"].get("serviceAccountName") is None, (
            "the head runs as no account of theirs"
        )
    for plural in PLURAL.values():
        for obj in emulator.objects(plural, "default"):
            if obj["metadata"]["uid"] != theirs["metadata"]["uid"]:  # what this run made is owned
                assert obj["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
