"""The dashboard's files: its own static files and the plotly.js bundle of the ``plotly``
package, with the stylesheets plotly.js would otherwise inject inline.

plotly.js adds its CSS at run time as inline ``<style>`` elements, which a
Content-Security-Policy without ``'unsafe-inline'`` blocks (a console error, and unstyled hover
labels). It skips that when the page already holds an element with the id it would use
(``plotly.js-style-global`` with class ``no-inline-styles``; the map library's 64-hex id), so
the page links two stylesheets with those ids, made here from the bundle's own rules: the same
CSS, served from 'self'. The rules are read from the bundle once per process (about 5 MB,
~30 ms); a bundle whose layout is not recognised raises :class:`AssetError` naming what was
looked for, rather than serving a page that breaks its own CSP.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: the files /ui/static/{name} serves (index.html is the page itself, served at /ui)
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}

#: plotly.js's own rule table: ``{"X,X div": '...', ...}``, X and Y replaced as below
_RULES_START = '{"X,X div":'
_RULE = re.compile(r"""\s*("(?:[^"\\]|\\.)*"|[A-Za-z_$][\w$]*)\s*:\s*"""
                   r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*([,}])""")
_SELECTOR_SUBS = ((re.compile(r"^,"), " ,"), (re.compile("X"), ".js-plotly-plot .plotly"),
                  (re.compile("Y"), ".plotly-notifier"))
#: the map library's stylesheet, injected unless an element with this id exists
_MAP_CSS = re.compile(r"""document\.getElementById\("([0-9a-f]{64})"\)\)\{var (\w)="""
                      r"""document\.createElement\("style"\);\2\.id="\1",\2\.textContent='""")


class AssetError(RuntimeError):
    """The plotly bundle is missing or has a layout this module does not recognise."""


@dataclass(frozen=True)
class PlotlyAssets:
    path: Path
    version: str
    global_css: str
    map_style_id: str
    map_css: str


def plotly_bundle() -> Path:
    """``plotly/package_data/plotly.min.js`` of the installed ``plotly`` package."""
    try:
        import plotly
    except ImportError as exc:  # a core dependency: only a broken install gets here
        raise AssetError("the dashboard needs the 'plotly' package (pip install plotly)") \
            from exc
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise AssetError(f"plotly.min.js not found at {path}")
    return path


def global_rules(src: str) -> list[str]:
    """plotly.js's global CSS rules, in the cascade order the bundle's ``insertRule(rule, 0)``
    calls leave them (each inserted first: the last one wins, so the list is reversed)."""
    start = src.find(_RULES_START)
    if start < 0:
        raise AssetError(f"plotly.min.js: rule table {_RULES_START!r} not found")
    pos, rules = start + 1, []
    while True:
        m = _RULE.match(src, pos)
        if m is None:
            raise AssetError(f"plotly.min.js: unreadable CSS rule at {src[pos:pos + 60]!r}")
        selector = m.group(1).strip('"')
        for pattern, repl in _SELECTOR_SUBS:
            selector = pattern.sub(repl, selector)
        rules.append(f"{selector} {{{m.group(2)[1:-1]}}}")
        pos = m.end()
        if m.group(3) == "}":
            return rules[::-1]


def map_stylesheet(src: str) -> tuple[str, str]:
    """``(element id, CSS)`` of the map library's stylesheet inside the bundle."""
    m = _MAP_CSS.search(src)
    if m is None:
        raise AssetError("plotly.min.js: the map library's stylesheet was not found")
    end = src.find("',", m.end())
    if end < 0:
        raise AssetError("plotly.min.js: the map library's stylesheet is not terminated")
    return m.group(1), src[m.end():end]


@cache
def plotly_assets() -> PlotlyAssets:
    path = plotly_bundle()
    src = path.read_text(encoding="utf-8")
    version = re.search(r"plotly\.js v([0-9][\w.+-]*)", src[:400])
    map_id, map_css = map_stylesheet(src)
    return PlotlyAssets(path, version.group(1) if version else "unknown",
                        "\n".join(global_rules(src)) + "\n", map_id, map_css + "\n")


@cache
def static_file(name: str) -> tuple[bytes, str] | None:
    """``(content, media type)`` of ``static/<name>`` (a plain file name with a known
    extension), or None."""
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or path.suffix not in STATIC_TYPES \
            or not path.is_file():
        return None
    return path.read_bytes(), STATIC_TYPES[path.suffix]


def fingerprint(content: bytes | str) -> str:
    """A short content hash, put in asset URLs so that a long cache lifetime is safe."""
    data = content.encode() if isinstance(content, str) else content
    return hashlib.sha256(data).hexdigest()[:12]
