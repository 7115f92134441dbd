"""The dashboard (``GET /ui``): static HTML, JavaScript and CSS in ``static/``, charts drawn by
the plotly.js bundle that the ``plotly`` Python package ships (served from that package, no CDN,
no build step). See :mod:`bucketsearch.app.routers.ui` and docs/dashboard.md."""
