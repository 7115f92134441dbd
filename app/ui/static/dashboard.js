/* The dashboard: views chosen by the URL fragment (#/indexes, #/index/NAME, #/query,
   #/loadtest), live refresh by polling (?refresh=MS, default 5000; ?history=N points of the
   live series, default 120), the key prompt, and write controls for a write key only. */
"use strict";
(function () {
  const { api, charts } = window.bs;
  const params = new URLSearchParams(location.search);
  const clampInt = (v, lo, hi, dflt) => {
    const n = Number.parseInt(v, 10);
    return Number.isFinite(n) ? Math.min(Math.max(n, lo), hi) : dflt;
  };
  const REFRESH_MS = clampInt(params.get("refresh"), 100, 600000, 5000);
  const HISTORY = clampInt(params.get("history"), 2, 100000, 120);
  const PROFILE_EVERY = 12;  // refreshes between two radius profiles (sampled searches)

  const state = { session: null, view: null, timer: null, generation: 0, cycles: 0 };
  window.bsDashboard = state;  // read by the browser tests (cycles, view)

  // ------------------------------------------------------------------ DOM helpers
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c !== null && c !== undefined && c !== false) {
        el.append(c instanceof Node ? c : document.createTextNode(String(c)));
      }
    }
    return el;
  }
  const $ = (id) => document.getElementById(id);

  function fmt(v, digits) {
    if (v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v))) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    const d = digits === undefined ? 3 : digits;
    return Math.abs(v) >= 1e5 ? v.toExponential(2) : Number(v.toPrecision(d)).toLocaleString("en-US");
  }
  const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toPrecision(3)}%`);

  /** A table: ``columns`` = [[header, (row) => value, "text"?], ...]. */
  function table(id, columns, rows, rowAttrs) {
    return h("table", { id },
      h("thead", {}, h("tr", {}, columns.map(([name, , kind]) => h("th", { class: kind }, name)))),
      h("tbody", {}, rows.map((row, i) => h("tr", rowAttrs ? rowAttrs(row, i) : {},
        columns.map(([, get, kind]) => {
          const v = get(row, i);
          return h("td", { class: kind }, v instanceof Node ? v : fmt(v));
        })))));
  }

  function showError(err) {
    const box = $("error");
    if (!err) { box.hidden = true; box.textContent = ""; return; }
    if (err.isAuth) { askForKey(err); return; }
    box.hidden = false;
    box.textContent = err.status ? `${err.path}: ${err.status} ${err.detail}` : String(err.message || err);
  }

  // ------------------------------------------------------------------ auth
  function askForKey(err) {
    stopPolling();
    const auth = $("auth");
    auth.hidden = false;
    $("view").replaceChildren();
    let text;
    if (err.status === 401 && !api.key()) {
      text = "This server needs a key to read (BUCKETSEARCH_READ_KEY is set). Type the read key, or the write key.";
    } else if (err.status === 401) {
      text = `The server did not accept the key header: ${err.detail}.`;
      api.forgetKey();
    } else {
      text = `The key was refused (${err.status}: ${err.detail}). Check it and type it again: the read key or the write key.`;
      api.forgetKey();
    }
    $("auth-message").textContent = text;
    $("key-state").textContent = "no key";
    $("forget-key").hidden = true;
    $("key-input").focus();
  }

  async function startSession() {
    try {
      state.session = await api.get("/v1/dashboard/session");
    } catch (err) {
      if (err.isAuth) { askForKey(err); return false; }
      showError(err);
      return false;
    }
    $("auth").hidden = true;
    const s = state.session;
    $("key-state").textContent = s.can_write ? (api.key() ? "write key" : "no key needed (writes open)")
      : (api.key() ? "read-only key" : "read-only (no key needed)");
    $("forget-key").hidden = !api.key();
    return true;
  }

  // ------------------------------------------------------------------ polling
  function stopPolling() {
    state.generation += 1;
    if (state.timer) clearTimeout(state.timer);
    state.timer = null;
  }

  /** Run ``refresh`` now and every REFRESH_MS after the previous run ended (never overlapping). */
  function poll(refresh) {
    stopPolling();
    const generation = state.generation;
    const tick = async () => {
      if (generation !== state.generation) return;
      try {
        await refresh();
        showError(null);
      } catch (err) {
        if (generation !== state.generation) return;
        showError(err);
        if (err.isAuth) return;
      }
      if (generation !== state.generation) return;
      state.cycles += 1;
      state.timer = setTimeout(tick, REFRESH_MS);
    };
    return tick();
  }

  // ------------------------------------------------------------------ view: indexes
  function indexesView() {
    let selected = null;
    const view = $("view");
    const tableBox = h("div", { id: "indexes-table" });
    const histTitle = h("h3", { id: "hist-title" });
    const hist = h("div", { id: "hist-chart", class: "chart" });
    view.replaceChildren(h("h2", {}, "Indexes"), tableBox,
      h("div", { class: "card" }, histTitle,
        h("p", { class: "note" }, "Buckets (distinct codes of the main table) per number of items they hold; log scale."),
        hist));

    async function refresh() {
      const { indexes } = await api.get("/v1/indexes");
      if (!indexes.length) {
        tableBox.replaceChildren(h("p", { class: "muted" }, "No index yet."));
        histTitle.textContent = "";
        return;
      }
      if (!indexes.some((x) => x.name === selected)) selected = indexes[0].name;
      tableBox.replaceChildren(table("indexes", [
        ["name", (x) => h("a", { href: `#/index/${encodeURIComponent(x.name)}` }, x.name), "text"],
        ["state", (x) => h("span", { class: `state-${x.state}`, title: x.reason || "" }, x.state), "text"],
        ["items", (x) => x.size], ["bits", (x) => x.bits], ["mode", (x) => x.mode, "text"],
        ["distinct codes", (x) => x.distinct_codes],
        ["share of code space", (x) => (x.code_space_fraction === null || x.code_space_fraction === undefined
          ? "–" : x.code_space_fraction.toExponential(3))],
        ["delta", (x) => x.delta_size], ["tombstones", (x) => x.tombstones],
        ["memory MB", (x) => (x.memory_bytes === null || x.memory_bytes === undefined ? null : x.memory_bytes / 1e6)],
        ["merges", (x) => x.merges],
      ], indexes, (x) => ({
        class: `clickable${x.name === selected ? " selected" : ""}`, "data-name": x.name,
        onclick: (ev) => { if (ev.target.tagName !== "A") { selected = x.name; refresh().catch(showError); } },
      })));
      const info = indexes.find((x) => x.name === selected);
      const rows = info.bucket_size_histogram || [];
      histTitle.textContent = `Bucket sizes of ${info.name}`;
      await charts.draw(hist, [{
        type: "bar", name: "buckets", x: rows.map((r) => r.size), y: rows.map((r) => r.buckets),
        marker: { color: charts.COLORS.measured },
        hovertemplate: "%{y} buckets of %{x} items<extra></extra>",
      }], { // whole numbers of items, one bar or many: never a fractional axis (0.6 .. 1.4)
            xaxis: { title: { text: "items in the bucket" }, type: "category" },
            yaxis: { title: { text: "buckets" }, type: "log" }, showlegend: false });
    }
    return poll(refresh);
  }

  // ------------------------------------------------------------------ view: one index
  /** The largest radius whose single-table probes, for the profile's 64 queries, stay within
      PROFILE_PROBES: sum_{i<=r} C(Q, i) * 64 (the server's default radius obeys the same cap). */
  const PROFILE_PROBES = 20e6;
  function profileRadius(bits) {
    let r = 0;
    let comb = 1;
    let total = 1;
    while (r < bits) {
      comb = (comb * (bits - r)) / (r + 1);
      if ((total + comb) * 64 > PROFILE_PROBES) break;
      total += comb;
      r += 1;
    }
    return r;
  }

  function indexView(name) {
    const path = `/v1/indexes/${encodeURIComponent(name)}`;
    const view = $("view");
    const ids = ["cost-chart", "cumulative-chart", "empty-chart", "planner-chart", "live-chart"];
    const el = Object.fromEntries(ids.map((id) => [id, h("div", { id, class: "chart" })]));
    const summary = h("p", { id: "index-summary" });
    const radiusTable = h("div", { id: "radius-table" });
    const engineTable = h("div", { id: "engine-table" });
    const plannerNote = h("p", { id: "planner-note", class: "note" });
    const controls = h("div", { id: "write-controls", class: "controls" });
    const history = new charts.Ring(HISTORY);
    let profile = null;
    let profileKey = null;
    let sinceProfile = 0;

    const card = (title, note, chart) => h("div", { class: "card" }, h("h3", {}, title),
      h("p", { class: "note" }, note), chart);
    view.replaceChildren(
      h("h2", {}, `Index ${name}`), summary, controls,
      h("div", { class: "grid" },
        card("Cost per radius: modeled vs measured", "Measured lookup time of one radius (p50, band p50–p99) over every search since the server started; modeled t0 × probes; the extended model; log scale.", el["cost-chart"]),
        card("Cumulative cost T(R)/T(0) against Σ C(Q, i)", "T(R): the mean measured time of radii 0..R summed. RAMAP's model says the curves coincide: T(R) = t0 Σ_{i≤R} C(Q, i).", el["cumulative-chart"]),
        card("Empty buckets and empty balls per radius", "Sampled queries (half codes of the index, half random): share of probed buckets that were empty, and of queries whose ball of radius r holds no item.", el["empty-chart"]),
        h("div", { class: "card" }, h("h3", {}, "The planner's choices"), plannerNote, el["planner-chart"]),
        card("Live: t0 and searches observed", `Last ${HISTORY} refreshes (every ${REFRESH_MS} ms).`, el["live-chart"])),
      h("h3", {}, "What ran: measured vs modeled, per query class and radius"), engineTable,
      h("h3", {}, "Per radius (the paper's model: range queries that ran single-table probing)"), radiusTable);

    if (state.session && state.session.can_write) {
      const queries = h("input", { id: "calibrate-queries", class: "small", type: "number", min: "1", value: "256" });
      const radius = h("input", { id: "calibrate-radius", class: "small", type: "number", min: "0", value: "2" });
      const done = h("span", { id: "write-result", class: "note" });
      const act = (fn) => async () => {
        done.textContent = "…";
        try { await fn(); done.textContent = "done"; sinceProfile = PROFILE_EVERY; } catch (err) {
          done.textContent = err.status ? `${err.status} ${err.detail}` : String(err);
        }
      };
      controls.replaceChildren(
        h("label", {}, "queries ", queries), h("label", {}, "radius ", radius),
        h("button", { type: "button", id: "calibrate", onclick: act(() => api.post(`${path}/cost-model/calibrate`,
          { queries: Number(queries.value), max_distance: Number(radius.value) })) }, "Calibrate t0"),
        h("button", { type: "button", id: "merge", onclick: act(() => api.post(`${path}/merge`)) }, "Merge now"),
        done);
    }

    function drawCost(cm) {
      const r = cm.radii;
      const x = r.map((e) => e.radius);
      const p50 = r.map((e) => charts.positive(e.measured.p50_ns));
      const p99 = r.map((e) => charts.positive(e.measured.p99_ns));
      const ext = profile ? profile.radii.filter((e) => e.radius <= Math.max(...x, 0)) : [];
      const traces = [
        { x, y: p99, name: "p99", mode: "lines", line: { width: 0 }, showlegend: false, hoverinfo: "skip" },
        { x, y: p50, name: "measured p50 (band to p99)", mode: "lines+markers", fill: "tonexty",
          fillcolor: charts.COLORS.band, line: { color: charts.COLORS.measured } },
        { x, y: r.map((e) => charts.positive(e.modeled_ns)), name: "modeled t0 × probes", mode: "lines+markers",
          line: { color: charts.COLORS.modeled, dash: "dash" } },
        { x: ext.map((e) => e.radius), y: ext.map((e) => charts.positive(e.extended_ns)), name: "extended model",
          mode: "lines+markers", line: { color: charts.COLORS.extended, dash: "dot" } },
      ];
      const shapes = cm.t0_ns ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: cm.t0_ns, y1: cm.t0_ns,
        line: { color: charts.COLORS.t0, width: 1, dash: "dashdot" } }] : [];
      const annotations = cm.t0_ns ? [{ xref: "paper", x: 0, y: Math.log10(cm.t0_ns), text: `t0 = ${fmt(cm.t0_ns)} ns`,
        showarrow: false, xanchor: "left", yanchor: "bottom", font: { color: charts.COLORS.t0 } }] : [];
      return charts.draw(el["cost-chart"], traces, {
        xaxis: { title: { text: "radius r" }, dtick: 1 }, yaxis: { title: { text: "ns per query" }, type: "log" },
        shapes, annotations }, "No search observed yet: searches (or a calibration) fill this chart.");
    }

    function drawCumulative(cm) {
      const r = cm.radii.filter((e) => e.measured.mean_ns);
      let sum = 0;
      const cum = r.map((e) => (sum += e.measured.mean_ns));
      const t0 = cum.length ? cum[0] : null;
      const ext = (profile ? profile.radii : []).filter((e) => e.extended_cumulative_ns);
      const ext0 = ext.length && ext[0].radius === 0 ? ext[0].extended_cumulative_ns : null;
      return charts.draw(el["cumulative-chart"], [
        { x: r.map((e) => e.radius), y: cum.map((v) => charts.positive(t0 ? v / t0 : null)), name: "measured T(R)/T(0)",
          mode: "lines+markers", line: { color: charts.COLORS.measured } },
        { x: r.map((e) => e.radius), y: r.map((e) => e.cumulative_paper_probes), name: "Σ_{i≤R} C(Q, i)",
          mode: "lines+markers", line: { color: charts.COLORS.modeled, dash: "dash" } },
        { x: ext.map((e) => e.radius), y: ext.map((e) => charts.positive(e.extended_cumulative_ns / ext0)),
          name: "extended model T(R)/T(0)", mode: "lines+markers", line: { color: charts.COLORS.extended, dash: "dot" } },
      ], { xaxis: { title: { text: "radius R" }, dtick: 1 }, yaxis: { title: { text: "relative to R = 0" }, type: "log" } },
      "No search observed yet.");
    }

    function drawEmpty() {
      const r = profile ? profile.radii : [];
      const x = r.map((e) => e.radius);
      return charts.draw(el["empty-chart"], [
        { type: "bar", x, y: r.map((e) => e.empty_share), name: "empty buckets / probes", marker: { color: charts.COLORS.empty } },
        { x, y: r.map((e) => e.empty_ball_share), name: "empty-ball queries", mode: "lines+markers",
          line: { color: charts.COLORS.measured } },
      ], { xaxis: { title: { text: "radius r" }, dtick: 1 },
           yaxis: { title: { text: "share" }, range: [0, 1.05], tickformat: ".0%" } });
    }

    function drawPlanner() {
      const planner = profile && profile.planner;
      if (!planner) {
        plannerNote.textContent = profile ? `Mode ${profile.mode}: no planner (every search runs ${profile.engine === "mih" ? "multi-index hashing" : "the single table"}).` : "";
        return charts.draw(el["planner-chart"], [], {}, "No planner in this mode.");
      }
      const c = planner.choices;
      const x = c.map((e) => e.radius);
      const traces = ["single", "mih", "scan"].map((m) => ({
        x, y: c.map((e) => charts.positive(e.predicted_ns[m])), name: `predicted ${m}`, mode: "lines+markers",
        line: { color: charts.COLORS[m] } }));
      traces.push({ x, y: c.map((e) => charts.positive(e.predicted_ns[e.mode])), name: "chosen", mode: "markers+text",
        text: c.map((e) => e.mode), textposition: "top center",
        marker: { size: 12, symbol: "circle-open", color: "#111" } });
      const last = planner.last_plan;
      plannerNote.textContent = `${planner.calibrated ? "Calibrated" : "Not calibrated yet"}. Predicted ns of one query per path and radius; the ring marks the path the planner runs.`
        + (last ? ` Last search: ${last.mode} at radius ${last.radius}${last.k ? ` (k = ${last.k})` : ""}, ${last.nq || 1} queries: ${last.reason}.` : "");
      return charts.draw(el["planner-chart"], traces, { xaxis: { title: { text: "radius r" }, dtick: 1 },
        yaxis: { title: { text: "predicted ns per query" }, type: "log" } });
    }

    function drawLive() {
      const t = history.map((e) => e.at);
      return charts.draw(el["live-chart"], [
        { x: t, y: history.map((e) => e.t0), name: "t0 (ns per probe)", mode: "lines+markers", line: { color: charts.COLORS.modeled } },
        { x: t, y: history.map((e) => e.samples), name: "(query, radius) samples", mode: "lines", yaxis: "y2",
          line: { color: charts.COLORS.measured } },
      ], { xaxis: { type: "date", tickformat: "%H:%M:%S" }, yaxis: { title: { text: "t0 ns" }, rangemode: "tozero" },
           yaxis2: { title: { text: "samples" }, overlaying: "y", side: "right", rangemode: "tozero" } });
    }

    function drawTable(cm) {
      const byR = new Map((profile ? profile.radii : []).map((e) => [e.radius, e]));
      const radii = [...new Set([...cm.radii.map((e) => e.radius), ...byR.keys()])].sort((a, b) => a - b);
      const cost = new Map(cm.radii.map((e) => [e.radius, e]));
      const g = (r, f) => (cost.get(r) ? f(cost.get(r)) : null);
      const p = (r, f) => (byR.get(r) ? f(byR.get(r)) : null);
      radiusTable.replaceChildren(table("radii", [
        ["r", (r) => r], ["C(Q, r)", (r) => g(r, (e) => e.paper_probes) ?? p(r, (e) => e.paper_probes)],
        ["searches", (r) => g(r, (e) => e.measured.count)],
        ["p50 ns", (r) => g(r, (e) => e.measured.p50_ns)], ["p99 ns", (r) => g(r, (e) => e.measured.p99_ns)],
        ["modeled ns", (r) => g(r, (e) => e.modeled_ns)], ["extended ns", (r) => p(r, (e) => e.extended_ns)],
        ["empty buckets", (r) => p(r, (e) => e.empty_buckets)], ["non-empty", (r) => p(r, (e) => e.nonempty_buckets)],
        ["items", (r) => p(r, (e) => e.items)], ["empty balls", (r) => p(r, (e) => pct(e.empty_ball_share))],
        ["planner", (r) => (profile && profile.planner ? (profile.planner.choices[r] || {}).mode : null), "text"],
      ], radii));
    }

    /** The cost model of what ran (``cm.engines``): every column defined (header tooltip and
        the legend below), each engine's model a line per term, the verdict per model. */
    function drawEngines(cm) {
      const e = cm.engines;
      if (!e) {
        engineTable.replaceChildren(h("p", { class: "note" }, "No search observed yet."));
        return;
      }
      const cols = [
        ["class", (r) => r.class, "text"], ["R", (r) => (r.k ? `${r.radius}/${r.radius_max}` : r.radius), "text"],
        ["engine", (r) => r.engine, "text"], ["share", (r) => pct(r.share), "text"], ["n", (r) => r.queries],
        ["probes", (r) => r.mean_probes], ["items", (r) => r.mean_items],
        ["cand", (r) => (r.engine === "mih" ? r.mean_candidates : null)], ["codes", (r) => r.mean_codes_compared],
        ["modeled", (r) => r.modeled_p50_ns], ["measured", (r) => r.measured_p50_ns],
        ["meas/model", (r) => r.measured_over_modeled], ["sumC", (r) => r.sum_c], ["paper t0*sumC", (r) => r.paper_ns],
      ];
      const t = table("engines", cols, e.rows, (r) => ({ class: r.holds === false ? "fails" : "" }));
      t.querySelectorAll("th").forEach((th) => { th.title = e.legend[th.textContent] || ""; });
      const models = Object.values(e.models).map((m) => `[${m.engine}] ${m.formula}, ${m.samples} queries\n`
        + m.terms.map((x) => `  ${fmt(x.coef_ns)} ns × ${x.term} (${x.counter}; 95% CI ${fmt(x.ci_ns[0])} – ${fmt(x.ci_ns[1])})`).join("\n")
        + Object.entries(m.unidentified).map(([k, v]) => `\n  ${k}: left out (${v})`).join("")).join("\n");
      engineTable.replaceChildren(
        h("p", { class: "note" }, `Times in ns. Paper t0 [${e.paper_t0_estimator || "none"}] = ${fmt(e.paper_t0_ns)} ns.`),
        t,
        h("ul", { id: "engine-verdicts" }, e.verdicts.summary.map((v) => h("li", {}, v))),
        h("details", {}, h("summary", {}, "Columns"),
          h("dl", { id: "engine-legend" }, Object.entries(e.legend).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]).flat())),
        h("details", {}, h("summary", {}, "Models (one line per term: coefficient × the counter it multiplies)"),
          h("pre", { id: "engine-models" }, models)));
    }

    /** ``t0 x ns [estimator] (95% CI a – b, stable) (source)``: the headline t0 with its interval. */
    function t0Text(cm) {
      if (cm.t0_ns === null || cm.t0_ns === undefined) return "t0 not fitted yet";
      const ci = cm.t0_ci_ns ? `, 95% CI ${fmt(cm.t0_ci_ns[0])} – ${fmt(cm.t0_ci_ns[1])} ns` : ", no interval";
      const cal = cm.calibration && cm.t0_source === "calibration" && cm.calibration.stable !== undefined
        ? (cm.calibration.stable ? ", stable" : ", UNSTABLE") : "";
      return `t0 ${fmt(cm.t0_ns)} ns [${cm.t0_estimator}${ci}${cal}] (${cm.t0_source})`;
    }

    async function refresh() {
      const [info, cm] = await Promise.all([api.get(path), api.get(`${path}/cost-model`)]);
      const key = `${info.main_size}/${info.merges}/${info.size}`;
      sinceProfile += 1;
      if (!profile || key !== profileKey || sinceProfile >= PROFILE_EVERY) {
        // the largest radius a range search reached, whatever engine ran it (cm.radii holds the
        // single-table searches only: on an auto index whose planner ran MIH past r = 1 it
        // stops there)
        const searched = cm.radii.map((e) => e.radius).concat(
          ((cm.engines && cm.engines.rows) || []).filter((e) => !e.k).map((e) => e.radius));
        const top = Math.min(Math.max(0, ...searched), profileRadius(info.bits));
        const q = top > 0 ? `?max_distance=${top}` : "";
        try {
          profile = await api.get(`${path}/radius-profile${q}`);
        } catch (err) {
          if (err.isAuth || !q) throw err;
          profile = await api.get(`${path}/radius-profile`);  // too costly: the default radius
        }
        profileKey = key;
        sinceProfile = 0;
      }
      summary.replaceChildren(
        `${fmt(info.size)} items · ${info.bits} bits · mode ${info.mode}`
        + `${info.substrings ? ` (${info.substrings} substrings)` : ""} · `,
        h("span", { class: `state-${info.state}` }, info.state),
        ` · ${fmt(info.distinct_codes)} distinct codes · `, h("span", { id: "t0-headline" }, t0Text(cm)),
        ` · profile of ${profile.queries} sampled queries up to radius ${profile.max_distance}`);
      history.push({ at: new Date(), t0: cm.t0_ns, samples: cm.t0_samples });
      await Promise.all([drawCost(cm), drawCumulative(cm), drawEmpty(), drawPlanner(), drawLive()]);
      drawTable(cm);
      drawEngines(cm);
    }
    return poll(refresh);
  }

  // ------------------------------------------------------------------ view: query box
  /** Hex (optionally 0x…) or a bit string (0b…, or exactly ``bits`` 0/1 digits; spaces and _
      ignored) -> the API's hex code: np.packbits order, bit 0 is the high bit of byte 0. */
  function parseCode(text, bits) {
    const digits = 2 * Math.ceil(bits / 8);
    let s = text.trim().replace(/[\s_]/g, "");
    const asBits = s.startsWith("0b") || (!s.startsWith("0x") && s.length === bits && /^[01]+$/.test(s));
    if (asBits) {
      s = s.replace(/^0b/, "");
      if (!/^[01]+$/.test(s) || s.length !== bits) {
        throw new Error(`code: a bit string needs exactly ${bits} digits 0/1, got ${s.length} characters`);
      }
      const padded = s.padEnd(digits * 4, "0");
      let hex = "";
      for (let i = 0; i < padded.length; i += 4) hex += Number.parseInt(padded.slice(i, i + 4), 2).toString(16);
      return hex;
    }
    s = s.replace(/^0x/, "");
    if (!/^[0-9a-fA-F]*$/.test(s) || s.length !== digits) {
      throw new Error(`code: a hex code of a ${bits}-bit index needs exactly ${digits} hex digits (or a bit string of ${bits} digits 0/1), got ${JSON.stringify(text.trim().slice(0, 80))}`);
    }
    return s.toLowerCase();
  }

  async function queryView() {
    stopPolling();
    const view = $("view");
    const { indexes } = await api.get("/v1/indexes");
    const usable = indexes.filter((x) => x.bits);
    const select = h("select", { id: "query-index" }, usable.map((x) => h("option", { value: x.name }, `${x.name} (${x.bits} bits)`)));
    const wanted = params.get("index") || (location.hash.split("?")[1] || "");
    if (usable.some((x) => x.name === wanted)) select.value = wanted;
    const code = h("input", { id: "query-code", class: "code", placeholder: "hex code, or a bit string", autocomplete: "off", spellcheck: "false" });
    const radius = h("input", { id: "query-radius", class: "small", type: "number", min: "0", placeholder: "r" });
    const k = h("input", { id: "query-k", class: "small", type: "number", min: "1", placeholder: "k" });
    const msg = h("p", { id: "query-message", class: "error", role: "alert" });
    const out = h("div", { id: "query-results" });
    const chart = h("div", { id: "query-chart", class: "chart" });
    const form = h("form", { id: "query-form", class: "inline" },
      h("label", {}, "index", select), h("label", {}, "code", code), h("label", {}, "radius", radius),
      h("label", {}, "k", k), h("button", { type: "submit", id: "query-submit" }, "Search"));
    view.replaceChildren(h("h2", {}, "Query"),
      h("p", { class: "note" }, "A radius gives every item with d ≤ r; k the k nearest (ordered by distance, then id); both: the k nearest within radius r."),
      form, msg, out, chart);
    chart.hidden = true;
    if (!usable.length) msg.textContent = "No index to search.";

    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      msg.textContent = "";
      const info = usable.find((x) => x.name === select.value);
      const r = radius.value.trim() === "" ? null : Number(radius.value);
      const kk = k.value.trim() === "" ? null : Number(k.value);
      let hex;
      try {
        if (!info) throw new Error("index: choose an index");
        hex = parseCode(code.value, info.bits);
        if (r === null && kk === null) throw new Error("give a radius, k or both");
        if (r !== null && !(Number.isInteger(r) && r >= 0 && r <= info.bits)) throw new Error(`radius: must be an integer in [0, ${info.bits}], got ${radius.value}`);
        if (kk !== null && !(Number.isInteger(kk) && kk >= 1)) throw new Error(`k: must be an integer >= 1, got ${k.value}`);
      } catch (err) {
        msg.textContent = err.message;
        return;
      }
      const body = { codes: [hex], stats: true };
      if (r !== null) body.max_distance = r; else body.k = kk;
      let res;
      try {
        res = await api.post(`/v1/indexes/${encodeURIComponent(info.name)}/search`, body);
      } catch (err) {
        if (err.isAuth) { askForKey(err); return; }
        msg.textContent = `${err.status} ${err.detail}`;
        return;
      }
      const result = res.results[0];
      let n = result.ids.length;
      if (r !== null && kk !== null) n = Math.min(n, kk);
      const rows = result.ids.slice(0, n).map((id, i) => ({ id, d: result.distances[i] }));
      const stats = (res.stats || [[]])[0];
      let cum = 0;
      const statRows = stats.map((e) => Object.assign({}, e, { cum: (cum += e.items) }));
      out.replaceChildren(
        h("p", { id: "query-summary" }, `${rows.length} result${rows.length === 1 ? "" : "s"} in ${fmt(res.took_ms)} ms`
          + (res.delta && res.delta.items ? ` (${res.delta.items} recent items scanned)` : "")),
        table("query-ids", [["#", (_, i) => i + 1], ["id", (x) => x.id], ["distance", (x) => x.d]], rows),
        h("h3", {}, "Per radius"),
        table("query-stats", [["r", (e) => e.radius], ["probes", (e) => e.probes], ["non-empty", (e) => e.nonempty_buckets],
          ["empty", (e) => e.empty_buckets], ["items", (e) => e.items], ["items ≤ r", (e) => e.cum],
          ["lookup ns", (e) => e.lookup_ns], ["modeled ns", (e) => e.modeled_ns]], statRows));
      chart.hidden = !stats.length;
      if (stats.length) {
        await charts.draw(chart, [
          { x: stats.map((e) => e.radius), y: stats.map((e) => charts.positive(e.lookup_ns)), name: "measured lookup ns", mode: "lines+markers", line: { color: charts.COLORS.measured } },
          { x: stats.map((e) => e.radius), y: stats.map((e) => charts.positive(e.modeled_ns)), name: "modeled t0 × probes", mode: "lines+markers", line: { color: charts.COLORS.modeled, dash: "dash" } },
        ], { xaxis: { title: { text: "radius r" }, dtick: 1 }, yaxis: { title: { text: "ns" }, type: "log" } });
      }
    });
  }

  // ------------------------------------------------------------------ view: load-test report
  function loadtestView() {
    stopPolling();
    const view = $("view");
    const input = h("input", { id: "report-file", type: "file", accept: "application/json,.json" });
    const msg = h("p", { id: "report-message", class: "error", role: "alert" });
    const out = h("div", { id: "report" });
    view.replaceChildren(h("h2", {}, "Load-test report"),
      h("p", { class: "note" }, "Open the JSON written by bucketsearch-loadtest --json (read in the browser, sent nowhere)."),
      input, msg, out);
    input.addEventListener("change", async () => {
      msg.textContent = "";
      out.replaceChildren();
      const file = input.files[0];
      if (!file) return;
      let report;
      try {
        report = JSON.parse(await file.text());
        if (!report || !Array.isArray(report.per_radius) || typeof report.params !== "object") {
          throw new Error("not a bucketsearch-loadtest --json report (per_radius and params are missing)");
        }
      } catch (err) {
        msg.textContent = `${file.name}: ${err.message}`;
        return;
      }
      await renderReport(report, out, file.name);
    });
  }

  async function renderReport(rep, out, fileName) {
    const lat = rep.latency_ms || {};
    const p = rep.params || {};
    const classes = rep.per_radius.concat(rep.knn || []);
    const model = rep.model || {};
    const radii = model.radii || [];
    const server = model.server || {};
    const estimates = (model.t0 || []).map((e) => ({ ...e, source: "this run" }))
      .concat((server.estimates || []).map((e) => ({ ...e, source: `server: ${e.source || ""}` })));
    const qm = model.query_model || {};
    const terms = Object.entries(qm.terms || {}).map(([name, t]) => ({ name, ...t }));
    const costChart = h("div", { id: "report-cost-chart", class: "chart" });
    const latChart = h("div", { id: "report-latency-chart", class: "chart" });
    out.replaceChildren(
      h("h3", {}, `Run: ${fileName}`),
      table("report-summary", [["", (x) => x[0], "text"], ["", (x) => x[1], "text"]], [
        ["index", p.index], ["mode", p.mode], ["target rate req/s", fmt(rep.target_rate)],
        ["achieved rate req/s", fmt(rep.achieved_rate)], ["queries/s", fmt(rep.queries_per_s)],
        ["requests", fmt(rep.requests)], ["errors", fmt(rep.errors)],
        ["status codes", JSON.stringify(rep.status_codes || {})],
        ["latency ms p50 / p99 / max", `${fmt(lat.p50)} / ${fmt(lat.p99)} / ${fmt(lat.max)}`],
        ["cost model", model.available === false ? `unavailable: ${model.unavailable || ""}` : "available"],
      ]),
      (rep.warnings || []).length ? h("ul", { id: "report-warnings" }, rep.warnings.map((w) => h("li", { class: "error" }, w))) : "",
      h("h3", {}, "t0 estimates (ns per bucket probe)"),
      table("report-t0", [
        ["estimator", (e) => e.estimator, "text"], ["source", (e) => e.source, "text"],
        ["t0 ns", (e) => e.t0_ns], ["95% interval", (e) => (e.ci_ns ? `${fmt(e.ci_ns[0])} – ${fmt(e.ci_ns[1])}` : "–"), "text"],
      ], estimates),
      h("h3", {}, "Per-query model terms"),
      table("report-terms", [
        ["term", (t) => t.name, "text"], ["coefficient ns", (t) => t.coef_ns !== undefined ? t.coef_ns : t.coef],
      ], terms),
      h("h3", {}, "Per radius"),
      table("report-radii", [
        ["R", (r) => r.radius], ["queries", (r) => r.queries], ["empty-ball queries", (r) => r.empty_ball_queries],
        ["T(R) p50 ns", (r) => r.measured_cumulative && r.measured_cumulative.p50_ns],
        ["T(R) p99 ns", (r) => r.measured_cumulative && r.measured_cumulative.p99_ns],
        ["t0 × Σ C(Q, i) ns", (r) => r.paper_cumulative_ns],
        ["T(R)/T(0)", (r) => r.measured_ratio], ["Σ C(Q, i)", (r) => r.paper_ratio],
        ["mean empty buckets", (r) => r.mean_empty_buckets],
      ], radii),
      h("h3", {}, "Per query class"),
      table("report-classes", [
        ["class", (e) => e.label, "text"], ["requests", (e) => e.count], ["errors", (e) => e.errors],
        ["latency p50 ms", (e) => e.latency_ms && e.latency_ms.p50], ["latency p99 ms", (e) => e.latency_ms && e.latency_ms.p99],
        ["server p50 ns", (e) => e.server_lookup_ns && e.server_lookup_ns.p50],
        ["items / query", (e) => e.items_per_query], ["empty buckets", (e) => pct(e.empty_fraction)],
      ], classes),
      h("div", { class: "grid" },
        h("div", { class: "card" }, h("h3", {}, "Lookup time T(R): measured vs modeled"), costChart),
        h("div", { class: "card" }, h("h3", {}, "Client latency per class"), latChart)));
    const x = radii.map((r) => r.radius);
    const cum = (key) => radii.map((r) => charts.positive(r.measured_cumulative && r.measured_cumulative[key]));
    await charts.draw(costChart, [
      { x, y: cum("p99_ns"), mode: "lines", line: { width: 0 }, showlegend: false, hoverinfo: "skip", name: "p99" },
      { x, y: cum("p50_ns"), name: "measured T(R) p50 (band to p99)",
        mode: "lines+markers", fill: "tonexty", fillcolor: charts.COLORS.band, line: { color: charts.COLORS.measured } },
      { x, y: radii.map((r) => charts.positive(r.paper_cumulative_ns)), name: "modeled t0 × Σ C(Q, i)", mode: "lines+markers",
        line: { color: charts.COLORS.modeled, dash: "dash" } },
    ], { xaxis: { title: { text: "radius R" }, dtick: 1 }, yaxis: { title: { text: "ns per query" }, type: "log" } });
    await charts.draw(latChart, [
      { type: "bar", x: classes.map((e) => e.label), y: classes.map((e) => e.latency_ms && e.latency_ms.p50), name: "p50 ms", marker: { color: charts.COLORS.measured } },
      { type: "bar", x: classes.map((e) => e.label), y: classes.map((e) => e.latency_ms && e.latency_ms.p99), name: "p99 ms", marker: { color: charts.COLORS.modeled } },
    ], { barmode: "group", yaxis: { title: { text: "ms" } } });
  }

  // ------------------------------------------------------------------ view: jobs
  /** Near-duplicate jobs (GET /v1/jobs): state, progress, the model's remaining time, result. */
  function jobsView() {
    const view = $("view");
    const box = h("div", { id: "jobs-table" });
    view.replaceChildren(h("h2", {}, "Jobs"),
      h("p", { class: "note" }, "Pairs within a radius, clusters or keep-lists (POST /v1/jobs); " +
        "remaining time from the join's cost model."), box);
    async function refresh() {
      const { jobs } = await api.get("/v1/jobs");
      if (!jobs.length) {
        box.replaceChildren(h("p", { class: "muted" }, "No job yet."));
        return;
      }
      box.replaceChildren(table("jobs", [
        ["id", (x) => x.id, "text"], ["index", (x) => x.index, "text"],
        ["radius", (x) => x.radius], ["output", (x) => x.output, "text"],
        ["state", (x) => h("span", { class: `state-${x.state}`, title: x.reason || "" }, x.state), "text"],
        ["items done", (x) => x.items_done], ["items", (x) => x.items], ["pairs", (x) => x.pairs],
        ["elapsed s", (x) => x.elapsed_s], ["remaining s", (x) => x.remaining_s],
        ["algorithm", (x) => x.algorithm || "–", "text"],
        ["result", (x) => (x.state === "completed"
          ? h("span", {}, ...["ndjson", "csv"].map((f) => h("a", {
            href: `/v1/jobs/${x.id}/result?format=${f}`, download: "" }, f + " ")))
          : "–"), "text"],
      ], jobs.slice().reverse()));
    }
    return poll(refresh);
  }

  // ------------------------------------------------------------------ routing
  async function route() {
    const hash = location.hash || "#/indexes";
    const [, view, arg] = hash.match(/^#\/([a-z]+)\/?([^?]*)/) || [null, "indexes", ""];
    state.view = view;
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === `#/${view}`);
    showError(null);
    if (view !== "loadtest" && !state.session && !(await startSession())) return;
    try {
      if (view === "index" && arg) await indexView(decodeURIComponent(arg));
      else if (view === "query") await queryView();
      else if (view === "loadtest") loadtestView();
      else if (view === "jobs") await jobsView();
      else if (window.bs.views && window.bs.views[view]) await window.bs.views[view](decodeURIComponent(arg));  // operate.js
      else await indexesView();
    } catch (err) {
      showError(err);
    }
  }

  // the DOM and polling helpers other view files use (operate.js)
  window.bs.ui = { h, fmt, pct, table, poll, stopPolling, showError, $ };

  function init() {
    $("refresh-state").textContent = `refresh every ${REFRESH_MS} ms`;
    $("key-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) { $("auth-message").textContent = "Type a key first."; return; }
      api.setKey(key);
      $("key-input").value = "";
      state.session = null;
      await route();
    });
    $("forget-key").addEventListener("click", () => {
      api.forgetKey();
      state.session = null;
      route();
    });
    window.addEventListener("hashchange", route);
    route();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
