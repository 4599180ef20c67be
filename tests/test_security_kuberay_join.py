"""backend=kuberay, issue 43, without a cluster: the user's Kubernetes token goes only to the API
server it came from; the autostop's RBAC is bound only to rayflow's own account. Joining by proof,
and what another party made first under rayflow's names, run on the real stack:
tests/test_security_kuberay_local.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.test_security_kuberay import K8S_AUTH

ACCOUNT = "rayflow-rayflow-autostop"  # rayflow's own account for RayCluster default/rayflow


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
    from rayflow.backends.kuberay.applied import Applied, relay
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
    run = Applied(ClusterHandle("kuberay"), "run-1", manifest, kube)
    service = backend_for_check("backend.dashboard_access=service")
    with pytest.raises(ConfigError) as refused_service:
        relay(service.section, run, "rayflow")
    assert refused_service.value.key == "backend.dashboard_access"
    monkeypatch.setattr(kube_module, "in_cluster", lambda: True)
    made = relay(backend_for_check().section, run, "rayflow")
    assert (
        made.upstream
        == f"{api}/api/v1/namespaces/default/services/rayflow-head-svc:dashboard/proxy"
    )
    assert made.k8s_token_auth and made.upstream_headers() == {"Authorization": "Bearer k8s"}


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
