"""backend=kuberay's security rows (issue 30): the dashboard relay answers only the process that
started it and forwards only Ray's Jobs API; a run tears down and joins only what it may; auth off
beside an exposed service is refused; Kubernetes RBAC token auth; literal secrets in manifests.

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


# --- ownership: a run deletes and joins only what it may -------------------------------------------


@pytest.fixture
def kube_world():
    """The Kubernetes emulator with the fake operator; the dashboard behind the service proxy is the
    recording upstream (it answers the Jobs API's version check), so no Ray head is started."""
    pytest.importorskip("kmock")
    from tests.harness.kube_emulator import KubeEmulator
    from tests.harness.kube_operator import FakeKubeRayOperator

    with KubeEmulator() as emulator, RecordingUpstream() as upstream:
        with FakeKubeRayOperator(
            emulator, f"http://127.0.0.1:{upstream.port}", "ray-token", head_ready_after_s=0.2
        ):
            yield emulator, upstream


# Kept, without autostop: these tests are about who owns what (autostop: tests/test_kuberay.py)
KEEP = ("backend.keep_cluster=true", "backend.autostop_idle_minutes=0")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The kept clusters' registry of the test's own ($XDG_CACHE_HOME)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def running(backend):
    from rayflow.orchestrator.cluster import running as cluster_running

    return cluster_running(backend)


def backend(emulator, *more: str):
    from rayflow.backends import backend_for
    from rayflow.orchestrator.compose import compose_config

    return backend_for(
        compose_config(
            "backend=kuberay",
            f"backend.kubeconfig={emulator.kubeconfig_path}",
            "backend.job_pip=[]",
            "backend.start_timeout_s=30",
            "backend.delete_timeout_s=10",
            *more,
        )
    )


def labels_of(emulator, name: str = "rayflow") -> dict:
    return emulator.get("rayclusters", "default", name)["metadata"]["labels"]


def test_two_runs_with_one_cluster_name_leave_each_other_intact(kube_world, capsys):
    from rayflow.errors import ConfigError

    emulator, _ = kube_world
    with running(backend(emulator)) as first:
        uid = emulator.get("rayclusters", "default", "rayflow")["metadata"]["uid"]
        assert labels_of(emulator)["rayflow.io/run"] == first.owner_run
        with pytest.raises(ConfigError) as refused:
            running(backend(emulator)).__enter__()
        assert refused.value.key == "backend.cluster_name"
        assert (
            f"RayCluster default/rayflow belongs to another rayflow run (rayflow.io/run={first.owner_run})"
            in str(refused.value)
        )
        assert "\n" not in str(refused.value)
        # untouched
        assert emulator.get("rayclusters", "default", "rayflow")["metadata"]["uid"] == uid
        assert labels_of(emulator)["rayflow.io/run"] == first.owner_run
    # the first run deleted its own
    assert emulator.get("rayclusters", "default", "rayflow") is None


def test_a_run_that_loses_the_race_to_create_refuses_and_deletes_nothing(
    kube_world, monkeypatch, capsys
):
    """Both runs saw no cluster: the create is atomic (409 for the second), and the teardown the
    loser registered before its create leaves the winner's cluster alone."""
    from rayflow.backends.kuberay.kube import Kube
    from rayflow.errors import ConfigError

    emulator, _ = kube_world
    with running(backend(emulator)):
        uid = emulator.get("rayclusters", "default", "rayflow")["metadata"]["uid"]
        real_get, calls = Kube.get, []

        # the loser's first look came before the winner's create
        def first_get_misses(self, kind, name):
            calls.append(name)
            return None if len(calls) == 1 else real_get(self, kind, name)

        monkeypatch.setattr(Kube, "get", first_get_misses)
        with pytest.raises(ConfigError, match="belongs to another rayflow run"):
            running(backend(emulator)).__enter__()
        monkeypatch.setattr(Kube, "get", real_get)
        assert "is not this run's (rayflow.io/run=" in capsys.readouterr().out
        assert emulator.get("rayclusters", "default", "rayflow")["metadata"]["uid"] == uid
        creates = [
            r for r in emulator.requests if r.method == "POST" and r.path.endswith("/rayclusters")
        ]
        assert creates and all(r.query.get("fieldManager") == "rayflow" for r in creates)
    assert emulator.get("rayclusters", "default", "rayflow") is None


def test_a_kept_cluster_is_joined_by_name_and_never_deleted_by_the_joiner(kube_world):
    """A run of this user's that names a cluster their run kept, and keeps it too, joins it and
    leaves it running (issue 43: a run with keep_cluster=false, which would delete its cluster,
    is refused instead); the kept cluster's record stays its first run's; `rayflow down` deletes
    it; one deleted behind rayflow's back is shown gone."""
    from rayflow.backends import kept
    from rayflow.errors import ConfigError

    emulator, _ = kube_world
    with running(backend(emulator, *KEEP)) as keeper:
        pass
    assert (
        labels_of(emulator)["rayflow.io/keep"] == "true"
        and labels_of(emulator)["rayflow.io/run"] == keeper.owner_run
    )
    with pytest.raises(ConfigError, match="is a cluster you kept") as refused:
        running(backend(emulator)).__enter__()
    assert refused.value.key == "backend.cluster_name"
    with running(backend(emulator, *KEEP)) as joiner:
        assert joiner.address.startswith("http://127.0.0.1:") and joiner.joined
        assert joiner.owner_run == keeper.owner_run
    # joined as it was, left running
    assert labels_of(emulator)["rayflow.io/run"] == keeper.owner_run
    [record] = kept.records()
    assert (record.backend, record.name, record.owner_run) == (
        "kuberay",
        "rayflow",
        keeper.owner_run,
    )
    # `rayflow down` deletes it by its record (its own label, by uid) and waits for its pods
    import rayflow

    assert rayflow.down("rayflow") == ["rayflow"]
    assert emulator.get("rayclusters", "default", "rayflow") is None and rayflow.clusters() == []
    # kept again, and deleted behind rayflow's back (kubectl delete): `status` says gone, once
    with running(backend(emulator, *KEEP)):
        pass
    emulator.delete("rayclusters", "default", "rayflow")
    assert [(r.name, r.state) for r in rayflow.clusters()] == [("rayflow", "gone")]
    assert rayflow.clusters() == []


def test_a_raycluster_rayflow_did_not_make_is_joined_only_when_trusted_by_uid_and_never_deleted(
    kube_world,
):
    """Issue 43: joining is by proof, not by name. A RayCluster made outside rayflow is refused
    with keep_cluster false or true (before, keep_cluster=true joined it); the user who trusts it
    names its uid (backend.join_uid, with keep_cluster=true), and it is left running."""
    from rayflow.errors import ConfigError

    emulator, upstream = kube_world
    theirs = backend(emulator).manifest()
    theirs["metadata"]["labels"] = {"team": "ml"}
    uid = emulator.put(theirs)["metadata"]["uid"]
    for more in ((), KEEP):
        with pytest.raises(ConfigError, match="no run of yours made and kept it") as refused:
            running(backend(emulator, *more)).__enter__()
        assert refused.value.key == "backend.cluster_name" and "\n" not in str(refused.value)
        assert "backend.join_uid=<kubectl get raycluster rayflow -n default -o" in str(
            refused.value
        )
    assert upstream.seen == [], "nothing reached its dashboard"
    with running(backend(emulator, *KEEP, f"backend.join_uid={uid}")) as joined:
        assert joined.joined and joined.teardown_command is None
    assert labels_of(emulator) == {"team": "ml"}
    assert emulator.get("rayclusters", "default", "rayflow")["metadata"]["uid"] == uid
    emulator.delete("rayclusters", "default", "rayflow")


def test_an_existing_rayjob_is_never_taken_over(kube_world):
    from rayflow.errors import ConfigError

    emulator, _ = kube_world
    other = backend(emulator, "backend.mode=rayjob").manifest({"rayflow.io/run": "someoneelse"})
    emulator.put(other)
    with pytest.raises(
        ConfigError,
        match=r"RayJob default/rayflow already exists \(made by rayflow run someoneelse\)",
    ):
        running(backend(emulator, "backend.mode=rayjob")).__enter__()
    assert (
        emulator.get("rayjobs", "default", "rayflow")["metadata"]["labels"]["rayflow.io/run"]
        == "someoneelse"
    )
    emulator.delete("rayjobs", "default", "rayflow")


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


def test_with_kubernetes_token_auth_the_jobs_client_sends_the_users_kubernetes_credential(
    kube_world,
):
    """The emulator accepts the manifest (its CRD schema), the operator brings up the head, and every
    Jobs API request reaches the dashboard with the kubeconfig's bearer token as X-Ray-Authorization:
    no Ray token, no Secret read."""
    from ray.job_submission import JobSubmissionClient

    emulator, upstream = kube_world
    with running(backend(emulator, *K8S_AUTH)) as b:
        applied = emulator.get("rayclusters", "default", "rayflow")
        assert applied["spec"]["authOptions"] == {"mode": "token", "enableK8sTokenAuth": True}
        assert "Authorization" not in b.submission.headers
        # whatever Ray token the client holds locally (Ray's client adds one where this process
        # has token auth on) is replaced by the Kubernetes credential
        local = {"Authorization": "Bearer a-local-ray-token"}
        client = JobSubmissionClient(b.address, headers={**b.submission.headers, **local})
        assert client.list_jobs() == []
    to_dashboard = [headers for _, path, headers in upstream.seen if "/api/" in path]
    assert to_dashboard and all(
        h.get("X-Ray-Authorization") == f"Bearer {emulator.token}" for h in to_dashboard
    )
    assert not any("a-local-ray-token" in str(h) for h in to_dashboard)
    assert not [r for r in emulator.requests if "/secrets/" in r.path], (
        "no Ray token is read with Kubernetes token auth"
    )


def test_kubernetes_token_auth_without_a_bearer_token_is_one_line():
    from types import SimpleNamespace

    from rayflow.backends import ClusterHandle
    from rayflow.backends.kuberay.cluster import _Applied
    from rayflow.errors import ClusterError

    b = backend_for_check(*K8S_AUTH)
    kube = SimpleNamespace(auth_headers=dict)  # a client certificate: nothing to pass on
    run = _Applied(ClusterHandle("kuberay"), "run-1", b.manifest(), kube)
    with pytest.raises(
        ClusterError, match="hold no bearer token .a client certificate cannot be passed on"
    ):
        b._relay(run, "rayflow")


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
