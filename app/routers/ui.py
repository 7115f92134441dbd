"""The dashboard's page and files: ``GET /ui`` and ``/ui/...`` (no data: every figure comes
from the JSON API, which the page calls with the key the user typed).

These paths are open (app.guard ``OPEN_PATHS`` / ``OPEN_PREFIXES``): the page must load to ask
for the key. The page carries a strict Content-Security-Policy (:data:`CSP`): scripts, styles,
images and API calls from this origin only, no inline script or style, no frames, no forms
posting elsewhere. Its scripts and stylesheets are referenced with a content hash in the URL and
served with a one-year immutable cache lifetime; the page itself is ``no-cache``.
"""
from __future__ import annotations

from fastapi import APIRouter, HTTPException, Path
from fastapi.responses import FileResponse, HTMLResponse, Response

from bucketsearch import __version__
from bucketsearch.app.ui.assets import fingerprint, plotly_assets, static_file

router = APIRouter(tags=["dashboard"], include_in_schema=False)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}
IMMUTABLE = {"Cache-Control": "public, max-age=31536000, immutable",
             "X-Content-Type-Options": "nosniff"}
VENDOR_CSS = ("plotly.css", "plotly-map.css")


def _asset_url(name: str) -> str:
    found = static_file(name)
    if found is None:
        raise RuntimeError(f"app/ui/static/{name} is missing from the installed package")
    return f"/ui/static/{name}?v={fingerprint(found[0])}"


def render_page() -> str:
    """index.html with the asset URLs (content-hashed) and plotly's stylesheet ids filled in."""
    assets = plotly_assets()
    page = static_file("index.html")
    if page is None:
        raise RuntimeError("app/ui/static/index.html is missing from the installed package")
    fields = {
        "VERSION": __version__, "PLOTLY_VERSION": assets.version,
        "PLOTLY_JS": f"/ui/vendor/plotly.min.js?v={assets.version}",
        "PLOTLY_CSS": f"/ui/vendor/plotly.css?v={fingerprint(assets.global_css)}",
        "MAP_CSS": f"/ui/vendor/plotly-map.css?v={fingerprint(assets.map_css)}",
        "MAP_STYLE_ID": assets.map_style_id,
        "APP_CSS": _asset_url("dashboard.css"), "APP_JS": _asset_url("dashboard.js"),
        "CHARTS_JS": _asset_url("charts.js"), "API_JS": _asset_url("api.js"),
        "OPERATE_JS": _asset_url("operate.js"),
        "FAVICON": _asset_url("favicon.svg"),
    }
    text = page[0].decode()
    for key, value in fields.items():
        text = text.replace("{{" + key + "}}", value)
    return text


@router.get("/ui")
def page() -> HTMLResponse:
    """The dashboard (one page; the view is in the URL fragment: #/indexes, #/index/NAME,
    #/query, #/loadtest; ``?refresh=MS`` sets the polling interval)."""
    return HTMLResponse(render_page(), headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"})


@router.get("/ui/static/{name}")
def static(name: str = Path(max_length=64, pattern=r"^[a-z0-9_-]+\.[a-z]+$")) -> Response:
    found = static_file(name)
    if found is None or name == "index.html":
        raise HTTPException(404, f"no dashboard file {name!r}")
    return Response(found[0], media_type=found[1], headers=IMMUTABLE)


@router.get("/ui/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    """plotly.js from the installed ``plotly`` package (about 5 MB, cached for a year: the URL
    carries its version)."""
    return FileResponse(plotly_assets().path, media_type="text/javascript; charset=utf-8",
                        headers=IMMUTABLE)


@router.get("/ui/vendor/{name}")
def plotly_css(name: str = Path(max_length=32)) -> Response:
    """The stylesheets plotly.js would inject inline (app.ui.assets)."""
    if name not in VENDOR_CSS:
        raise HTTPException(404, f"no dashboard file {name!r}; known: {', '.join(VENDOR_CSS)}")
    assets = plotly_assets()
    css = assets.global_css if name == "plotly.css" else assets.map_css
    return Response(css, media_type="text/css; charset=utf-8", headers=IMMUTABLE)
