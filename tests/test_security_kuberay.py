"""backend=kuberay's security rows (issue 30): the dashboard relay answers only the process that
started it and forwards only Ray's Jobs API; auth off beside an exposed service is refused;
Kubernetes RBAC token auth as rendered and checked; literal secrets in manifests. What a run joins,
reaches and deletes, and Kubernetes token auth against a real head: test_security_kuberay_local.py.

The relay is driven over real HTTP against a tiny upstream that records every request it gets, so
"never forwarded" is asserted where it matters: at the upstream (the API server's place)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading

import pytest

from rayflow.backends.kuberay.relay import RELAY_HEADER, DashboardRelay

K8S_TOKEN = "k8s-bearer-of-the-user"
PROXY = "/api/v1/namespaces/default/services/rayflow-head-svc:dashboard/proxy"


class RecordingUpstream:
    """An HTTP (and WebSocket) server on loopback that records each request and answers 200."""

    def __init__(self):
        self.seen: list[tuple[str, str, dict]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _handle(self, request):
        from aiohttp import web

        self.seen.append((request.method, request.raw_path, dict(request.headers)))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.send_str("a log line")
            await ws.close()
            return ws
        if request.path.endswith("/api/version"):
            import ray

            return web.json_response(
                {
                    "version": "4",
                    "ray_version": ray.__version__,
                    "ray_commit": "x",
                    "session_name": "s",
                }
            )
        if request.path.endswith("/api/jobs/"):
            return web.json_response([])
        return web.Response(text="ok")

    async def _serve(self) -> int:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def __enter__(self) -> RecordingUpstream:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@pytest.fixture
def relayed():
    with RecordingUpstream() as upstream:
        relay = DashboardRelay(
            f"http://127.0.0.1:{upstream.port}{PROXY}",
            lambda: {"Authorization": f"Bearer {K8S_TOKEN}"},
        )
        relay.start()
        try:
            yield relay, upstream
        finally:
            relay.stop()


def raw_request(
    relay: DashboardRelay, method: str, target: str, headers: dict | None = None
) -> int:
    """The request target sent byte for byte (http.client does not normalise it)."""
    host, port = relay.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, target, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


TRAVERSALS = [
    "/../../../../../../../api/v1/namespaces/team/secrets",
    "/api/jobs/../../api/v1/namespaces/team/secrets",
    "/%2e%2e/%2e%2e/api/v1/namespaces/team/secrets",
    "/api/jobs/%2E%2E/%2E%2E/%2E%2E/api/v1/namespaces/team/secrets",
    "/api/jobs/..%2f..%2f..%2fapi%2fv1%2fnamespaces%2fteam%2fsecrets",
    "/api/jobs/%252e%252e/%252e%252e/api/v1/namespaces/team/secrets",  # double-encoded
    "/api/jobs/%2e%2e%5c%2e%2e%5capi",  # encoded backslashes
    "/api/jobs/..\\..\\api/v1/secrets",
    "//api/v1/namespaces/team/secrets",
    "/api/jobs//../../v1/secrets",
    "/api/jobs/./x",
    "/api/v1/namespaces/team/secrets",  # no traversal at all: simply not the Jobs API
    "/api/v0/logs/file?node_id=x&filename=../../etc/passwd",
    "/logs/raylet.out",
    "http://127.0.0.1/api/v1/namespaces/team/secrets",  # absolute-form target
]


def test_the_relay_refuses_requests_without_its_secret_and_forwards_none(relayed):
    relay, upstream = relayed
    assert raw_request(relay, "GET", "/api/version") == 401
    assert raw_request(relay, "GET", "/api/version", {RELAY_HEADER: "guessed"}) == 401
    assert raw_request(relay, "GET", "/api/version", {RELAY_HEADER: relay.secret[:-1]}) == 401
    assert (
        raw_request(relay, "POST", "/api/jobs/", {"Authorization": "Bearer stolen-ray-token"})
        == 401
    )
    assert upstream.seen == []


@pytest.mark.parametrize("target", TRAVERSALS)
def test_the_relay_never_forwards_a_path_outside_the_jobs_api(relayed, target):
    relay, upstream = relayed
    status = raw_request(relay, "GET", target, relay.client_headers())
    assert status in (400, 403, 404), status
    assert upstream.seen == [], f"{target!r} reached the upstream as {upstream.seen[0][1]!r}"


def test_an_authorised_jobs_api_request_passes_with_the_credentials_and_without_the_secret(relayed):
    relay, upstream = relayed
    assert (
        raw_request(
            relay,
            "GET",
            "/api/version",
            {**relay.client_headers(), "Authorization": "Bearer ray-token"},
        )
        == 200
    )
    [(method, path, headers)] = upstream.seen
    assert (method, path) == ("GET", f"{PROXY}/api/version")
    assert headers["Authorization"] == f"Bearer {K8S_TOKEN}"  # the API server's
    assert headers["X-Ray-Authorization"] == "Bearer ray-token"  # the dashboard's
    assert RELAY_HEADER.lower() not in {k.lower() for k in headers}


def test_rays_jobs_client_works_through_the_relay_with_its_secret(relayed):
    """What JobSubmissionClient calls (version check, list, the logs' WebSocket tail) is relayed."""
    from ray.job_submission import JobSubmissionClient

    relay, upstream = relayed
    client = JobSubmissionClient(relay.url, headers=relay.client_headers())
    assert client.list_jobs() == []

    async def tail() -> list[str]:
        return [line async for line in client.tail_job_logs("raysubmit_abc")]

    assert asyncio.run(tail()) == ["a log line"]
    paths = [path for _, path, _ in upstream.seen]
    assert f"{PROXY}/api/version" in paths and f"{PROXY}/api/jobs/" in paths
    assert f"{PROXY}/api/jobs/raysubmit_abc/logs/tail" in paths
    from ray.exceptions import AuthenticationError

    with pytest.raises(AuthenticationError):  # without the secret the client gets nothing (401)
        JobSubmissionClient(relay.url)


def test_the_relays_secret_differs_per_relay():
    a, b = DashboardRelay("http://127.0.0.1:1", dict), DashboardRelay("http://127.0.0.1:1", dict)
    assert a.secret != b.secret and len(a.secret) >= 32
    json.dumps(a.client_headers())  # plain strings, as Ray's client sends them


# --- ownership (who joins and deletes what): tests/test_security_kuberay_local.py, on the real stack


# --- auth off beside a head reachable from outside the cluster -----------------------------------

EXPOSED = [
    (
        ["backend.service_type=LoadBalancer"],
        "backend.service_type",
        "a head service of type LoadBalancer",
    ),
    (["backend.service_type=NodePort"], "backend.service_type", "a head service of type NodePort"),
    (
        ["+backend.overrides.spec.headGroupSpec.serviceType=LoadBalancer"],
        "backend.overrides",
        "a head service of type LoadBalancer",
    ),
    (
        ["+backend.overrides.spec.headGroupSpec.headService.spec.type=NodePort"],
        "backend.overrides",
        "a head service of type NodePort",
    ),
    (
        ["+backend.overrides.spec.headGroupSpec.enableIngress=true"],
        "backend.overrides",
        "an Ingress",
    ),
    (
        ["+backend.overrides.spec.headGroupSpec.template.spec.hostNetwork=true"],
        "backend.overrides",
        "hostNetwork",
    ),
    (
        ["backend.mode=rayjob", "backend.service_type=NodePort"],
        "backend.service_type",
        "spec.rayClusterSpec.headGroupSpec.serviceType",
    ),
]


def check(*overrides: str) -> None:
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    backend_for(compose_config("backend=kuberay", *overrides)).check()


@pytest.mark.parametrize("more,key,what", EXPOSED, ids=[e[0][-1] for e in EXPOSED])
def test_auth_off_beside_an_exposed_head_is_refused_naming_the_key(more, key, what):
    """Issue 43: named ray_auth_mode first; what exposes the head (`key`'s) is said in the line."""
    from rayflow.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        check("ray_auth_mode=disabled", *more)
    assert (
        refused.value.key == "ray_auth_mode"
        and what in str(refused.value)
        and "CVE-2023-48022" in str(refused.value)
    )
    check("ray_auth_mode=token", *more)  # with token auth the same exposure is the user's choice


def test_auth_off_with_a_clusterip_service_is_refused():
    """Issue 43 (allowed until now): a ClusterIP head's ports listen on the pod network, which
    every pod of the Kubernetes cluster reaches."""
    from rayflow.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        check("ray_auth_mode=disabled", "backend.service_type=ClusterIP")
    assert refused.value.key == "ray_auth_mode" and "pod network" in str(refused.value)


def test_overrides_that_turn_auth_off_beside_an_exposed_service_are_refused():
    from rayflow.errors import ConfigError

    with pytest.raises(ConfigError, match="a head service of type LoadBalancer") as refused:
        check(
            "ray_auth_mode=token",
            "backend.service_type=LoadBalancer",
            "+backend.overrides.spec.authOptions.mode=disabled",
        )
    assert refused.value.key == "ray_auth_mode"
    assert "token auth is off (backend.overrides turns it off)" in str(refused.value)


TEAM_CLUSTER = """\
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: team-ray}
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    serviceType: LoadBalancer
    rayStartParams: {}
    template:
      spec:
        containers:
          - name: ray-head
            image: rayproject/ray:2.60.0-py311
            env: [{name: RAY_AUTH_MODE, value: disabled}]
            resources: {limits: {cpu: "1", memory: 2Gi}, requests: {cpu: "1", memory: 2Gi}}
  workerGroupSpecs: []
"""


def test_a_users_manifest_with_an_exposed_head_and_no_auth_is_refused(tmp_path):
    from rayflow.errors import ConfigError

    path = tmp_path / "team.yaml"
    path.write_text(TEAM_CLUSTER)
    # the manifest's own RAY_AUTH_MODE=disabled is kept, whatever ray_auth_mode says: refused,
    # named ray_auth_mode first (issue 43), with the manifest and the exposure in the line
    for mode in ("token", "disabled"):
        with pytest.raises(
            ConfigError,
            match=r"a head service of type LoadBalancer \(spec.headGroupSpec.serviceType\)",
        ) as refused:
            check(f"ray_auth_mode={mode}", f"backend.manifest={path}")
        assert refused.value.key == "ray_auth_mode"
        if mode == "token":
            assert f"(backend.manifest {path} turns it off)" in str(refused.value)
    # a ClusterIP head too (issue 43: allowed until now): the pod network reaches it
    path.write_text(TEAM_CLUSTER.replace("serviceType: LoadBalancer", "serviceType: ClusterIP"))
    for mode in ("token", "disabled"):
        with pytest.raises(ConfigError, match="pod network") as refused:
            check(f"ray_auth_mode={mode}", f"backend.manifest={path}")
        assert refused.value.key == "ray_auth_mode"


def test_the_cli_refuses_auth_off_with_a_loadbalancer_in_one_line_and_starts_nothing(rayflow):
    out = rayflow.run(
        "backend=kuberay",
        "ray_auth_mode=disabled",
        "backend.service_type=LoadBalancer",
        "tracking=none",
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    [line] = [l for l in out.stderr.splitlines() if l.strip()]
    assert (
        line.startswith("rayflow: error: ray_auth_mode: disabled, but with backend=kuberay ")
        and "a head service of type LoadBalancer" in line
        and "Traceback" not in out.stderr
    )


# --- Kubernetes RBAC token auth (KubeRay 1.6+, Ray >= 2.55) --------------------------------------

K8S_AUTH = ["+backend.overrides.spec.authOptions.enableK8sTokenAuth=true"]


def test_kubernetes_token_auth_renders_and_checks():
    from rayflow.errors import ConfigError

    b = backend_for_check(*K8S_AUTH)
    b.check()
    assert b.manifest()["spec"]["authOptions"] == {"mode": "token", "enableK8sTokenAuth": True}
    with pytest.raises(ConfigError, match=r"needs Ray >= 2.55.0 on the cluster, got 2.53.0") as old:
        check(*K8S_AUTH, "backend.ray_version=2.53.0")
    assert old.value.key == "backend.overrides"
    # Ray's token auth off under Kubernetes token auth: auth off first (issue 43)
    with pytest.raises(ConfigError, match="backend.overrides turns it off") as off:
        check(*K8S_AUTH, "+backend.overrides.spec.authOptions.mode=disabled")
    assert off.value.key == "ray_auth_mode"


def backend_for_check(*overrides: str):
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    return backend_for(compose_config("backend=kuberay", *overrides))


def test_kubernetes_token_auth_without_a_bearer_token_is_one_line():
    from types import SimpleNamespace

    from rayflow.backends import ClusterHandle
    from rayflow.backends.kuberay.applied import Applied, relay
    from rayflow.errors import ClusterError

    b = backend_for_check(*K8S_AUTH)
    kube = SimpleNamespace(auth_headers=dict)  # a client certificate: nothing to pass on
    run = Applied(ClusterHandle("kuberay"), "run-1", b.manifest(), kube)
    with pytest.raises(
        ClusterError, match="hold no bearer token .a client certificate cannot be passed on"
    ):
        relay(b.section, run, "rayflow")


def test_the_relay_sends_the_kubernetes_credential_in_place_of_any_ray_token():
    with RecordingUpstream() as upstream:
        relay = DashboardRelay(
            f"http://127.0.0.1:{upstream.port}{PROXY}",
            lambda: {"Authorization": f"Bearer {K8S_TOKEN}"},
            k8s_token_auth=True,
        )
        relay.start()
        try:
            headers = {
                **relay.client_headers(),
                "Authorization": "Bearer ray",
                "x-ray-authorization": "Bearer forged",
            }
            assert raw_request(relay, "GET", "/api/version", headers) == 200
        finally:
            relay.stop()
    [(_, _, seen)] = upstream.seen
    assert [v for k, v in seen.items() if k.lower() == "x-ray-authorization"] == [
        f"Bearer {K8S_TOKEN}"
    ]


# --- literal secrets in a manifest ----------------------------------------------------------------

PLANTED = "hunter2-planted-in-the-manifest"
WITH_SECRETS = TEAM_CLUSTER.replace("serviceType: LoadBalancer", "serviceType: ClusterIP").replace(
    "env: [{name: RAY_AUTH_MODE, value: disabled}]",
    f"env: [{{name: AWS_SECRET_ACCESS_KEY, value: {PLANTED}}}, {{name: REGION, value: eu-west-1}}, "
    "{name: DB_PASSWORD, valueFrom: {secretKeyRef: {name: db, key: password}}}]",
)


def test_a_dry_run_keeps_the_manifest_on_stdout_and_names_the_secret_alternative_on_stderr(
    rayflow, tmp_path
):
    import yaml

    path = tmp_path / "team.yaml"
    path.write_text(WITH_SECRETS)
    out = rayflow.run(
        "backend=kuberay", f"backend.manifest={path}", "dry_run=true", "tracking=none", timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [document] = list(yaml.safe_load_all(out.stdout))  # exactly the one object kubectl takes
    assert document["kind"] == "RayCluster" and document["metadata"]["name"] == "team-ray"
    env = {
        e["name"]: e
        for e in document["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert (
        env["REGION"]["value"] == "eu-west-1"
        and env["DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "db"
    )
    assert PLANTED not in out.stdout + out.stderr
    warnings = [line for line in out.stderr.splitlines() if "is a literal value" in line]
    assert len(warnings) == 1, out.stderr  # DB_PASSWORD comes from a Secret already
    assert "env[AWS_SECRET_ACCESS_KEY]" in warnings[0] and "valueFrom.secretKeyRef" in warnings[0]
