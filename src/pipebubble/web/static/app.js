// pipebubble explorer: controls and requests. The server computes every number
// (GET /api/simulate returns exactly what `pipebubble simulate --json` prints); this script
// asks for it and charts.js draws it.
"use strict";

const $ = (id) => document.getElementById(id);
// name, label, slider min, max, step, default; "" default = empty (no value sent).
const PARAMS = [
  ["ranks", "p", 1, 32, 1, 4], ["microbatches", "m", 1, 256, 1, 8], ["chunks", "v", 1, 8, 1, 1],
  ["f", "F", 0, 10, 0.1, 1], ["b", "B", 0, 20, 0.1, 2], ["w", "W", 0, 10, 0.1, 1],
  ["comm", "comm", 0, 5, 0.05, 0], ["overlap", "overlap", 0.05, 1, 0.05, 1],
  ["mem_b", "M_B", 0, 10, 0.1, 1], ["mem_w", "M_W", 0, 10, 0.1, 0],
  ["memory_limit", "limit", 0, 64, 0.5, ""],
];
const state = { meta: null, seq: 0, controller: null, files: [], last: [] };

// ---- controls ----------------------------------------------------------------------------
function buildControls() {
  const sel = $("schedule");
  for (const s of state.meta.schedules) sel.append(el("option", { value: s.name }, s.name));
  sel.value = state.meta.defaults.schedule;
  const box = $("numbers");
  for (const [name, label, min, max, step, def] of PARAMS) {
    const row = el("div", { class: "row", id: "row-" + name });
    row.append(el("label", { for: name }, label));
    const slider = el("input", { type: "range", id: name + "-slider", min, max, step,
      value: def === "" ? max : def, "aria-label": label + " slider" });
    const input = el("input", { type: "number", id: name, name, min, step, value: def });
    if (def === "") input.placeholder = "none";
    slider.addEventListener("input", () => { input.value = slider.value; changed(); });
    input.addEventListener("input", () => { if (input.value !== "") slider.value = input.value; changed(); });
    row.append(slider, input);
    box.append(row);
  }
  const cmp = $("compare");
  for (const s of state.meta.schedules) {
    const label = el("label");
    const box2 = el("input", { type: "checkbox", value: s.name, class: "compare" });
    box2.addEventListener("change", changed);
    label.append(box2, el("span", { class: "swatch", style: "background:" + s.color }), s.name);
    cmp.append(label);
  }
  sel.addEventListener("change", () => { syncChunks(); changed(); });
  $("file").addEventListener("change", loadFiles);
  $("clear-files").addEventListener("click", () => { state.files = []; $("file").value = ""; changed(); });
  $("download-svg").addEventListener("click", () => download(viewSvg(), "pipebubble.svg"));
  $("download-png").addEventListener("click", downloadPng);
  $("version").textContent = state.meta.version;
  syncChunks();
}

function syncChunks() {  // v is the schedule's own when the family fixes it
  const s = spec($("schedule").value);
  $("summary").textContent = s.summary;
  const row = $("row-chunks");
  row.classList.toggle("disabled", s.fixed_chunks);
  $("chunks").disabled = $("chunks-slider").disabled = s.fixed_chunks;
  if (s.chunks === null) {  // auto: empty v lets the search choose the placement
    $("chunks").value = "";
  } else if (s.fixed_chunks || $("chunks").value === "" || Number($("chunks").value) < s.min_chunks) {
    $("chunks").value = $("chunks-slider").value = s.fixed_chunks ? s.chunks : Math.max(s.min_chunks, s.chunks);
  }
}

function query(name) {  // the API's parameters for schedule `name`
  const q = new URLSearchParams({ schedule: name });
  const s = spec(name);
  for (const [param] of PARAMS) {
    const v = $(param).value.trim();
    if (v === "") continue;
    if (param === "chunks") {  // compared schedules keep their own v where v is theirs
      if (s.fixed_chunks || (s.chunks === null && name !== $("schedule").value)) continue;
      q.set(param, String(Math.max(Number(v), s.min_chunks)));
    } else q.set(param, v);
  }
  return q;
}

// ---- fetching ----------------------------------------------------------------------------
let timer = null;
function changed() {  // debounced: one request burst per pause in the input
  clearTimeout(timer);
  timer = setTimeout(update, 120);
}

async function getJson(url, options, signal) {
  const resp = await fetch(url, { ...options, signal });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

async function update() {
  const seq = ++state.seq;
  if (state.controller) state.controller.abort();
  const controller = state.controller = new AbortController();
  document.body.dataset.state = "loading";
  const main = $("schedule").value;
  const others = [...document.querySelectorAll(".compare:checked")].map((c) => c.value)
    .filter((n) => n !== main);
  const names = [main, ...others];
  saveHash(main);
  $("download-csv").href = "/api/csv?" + query(main);
  $("download-csv").download = main + ".csv";
  $("download-trace").href = "/api/trace?" + query(main);
  $("download-trace").download = main + ".trace.json";
  const jobs = names.map((n) => getJson("/api/simulate?" + query(n), {}, controller.signal)
    .then((data) => ({ name: n, data }), (err) => ({ name: n, error: err })));
  const fileJobs = state.files.map((f) => f.tooBig ? { name: f.name, error: new Error(f.tooBig), file: f } : getJson("/api/simulate?name=" + encodeURIComponent(f.name)
    + "&" + query(main), { method: "POST", body: f.text }, controller.signal)
    .then((data) => ({ name: f.name, data, file: f }), (err) => ({ name: f.name, error: err, file: f })));
  const sweeps = names.map((n) => getJson("/api/sweep?" + query(n), {}, controller.signal)
    .then((data) => data, () => null));
  const results = await Promise.all([...jobs, ...fileJobs]);
  const sweepData = await Promise.all(sweeps);
  if (seq !== state.seq) return;  // a newer request is on its way
  if (results.some((r) => r.error && r.error.name === "AbortError")) return;
  render(results, sweepData.filter(Boolean));
  document.body.dataset.state = "ready";
  document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
}

async function loadFiles(event) {
  const most = state.meta.limits.max_body_bytes;
  for (const file of event.target.files) {
    if (file.size > most) {  // the server would refuse it (413): say so without sending it
      state.files.push({ name: file.name, tooBig:
        `${file.name} is ${file.size} bytes; the explorer takes files of at most ${most} bytes` });
      continue;
    }
    state.files.push({ name: file.name, text: await file.text() });
  }
  $("clear-files").hidden = state.files.length === 0;
  changed();
}

// ---- drawing -----------------------------------------------------------------------------
function render(results, sweeps) {
  const first = results[0];
  $("error").hidden = !first.error;
  $("error").textContent = first.error ? first.error.message : "";
  const d = first.data;
  $("step-time").textContent = d ? fmt(d.step_time) : "–";
  $("bubble").textContent = d ? pct(d.bubble_fraction) : "–";
  $("closed-form").textContent = d && d.closed_form_bubble !== null ? pct(d.closed_form_bubble) : "none";
  $("formula").textContent = spec(first.name).formula || "(no closed form for this schedule)";
  // ZB-H2, ZB-V...: the published form is over the idlest rank's own span, not the step
  $("basis").textContent = d && d.closed_form_basis === "span"
    ? "measured within a rank's span: the idlest rank idles " + pct(d.span_bubble_fraction) : "";
  $("peak-memory").textContent = d ? d.per_rank.map((r) => fmt(r.peak_memory)).join(" · ") : "–";
  // a measured run gets its prediction (server-side, from its own medians) right after it
  results = results.flatMap((r) => r.data && r.data.predicted_timeline ? [r, { name: r.name + " · predicted",
    data: r.data.predicted_timeline, file: r.file, predicted: true }] : [r]);
  const simulated = results.filter((r) => r.data && !r.file);
  const scale = Math.max(...simulated.map((r) => r.data.step_time), 1e-12);
  const panels = $("panels");
  panels.replaceChildren();
  state.last = results;
  const fileSpan = (r) => Math.max(...results.filter((x) => x.file === r.file && x.data)
    .map((x) => x.data.step_time));  // a run and its prediction share one time scale
  for (const r of results) panels.append(panel(r, r.file ? fileSpan(r) : scale));
  $("clear-files").hidden = state.files.length === 0;
  $("legend").replaceChildren(...legend(results, limit()));
  $("sweep").replaceChildren(sweepChart(sweeps, Number($("microbatches").value)));
}

function limit() {
  const v = $("memory_limit").value.trim();
  return v === "" ? null : Number(v);
}

function panel(r, span) {
  const box = el("div", { class: "panel", "data-name": r.name });
  const color = r.file ? "#999" : spec(r.name).color;
  const h = el("h3");
  h.append(el("span", { class: "swatch", style: "background:" + color }),
    r.file && !r.predicted ? r.name + " (" + (r.data ? r.data.source : "file") + ")" : r.name);
  box.append(h);
  if (r.error) {
    box.append(el("div", { class: "panel-error" }, r.error.message));
    return box;
  }
  const d = r.data;
  const stats = el("div", { class: "stats" });
  const peaks = d.per_rank.map((x) => x.peak_memory);
  const lim = limit();
  const unit = ["measured", "predicted"].includes(d.source) ? " s" : "";  // runs: seconds
  stats.innerHTML = "p=" + d.ranks + " m=" + d.microbatches + " stages=" + d.stages +
    " · step time <b>" + fmt(d.step_time) + unit + "</b> · bubble <b class=bubble>" + pct(d.bubble_fraction) +
    "</b> · closed form " + pct(d.closed_form_bubble) +
    (d.closed_form_basis === "span" ? " (span bubble " + pct(d.span_bubble_fraction) + ")" : "") +
    " · peak memory <b class=peak>" +
    peaks.map(fmt).join(" · ") + "</b>";
  box.append(stats);
  if (lim !== null) {
    // the server's verdict when it gives one (simulate --json with a limit), else the peaks'
    const over = Array.isArray(d.over_limit_ranks) ? d.over_limit_ranks
      : peaks.map((x, i) => [x, i]).filter(([x]) => x > lim + 1e-9).map(([, i]) => i);
    box.append(el("div", { class: over.length ? "over fits" : "fits" }, over.length
      ? "does not fit the memory limit " + fmt(lim) + " on rank(s) " + over.join(", ")
      : "fits the memory limit " + fmt(lim) + " on every rank"));
  }
  if (d.predicted) box.append(predictedTable(d));
  box.append(gantt(d, span), memoryChart(d, span, lim));
  if (r.file && !r.predicted) {
    const b = el("button", { type: "button" }, "Perfetto trace of this file");
    b.addEventListener("click", async () => {
      const resp = await fetch("/api/trace?name=" + encodeURIComponent(r.name) + "&" + query($("schedule").value),
        { method: "POST", body: r.file.text });
      download(await resp.blob(), r.name.replace(/\.\w+$/, "") + ".trace.json");
    });
    box.append(b);
  }
  return box;
}

function predictedTable(d) {  // a measured run (run --json) next to its prediction
  const t = el("table", { class: "predicted" });
  t.innerHTML = "<tr><th></th><th>measured</th><th>predicted</th></tr>";
  const rows = [["step time", fmt(d.step_time), fmt(d.predicted.step_time)],
    ["bubble", pct(d.bubble_fraction), pct(d.predicted.bubble_fraction)]];
  for (const row of rows) {
    const tr = el("tr");
    tr.innerHTML = row.map((x) => "<td>" + x + "</td>").join("");
    t.append(tr);
  }
  return t;
}

// ---- start -------------------------------------------------------------------------------
// The view lives in the address (#schedule=1f1b&ranks=8&compare=zb-h1): reload keeps it and
// a link shares it. Unknown names and values are left to the server to judge.
function saveHash(main) {
  const q = query(main);
  const others = [...document.querySelectorAll(".compare:checked")].map((c) => c.value);
  if (others.length) q.set("compare", others.join(","));
  history.replaceState(null, "", "#" + q);
}
function loadHash() {
  const q = new URLSearchParams(location.hash.slice(1));
  if (q.has("schedule") && spec(q.get("schedule"))) $("schedule").value = q.get("schedule");
  syncChunks();
  for (const [param] of PARAMS) {
    if (!q.has(param) || $(param).disabled) continue;
    $(param).value = q.get(param);
    if (q.get(param) !== "") $(param + "-slider").value = q.get(param);
  }
  const others = (q.get("compare") || "").split(",");
  for (const box of document.querySelectorAll(".compare")) box.checked = others.includes(box.value);
}

// First paint: the server inlines the first view (api.initial_view: the metadata and the
// default schedule's simulation and sweep), so the page draws a schedule before any request;
// then it asks as usual. A link with another view (#...) waits for its own answer.
function start(meta, initial) {
  state.meta = meta;
  buildControls();
  loadHash();
  if (initial && query($("schedule").value).toString() === initial.query
      && !document.querySelector(".compare:checked")) {
    render([{ name: initial.name, data: initial.simulation }], initial.sweep ? [initial.sweep] : []);
    document.body.dataset.state = "ready";
    document.body.dataset.firstPaint = "inline";
  }
  update();
}

const inlined = (() => {
  try { return JSON.parse($("initial").textContent || "null"); } catch (e) { return null; }
})();
if (inlined && inlined.meta) start(inlined.meta, inlined);
else fetch("/api/meta").then((r) => r.json()).then((meta) => start(meta, null));
