"""The API server's services proxy, for tests/kube_emulator.py:
/api/v1/namespaces/<ns>/services/<[scheme:]name[:port]>/proxy/<path>.

The service must exist, name the port (by name or number; the first one when none is given) and
have a Ready pod behind its selector; the request then goes to the upstream URL a test registered
for it (`KubeEmulator.proxy_to`), streamed both ways, and a WebSocket upgrade is bridged message
by message. Hop-by-hop headers and the caller's Authorization (meant for the API server) are not
forwarded. A refusal is a 503 ServiceUnavailable Status, as the server answers.
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import aiohttp.web
from kmock import KubernetesError

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
    "authorization",
}
PROXY_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/]+)/proxy(/.*)?$")


def _unavailable(message: str) -> KubernetesError:
    return KubernetesError(status=503, reason="ServiceUnavailable", message=message, details={})


class ServicesProxy:
    """Mixed into the emulator's handler, which provides `read`, `list`, `upstreams` ((namespace,
    service, port name or None) -> URL) and `_session` (an aiohttp.ClientSession or None, closed
    by the emulator). Runs on the emulator loop."""

    __slots__ = ()  # the handler is an attrs slotted class; an empty mixin keeps it slotted

    upstreams: dict[tuple[str, str, str | None], str]
    _session: aiohttp.ClientSession | None

    async def _proxy(
        self, raw: aiohttp.web.BaseRequest, ns: str, target: str, path: str
    ) -> aiohttp.web.StreamResponse:
        parts = target.split(":")
        name, port = (
            (parts[1], parts[2])
            if len(parts) == 3
            else (parts[0], parts[1] if len(parts) == 2 else "")
        )
        svc = self.read("services", ns, name)
        ports = svc.get("spec", {}).get("ports", [])
        chosen = (
            next((p for p in ports if port in (p.get("name"), str(p.get("port")))), None)
            if port
            else (ports[0] if ports else None)
        )
        if chosen is None:
            raise _unavailable(f'no service port "{port}" found for service "{name}"')
        selector = svc.get("spec", {}).get("selector")
        ready = [
            p
            for p in self.list(
                "pods", ns, ",".join(f"{k}={v}" for k, v in (selector or {}).items())
            )
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        upstream = self.upstreams.get((ns, name, chosen.get("name"))) or self.upstreams.get(
            (ns, name, None)
        )
        if (
            selector and not ready
        ) or upstream is None:  # no endpoints: nothing ready behind the service
            raise _unavailable(f'no endpoints available for service "{name}"')
        url = upstream.rstrip("/") + path + (f"?{raw.query_string}" if raw.query_string else "")
        headers = {k: v for k, v in raw.headers.items() if k.lower() not in HOP_BY_HOP}
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        if raw.headers.get("Upgrade", "").lower() == "websocket":
            return await self._bridge_websocket(raw, url, headers)
        try:
            upstream_response = await self._session.request(
                raw.method,
                url,
                headers=headers,
                data=raw.content if raw.body_exists else None,
                allow_redirects=False,
            )
        except aiohttp.ClientConnectorError as e:
            raise _unavailable(f"error trying to reach service: {e}") from e
        async with upstream_response:
            response = aiohttp.web.StreamResponse(
                status=upstream_response.status,
                headers={
                    k: v
                    for k, v in upstream_response.headers.items()
                    if k.lower() not in HOP_BY_HOP
                },
            )
            await response.prepare(raw)
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
        await response.write_eof()
        return response

    async def _bridge_websocket(
        self, raw: aiohttp.web.BaseRequest, url: str, headers: dict[str, str]
    ):
        headers = {k: v for k, v in headers.items() if not k.lower().startswith("sec-websocket")}
        try:
            upstream = await self._session.ws_connect(url, headers=headers)
        except (
            aiohttp.WSServerHandshakeError
        ) as e:  # the upstream's refusal reaches the client as is
            return aiohttp.web.Response(status=e.status, text=e.message)
        async with upstream:
            downstream = aiohttp.web.WebSocketResponse()
            await downstream.prepare(raw)

            async def pump(source, sink) -> None:
                async for msg in source:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        await sink.send_str(msg.data)
                    elif msg.type == aiohttp.WSMsgType.BINARY:
                        await sink.send_bytes(msg.data)
                await sink.close()

            tasks = [
                asyncio.ensure_future(pump(upstream, downstream)),
                asyncio.ensure_future(pump(downstream, upstream)),
            ]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                task.result()
        return downstream
