// The board page: filters, sorts and draws the data publish embedded (#board-data).
// Nothing is fetched; every number comes from that JSON (computed in evalkit/leaderboard/page.py).
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("board-data").textContent);
  var PLOT_CONFIG = {displaylogo: false, responsive: true};

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmt(x, digits) { return x === null || x === undefined ? "—" : x.toFixed(digits); }
  function fmtSigned(x) { return x === null || x === undefined ? "—" : (x >= 0 ? "+" : "") + x.toFixed(2); }
  function fmtLen(n) {
    if (n === null || n === undefined) return "—";
    return n >= 1024 && n % 1024 === 0 ? (n / 1024) + "K" : String(n);
  }
  function fmtBytes(b) {
    if (b === null || b === undefined) return "—";
    var units = ["B", "KB", "MB", "GB"], i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : 1)) + " " + units[i];
  }
  function uniq(rows, key) {
    var seen = {}, out = [];
    rows.forEach(function (r) { var v = r[key]; if (!(String(v) in seen)) { seen[String(v)] = 1; out.push(v); } });
    return out.sort(function (a, b) { return typeof a === "number" ? a - b : String(a).localeCompare(String(b)); });
  }
  // What a recall cell says on hover: n (attempted: a failure is a miss), interval, failures
  // and what was not attempted (flagged).
  function cellInfo(r) {
    var parts = [];
    if (r.n > 0) parts.push("recall " + fmt(r.recall, 3) + ", n = " + r.n +
                            ", 95 % interval [" + fmt(r.lo, 2) + ", " + fmt(r.hi, 2) + "]");
    else parts.push("nothing attempted (n = 0)");
    if (r.n_flagged) parts.push(r.n_flagged + " flagged");
    if (r.n_failed) parts.push(r.n_failed + " failed");
    return parts.join("; ");
  }

  // -- a sortable table ----------------------------------------------------------------------
  // columns: {key, label, num, render(row) -> text, title(row) -> hover, cls(row)}
  function sortableTable(table, columns, rowClass) {
    var state = {rows: [], key: null, dir: 1};
    var thead = el("thead"), tr = el("tr"), tbody = el("tbody");
    columns.forEach(function (c) {
      var th = el("th", {"data-key": c.key, "class": c.num ? "num" : "", title: "sort by " + c.label}, c.label);
      th.addEventListener("click", function () {
        state.dir = state.key === c.key ? -state.dir : 1;
        state.key = c.key;
        Array.prototype.forEach.call(tr.children, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
        draw();
      });
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    table.appendChild(thead);
    table.appendChild(tbody);
    function cmp(a, b) {
      var x = a[state.key], y = b[state.key];
      if (x === null || x === undefined) return (y === null || y === undefined) ? 0 : 1;  // empty last
      if (y === null || y === undefined) return -1;
      if (typeof x === "number" && typeof y === "number") return state.dir * (x - y);
      return state.dir * String(x).localeCompare(String(y));
    }
    function draw() {
      var rows = state.rows.slice();
      if (state.key) rows = rows.map(function (r, i) { return [r, i]; })
        .sort(function (a, b) { return cmp(a[0], b[0]) || a[1] - b[1]; })  // stable
        .map(function (p) { return p[0]; });
      var frag = document.createDocumentFragment();
      rows.forEach(function (r) {
        var row = el("tr", rowClass ? {"class": rowClass(r)} : {});
        columns.forEach(function (c) {
          var td = el("td", {"class": (c.num ? "num " : "") + (c.cls ? c.cls(r) : "")},
                      c.render ? c.render(r) : r[c.key]);
          if (c.title) td.title = c.title(r);
          row.appendChild(td);
        });
        frag.appendChild(row);
      });
      tbody.replaceChildren(frag);
    }
    return {set: function (rows) { state.rows = rows; draw(); }};
  }

  // -- header ----------------------------------------------------------------------------------
  document.getElementById("summary").textContent =
    D.rows.length + (D.rows.length === 1 ? " row" : " rows") + " from " + D.n_runs + " run(s), the latest from " + D.latest +
    "; published by evalkit " + D.version + ". Generated from the same rows as results.csv.";

  // -- reference models: hidden by default beside language models ---------------------------------
  // They bound a task (oracle keeps every token, forgetful a fixed n-gram memory); a board of
  // references only shows them, since nothing else would be left.
  var REFS = {};
  D.references.forEach(function (m) { REFS[m] = 1; });
  var allModels = uniq(D.rows, "model_label");
  var hasModels = allModels.some(function (m) { return !(m in REFS); });
  var refBox = document.getElementById("show-references");
  refBox.checked = !hasModels;
  document.getElementById("reference-names").textContent = D.references.join(", ");
  if (!D.references.length || !hasModels) document.getElementById("references-toggle").hidden = true;
  function shown(m) { return refBox.checked || !(m in REFS); }

  // -- results table with filters ----------------------------------------------------------------
  var FILTERS = [["task_label", "task"], ["model_label", "model"], ["state_kind", "state kind"],
                 ["target_length", "length"], ["depth", "depth"], ["load", "load"]];
  var resultCols = [
    {key: "task_label", label: "task"},
    {key: "model_label", label: "model"},
    {key: "state_kind", label: "state kind"},
    {key: "target_length", label: "length (tok)", num: true, render: function (r) { return fmtLen(r.target_length); }},
    {key: "depth", label: "depth", num: true},
    {key: "load", label: "load", num: true},
    {key: "recall", label: "recall", num: true, render: function (r) { return r.n > 0 ? fmt(r.recall, 2) : "—"; },
     title: cellInfo, cls: function (r) { return r.n > 0 ? "recall" : "empty"; }},
    {key: "lo", label: "95 % interval", num: true, title: cellInfo,
     render: function (r) { return r.n > 0 ? "[" + fmt(r.lo, 2) + ", " + fmt(r.hi, 2) + "]" : "—"; }},
    {key: "n", label: "n", num: true, title: cellInfo},
    {key: "n_flagged", label: "flagged", num: true},
    {key: "n_failed", label: "failed", num: true},
    {key: "state_bytes", label: "state bytes", num: true, render: function (r) { return fmtBytes(r.state_bytes); },
     title: function (r) { return r.state_bytes === null ? "" : r.state_bytes.toFixed(0) + " bytes"; }},
    {key: "prompt_tokens", label: "prompt tokens", num: true, render: function (r) { return fmt(r.prompt_tokens, 0); }},
    {key: "primary_metric", label: "metric"}
  ];
  var results = sortableTable(document.getElementById("results-table"), resultCols);
  var chosen = {};
  var filterBox = document.getElementById("filters");
  FILTERS.forEach(function (f) {
    var label = el("label", {}, f[1]);
    var sel = el("select", {id: "filter-" + f[0], "data-key": f[0]});
    sel.appendChild(el("option", {value: ""}, "all"));
    uniq(D.rows, f[0]).forEach(function (v) {
      sel.appendChild(el("option", {value: String(v)}, f[0] === "target_length" ? fmtLen(v) : v));
    });
    sel.addEventListener("change", function () { chosen[f[0]] = sel.value; applyFilters(); });
    label.appendChild(sel);
    filterBox.appendChild(label);
  });
  function applyFilters() {
    var rows = D.rows.filter(function (r) {
      return shown(r.model_label) &&
        FILTERS.every(function (f) { var v = chosen[f[0]]; return !v || String(r[f[0]]) === v; });
    });
    results.set(rows);
    document.getElementById("row-count").textContent = rows.length + " of " + D.rows.length + " rows shown" +
      (refBox.checked || !D.references.length ? "" : " (reference models hidden)");
  }

  // -- heatmaps ----------------------------------------------------------------------------------
  var tasks = uniq(D.rows, "task_label");
  var modelSel = document.getElementById("heatmap-model");
  // Start on the model with cells on the most tasks, a model with a state (the board's
  // subject) before one without, so the first view has heatmaps rather than empty tasks.
  var STATEFUL = {recurrent: 2, hybrid: 1};
  function taskCount(m) { return uniq(D.rows.filter(function (r) { return r.model_label === m; }), "task_label").length; }
  function fillModels() {
    var keep = modelSel.value;
    var models = allModels.filter(shown);
    modelSel.replaceChildren();
    models.forEach(function (m) { modelSel.appendChild(el("option", {value: m}, m)); });
    var best = models.slice().sort(function (a, b) {
      return taskCount(b) - taskCount(a) || (STATEFUL[D.kinds[b]] || 0) - (STATEFUL[D.kinds[a]] || 0) ||
             a.localeCompare(b);
    })[0];
    modelSel.value = models.indexOf(keep) >= 0 ? keep : best;
  }
  function heatmap(div, cells, axis, axisLabel, model, task) {
    var xs = uniq(cells, "target_length"), ys = uniq(cells, axis);
    var z = ys.map(function () { return xs.map(function () { return null; }); });
    var blank = function () { return ys.map(function () { return xs.map(function () { return ""; }); }); };
    var label = blank(), hover = blank();  // the cell's label; what hovering it says
    cells.forEach(function (c) {
      var i = ys.indexOf(c[axis]), j = xs.indexOf(c.target_length);
      z[i][j] = c.n > 0 ? c.recall : null;
      label[i][j] = c.n > 0 ? fmt(c.recall, 2) : "— (" + (c.n_flagged ? c.n_flagged + " flagged" : "n = 0") + ")";
      hover[i][j] = model + "<br>" + task + ", length " + fmtLen(c.target_length) + ", " + axis + " " +
                    c[axis] + "<br>" + cellInfo(c);
    });
    var trace = {type: "heatmap", x: xs.map(fmtLen), y: ys.map(String), z: z, text: label,
                 customdata: hover, zmin: 0, zmax: 1, colorscale: "Viridis", hoverongaps: true,
                 texttemplate: "%{text}", hovertemplate: "%{customdata}<extra></extra>",
                 colorbar: {title: {text: "recall"}, thickness: 12}};
    Plotly.react(div, [trace], {
      title: {text: task + ": length x " + axisLabel, font: {size: 14}, x: 0.01, xanchor: "left"},
      margin: {l: 60, r: 20, t: 40, b: 50},
      xaxis: {title: {text: "length (tokens)"}, type: "category"},
      yaxis: {title: {text: axisLabel}, type: "category"}
    }, PLOT_CONFIG);
  }
  var heatList = document.getElementById("heatmap-list");
  function drawHeatmaps() {
    var model = modelSel.value;
    heatList.replaceChildren();
    tasks.forEach(function (task) {
      var byDepth = D.by_depth.filter(function (c) { return c.task_label === task && c.model_label === model; });
      var byLoad = D.by_load.filter(function (c) { return c.task_label === task && c.model_label === model; });
      heatList.appendChild(el("h3", {}, task));
      if (!byDepth.length) { heatList.appendChild(el("p", {"class": "note"}, model + " has no cells on " + task + ".")); return; }
      var box = el("div", {"class": "charts"});
      var a = el("div", {"class": "chart heatmap", "data-task": task, "data-axis": "depth"});
      var b = el("div", {"class": "chart heatmap", "data-task": task, "data-axis": "load"});
      box.appendChild(a); box.appendChild(b);
      heatList.appendChild(box);
      heatmap(a, byDepth, "depth", "depth", model, task);
      heatmap(b, byLoad, "load", "load (facts)", model, task);
    });
  }
  modelSel.addEventListener("change", drawHeatmaps);

  // -- recall vs. state bytes ------------------------------------------------------------------------
  var stateList = document.getElementById("state-list");
  function stateChart(task, pts) {
    stateList.appendChild(el("h3", {}, task));
    if (!pts.length) { stateList.appendChild(el("p", {"class": "note"}, "No state bytes recorded on " + task + ".")); return; }
    var traces = uniq(pts, "model_label").map(function (m) {
      var g = pts.filter(function (p) { return p.model_label === m; })
        .sort(function (a, b) { return a.state_bytes - b.state_bytes; });
      return {type: "scatter", mode: "lines+markers", name: m + (D.kinds[m] ? " (" + D.kinds[m] + ")" : ""),
              x: g.map(function (p) { return p.state_bytes; }), y: g.map(function (p) { return p.recall; }),
              error_y: {type: "data", symmetric: false, thickness: 1,
                        array: g.map(function (p) { return p.hi - p.recall; }),
                        arrayminus: g.map(function (p) { return p.recall - p.lo; })},
              text: g.map(function (p) { return m + "<br>length " + fmtLen(p.target_length) + ", " +
                                                  fmtBytes(p.state_bytes) + "<br>" + cellInfo(p); }),
              hovertemplate: "%{text}<extra></extra>"};
    });
    var div = el("div", {"class": "chart wide state-chart", "data-task": task});
    stateList.appendChild(div);
    Plotly.react(div, traces, {
      margin: {l: 60, r: 20, t: 20, b: 50}, hovermode: "closest",
      xaxis: {title: {text: "bytes held at the question (log)"}, type: "log"},
      yaxis: {title: {text: "recall"}, range: [-0.05, 1.05]},
      showlegend: true, legend: {font: {size: 11}}  // named even with one model
    }, PLOT_CONFIG);
  }
  // The page opens here: the tasks most models answered first (MQAR's and the prose twins'
  // sweeps on the standard board), then the rest.
  function drawState() {
    stateList.replaceChildren();
    var pts = D.state.filter(function (p) { return shown(p.model_label) && p.n > 0 && p.state_bytes !== null; });
    function of(t) { return pts.filter(function (p) { return p.task_label === t; }); }
    function nModels(t) { return uniq(of(t), "model_label").length; }
    tasks.slice().sort(function (a, b) { return nModels(b) - nModels(a) || a.localeCompare(b); })
      .forEach(function (t) { stateChart(t, of(t)); });
  }
  function drawAll() { drawState(); applyFilters(); fillModels(); drawHeatmaps(); }
  refBox.addEventListener("change", drawAll);
  drawAll();

  // -- gap table --------------------------------------------------------------------------------------
  function excludesZero(g) { return g.ci_low !== null && g.ci_high !== null && (g.ci_low > 0 || g.ci_high < 0); }
  document.getElementById("gap-note").textContent = D.gaps.length ?
    "Paired over the same probes and questions, pooled over depth and load, in the task's primary metric and, " +
    "beside it, its other one (forced choice beside a generated answer's recall); 95 % paired bootstrap interval (" +
    D.gap_options.n_boot + " resamples, seed " + D.gap_options.seed + "). Bold with *: the interval excludes 0. " +
    "Every (length, depth, load) cell is in gaps.csv." :
    "Not computed: no baseline/model pair answered the same probes.";
  var gapCols = [
    {key: "baseline", label: "baseline"}, {key: "model", label: "model"}, {key: "task_label", label: "task"},
    {key: "target_length", label: "length (tok)", num: true, render: function (g) { return fmtLen(g.target_length); }},
    {key: "n_pairs", label: "pairs", num: true},
    {key: "baseline_recall", label: "baseline recall", num: true, render: function (g) { return fmt(g.baseline_recall, 2); }},
    {key: "model_recall", label: "model recall", num: true, render: function (g) { return fmt(g.model_recall, 2); }},
    {key: "gap", label: "gap", num: true, cls: function () { return "gap"; },
     render: function (g) { return fmtSigned(g.gap) + (excludesZero(g) ? " *" : ""); }},
    {key: "ci_low", label: "95 % interval", num: true,
     render: function (g) { return "[" + fmtSigned(g.ci_low) + ", " + fmtSigned(g.ci_high) + "]"; },
     title: function (g) { return excludesZero(g) ? "excludes 0" : "includes 0"; }},
    {key: "metric", label: "metric"},
    // the task's other metric beside the primary (forced choice beside a generated answer's
    // recall): a model can lose a fact in one and keep it in the other
    {key: "other_gap", label: "other metric: gap [95 % interval]", num: true,
     render: function (g) {
       if (!g.other_metric || g.other_gap === null) { return "-"; }
       var o = {ci_low: g.other_ci_low, ci_high: g.other_ci_high};
       return g.other_metric + " " + fmtSigned(g.other_gap) + (excludesZero(o) ? " *" : "") +
         " [" + fmtSigned(g.other_ci_low) + ", " + fmtSigned(g.other_ci_high) + "]";
     },
     title: function (g) {
       return g.other_metric && g.other_gap !== null ? g.other_n_pairs + " pairs; baseline " +
         fmt(g.other_baseline_recall, 2) + ", model " + fmt(g.other_model_recall, 2) : "no other metric";
     }}
  ];
  if (D.gaps.length) {
    sortableTable(document.getElementById("gap-table"), gapCols,
                  function (g) { return excludesZero(g) ? "sig" : ""; }).set(D.gaps);
  }

  // -- provenance ---------------------------------------------------------------------------------------
  var prov = document.getElementById("provenance-body");
  function simpleTable(header, rows) {
    var t = el("table", {"class": "data"}), h = el("tr");
    header.forEach(function (c) { h.appendChild(el("th", {}, c)); });
    var thead = el("thead"); thead.appendChild(h); t.appendChild(thead);
    var body = el("tbody");
    rows.forEach(function (r) {
      var tr = el("tr");
      r.forEach(function (c) { var td = el("td", c && c.hash ? {"class": "hash"} : {}, c && c.hash ? c.hash : c); tr.appendChild(td); });
      body.appendChild(tr);
    });
    t.appendChild(body);
    var box = el("div", {"class": "scroll"}); box.appendChild(t);
    return box;
  }
  function kv(obj) {
    if (!obj || typeof obj !== "object") return obj === null || obj === undefined ? "" : String(obj);
    return Object.keys(obj).sort().map(function (k) {
      var v = obj[k];
      return k + "=" + (v !== null && typeof v === "object" ? JSON.stringify(v) : v);
    }).join(", ");
  }
  prov.appendChild(el("h3", {}, "Runs"));
  prov.appendChild(simpleTable(["run", "created", "evalkit", "config hash", "git commit", "seeds", "python", "folder"],
    D.provenance.runs.map(function (r) {
      return [r.run_id, r.created, r.evalkit_version, {hash: r.config_hash},
              {hash: r.git ? (r.git.commit || "") + (r.git.dirty ? " (dirty)" : "") : ""},
              kv(r.seeds), r.python || "", r.path];
    })));
  prov.appendChild(el("h3", {}, "Packages"));
  prov.appendChild(simpleTable(["run", "packages"], D.provenance.runs.map(function (r) { return [r.run_id, kv(r.packages)]; })));
  prov.appendChild(el("h3", {}, "Models"));
  prov.appendChild(simpleTable(["model", "kind", "identity hash", "weights hash", "tokenizer hash", "identity"],
    D.provenance.models.map(function (m) {
      var rest = {};
      Object.keys(m.identity).forEach(function (k) { if (!/_hash$/.test(k)) rest[k] = m.identity[k]; });
      return [m.model, m.kind, {hash: m.hash}, {hash: m.identity.weights_hash || ""},
              {hash: m.identity.tokenizer_hash || ""}, kv(rest)];
    })));
  prov.appendChild(el("h3", {}, "Tasks"));
  prov.appendChild(simpleTable(["task", "version", "config hash", "primary metric", "source"],
    D.provenance.tasks.map(function (t) {
      return [t.task, t.version, {hash: t.config_hash}, t.primary_metric, t.source];
    })));
})();
