"""The serving proxy (``/proxy``), served by the provider's plugin in the api-server.

``/proxy/t/<token>/<name>/...`` opens the named port of a job this cluster runs: the token is
checked here (``services/serving.py``: 401 invalid or expired, 403 minted by another cluster or for
another port or incarnation; nothing is forwarded then), and the request goes to the job's port,
streamed both ways: the request body as it arrives, the response chunk by chunk as the app sends
it (chunked, server-sent events), and a WebSocket upgrade. A root-relative ``Location`` from the app
gets the capability prefix back (with the cluster tag when a parent relayed the request).

``/proxy/t/cluster=<cluster>/<token>/<name>/...`` is the parent's blind relay: it forwards
``/proxy/t/<token>/<name>/...`` to the configured Airflow peer ``<cluster>`` without reading the
token (the peer checks it); an unknown cluster is a 404. These are the only routes here, and like
every plugin route they are outside Airflow's authentication: the token is the authentication.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from iris_airflow_provider.core.names import NAME_PATTERN
from iris_airflow_provider.core.serving import (
    CAPABILITY_ROUTE,
    PROXY_PREFIX,
    RELAY_HEADER,
    RELAY_TAG,
    rewrite_location,
)
from iris_airflow_provider.plugins.private_app import private_app
from iris_airflow_provider.services.serving import (
    OpenedPort,
    ServingUnavailableError,
    TokenRefusedError,
    caller_prefix,
)

log = logging.getLogger(__name__)
__all__ = ["PROXY_PREFIX", "app"]

app = private_app("Iris serving proxy", "Capability URLs of the ports jobs serve, and the parent's relay to its peers.")

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself are not forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
# Airflow's own session cookie is this origin's, not the served app's: it never leaves.
AIRFLOW_COOKIES = frozenset({"_token"})
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# No read or write timeout: a stream may idle between tokens, a body may take long to upload.
TIMEOUT = httpx.Timeout(connect=10, read=None, write=None, pool=10)

_client: httpx.AsyncClient | None = None


def client() -> httpx.AsyncClient:
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False, trust_env=False)
    return _client


def problem(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {
            "code": {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(status, "unavailable"),
            "message": message,
        },
        status_code=status,
    )


def request_headers(request: Request, extra: dict[str, str]) -> list[tuple[str, str]]:
    """The caller's headers for the next hop: no hop-by-hop ones, no Airflow cookie, and ``extra``
    replacing any the caller sent under those names (a caller cannot pose as a relaying parent)."""
    dropped = HOP_BY_HOP | {"cookie"} | {name.lower() for name in extra}
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in dropped]
    cookie = without_airflow_cookies(request.headers.get("cookie", ""))
    if cookie:
        headers.append(("cookie", cookie))
    headers += list(extra.items())
    return headers


def without_airflow_cookies(header: str) -> str:
    if not header:
        return ""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # an unparsable header is passed on as it came, minus nothing we can see
        return header
    return "; ".join(f"{name}={morsel.coded_value}" for name, morsel in jar.items() if name not in AIRFLOW_COOKIES)


class UpstreamResponse(StreamingResponse):
    """The served app's answer, streamed as it comes; its connection closed however the stream ends.

    Starlette runs a response's background task only when the stream ends well: under an ASGI server
    that reports a caller hanging up as an error (spec 2.4), a ``BackgroundTask(aclose)`` would be
    skipped and the app would go on streaming (a model, spending its accelerator) to nobody."""

    def __init__(self, answer: httpx.Response) -> None:
        super().__init__(answer.aiter_raw(), status_code=answer.status_code)
        self.answer = answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.answer.aclose()


async def forward(
    request: Request, url: str, extra_headers: dict[str, str], location_prefix: str | None, origin: str
) -> Response:
    """Send ``request`` to ``url`` and stream the answer back as it comes."""
    # A body only when the caller sent one, streamed as it arrives (its Content-Length goes along).
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    body: AsyncIterator[bytes] | None = request.stream() if has_body else None
    upstream = client().build_request(
        request.method, url, headers=request_headers(request, extra_headers), content=body
    )
    try:
        answer = await client().send(upstream, stream=True)
    except httpx.HTTPError as error:
        return problem(502, f"the served port did not answer: {type(error).__name__}")
    headers = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in HOP_BY_HOP]
    if location_prefix is not None:
        headers = [
            (k, rewrite_location(v, prefix=location_prefix, upstream_origin=origin) if k.lower() == "location" else v)
            for k, v in headers
        ]
    response = UpstreamResponse(answer)
    response.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return response


def split_capability(rest: str) -> tuple[str, str, str] | None:
    """``<token>/<name>/<path>`` -> its parts (``<path>`` may be empty); None when too short."""
    token, _, tail = rest.partition("/")
    port, _, path = tail.partition("/")
    return (token, port, path) if token and port else None


def upstream_path(path: str, query: str) -> str:
    return "/" + path + (f"?{query}" if query else "")


def raw_rest(request: Request | WebSocket, rest: str) -> str:
    """What follows ``/proxy/t/`` as the caller sent it, still percent-encoded: the route's ``rest``
    is decoded, and decoding it twice would turn ``%2525`` into ``%``."""
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        _, found, tail = raw.decode("latin-1").partition(f"{CAPABILITY_ROUTE}/")
        if found:
            return tail
    return quote(rest, safe="/")


@app.api_route("/t/{rest:path}", methods=METHODS, include_in_schema=False)
async def capability(rest: str, request: Request) -> Response:
    rest = raw_rest(request, rest)
    if rest.startswith(RELAY_TAG):
        return await relay(rest, request)
    parts = split_capability(rest)
    if parts is None:
        return problem(404, "a serving URL is /proxy/t/<token>/<name>/...")
    token, port, path = parts
    try:  # the backend is asked where the port is (files, or the Kubernetes API): off the event loop
        opened = await run_in_threadpool(open_port, token, port)
    except TokenRefusedError as refusal:
        return problem(refusal.status, str(refusal))
    except ServingUnavailableError as error:
        return problem(503, str(error))
    relayed_by = relay_cluster(request)
    origin = f"http://{opened.target.host}:{opened.target.port}"
    url = origin + upstream_path(path, request.url.query)
    return await forward(request, url, {}, caller_prefix(token, port, relayed_by), origin)


def relay_cluster(request: Request | WebSocket) -> str:
    """The cluster tag a parent relayed this request under (a name, or "")."""
    value = request.headers.get(RELAY_HEADER, "")
    return value if NAME_PATTERN.fullmatch(value) else ""


def open_port(token: str, port: str) -> OpenedPort:
    from iris_airflow_provider.hooks.serving import get_serving

    return get_serving().open(token, port)


def relay_target(tagged: str) -> tuple[str, str, str] | None:
    """``cluster=<c>/<rest>`` -> (c, the peer's URL, rest), when ``c`` is a configured Airflow peer."""
    from iris_airflow_provider.hooks.serving import relay_targets

    cluster, _, rest = tagged[len(RELAY_TAG) :].partition("/")
    url = relay_targets().get(cluster)
    return (cluster, url, rest) if url else None


async def relay(tagged: str, request: Request) -> Response:
    target = await run_in_threadpool(relay_target, tagged)
    if target is None:
        return problem(404, "no such cluster among this cluster's peers")
    cluster, peer_url, rest = target
    url = f"{peer_url.rstrip('/')}/proxy/t/{upstream_path(rest, request.url.query).lstrip('/')}"
    # The peer rewrites redirects itself (it knows the tag from the header): pass them on as they come.
    return await forward(request, url, {RELAY_HEADER: cluster}, None, peer_url)


# WebSocket ----------------------------------------------------------------------------------------


@app.websocket("/t/{rest:path}")
async def capability_socket(websocket: WebSocket, rest: str) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    extra: dict[str, str] = {}
    rest = raw_rest(websocket, rest)
    if rest.startswith(RELAY_TAG):
        target = await run_in_threadpool(relay_target, rest)
        if target is None:
            await deny(websocket, 404, "no such cluster among this cluster's peers")
            return
        cluster, peer_url, tail = target
        peer_socket = peer_url.rstrip("/").replace("http", "ws", 1)  # https -> wss, http -> ws
        url = f"{peer_socket}/proxy/t/{upstream_path(tail, websocket.url.query).lstrip('/')}"
        extra[RELAY_HEADER] = cluster
    else:
        parts = split_capability(rest)
        if parts is None:
            await deny(websocket, 404, "a serving URL is /proxy/t/<token>/<name>/...")
            return
        token, port, path = parts
        try:
            opened = await run_in_threadpool(open_port, token, port)
        except TokenRefusedError as refusal:
            await deny(websocket, refusal.status, str(refusal))
            return
        except ServingUnavailableError as error:
            await deny(websocket, 503, str(error))
            return
        url = f"ws://{opened.target.host}:{opened.target.port}" + upstream_path(path, websocket.url.query)
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    try:
        upstream = await connect(
            url,
            subprotocols=subprotocols or None,  # type: ignore[arg-type]
            additional_headers=extra,
            open_timeout=10,
            max_size=None,
            compression=None,
        )
    except InvalidStatus as refused:  # a peer's refusal (401, 403, 503 ...) reaches the caller as it is
        answer = refused.response
        await websocket.send_denial_response(
            Response(bytes(answer.body or b""), status_code=answer.status_code, media_type="application/json")
        )
        return
    except Exception as error:
        await deny(websocket, 502, f"the served port did not accept the WebSocket: {type(error).__name__}")
        return
    async with upstream:
        await websocket.accept(subprotocol=upstream.subprotocol)
        await pump(websocket, upstream)


async def pump(websocket: WebSocket, upstream: Any) -> None:
    """Carry messages both ways until either side closes."""

    async def downstream_to_upstream() -> None:
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is not None:
                    await upstream.send(message["text"])
                elif message.get("bytes") is not None:
                    await upstream.send(message["bytes"])
        except WebSocketDisconnect:
            pass
        finally:
            await upstream.close()

    async def upstream_to_downstream() -> None:
        try:
            async for message in upstream:
                if isinstance(message, str):
                    await websocket.send_text(message)
                else:
                    await websocket.send_bytes(message)
        except Exception:  # the upstream closed abruptly: close ours too
            log.debug("served WebSocket closed", exc_info=True)
        finally:
            with contextlib.suppress(Exception):
                await websocket.close()

    tasks = [asyncio.create_task(downstream_to_upstream()), asyncio.create_task(upstream_to_downstream())]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(BaseException):
            await task


async def deny(websocket: WebSocket, status: int, message: str) -> None:
    """Refuse the upgrade with an HTTP status where the server allows it, else close with 4000+status."""
    try:
        await websocket.send_denial_response(problem(status, message))
    except RuntimeError:
        await websocket.close(code=4000 + status, reason=message[:120])
