// pipebubble explorer. The server computes every number (GET /api/simulate returns exactly
// what `pipebubble simulate --json` prints); this script only asks and draws.
"use strict";

const $ = (id) => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
// name, label, slider min, max, step, default; "" default = empty (no value sent).
const PARAMS = [
  ["ranks", "p", 1, 32, 1, 4], ["microbatches", "m", 1, 256, 1, 8], ["chunks", "v", 1, 8, 1, 1],
  ["f", "F", 0, 10, 0.1, 1], ["b", "B", 0, 20, 0.1, 2], ["w", "W", 0, 10, 0.1, 1],
  ["comm", "comm", 0, 5, 0.05, 0], ["overlap", "overlap", 0.05, 1, 0.05, 1],
  ["mem_b", "M_B", 0, 10, 0.1, 1], ["mem_w", "M_W", 0, 10, 0.1, 0],
  ["memory_limit", "limit", 0, 64, 0.5, ""],
];
const state = { meta: null, seq: 0, controller: null, files: [], last: [] };

function el(tag, attrs = {}, text = "") {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== "") node.textContent = text;
  return node;
}
const fmt = (x) => (x === null || x === undefined) ? "–" : String(Number(Number(x).toPrecision(4)));
const pct = (x) => (x === null || x === undefined) ? "–" : (100 * x).toFixed(2) + " %";
const spec = (name) => state.meta.schedules.find((s) => s.name === name);

// ---- colours: the PNG renderer's (render/style.py), served by /api/meta -------------------
function hexRgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255].map((c) => c / 255);
}
function kindColor(kind, chunk, chunks) {  // same rule as style.kind_color
  const c = state.meta.colors;
  let rgb = hexRgb(c.kinds[kind] || c.fallback);
  if (chunks > 1 && chunk > 0) {
    const k = 1 - c.chunk_darkening * chunk / (chunks - 1);
    rgb = rgb.map((x) => x * k);
  }
  return rgb;
}
const css = (rgb) => "rgb(" + rgb.map((x) => Math.round(255 * x)).join(",") + ")";
const textColor = (rgb) => 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2] > 0.5 ? "black" : "white";

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
  if (s.fixed_chunks || Number($("chunks").value) < s.min_chunks) {
    $("chunks").value = $("chunks-slider").value = s.fixed_chunks ? s.chunks : Math.max(s.min_chunks, s.chunks);
  }
}

function query(name) {  // the API's parameters for schedule `name`
  const q = new URLSearchParams({ schedule: name });
  const s = spec(name);
  for (const [param] of PARAMS) {
    const v = $(param).value.trim();
    if (v === "") continue;
    if (param === "chunks") {
      if (s.fixed_chunks) continue;
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
  $("sweep").replaceChildren(sweepChart(sweeps));
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

const W = 760, LEFT = 58, ROW = 22;
function gantt(d, span) {
  const p = d.ranks, h = p * ROW + 26, x = (t) => LEFT + (W - LEFT - 8) * t / (span || 1);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${h}`, class: "gantt", "data-events": d.events.length });
  // chunk = the stage's index among its rank's stages (render/terminal.chunk_of_stage)
  const chunkOf = {}, chunksOf = {};
  for (const e of d.events) (chunksOf[e.rank] = chunksOf[e.rank] || new Set()).add(e.stage);
  for (const stages of Object.values(chunksOf)) {
    [...stages].sort((a, b) => a - b).forEach((s, i) => { chunkOf[s] = i; });
  }
  for (let r = 0; r < p; r++) {
    svg.append(el("svg:rect", { x: LEFT, y: r * ROW + 2, width: x(d.step_time) - LEFT, height: ROW - 4,
      fill: state.meta.colors.idle }));
    svg.append(el("svg:text", { x: 4, y: r * ROW + ROW / 2 + 4, "font-size": 11 }, "rank " + r));
  }
  for (const e of d.events) {
    const n = chunksOf[e.rank] ? chunksOf[e.rank].size : 1;
    const rgb = kindColor(e.kind, chunkOf[e.stage] || 0, n);
    const x0 = x(e.start), wd = Math.max(x(e.end) - x0, 0.5);
    const g = el("svg:g", { class: "action" });
    g.append(el("svg:title", {}, `${e.stage}${e.kind}${e.microbatch}: rank ${e.rank}, stage ${e.stage}, ` +
      `${state.meta.kind_names[e.kind] || e.kind}, microbatch ${e.microbatch}, start ${fmt(e.start)}, end ${fmt(e.end)}`));
    g.append(el("svg:rect", { x: x0, y: e.rank * ROW + 2, width: wd, height: ROW - 4, fill: css(rgb),
      stroke: "#fff", "stroke-width": 0.5 }));
    if (wd > 12) g.append(el("svg:text", { x: x0 + wd / 2, y: e.rank * ROW + ROW / 2 + 4, "font-size": 10,
      "text-anchor": "middle", fill: textColor(rgb) }, String(e.microbatch)));
    svg.append(g);
  }
  axis(svg, span, x, p * ROW + 4);
  return svg;
}

function axis(svg, span, x, y) {
  svg.append(el("svg:line", { x1: LEFT, x2: x(span), y1: y, y2: y, stroke: "#999" }));
  const step = niceStep(span / 6);
  for (let t = 0; t <= span + 1e-9; t += step) {
    svg.append(el("svg:text", { x: x(t), y: y + 13, "font-size": 10, "text-anchor": "middle", fill: "#555" }, fmt(t)));
  }
}
function niceStep(raw) {
  if (!(raw > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map((k) => k * e).find((s) => s >= raw);
}

function memoryChart(d, span, lim) {
  const p = d.ranks, RH = 30, h = p * RH + 8, x = (t) => LEFT + (W - LEFT - 8) * t / (span || 1);
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${h}`, class: "memory" });
  const mem = d.memory || [];
  const top = Math.max(1e-12, lim || 0, ...d.per_rank.map((r) => r.peak_memory));
  for (let r = 0; r < p; r++) {
    const y0 = r * RH + RH, y = (v) => y0 - (RH - 6) * v / top;
    svg.append(el("svg:text", { x: 4, y: y0 - 8, "font-size": 10, fill: "#555" }, "mem " + r));
    svg.append(el("svg:line", { x1: LEFT, x2: x(d.step_time), y1: y0, y2: y0, stroke: "#ddd" }));
    const curve = mem.find((m) => m.rank === r);
    if (curve && curve.time.length) {
      let path = `M${x(curve.time[0])},${y0}`;
      curve.time.forEach((t, i) => {
        if (i > 0) path += `L${x(t)},${y(curve.value[i - 1])}`;
        path += `L${x(t)},${y(curve.value[i])}`;
      });
      path += `L${x(curve.time[curve.time.length - 1])},${y0}Z`;
      const peak = d.per_rank[r].peak_memory;
      const over = lim !== null && peak > lim + 1e-9;
      svg.append(el("svg:path", { d: path, fill: over ? "#CC3311" : "#6699CC", "fill-opacity": 0.55,
        stroke: over ? "#CC3311" : "#0077BB", "stroke-width": 1 }));
      svg.lastChild.append(el("svg:title", {}, `rank ${r}: peak activation memory ${fmt(peak)}`));
      svg.append(el("svg:text", { x: W - 6, y: y0 - 8, "font-size": 10, "text-anchor": "end",
        fill: over ? "#CC3311" : "#555" }, "peak " + fmt(peak)));
    }
    if (lim !== null) svg.append(el("svg:line", { x1: LEFT, x2: x(d.step_time), y1: y(lim), y2: y(lim),
      stroke: "#CC3311", "stroke-dasharray": "4 3" }));
  }
  return svg;
}

function sweepChart(sweeps) {
  const w = 600, h = 200, L = 44, B = 24;
  const svg = el("svg:svg", { viewBox: `0 0 ${w} ${h}`, id: "sweep-svg" });
  const ms = sweeps.flatMap((s) => s.points.map((p) => p.microbatches));
  if (!ms.length) return svg;
  const lo = Math.log2(Math.min(...ms)), hi = Math.max(Math.log2(Math.max(...ms)), lo + 1);
  const x = (m) => L + (w - L - 10) * (Math.log2(m) - lo) / (hi - lo);
  const y = (f) => h - B - (h - B - 8) * f;
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    svg.append(el("svg:line", { x1: L, x2: w - 10, y1: y(f), y2: y(f), stroke: "#eee" }));
    svg.append(el("svg:text", { x: L - 4, y: y(f) + 4, "font-size": 10, "text-anchor": "end" }, (100 * f) + " %"));
  }
  for (const m of [...new Set(ms)].filter((m) => Number.isInteger(Math.log2(m)))) {
    svg.append(el("svg:text", { x: x(m), y: h - 8, "font-size": 10, "text-anchor": "middle" }, String(m)));
  }
  const current = Number($("microbatches").value);
  svg.append(el("svg:line", { x1: x(current), x2: x(current), y1: 8, y2: h - B, stroke: "#999", "stroke-dasharray": "2 2" }));
  sweeps.forEach((s, i) => {
    svg.append(el("svg:text", { x: w - 12, y: 18 + 13 * i, "font-size": 11, "text-anchor": "end",
      fill: spec(s.schedule).color }, s.schedule));
  });
  for (const s of sweeps) {
    const color = spec(s.schedule).color;
    const pts = s.points.filter((p) => p.bubble_fraction !== undefined);
    const line = pts.map((p, i) => (i ? "L" : "M") + x(p.microbatches) + "," + y(p.bubble_fraction)).join("");
    svg.append(el("svg:path", { d: line, fill: "none", stroke: color, "stroke-width": 1.5 }));
    const cf = pts.filter((p) => p.closed_form_bubble !== null);
    if (cf.length) svg.append(el("svg:path", { d: cf.map((p, i) => (i ? "L" : "M") + x(p.microbatches) + "," +
      y(p.closed_form_bubble)).join(""), fill: "none", stroke: "#222", "stroke-dasharray": "3 3", "stroke-width": 1,
      class: "closed-form" }));
    for (const p of pts) {
      const c = el("svg:circle", { cx: x(p.microbatches), cy: y(p.bubble_fraction), r: 3, fill: color });
      c.append(el("svg:title", {}, `${s.schedule} m=${p.microbatches}: bubble ${pct(p.bubble_fraction)}` +
        (p.closed_form_bubble !== null ? `, closed form ${pct(p.closed_form_bubble)}` : "")));
      svg.append(c);
    }
  }
  return svg;
}

// ---- downloads ---------------------------------------------------------------------------
function viewSvg() {  // every panel's charts stacked in one standalone SVG
  const parts = [...document.querySelectorAll(".panel")];
  const out = el("svg:svg", { width: W });
  let y = 0;
  for (const p of parts) {
    out.append(el("svg:text", { x: 4, y: y + 16, "font-size": 13, "font-weight": "bold" },
      p.querySelector("h3").textContent + " — " + p.querySelector(".stats").textContent));
    y += 24;
    for (const chart of p.querySelectorAll("svg")) {
      const [, , w, h] = chart.getAttribute("viewBox").split(" ").map(Number);
      const copy = chart.cloneNode(true);
      copy.setAttribute("x", 0); copy.setAttribute("y", y);
      copy.setAttribute("width", w); copy.setAttribute("height", h);
      out.append(copy);
      y += h + 4;
    }
  }
  out.setAttribute("height", y);
  out.setAttribute("viewBox", `0 0 ${W} ${y}`);
  out.prepend(el("svg:rect", { width: W, height: y, fill: "#fff" }));
  return new Blob([new XMLSerializer().serializeToString(out)], { type: "image/svg+xml" });
}

function downloadPng() {  // the SVG drawn on a canvas at twice its size
  const url = URL.createObjectURL(viewSvg());
  const img = new Image();
  img.onload = () => {
    const canvas = el("canvas", { width: img.width * 2, height: img.height * 2 });
    const ctx = canvas.getContext("2d");
    ctx.scale(2, 2);
    ctx.drawImage(img, 0, 0);
    URL.revokeObjectURL(url);
    canvas.toBlob((blob) => download(blob, "pipebubble.png"), "image/png");
  };
  img.src = url;
}

function download(blob, name) {
  const a = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
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

fetch("/api/meta").then((r) => r.json()).then((meta) => {
  state.meta = meta;
  buildControls();
  loadHash();
  update();
});
