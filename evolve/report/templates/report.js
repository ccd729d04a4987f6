// Draws the views from the embedded payload; in live mode polls the server for a new one.
// Program text reaches the document only through textContent: it is never parsed as HTML.
"use strict";
(function () {
  const body = document.body;
  const live = body.dataset.live === "true";
  const runId = body.dataset.run;
  const config = { responsive: true, displaylogo: false };
  let data = JSON.parse(document.getElementById("report-data").textContent);
  let lineageNodes = data.lineage.nodes;

  function text(id, value) { document.getElementById(id).textContent = value == null ? "" : String(value); }

  function note(el, message) {
    const p = document.createElement("p");
    p.className = "note";
    p.textContent = message;
    el.replaceChildren(p);
  }

  function plot(id, fig, empty) {
    const el = document.getElementById(id);
    if (!fig) { Plotly.purge(el); note(el, empty); return; }
    if (el.querySelector("p.note")) el.replaceChildren();
    Plotly.react(el, fig.data, themed(fig.layout), config);
  }

  function themed(layout) { return Object.assign({ template: data.template }, layout); }

  function summary() {
    const m = data.meta;
    const best = m.best_scalar == null ? "none yet" : m.best_scalar.toPrecision(6) + " (program " + m.best_id + ")";
    text("status", "(" + m.status + ")");
    text("summary", (m.quality ? "children " + m.quality + ". " : "") + m.evaluations + " evaluations, " +
      m.completions + " completions, " + m.islands +
      " islands, best scalar " + best + ", errors " + JSON.stringify(m.errors) + ", answers " +
      JSON.stringify(m.variants));
  }

  // One row per ensemble member and ask arm; every cell is set through textContent.
  function arms() {
    const holder = document.getElementById("arms");
    const rows = data.arms || [];
    if (!rows.length) { note(holder, "no group records its member yet (a run older than ensembles)"); return; }
    const table = document.createElement("table");
    table.className = "arms";
    const head = ["", "name", "groups", "share", "last 20", "tokens", "new valid", "per 1k tokens", "improved",
      "copies", "best child"];
    const pct = function (x) { return (100 * x).toFixed(0) + "%"; };
    const lines = [head].concat(rows.map(function (r) {
      return [r.kind, r.name, r.groups, pct(r.share), pct(r.recent_share), r.tokens, r.valid,
        r.valid_per_1k_tokens == null ? "-" : r.valid_per_1k_tokens.toFixed(2), r.improved, r.copies,
        r.best_scalar == null ? "-" : r.best_scalar.toPrecision(6) + " (#" + r.best_id + ")"];
    }));
    lines.forEach(function (cells, i) {
      const tr = document.createElement("tr");
      cells.forEach(function (c) {
        const td = document.createElement(i === 0 ? "th" : "td");
        td.textContent = String(c);
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    holder.replaceChildren(table);
  }

  function grids() {
    const holder = document.getElementById("grids");
    holder.querySelectorAll(".js-plotly-plot").forEach(function (el) { Plotly.purge(el); });
    holder.replaceChildren();
    if (!data.figures.grids.length) { note(holder, "no evaluated program yet"); return; }
    data.figures.grids.forEach(function (fig) {
      const el = document.createElement("div");
      el.className = "plot";
      holder.appendChild(el);
      Plotly.newPlot(el, fig.data, themed(fig.layout), config);
    });
  }

  function paretoAxes() {
    const axes = data.pareto.axes;
    ["pareto-x", "pareto-y"].forEach(function (id, which) {
      const sel = document.getElementById(id);
      const keep = sel.value;
      sel.replaceChildren();
      axes.forEach(function (name, i) {
        const opt = document.createElement("option");
        opt.value = String(i);
        opt.textContent = name;
        sel.appendChild(opt);
      });
      sel.value = keep && Number(keep) < axes.length ? keep : String(Math.min(which, axes.length - 1));
    });
  }

  function pareto() {
    const p = data.pareto;
    const el = document.getElementById("pareto");
    let i = Number(document.getElementById("pareto-x").value);
    let j = Number(document.getElementById("pareto-y").value);
    if (!p.sample.length || p.axes.length < 2) { Plotly.purge(el); note(el, "no evaluated program yet"); return; }
    if (i === j) { j = (i + 1) % p.axes.length; document.getElementById("pareto-y").value = String(j); }
    const lo = Math.min(i, j), hi = Math.max(i, j);
    const front = p.fronts[lo + "," + hi] || [];
    const fx = front.map(function (r) { return lo === i ? r[0] : r[1]; });
    const fy = front.map(function (r) { return lo === i ? r[1] : r[0]; });
    text("pareto-note", "front over all " + p.evaluated + " evaluated programs; " + p.sample.length +
      " shown as background" + (front.length ? "" : "; no precomputed front for this pair"));
    if (el.querySelector("p.note")) el.replaceChildren();
    Plotly.react(el, [
      { x: p.sample.map(function (r) { return r[i + 1]; }), y: p.sample.map(function (r) { return r[j + 1]; }),
        customdata: p.sample.map(function (r) { return r[0]; }), mode: "markers", type: "scatter",
        name: "programs", marker: { size: 5, color: "#9ab", opacity: 0.6 },
        hovertemplate: "program %{customdata}<br>(%{x:.4g}, %{y:.4g})<extra></extra>" },
      { x: fx, y: fy, customdata: front.map(function (r) { return r[2]; }), mode: "lines+markers",
        type: "scatter", name: "Pareto front", line: { shape: "hv", color: "#d62728" }, marker: { size: 8 },
        hovertemplate: "program %{customdata}<br>(%{x:.4g}, %{y:.4g})<extra></extra>" }
    ], { height: 420, template: data.template, xaxis: { title: { text: p.axes[i] } },
         yaxis: { title: { text: p.axes[j] } }, margin: { l: 60, r: 20, t: 20, b: 50 } }, config);
    el.removeAllListeners && el.removeAllListeners("plotly_click");
    el.on("plotly_click", function (ev) { if (ev.points.length) showProgram(ev.points[0].customdata); });
  }

  function lineage(nodes, roots) {
    lineageNodes = nodes;
    const el = document.getElementById("lineage");
    const byId = new Map(nodes.map(function (n) { return [n.id, n]; }));
    const yOf = function (n) { return n.scalar == null ? null : n.scalar; };
    const ex = [], ey = [];
    nodes.forEach(function (n) {
      const parent = byId.get(n.parent_id);
      if (parent && yOf(parent) != null && yOf(n) != null) {
        ex.push(parent.generation, n.generation, null);
        ey.push(yOf(parent), yOf(n), null);
      }
    });
    const shown = nodes.filter(function (n) { return yOf(n) != null; });
    Plotly.react(el, [
      { x: ex, y: ey, mode: "lines", type: "scatter", line: { color: "#bbb" }, hoverinfo: "skip", name: "parent" },
      { x: shown.map(function (n) { return n.generation; }), y: shown.map(yOf),
        customdata: shown.map(function (n) { return n.id; }), mode: "markers", type: "scatter", name: "program",
        marker: { size: shown.map(function (n) { return roots.indexOf(n.id) >= 0 ? 16 : 11; }),
                  color: shown.map(function (n) { return n.island; }), colorscale: "Viridis", line: { width: 1 } },
        hovertemplate: "program %{customdata}<br>generation %{x}<br>scalar %{y:.6g}<extra></extra>" }
    ], { height: 380, template: data.template, showlegend: false, hovermode: "closest",
         xaxis: { title: { text: "generation" } }, yaxis: { title: { text: "scalar" } },
         margin: { l: 60, r: 20, t: 20, b: 50 } }, config);
    el.removeAllListeners && el.removeAllListeners("plotly_click");
    el.on("plotly_click", function (ev) {
      const point = ev.points.find(function (pt) { return pt.customdata != null; });
      if (point) showProgram(point.customdata);
    });
    const list = document.getElementById("nodes");
    list.replaceChildren();
    nodes.slice().sort(function (a, b) { return b.generation - a.generation || a.id - b.id; }).forEach(function (n) {
      const b = document.createElement("button");
      b.type = "button";
      b.dataset.program = String(n.id);
      b.className = roots.indexOf(n.id) >= 0 ? "root" : "";
      b.textContent = "#" + n.id + " g" + n.generation + (n.scalar == null ? " error" : " " + n.scalar.toPrecision(4));
      b.addEventListener("click", function () { showProgram(n.id); });
      list.appendChild(b);
    });
  }

  function fill(d) {
    const box = document.getElementById("program");
    box.hidden = false;
    box.dataset.program = String(d.id);
    text("program-title", "Program " + d.id + " (island " + d.island + ", generation " + d.generation + ", parent " +
      (d.parent_id == null ? "none" : d.parent_id) + ", policy version " + (d.policy_version == null ? "-" :
      d.policy_version) + ", answer " + (d.slot == null ? "-" : d.slot) + " parsed " + (d.parse_status || "-") + ")");
    const scores = d.scores ? Object.keys(d.scores).map(function (k) { return k + " " + d.scores[k]; }).join(", ") : "";
    text("program-scores", "scalar " + d.scalar + " (" + (d.duration_s == null ? "-" : d.duration_s.toFixed(2)) +
      " s)\n" + scores);
    text("program-code", d.code);
    text("program-diff", d.diff == null ? "(no parent)" : d.diff);
    text("program-feedback", d.feedback);
    text("program-errors", [d.error_kind ? "error " + d.error_kind + ": " + (d.error || "") : "no error",
      (d.swallowed || []).length ? "raised into the evaluator:\n" + d.swallowed.join("\n") : "",
      "stdout:\n" + (d.stdout || ""), "stderr:\n" + (d.stderr || "")].filter(Boolean).join("\n"));
    text("program-completion", d.completion == null ? "(the seed, or a migrant: no completion)" : d.completion);
    text("program-prompt", d.prompt);
  }

  function showProgram(id) {
    if (!live) {
      const d = data.details[String(id)];
      if (d) fill(d); else text("lineage-note", "program " + id + " is not in this report; open it with evolve serve");
      return;
    }
    fetch("/api/program/" + encodeURIComponent(id) + "?run=" + runId).then(function (r) {
      if (!r.ok) throw new Error("program " + id + ": " + r.status);
      return r.json();
    }).then(fill).catch(function (e) { text("lineage-note", e.message); });
  }

  function lookup() {
    const id = Number(document.getElementById("lineage-id").value);
    if (!id) return;
    if (!live) {
      if (!data.details[String(id)]) { text("lineage-note", "program " + id + " is not in this report; use evolve serve"); return; }
      lineage(data.lineage.nodes, [id]);
      showProgram(id);
      return;
    }
    fetch("/api/lineage/" + id + "?run=" + runId).then(function (r) {
      if (!r.ok) throw new Error("no program " + id);
      return r.json();
    }).then(function (nodes) { text("lineage-note", ""); lineage(nodes, [id]); showProgram(id); })
      .catch(function (e) { text("lineage-note", e.message); });
  }

  // Views are drawn one per task: the first ones paint while the rest still wait, so a big run shows its
  // curves at once. body[data-first-paint] / body[data-ready] mark the two moments (tests and benchmarks).
  function steps() {
    const f = data.figures;
    return [
      function () { summary(); plot("best_eval", f.best_eval, "no successful evaluation yet"); },
      function () { plot("best_time", f.best_time, "no successful evaluation yet"); body.dataset.firstPaint = "true"; },
      function () { plot("components_eval", f.components_eval, "no component scores yet"); },
      function () { plot("components_time", f.components_time, "no component scores yet"); },
      function () { paretoAxes(); pareto(); },
      grids,
      function () { if (document.getElementById("lineage-id").value === "") lineage(data.lineage.nodes, data.lineage.roots); },
      function () { plot("errors", f.errors, "no evaluation yet"); },
      function () { plot("parse", f.parse, "no completion yet (the seed has no parse outcome)"); },
      function () { plot("throughput", f.throughput, "no evaluation yet"); },
      arms,
      function () { plot("policy", f.policy, "no policy version with statistics or children yet"); },
    ];
  }

  function draw(done) {
    const queue = steps();
    (function next() {
      const step = queue.shift();
      if (!step) { done(); return; }
      step();
      setTimeout(next, 0);
    })();
  }

  summary();
  document.addEventListener("DOMContentLoaded", function () {
    document.getElementById("pareto-x").addEventListener("change", pareto);
    document.getElementById("pareto-y").addEventListener("change", pareto);
    document.getElementById("lineage-go").addEventListener("click", lookup);
    draw(function () { body.dataset.ready = "true"; });
    if (live) { poll(); pollSampling(); }
  });

  // The group being sampled, as the run publishes it every 2 s (tokens so far, tokens/s, rows finished, elapsed).
  function pollSampling() {
    setInterval(function () {
      fetch("/api/sampling?run=" + runId).then(function (r) { return r.json(); })
        .then(function (s) { text("sampling", s.line); })
        .catch(function () { text("sampling", ""); });
    }, 2000);
  }

  function poll() {
    let key = data.key;
    setInterval(function () {
      fetch("/api/data?run=" + runId + "&key=" + encodeURIComponent(key || "")).then(function (r) {
        return r.status === 204 ? null : r.json();
      }).then(function (fresh) {
        if (!fresh) return;
        data = fresh;
        key = fresh.key;
        draw(function () {});
      }).catch(function () { text("status", "(server unreachable; retrying)"); });
    }, Number(body.dataset.refresh));
  }
})();
