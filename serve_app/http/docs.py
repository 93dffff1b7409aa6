"""Swagger UI served by vaultvec itself: no CDN, so /docs works offline.

The UI is at /docs and /v1/docs, the OpenAPI at /openapi.json and /v1/openapi.json; the
Swagger UI dist comes from the swagger-ui-py package (Swagger UI 5: the 4.x of
swagger-ui-bundle cannot render FastAPI's OpenAPI 3.1).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/static"
UI = {"/docs": "/openapi.json", "/v1/docs": "/v1/openapi.json"}  # UI page -> the OpenAPI it loads
PATHS = frozenset({*UI, *UI.values()})


def assets_dir() -> Path:
    """swagger-ui-py's dist directory, found without importing the package (and its deps)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is missing (a dependency of vaultvec)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def install(app: FastAPI) -> None:
    """Serve the UI's assets, the UI pages and /v1/openapi.json (FastAPI serves /openapi.json)."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="swagger-ui")

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(app.openapi())

    app.add_api_route(UI["/v1/docs"], openapi, include_in_schema=False)

    def page(openapi_url: str) -> Callable[[Request], Awaitable[HTMLResponse]]:
        async def swagger_ui(request: Request) -> HTMLResponse:
            root = request.scope.get("root_path", "").rstrip("/")
            return get_swagger_ui_html(
                openapi_url=root + openapi_url,
                title=f"{app.title} - Swagger UI",
                swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
                swagger_favicon_url=f"{root}{ASSETS}/favicon-32x32.png",
                # No badge from the public online validator (swagger.io).
                swagger_ui_parameters={"validatorUrl": None},
            )

        return swagger_ui

    for path, openapi_url in UI.items():
        app.add_api_route(path, page(openapi_url), include_in_schema=False)
