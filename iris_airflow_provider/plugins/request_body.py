"""Reading a request body with a size limit, for the plugin's apps (whose routes authenticate first).

FastAPI reads and parses a declared body before any dependency runs, so an unauthenticated client
could make the api-server hold and parse hundreds of MiB before its 401. The plugin's routes take
no declared body: they authenticate, then call :func:`read_body`, which refuses a body larger than
the route's limit from its ``Content-Length`` without reading it, and stops reading a chunked one
as soon as it passes the limit.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel


class BodyTooLargeError(Exception):
    def __init__(self, route: str, limit: int) -> None:
        super().__init__(f"the body of {route} may be at most {limit} bytes; this one is larger")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, or BodyTooLargeError once it exceeds ``limit`` bytes."""
    route = f"{request.method} {request.url.path}"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(route, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(route, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def documented_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its body itself: the body's schema, as if declared."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
