"""The proxy's streamed answer closes its connection to the served app however the stream ends,
under either way an ASGI server reports a caller hanging up: a ``http.disconnect`` message (spec
before 2.4, which uvicorn uses today: ``test_proxy.py`` covers it over real HTTP) or an error from
``send`` (spec 2.4), where Starlette skips a response's background task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.requests import ClientDisconnect

from iris_airflow_provider.plugins.serving_proxy import UpstreamResponse


class EndlessStream(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            yield b'{"line": 0}\n'
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        self.closed = True


def hang_up_after(messages: int) -> Any:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if len(sent) == messages:
            raise OSError("the caller hung up")
        sent.append(message)

    return send


async def never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


@pytest.mark.parametrize("messages", [0, 1, 3], ids=["before-the-head", "after-the-head", "mid-body"])
def test_a_caller_hanging_up_closes_the_apps_stream_under_asgi_2_4(messages: int) -> None:
    stream = EndlessStream()
    response = UpstreamResponse(httpx.Response(200, stream=stream))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        asyncio.run(response(scope, never_disconnects, hang_up_after(messages)))
    assert stream.closed
