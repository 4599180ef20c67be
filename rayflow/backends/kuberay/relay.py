"""A relay on 127.0.0.1 to a KubeRay head's dashboard, through the Kubernetes API server.

Ray's Jobs client takes a URL and headers but no client certificate, while kubeconfigs
(kind's among them) often authenticate with one, or with tokens an exec plugin refreshes. So
rayflow serves the Jobs API on a loopback port and forwards each request, HTTP and WebSocket
(Ray's log tail) alike, to the API server's service proxy with this client's Kubernetes
credentials (TLS context and bearer token, fetched per request). The API server takes the
`Authorization` header for itself, so the Ray token the client sends there is forwarded as
`X-Ray-Authorization`, the header Ray's dashboard reads behind proxies. Inside the cluster the
relay may forward to the head service directly (`to_service`), with the same header and no
Kubernetes credential.

Kubernetes token auth (KubeRay's `enableK8sTokenAuth`, Ray >= 2.55): the dashboard takes a
Kubernetes bearer token as Ray's and checks it with the API server (TokenReview, then RBAC verb
`ray:write` on the RayCluster). The relay passes on this client's own, and only ever from the
credentials it sends upstream, to that same upstream: a relay built with them goes through the API
server's service proxy (`through_api_server`, the API server of the kubeconfig they came from), and
one without any (`to_service`) cannot be built for Kubernetes token auth. So the token is never
sent to a dashboard URL by rayflow; the API server hands `X-Ray-Authorization` on to the head,
which needs it for its TokenReview (docs/security.md: the residual risk).

The relay holds this user's Kubernetes credentials, and its port is open to every local user, so
it answers only the process that started it and forwards only Ray's Jobs API: each request must
carry the relay's per-run random secret (`RELAY_HEADER`, compared in constant time; 401
otherwise), and its path, percent-decoded once and refused when it holds `.` or `..` segments,
empty segments, encoded slashes, backslashes or a second layer of encoding, must be one that
Ray's JobSubmissionClient calls (`JOBS_API`; 404 otherwise). Nothing refused is forwarded, so a
path such as `/../../api/v1/namespaces/x/secrets` never reaches the API server with the token.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import ssl
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import unquote

from rayflow.security.redaction import mask_text

if TYPE_CHECKING:  # aiohttp loads with the relay's first start
    from aiohttp import ClientSession, web

# Connection-level headers a proxy must not forward (RFC 9110 7.6.1), and those aiohttp sets itself.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-encoding",
}
WS_HEADERS = {
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
}
RELAY_HEADER = "X-Rayflow-Relay"  # the per-run secret; stripped before anything is forwarded
HTTP_SILENCE_S = 60  # an upstream that says nothing this long on an HTTP request has gone

# What Ray 2.60's JobSubmissionClient calls (ray/dashboard/modules/job/sdk.py and
# dashboard_sdk.py), by method: the version check, submit/list, one job's info, stop, delete,
# logs and the logs' WebSocket tail, and the runtime_env package upload; and three reads of the
# cluster's activity. Nothing else is relayed.
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
JOBS_API = (
    ({"GET"}, re.compile(r"/api/version")),
    ({"GET", "POST"}, re.compile(r"/api/jobs/?")),
    ({"GET", "DELETE"}, re.compile(rf"/api/jobs/{_NAME}")),
    ({"POST"}, re.compile(rf"/api/jobs/{_NAME}/stop")),
    ({"GET"}, re.compile(rf"/api/jobs/{_NAME}/logs(/tail)?")),
    ({"GET", "PUT"}, re.compile(rf"/api/packages/[a-z0-9]+/{_NAME}")),
    # and what `rayflow status` reads of a kept cluster (rayflow.runtime.activity), read-only
    ({"GET"}, re.compile(r"/api/component_activities")),
    ({"GET"}, re.compile(r"/api/cluster_status")),
    ({"GET"}, re.compile(r"/api/v0/nodes")),
)


def jobs_api_path(raw_path: str, method: str) -> str | None:
    """The path to forward for a request target as received (undecoded, query included), or None
    when it is not one of JOBS_API: percent-decoded once per segment, and refused when a segment
    is `.`, `..` or empty (but a trailing slash), or decodes to a slash, backslash or another
    `%`."""
    path = raw_path.partition("?")[0]
    if not path.startswith("/") or "\\" in path:
        return None
    segments = [
        unquote(part, errors="replace") if "%" in part else part for part in path[1:].split("/")
    ]
    for index, segment in enumerate(segments):
        if segment in (".", "..") or any(c in segment for c in "/\\%") or not segment.isprintable():
            return None
        if not segment and index != len(segments) - 1:  # `//`, and a trailing slash's is allowed
            return None
    decoded = "/" + "/".join(segments)
    if any(method in methods and pattern.fullmatch(decoded) for methods, pattern in JOBS_API):
        return decoded
    return None


def ssl_context(configuration) -> ssl.SSLContext | bool | None:
    """The kubernetes client's TLS settings as an aiohttp `ssl` argument."""
    if not configuration.host.startswith("https"):
        return None
    if not configuration.verify_ssl:
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if getattr(configuration, "assert_hostname", None) is False:
        context.check_hostname = False
    return context


def through_api_server(kube, service: str, port: str, k8s_token_auth: bool) -> DashboardRelay:
    """A relay to a service port of `kube`'s namespace through its API server's service proxy,
    with its credentials (and, for Kubernetes token auth, its bearer token as Ray's)."""
    return DashboardRelay(
        kube.service_proxy_url(service, port),
        kube.auth_headers,
        ssl_context(kube.configuration),
        k8s_token_auth=k8s_token_auth,
    )


def to_service(url: str) -> DashboardRelay:
    """A relay straight to a head service's URL (rayflow runs in the cluster): no Kubernetes
    credential goes with it, so a cluster with Kubernetes token auth is not reached this way."""
    return DashboardRelay(url)


class DashboardRelay:
    def __init__(
        self,
        upstream: str,
        upstream_headers: Callable[[], dict[str, str]] | None = None,
        tls=None,
        *,
        k8s_token_auth: bool = False,
    ):
        self.upstream = upstream.rstrip("/")
        # the API server's credentials, per request (exec plugins refresh them); none for a head
        # service reached directly
        self.upstream_headers = upstream_headers
        # Kubernetes token auth: the dashboard's credential is the bearer token of
        # upstream_headers, the one the upstream (the API server) gets anyway; it replaces
        # whatever the Jobs client sent. Nothing else brings a Kubernetes token in.
        if k8s_token_auth and upstream_headers is None:
            raise ValueError(
                "Kubernetes token auth passes on the API server's own credentials: the relay "
                "must go through the API server"
            )
        self.k8s_token_auth = k8s_token_auth
        self.tls = tls
        # what only the process that started the relay holds
        self.secret = secrets.token_urlsafe(32)
        self.url: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rayflow-dashboard-relay", daemon=True
        )
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        return self.url

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _serve(self) -> str:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        self._session = ClientSession(
            connector=TCPConnector(ssl=self.tls),
            auto_decompress=False,
            timeout=ClientTimeout(total=None, sock_connect=30),
        )
        app = web.Application(client_max_size=1024**3)  # runtime_env packages are uploaded whole
        app.router.add_route("*", "/{path:.*}", self._forward)
        runner = self._runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]  # the one site's (host, port)
        return f"http://127.0.0.1:{port}"

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def client_headers(self) -> dict[str, str]:
        """What the Jobs client must send with every request for the relay to answer it."""
        return {RELAY_HEADER: self.secret}

    def _authorised(self, request) -> bool:
        given = request.headers.get(RELAY_HEADER, "")
        return hmac.compare_digest(given.encode(), self.secret.encode())

    def _headers(self, request) -> dict[str, str]:
        skip = HOP_BY_HOP | WS_HEADERS | {RELAY_HEADER.lower()}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        ray_auth = headers.pop("Authorization", None) or headers.pop("authorization", None)
        if ray_auth:  # the Ray token: the API server would consume Authorization
            headers["X-Ray-Authorization"] = ray_auth
        upstream = self.upstream_headers() if self.upstream_headers is not None else {}
        if self.k8s_token_auth:
            headers = {k: v for k, v in headers.items() if k.lower() != "x-ray-authorization"}
            bearer = {k.lower(): v for k, v in upstream.items()}.get("authorization")
            if bearer:  # none: the dashboard answers 401, which the caller reports
                headers["X-Ray-Authorization"] = bearer
        headers.update(upstream)
        return headers

    async def _forward(self, request):
        from aiohttp import web

        session = self._session
        assert session is not None  # made by _serve before the relay listens
        if not self._authorised(request):
            return web.Response(
                status=401,
                text="rayflow relay: this relay answers only the rayflow process that started it\n",
            )
        path = jobs_api_path(request.raw_path, request.method)
        if path is None:
            return web.Response(status=404, text="rayflow relay: only Ray's Jobs API is relayed\n")
        query = request.raw_path.partition("?")[2]
        target = self.upstream + path + (f"?{query}" if query else "")
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._forward_websocket(session, request, target)
        return await self._forward_http(session, request, target)

    async def _forward_websocket(self, session: ClientSession, request, target: str):
        """A WebSocket (Ray's log tail): messages pumped both ways until either side closes."""
        from aiohttp import WSMsgType, web

        client = web.WebSocketResponse()
        await client.prepare(request)
        async with session.ws_connect(target, headers=self._headers(request)) as upstream:

            async def pump(source, sink):
                async for message in source:
                    if message.type == WSMsgType.TEXT:
                        await sink.send_str(message.data)
                    elif message.type == WSMsgType.BINARY:
                        await sink.send_bytes(message.data)
                    else:
                        break
                await sink.close()

            await asyncio.gather(
                pump(upstream, client), pump(client, upstream), return_exceptions=True
            )
        return client

    async def _forward_http(self, session: ClientSession, request, target: str):
        """An HTTP request, its body and the answer streamed through."""
        from aiohttp import ClientError, ClientTimeout, web

        body = request.content.iter_chunked(1 << 16) if request.body_exists else None
        try:
            upstream_response = await session.request(
                request.method,
                target,
                headers=self._headers(request),
                data=body,
                allow_redirects=False,
                # An API server that takes the request and never answers would hold the Jobs
                # client's call for good (it sets no timeout): its silence ends in a 502 here.
                timeout=ClientTimeout(total=None, sock_connect=30, sock_read=HTTP_SILENCE_S),
            )
        except (ClientError, OSError) as err:  # the API server is unreachable: what a gateway says
            return web.Response(
                status=502, text=mask_text(f"rayflow relay: {type(err).__name__}: {err}")
            )
        async with upstream_response as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            # passed through undecoded (auto_decompress off)
            if "Content-Encoding" in upstream.headers:
                response.headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(1 << 16):
                await response.write(chunk)
            await response.write_eof()
            return response
