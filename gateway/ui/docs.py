"""``/docs`` served with no internet: FastAPI's Swagger page with its
scripts and styles (swagger-ui 5, which renders OpenAPI 3.1) from the
``fastapi-offline`` package's static folder, served by the
gateway (FastAPI's default page loads them from a CDN, so an air-gapped
cluster saw a blank page)."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

SWAGGER = Path(fastapi_offline.__file__).parent / "static"
PREFIX = "/docs/static"


def docs_routes(app: FastAPI) -> None:
    """``/docs`` and its assets (the app is made with ``docs_url=None``)."""
    app.mount(PREFIX, StaticFiles(directory=SWAGGER), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon.png",
        )
