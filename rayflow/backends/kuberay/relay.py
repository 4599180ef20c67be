"""A relay on 127.0.0.1 to a KubeRay head's dashboard, through the Kubernetes API server.

Ray's Jobs client takes a URL and headers but no client certificate, while kubeconfigs
(kind's among them) often authenticate with one, or with tokens an exec plugin refreshes. So
rayflow serves the Jobs API on a loopback port and forwards each request, HTTP and WebSocket
(Ray's log tail) alike, to the API server's service proxy with this client's Kubernetes
credentials (TLS context and bearer token, fetched per request). The API server takes the
`Authorization` header for itself, so the Ray token the client sends there is forwarded as
`X-Ray-Authorization`, the header Ray's dashboard reads behind proxies. Inside the cluster the
relay forwards to the head service directly, with the same header.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Callable

# Connection-level headers a proxy must not forward (RFC 9110 7.6.1), and those aiohttp sets itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length", "content-encoding"}
WS_HEADERS = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}


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


class DashboardRelay:
    def __init__(self, upstream: str, upstream_headers: Callable[[], dict[str, str]], tls=None):
        self.upstream = upstream.rstrip("/")
        self.upstream_headers = upstream_headers  # the API server's credentials, per request
        self.tls = tls
        self.url: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rayflow-dashboard-relay", daemon=True)
        self._runner = None
        self._session = None

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

        self._session = ClientSession(connector=TCPConnector(ssl=self.tls), auto_decompress=False,
                                      timeout=ClientTimeout(total=None, sock_connect=30))
        app = web.Application(client_max_size=1024**3)  # runtime_env packages are uploaded whole
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _headers(self, request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | WS_HEADERS}
        ray_auth = headers.pop("Authorization", None) or headers.pop("authorization", None)
        if ray_auth:  # the Ray token: the API server would consume Authorization
            headers["X-Ray-Authorization"] = ray_auth
        headers.update(self.upstream_headers())
        return headers

    async def _forward(self, request):
        from aiohttp import ClientError, WSMsgType, web

        target = self.upstream + request.path_qs
        if request.headers.get("Upgrade", "").lower() == "websocket":
            client = web.WebSocketResponse()
            await client.prepare(request)
            async with self._session.ws_connect(target, headers=self._headers(request)) as upstream:
                async def pump(source, sink):
                    async for message in source:
                        if message.type == WSMsgType.TEXT:
                            await sink.send_str(message.data)
                        elif message.type == WSMsgType.BINARY:
                            await sink.send_bytes(message.data)
                        else:
                            break
                    await sink.close()

                await asyncio.gather(pump(upstream, client), pump(client, upstream), return_exceptions=True)
            return client
        body = request.content.iter_chunked(1 << 16) if request.body_exists else None
        try:
            upstream_response = await self._session.request(request.method, target, headers=self._headers(request),
                                                            data=body, allow_redirects=False)
        except (ClientError, OSError) as err:  # the API server is unreachable: what a gateway says
            return web.Response(status=502, text=f"rayflow relay: {type(err).__name__}: {err}")
        async with upstream_response as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            if "Content-Encoding" in upstream.headers:  # passed through undecoded (auto_decompress off)
                response.headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(1 << 16):
                await response.write(chunk)
            await response.write_eof()
            return response
