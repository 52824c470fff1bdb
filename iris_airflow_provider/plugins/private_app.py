"""The provider's FastAPI apps describe themselves to authenticated callers only.

FastAPI serves ``/docs``, ``/redoc`` and ``/openapi.json`` to anyone by default; each app here turns
them off and serves ``openapi.json`` (and, for the UI API, its Swagger page) from a route behind its
own authentication instead.
"""

from __future__ import annotations

from fastapi import FastAPI


def private_app(title: str, description: str) -> FastAPI:
    return FastAPI(title=title, description=description, version="1", docs_url=None, redoc_url=None, openapi_url=None)
