/* dlopt dashboard: draws the server-built Plotly figures and keeps a run page live.
 *
 * Figures are embedded as <script type="application/json" id="fig-..."> (Django's
 * json_script) next to a <div data-figure="fig-...">. The run page polls its JSON
 * endpoint every 2 s and updates numbers, tables and charts in place
 * without reloading: the first answer and refreshes re-plot with Plotly.react, a changed poll that
 * sends back its cursor gets only what is new (Plotly.extendTraces). Everything stays readable without JS.
 */
(function () {
  "use strict";

  // On a narrow screen Plotly's toolbar sits over the chart title: leave it out there (pinch-zoom still works).
  var NARROW = window.matchMedia && window.matchMedia("(max-width: 760px)").matches;
  var PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["sendDataToCloud"],
                      displayModeBar: NARROW ? false : "hover" };
  var POLL_MS = 2000;

  function readFigure(id) {
    var el = document.getElementById(id);
    if (!el) return null;
    try { return JSON.parse(el.textContent); } catch (e) { return null; }
  }

  function plot(div, fig, react) {
    if (!window.Plotly || !fig) return;
    var fn = react && div.classList.contains("drawn") ? window.Plotly.react : window.Plotly.newPlot;
    fn(div, fig.data || [], fig.layout || {}, PLOT_CONFIG);
    div.classList.add("drawn");
  }

  function drawAll() {
    document.querySelectorAll("[data-figure]").forEach(function (div) {
      plot(div, readFigure(div.getAttribute("data-figure")), false);
    });
  }

  // --- team switcher: submit on change (the button stays for no-JS use) -------------------------
  function teamSwitcher() {
    document.querySelectorAll("form[data-autosubmit]").forEach(function (form) {
      form.querySelectorAll(".js-hide").forEach(function (b) { b.hidden = true; });
      var select = form.querySelector("select");
      if (select) select.addEventListener("change", function () { form.submit(); });
    });
  }

  // --- live run page --------------------------------------------------------------------------
  function td(text, cls) {
    var cell = document.createElement("td");
    if (cls) cell.className = cls;
    cell.textContent = text == null ? "" : String(text);
    return cell;
  }

  function badge(text, cls) {
    var span = document.createElement("span");
    span.className = "badge " + cls;
    span.textContent = text;
    return span;
  }

  function taskRow(t) {
    var tr = document.createElement("tr");
    tr.className = "task-" + t.status;
    tr.setAttribute("data-task", String(t.index));
    tr.appendChild(td(t.index, "num"));
    var name = td(""); var code = document.createElement("code"); code.textContent = t.name; name.appendChild(code);
    tr.appendChild(name);
    tr.appendChild(td(t.display.weight, "num"));
    tr.appendChild(td(t.display.flops, "num"));
    tr.appendChild(td(t.display.trials, "num"));
    tr.appendChild(td(t.display.best, "num"));
    tr.appendChild(td(t.display.gflops, "num"));
    var st = td(""); st.appendChild(badge(t.display.status, "task-status-" + t.status)); tr.appendChild(st);
    return tr;
  }

  function renderTasks(tbody, tasks) {
    if (!tbody || !tasks) return;
    var rows = document.createDocumentFragment();
    tasks.forEach(function (t) { rows.appendChild(taskRow(t)); });
    if (tasks.length) { tbody.replaceChildren(rows); }
  }

  // A delta's task rows: only those that changed, each replacing the row of its task index.
  function patchTasks(tbody, tasks) {
    if (!tbody || !tasks) return;
    tasks.forEach(function (t) {
      var old = tbody.querySelector('tr[data-task="' + t.index + '"]');
      if (old) old.replaceWith(taskRow(t)); else tbody.appendChild(taskRow(t));
    });
  }

  function roundRow(r) {
    var tr = document.createElement("tr");
    [r.round_index, r.task_index, r.dop, r.display.mean_error, r.n_candidates, r.n_remeasured, r.n_failures,
     r.display.measuring]
      .forEach(function (v) { tr.appendChild(td(v, "num")); });
    return tr;
  }

  function renderRounds(tbody, rounds) {
    if (!tbody || !rounds || !rounds.length) return;
    var rows = document.createDocumentFragment();
    rounds.forEach(function (r) { rows.appendChild(roundRow(r)); });
    tbody.replaceChildren(rows);
  }

  function appendRounds(tbody, rounds) {
    if (!tbody || !rounds) return;
    rounds.forEach(function (r) { tbody.appendChild(roundRow(r)); });
  }

  // Plotly.extendTraces with a delta's new points ({traces, x, y, relayout}); false if it could not.
  function extend(div, ext) {
    if (!ext || !ext.traces || !ext.traces.length) return true;
    if (!window.Plotly || !div || !div.classList.contains("drawn") || !div.data) return false;
    if (ext.traces.some(function (i) { return i >= div.data.length; })) return false;
    window.Plotly.extendTraces(div, { x: ext.x, y: ext.y }, ext.traces);
    if (ext.relayout && Object.keys(ext.relayout).length) window.Plotly.relayout(div, ext.relayout);
    return true;
  }

  // The most points one curve trace holds (the server re-sends the curve thinned past a limit).
  function curvePoints() {
    var div = document.querySelector("[data-figure=fig-curve]");
    if (!div || !div.data) return 0;
    return div.data.reduce(function (m, t) { return Math.max(m, (t.x || []).length); }, 0);
  }

  function fmtDuration(s) {
    if (s < 120) return s.toFixed(1) + " s";
    var m = Math.floor(Math.round(s) / 60), sec = Math.round(s) % 60;
    if (m < 120) return m + " min " + (sec < 10 ? "0" : "") + sec + " s";
    var h = Math.floor(m / 60), mm = m % 60;
    return h + " h " + (mm < 10 ? "0" : "") + mm + " min";
  }

  // A running run's wall time and time left tick every second between polls (the server sends when
  // the attempt began; wall_seconds grows only when an attempt ends).
  function tickWall() {
    var wall = document.getElementById("run-wall");
    var since = wall && wall.getAttribute("data-running-since");
    if (!since) return;
    var started = Date.parse(since);
    if (isNaN(started)) return;
    var elapsed = Number(wall.getAttribute("data-wall-base") || 0) + Math.max(0, (Date.now() - started) / 1000);
    wall.textContent = fmtDuration(elapsed) + " so far";
    var eta = document.getElementById("run-eta");
    var done = eta ? Number(eta.getAttribute("data-trials-done")) : 0;
    if (eta && done > 0) {
      var left = Math.max(0, Number(eta.getAttribute("data-max-trials")) - done) * elapsed / done;
      var budget = Number(eta.getAttribute("data-max-seconds"));  // the run's time budget, 0: none
      if (budget > 0) { left = Math.min(left, Math.max(0, budget - elapsed)); }
      eta.textContent = eta.textContent.replace(/^about .*? \(/, "about " + fmtDuration(left) + " (");
    }
  }

  function applyRun(root, run) {
    var d = run.display || {};
    document.querySelectorAll("[data-field]").forEach(function (el) {
      var key = el.getAttribute("data-field");
      if (Object.prototype.hasOwnProperty.call(d, key)) el.textContent = d[key];
    });
    var status = document.getElementById("run-status");
    if (status) status.className = "badge status-" + run.status;
    var fill = document.getElementById("progress-fill");
    if (fill) fill.style.width = (run.progress * 100).toFixed(1) + "%";
    var bar = document.getElementById("progress-bar");
    if (bar) bar.setAttribute("aria-valuenow", run.trials_done);
    var actions = run.actions || {};
    root.querySelectorAll("form[data-action]").forEach(function (f) {
      f.hidden = !actions[f.getAttribute("data-action")];
    });
    var err = document.getElementById("run-error");
    if (err) {
      err.hidden = !run.error;
      var pre = err.querySelector("[data-raw=error]");
      if (pre) pre.textContent = run.error || "";
    }
    var noEnergy = document.getElementById("energy-not-measured");
    if (noEnergy) noEnergy.hidden = !!run.energy;
    [["records", run.has_records], ["module", run.has_module], ["package", run.has_module]].forEach(function (pair) {
      var link = document.querySelector("[data-download=" + pair[0] + "]");
      var missing = document.querySelector("[data-download-missing=" + pair[0] + "]");
      if (link) link.hidden = !pair[1];
      if (missing) missing.hidden = !!pair[1];
    });
    var usage = document.getElementById("package-usage");
    if (usage) usage.hidden = !run.has_module;
    var wall = document.getElementById("run-wall");
    if (wall) {
      wall.setAttribute("data-running-since", run.running_since || "");
      wall.setAttribute("data-wall-base", String(run.wall_seconds || 0));
    }
    var eta = document.getElementById("run-eta");
    if (eta) {
      eta.setAttribute("data-trials-done", String(run.trials_done || 0));
      eta.setAttribute("data-max-trials", String(run.max_trials || 0));
    }
    tickWall();
    var gap = document.getElementById("estimate-gap");
    if (gap) gap.hidden = !d.estimate_gap;
  }

  function liveRun(root) {
    var url = root.getAttribute("data-live-url");
    var stamp = root.getAttribute("data-stamp") || "";
    var cursor = root.getAttribute("data-cursor") || "";
    var indicator = document.getElementById("live-indicator");
    var failures = 0;
    var timer = null;
    root.setAttribute("data-updates", "0");

    function say(text) { if (indicator) indicator.textContent = text; }

    function schedule(ms) { timer = window.setTimeout(poll, ms); }

    var etag = null;

    function settled(body) {
      if (body.run.is_terminal) {
        root.setAttribute("data-terminal", "1");
        say("finished · final state shown");
        return;
      }
      say("live · updated " + new Date().toLocaleTimeString());
      schedule(POLL_MS);
    }

    function count(attr) { root.setAttribute(attr, String(Number(root.getAttribute(attr) || "0") + 1)); }

    // A delta: append the new rounds and curve points, replace the changed task rows. If the figures
    // cannot be extended (not drawn), forget the cursor and stamp: the next poll gets the full payload.
    function applyDelta(body) {
      patchTasks(document.getElementById("tasks-body"), body.tasks);
      appendRounds(document.getElementById("rounds-body"), body.dop_rounds);
      var ext = body.extend || {};
      var ok = extend(document.querySelector("[data-figure=fig-curve]"), ext.curve);
      ok = extend(document.querySelector("[data-figure=fig-dop]"), ext.dop) && ok;
      cursor = ok ? (body.cursor || "") : "";
      if (!ok) stamp = "";
      count("data-deltas");
    }

    function apply(body) {
      applyRun(root, body.run);
      if (body.unchanged) return;
      stamp = body.stamp;
      if (body.mode === "delta") {
        applyDelta(body);
      } else {
        cursor = body.cursor || "";
        renderTasks(document.getElementById("tasks-body"), body.tasks);
        renderRounds(document.getElementById("rounds-body"), body.dop_rounds);
        var figs = body.figures || {};
        var curve = document.querySelector("[data-figure=fig-curve]");
        var dop = document.querySelector("[data-figure=fig-dop]");
        if (curve && figs.curve) plot(curve, figs.curve, true);
        if (dop && figs.dop) plot(dop, figs.dop, true);
        count("data-full-updates");
      }
      root.setAttribute("data-stamp", stamp);
      root.setAttribute("data-cursor", cursor);
      root.setAttribute("data-updates", String(Number(root.getAttribute("data-updates")) + 1));
    }

    // An unchanged run answers 304 (If-None-Match = the last ETag): nothing to parse or re-plot.
    // cache "no-store" hands the 304 to this code instead of replaying the browser's cached copy.
    function poll() {
      if (document.hidden) { schedule(POLL_MS); return; }
      var q = url + (url.indexOf("?") < 0 ? "?" : "&") + "stamp=" + encodeURIComponent(stamp);
      if (cursor) q += "&cursor=" + encodeURIComponent(cursor) + "&points=" + curvePoints();
      var headers = { Accept: "application/json" };
      if (etag) headers["If-None-Match"] = etag;
      fetch(q, { credentials: "same-origin", cache: "no-store", headers: headers })
        .then(function (resp) {
          if (resp.status === 304) return null;
          if (!resp.ok) throw new Error("HTTP " + resp.status);
          etag = resp.headers.get("ETag");
          return resp.json();
        })
        .then(function (body) {
          failures = 0;
          root.setAttribute("data-polls", String(Number(root.getAttribute("data-polls") || "0") + 1));
          if (body === null) {
            root.setAttribute("data-not-modified", String(Number(root.getAttribute("data-not-modified") || "0") + 1));
            say("live · unchanged " + new Date().toLocaleTimeString());
            schedule(POLL_MS);
            return;
          }
          apply(body);
          settled(body);
        })
        .catch(function (e) {
          failures += 1;
          say("connection problem (" + e.message + "), retrying…");
          schedule(Math.min(30000, POLL_MS * Math.pow(2, failures)));
        });
    }

    if (root.getAttribute("data-terminal") === "1") { say(""); return; }
    say("live");
    schedule(POLL_MS);
  }

  // --- GPU job form: predicted utilization / memory and the placing policy, before submitting ------
  function jobPreview(form) {
    var url = form.getAttribute("data-preview-url"), pending = null;
    function show(body) {
      var fmt = { util_pct: function (v) { return v == null ? "—" : v.toFixed(1) + " %"; },
                  mem_mb: function (v) { return v == null ? "—" : v.toFixed(0) + " MB"; },
                  predictor_version: function (v) { return v == null ? "none" : "v" + v; } };
      var note = document.getElementById("preview-note");
      if (note) { note.hidden = !body.note; note.textContent = body.note || ""; }
      form.querySelectorAll("[data-preview]").forEach(function (el) {
        var k = el.getAttribute("data-preview");
        if (k in body) el.textContent = fmt[k] ? fmt[k](body[k]) : String(body[k]);
      });
    }
    function preview() {
      var model = form.querySelector("#id_model"), batch = form.querySelector("#id_batch_size");
      var err = document.getElementById("preview-error");
      if (!batch.checkValidity()) {  // the input's own bounds (the form's): said now, no request made
        err.hidden = false;
        err.textContent = "Batch size: " + batch.validationMessage;
        return;
      }
      var q = url + "?model=" + encodeURIComponent(model.value) + "&batch_size=" + encodeURIComponent(batch.value);
      var kind = form.querySelector("#id_kind");
      if (kind && kind.value) q += "&kind=" + encodeURIComponent(kind.value);
      pending = q;
      fetch(q, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { return r.json().then(function (b) { return { ok: r.ok, body: b }; }); })
        .then(function (res) {
          if (q !== pending) return;
          err.hidden = res.ok;
          err.textContent = res.ok ? "" : (res.body.detail || "No prediction");
          if (res.ok) { show(res.body); form.setAttribute("data-previewed", "1"); }
        })
        .catch(function () { err.hidden = false; err.textContent = "Prediction unavailable right now."; });
    }
    form.querySelector("#id_model").addEventListener("change", preview);
    form.querySelector("#id_batch_size").addEventListener("input", preview);
    var kindField = form.querySelector("#id_kind");
    if (kindField) kindField.addEventListener("change", preview);
    preview();
  }

  // --- a queued or running simulation: poll its status (304 while unchanged), reload when done ------
  function simulationProgress(el) {
    var url = el.getAttribute("data-progress-url"), etag = null;
    var badgeEl = el.querySelector("[data-progress=status]"), text = el.querySelector("[data-progress=text]");
    function tick() {
      var headers = { Accept: "application/json" };
      if (etag) headers["If-None-Match"] = etag;
      fetch(url, { credentials: "same-origin", cache: "no-store", headers: headers })
        .then(function (r) {
          if (r.status === 304) return null;
          if (!r.ok) throw new Error("HTTP " + r.status);
          etag = r.headers.get("ETag");
          return r.json();
        })
        .then(function (b) {
          if (b) {
            el.setAttribute("data-status", b.status);
            badgeEl.textContent = b.status;
            badgeEl.className = "badge status-" + b.status;
            text.textContent = b.status === "queued" ? "waiting for a worker…" :
              (b.elapsed_s != null ? "running for " + Math.round(b.elapsed_s) + " s…" : b.status);
            if (b.terminal) { window.location.reload(); return; }
          }
          window.setTimeout(tick, POLL_MS);
        })
        .catch(function (e) { text.textContent = "connection problem (" + e.message + "), retrying…";
                              window.setTimeout(tick, POLL_MS * 4); });
    }
    window.setTimeout(tick, POLL_MS / 2);
  }

  // --- navigation: collapses behind a Menu button on narrow screens (CSS decides when) -----------
  function navToggle() {
    var button = document.querySelector(".nav-toggle");
    var bar = document.querySelector(".topbar");
    if (!button || !bar) return;
    bar.classList.add("js-nav");
    button.addEventListener("click", function () {
      var open = bar.classList.toggle("nav-open");
      button.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // --- start form: show only the options that apply, and the estimate for the chosen budget --------
  function startForm(form) {
    var estimates = readFigure("run-estimates") || {};
    var nodeCores = Number(form.getAttribute("data-node-cores") || 0);
    function val(name) { var el = form.elements[name]; return el ? el.value : ""; }
    function checkedValue(name) {
      var el = form.querySelector("input[name=" + name + "]:checked");
      return el ? el.value : "";
    }
    function fmtEnergy(j) {
      if (j >= 0.1 * 3.6e6) return (j / 3.6e6).toFixed(3) + " kWh";
      if (j >= 1000) return (j / 1000).toFixed(2) + " kJ";
      return j.toFixed(1) + " J";
    }
    function update() {
      var trimmer = form.elements.trimmer_enabled;
      var details = document.getElementById("trimmer-details");
      if (details && trimmer) details.hidden = !trimmer.checked;
      var fixed = document.getElementById("fixed-dop");
      if (fixed) fixed.hidden = checkedValue("dop_mode") !== "fixed";
      var note = document.getElementById("dop-note");
      if (note) {
        var threads = Number(val("threads")) || Number(val("num_cores")) || nodeCores;
        var one = val("target_kind") !== "cuda" && (!threads || (nodeCores > 0 && threads * 2 > nodeCores));
        note.hidden = !one;
        if (one && nodeCores > 0) {
          note.textContent = "Each measurement takes " + threads + " of the node's " + nodeCores + " cores, so no two " +
            "run at once: DOP stays 1 whatever is chosen here. Set fewer threads per measurement (at most " +
            Math.max(1, Math.floor(nodeCores / 2)) + ") to measure in parallel.";
        }
      }
      var text = document.getElementById("run-estimate-text");
      var entry = estimates[val("model")];
      if (text && entry) {
        var trials = parseInt(val("max_trials"), 10);
        if (!(trials > 0)) { text.textContent = "Estimate: give the number of trials."; return; }
        var time = entry.wall_s_per_trial ? "about " + fmtDuration(entry.wall_s_per_trial * trials) : "time unknown";
        text.textContent = "Estimate for " + trials.toLocaleString("en-US") + " trials: " + time + ", about " +
          fmtEnergy(entry.joules_per_trial * trials) + " (from " + entry.basis +
          (entry.tasks ? "; the model has " + entry.tasks + " tuning tasks" : "") + ").";
      }
    }
    form.addEventListener("change", update);
    form.addEventListener("input", update);
    update();
  }

  function start() {
    var startRun = document.getElementById("start-run-form");
    if (startRun) startForm(startRun);
    navToggle();
    teamSwitcher();
    drawAll();
    var live = document.getElementById("run-live");
    if (live) { liveRun(live); tickWall(); window.setInterval(tickWall, 1000); }
    var jobForm = document.getElementById("job-form");
    if (jobForm) jobPreview(jobForm);
    var simProgress = document.getElementById("sim-progress");
    if (simProgress) simulationProgress(simProgress);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
