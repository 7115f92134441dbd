/* Operating views (issue 30), in their own file: #/advise/NAME (the radius advisor:
   POST /v1/indexes/NAME/advise, per-radius table, recommendation, the quality-vs-cost frontier
   and the cost per radius) and #/audit (GET /v1/audit, polled: the exactness audit's counters
   and its last mismatches). dashboard.js routes to window.bs.views[view] and lends its DOM
   helpers as window.bs.ui. */
"use strict";
(function () {
  const { api, charts } = window.bs;

  // ------------------------------------------------------------------ view: radius advisor
  async function adviseView(name) {
    const { h, fmt, pct, table, stopPolling, $ } = window.bs.ui;
    stopPolling();  // this view runs on request, it does not poll
    const view = $("view");
    const { indexes } = await api.get("/v1/indexes");
    const names = indexes.filter((x) => x.state === "ready" || x.state === "read_only").map((x) => x.name);
    if (!names.length) {
      view.replaceChildren(h("h2", {}, "Radius advisor"), h("p", { class: "muted" }, "No index yet."));
      return;
    }
    const current = names.includes(name) ? name : names[0];
    const select = h("select", { id: "advise-index" },
      names.map((n) => h("option", { value: n, selected: n === current }, n)));
    select.addEventListener("change", () => { location.hash = `#/advise/${encodeURIComponent(select.value)}`; });
    const field = (id, label, attrs) => h("label", {}, label, h("input", Object.assign({ id, class: "small" }, attrs)));
    const objective = h("select", { id: "advise-objective" }, h("option", { value: "f1" }, "F1"),
      h("option", { value: "recall" }, "recall"));
    const relevance = h("textarea", { id: "advise-relevance", rows: "3", cols: "60", spellcheck: "false",
      placeholder: '{"db_ids": [...], "db_labels": [...]}  or  {"query_ids": [...], "pairs": [[0, 17, true], ...]}' });
    const status = h("span", { id: "advise-status", class: "note" });
    const form = h("form", { class: "inline", id: "advise-form" },
      h("label", {}, "index", select),
      field("advise-sample", "sample", { type: "number", min: "1", value: "200" }),
      field("advise-radius", "radius max", { type: "number", min: "0", value: "6" }),
      h("label", {}, "objective", objective),
      field("advise-gain", "min gain", { type: "number", min: "0", max: "1", step: "0.005", value: "0.01" }),
      field("advise-budget", "budget µs", { type: "number", min: "0", step: "any" }),
      h("label", {}, "relevance (JSON, optional)", relevance),
      h("button", { type: "submit", id: "advise-run" }, "Advise"), status);
    const recommendation = h("p", { id: "advise-recommendation" });
    const rule = h("p", { id: "advise-rule", class: "note" });
    const summary = h("p", { id: "advise-summary", class: "note" });
    const tableBox = h("div", { id: "advise-table" });
    const frontier = h("div", { id: "advise-frontier", class: "chart" });
    const cost = h("div", { id: "advise-cost", class: "chart" });
    view.replaceChildren(h("h2", {}, "Radius advisor"),
      h("p", { class: "note" }, "For radii 0..R, from a sample of the index's own items (held out of the database) or the queries given: answers per query, empty balls, modeled and measured cost of the mode that runs and, with labels or duplicate pairs, precision / recall / F1 / RAMAP with 95% bootstrap intervals."),
      form, recommendation, rule, summary,
      h("div", { class: "grid" },
        h("div", { class: "card" }, h("h3", {}, "Quality vs cost: the frontier"),
          h("p", { class: "note" }, "One point per radius at its measured cost per query (log); the Pareto frontier as a step line; the recommended radius ringed. Without relevance, quality is the mean answers per query."), frontier),
        h("div", { class: "card" }, h("h3", {}, "Cost per query by radius"),
          h("p", { class: "note" }, "Measured (the fastest of the timed runs of the sample) and modeled (t0 × probes, or the planner's prediction) ns per query; log scale."), cost)),
      h("h3", {}, "Per radius"), tableBox);

    const ci = (row, key) => (row[key] === undefined ? "–"
      : `${fmt(row[key], 3)}${row[`${key}_ci`] ? ` [${fmt(row[`${key}_ci`][0], 3)}, ${fmt(row[`${key}_ci`][1], 3)}]` : ""}`);

    function render(res) {
      const rec = res.recommendation;
      recommendation.replaceChildren(h("strong", {}, rec.radius === null ? "No recommendation: " : "Recommended: "), rec.reason);
      rule.textContent = `Rule: ${rec.rule}.`;
      summary.textContent = `${res.n_queries} queries × ${fmt(res.n_db)} items, ${res.bits} bits, mode ${res.mode}`
        + `${res.holdout ? ", queries held out" : ""}${res.map ? ` · mAP (tie-aware) ${fmt(res.map.tie_aware, 4)}` : ""}`
        + ` · t0 ${res.t0_ns === null ? "not fitted" : `${fmt(res.t0_ns)} ns`}`;
      const quality = res.radii.length && res.radii[0].precision_macro !== undefined;
      const columns = [
        ["r", (x) => x.radius],
        ["answers mean", (x) => x.answers_mean], ["p50", (x) => x.answers_p50], ["p99", (x) => x.answers_p99],
        ["empty balls", (x) => pct(x.empty_share)],
        ["probes", (x) => x.modeled_probes],
        ["modeled µs", (x) => (x.modeled_ns === null ? null : x.modeled_ns / 1e3)],
        ["measured µs", (x) => (x.measured_ns === null ? null : x.measured_ns / 1e3)],
      ];
      if (quality) {
        columns.push(["precision", (x) => ci(x, "precision_macro"), "text"], ["recall", (x) => ci(x, "recall_macro"), "text"],
          ["F1", (x) => ci(x, "f1_macro"), "text"], ["RAMAP", (x) => ci(x, "ramap"), "text"]);
      }
      columns.push(["frontier", (x) => (x.pareto ? "●" : ""), "text"]);
      tableBox.replaceChildren(table("advise-rows", columns, res.radii,
        (x) => ({ class: x.radius === rec.radius ? "selected" : null, title: x.measured_note || "" })));
      const qkey = res.frontier_quality;
      const pts = res.radii.filter((x) => x.measured_ns !== null && x[qkey] !== null && x[qkey] !== undefined);
      const front = pts.filter((x) => x.pareto).sort((a, b) => a.measured_ns - b.measured_ns);
      const chosen = pts.filter((x) => x.radius === rec.radius);
      const qlabel = { f1_macro: "F1 (macro)", recall_macro: "recall (macro)", answers_mean: "answers per query" }[qkey] || qkey;
      charts.draw(frontier, [
        { x: pts.map((x) => x.measured_ns), y: pts.map((x) => x[qkey]), text: pts.map((x) => `r = ${x.radius}`),
          mode: "markers+text", textposition: "top center", name: "radius", marker: { color: charts.COLORS.measured, size: 9 } },
        { x: front.map((x) => x.measured_ns), y: front.map((x) => x[qkey]), mode: "lines", line: { shape: "hv", color: "#111" },
          name: "Pareto frontier" },
        { x: chosen.map((x) => x.measured_ns), y: chosen.map((x) => x[qkey]), mode: "markers", name: "recommended",
          marker: { size: 18, color: "rgba(0,0,0,0)", line: { color: charts.COLORS.modeled, width: 3 } } },
      ], { xaxis: { title: { text: "measured ns per query (log)" }, type: "log" }, yaxis: { title: { text: qlabel } },
           hovermode: "closest" }, "No radius was measured (limits).");
      const x = res.radii.map((r) => r.radius);
      charts.draw(cost, [
        { x, y: res.radii.map((r) => charts.positive(r.measured_ns)), name: "measured", mode: "lines+markers",
          line: { color: charts.COLORS.measured } },
        { x, y: res.radii.map((r) => charts.positive(r.modeled_ns)), name: "modeled", mode: "lines+markers",
          line: { color: charts.COLORS.modeled, dash: "dash" } },
      ], { xaxis: { title: { text: "radius r" }, dtick: 1 }, yaxis: { title: { text: "ns per query" }, type: "log" } });
    }

    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = { sample: Number($("advise-sample").value), radius_max: Number($("advise-radius").value),
                     objective: objective.value, min_gain: Number($("advise-gain").value) };
      if ($("advise-budget").value) body.budget_us = Number($("advise-budget").value);
      if (relevance.value.trim()) {
        try {
          Object.assign(body, JSON.parse(relevance.value));
        } catch (err) {
          status.textContent = `relevance: not JSON (${err.message})`;
          return;
        }
      }
      status.textContent = "running…";
      try {
        const res = await api.post(`/v1/indexes/${encodeURIComponent(select.value)}/advise`, body);
        render(res);
        status.textContent = "done";
        window.bsAdvice = res;  // read by the browser tests
      } catch (err) {
        status.textContent = err.status ? `${err.status} ${err.detail}` : String(err);
      }
    });
  }

  // ------------------------------------------------------------------ view: exactness audit
  function auditView() {
    const { h, fmt, table, poll, $ } = window.bs.ui;
    const view = $("view");
    const summary = h("p", { id: "audit-summary" });
    const counters = h("div", { id: "audit-counters" });
    const mismatches = h("div", { id: "audit-mismatches" });
    view.replaceChildren(h("h2", {}, "Exactness audit"),
      h("p", { class: "note" }, "A share of the served searches is re-checked, off the request path, against a linear scan of the very state each request read (main table, delta, tombstones). Counters since this server process started; the last mismatches, newest first."),
      summary, counters, h("h3", {}, "Last mismatches"), mismatches);

    async function refresh() {
      const rep = await api.get("/v1/audit");
      summary.replaceChildren(rep.enabled
        ? `On: one search in every ${fmt(rep.period)} sampled (a wrong answer in every search is caught within ${fmt(rep.sampling_bound)} searches), ${rep.queries_per_sample} queries a sample, checker CPU share ≤ ${fmt(rep.cpu_share)}.`
        : "Off (BUCKETSEARCH_AUDIT_RATE=0).",
        " ", h("span", { id: "audit-verdict", class: rep.mismatched ? "error" : "ok" },
          rep.mismatched ? `${fmt(rep.mismatched)} wrong answers found` : "no wrong answer found"));
      const rows = [["sampled", rep.sampled], ["checked", rep.checked], ["queries checked", rep.checked_queries],
        ["mismatched", rep.mismatched], ["queries mismatched", rep.mismatched_queries], ["dropped (queue full)", rep.dropped],
        ["checker errors", rep.errors], ["checker CPU s", rep.busy_seconds], ["queue", `${rep.queue.size} / ${rep.queue.capacity}`]];
      counters.replaceChildren(table("audit-table", [["counter", (r) => r[0], "text"], ["value", (r) => r[1]]], rows));
      if (!rep.mismatches.length) {
        mismatches.replaceChildren(h("p", { class: "muted" }, "None."));
        return;
      }
      mismatches.replaceChildren(table("audit-mismatch-table", [
        ["when", (m) => new Date(m.at * 1000).toISOString().replace("T", " ").slice(0, 19), "text"],
        ["index", (m) => m.index, "text"], ["kind", (m) => m.kind, "text"], ["k", (m) => m.k],
        ["max distance", (m) => m.max_distance], ["query", (m) => m.query, "text"],
        ["served", (m) => m.served.n], ["expected", (m) => m.expected.n],
        ["missing ids", (m) => m.missing_ids.join(", "), "text"], ["extra ids", (m) => m.extra_ids.join(", "), "text"],
        ["state", (m) => `v${m.state_version}, delta ${m.delta_items}, tombstones ${m.tombstones}`, "text"],
      ], rep.mismatches));
    }
    return poll(refresh);
  }

  window.bs = Object.assign(window.bs || {}, {
    views: Object.assign((window.bs && window.bs.views) || {}, { advise: adviseView, audit: auditView }),
  });
})();
