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

            return web.json_response({"version": "4", "ray_version": ray.__version__, "ray_commit": "x", "session_name": "s"})
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

    def __enter__(self) -> "RecordingUpstream":
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
        relay = DashboardRelay(f"http://127.0.0.1:{upstream.port}{PROXY}", lambda: {"Authorization": f"Bearer {K8S_TOKEN}"})
        relay.start()
        try:
            yield relay, upstream
        finally:
            relay.stop()


def raw_request(relay: DashboardRelay, method: str, target: str, headers: dict | None = None) -> int:
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
    assert raw_request(relay, "POST", "/api/jobs/", {"Authorization": "Bearer stolen-ray-token"}) == 401
    assert upstream.seen == []


@pytest.mark.parametrize("target", TRAVERSALS)
def test_the_relay_never_forwards_a_path_outside_the_jobs_api(relayed, target):
    relay, upstream = relayed
    status = raw_request(relay, "GET", target, relay.client_headers())
    assert status in (400, 403, 404), status
    assert upstream.seen == [], f"{target!r} reached the upstream as {upstream.seen[0][1]!r}"


def test_an_authorised_jobs_api_request_passes_with_the_credentials_and_without_the_secret(relayed):
    relay, upstream = relayed
    assert raw_request(relay, "GET", "/api/version", {**relay.client_headers(), "Authorization": "Bearer ray-token"}) == 200
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
