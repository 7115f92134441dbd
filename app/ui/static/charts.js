/* Chart helpers over plotly.js: one Plotly.react per chart and refresh (the chart's DOM is
   reused, never appended to), fixed-size ring buffers for the live series, and no mode bar
   (it would add inline styles, which the page's Content-Security-Policy forbids). */
"use strict";
(function () {
  const CONFIG = { displayModeBar: false, responsive: false, displaylogo: false };
  const COLORS = { measured: "#1f5fbf", band: "rgba(31,95,191,0.18)", modeled: "#c2410c",
                   extended: "#7e22ce", t0: "#6b7280", empty: "#dc2626", nonempty: "#16a34a",
                   single: "#1f5fbf", mih: "#c2410c", scan: "#6b7280" };

  /** Draw or redraw ``el`` (a div) with ``traces``; ``layout`` over the common layout;
      ``emptyText`` shown in place of a chart whose traces hold no point. */
  function draw(el, traces, layout, emptyText) {
    const base = {
      margin: { l: 64, r: 64, t: 24, b: 96 }, height: 360, hovermode: "x unified",
      legend: { orientation: "h", x: 0, y: -0.3, yanchor: "top" }, font: { size: 12 },
      paper_bgcolor: "#fff", plot_bgcolor: "#fff",
    };
    const merged = Object.assign(base, layout || {});
    merged.uirevision = el.id;  // keep zoom and hidden traces across refreshes
    if (!traces.some((t) => t.x && t.x.length)) {
      merged.annotations = [{ text: emptyText || "no data yet", xref: "paper", yref: "paper",
                              x: 0.5, y: 0.5, showarrow: false, font: { size: 14, color: "#5b6575" } }];
      merged.xaxis = { visible: false };
      merged.yaxis = { visible: false };
      merged.shapes = [];
      merged.showlegend = false;
    }
    return window.Plotly.react(el, traces, merged, CONFIG);
  }

  /** Points a chart holds per trace, as plotted (what the browser tests count). */
  function pointCounts(el) {
    return (el.data || []).map((t) => (t.x ? t.x.length : 0));
  }

  /** A fixed-capacity FIFO: memory stays bounded however long the page polls. */
  class Ring {
    constructor(capacity) { this.capacity = capacity; this.items = []; }
    push(item) {
      this.items.push(item);
      if (this.items.length > this.capacity) this.items.splice(0, this.items.length - this.capacity);
    }
    map(fn) { return this.items.map(fn); }
    get length() { return this.items.length; }
  }

  /** A log axis needs positive values: null (a gap) for the others. */
  const positive = (v) => (typeof v === "number" && Number.isFinite(v) && v > 0 ? v : null);

  window.bs = Object.assign(window.bs || {}, {
    charts: { draw, pointCounts, Ring, positive, COLORS },
  });
})();
