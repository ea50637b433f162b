"""The web UI: static ES modules and CSS from the package's `ui/` folder, served at `/` and `/ui/…`.

The UI is a client of the public API only (`server-contract.md`); it needs no route of its own. Its files
need no API key (§1). No build step and no CDN: the files in `ui/` are what the browser runs, so the UI
works offline. The page's Content-Security-Policy allows only this server's own scripts, styles and API,
a second line of defence behind the UI's rule of never turning text into markup.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

UI_DIR = Path(__file__).with_name("ui")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class _Assets(StaticFiles):
    """The UI's files, revalidated on each load (an upgraded ringlet serves its new UI at once)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


async def index(request: Request) -> Response:
    return FileResponse(UI_DIR / "index.html", media_type="text/html; charset=utf-8",
                        headers={**HEADERS, "Content-Security-Policy": CSP, "X-Frame-Options": "DENY"})


def install(app: Starlette) -> None:
    """Serve the UI on `app`: `/` and `/ui/…`, outside the API document."""
    app.add_route("/", index, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount("/ui", _Assets(directory=UI_DIR), name="ui")
