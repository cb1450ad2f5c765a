// pipebubble explorer: drawing. Turns the server's JSON (the `simulate --json` object) into
// SVG: the Gantt chart, each rank's memory over time, the bubble-against-m curve, and the
// downloads of the view. Loaded before app.js, which owns the controls and the requests and
// sets `state.meta` (the colours and schedules of GET /api/meta) that these functions read.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";

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

// ---- charts ------------------------------------------------------------------------------
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

// ---- the colour key: what the charts above draw, in the charts' own colours -----------------
function keyItem(color, label, kind, extra = {}) {
  const item = el("span", { class: "key", "data-kind": kind });
  item.append(el("span", { class: "swatch", style: "background:" + color, ...extra }), label);
  return item;
}
function legend(results, lim) {
  const c = state.meta.colors, names = state.meta.kind_names;
  const shown = results.filter((r) => r.data && r.data.events);
  const kinds = new Set(shown.flatMap((r) => r.data.events.map((e) => e.kind)));
  const order = ["F", "I", "W", "B", ...[...kinds].filter((k) => !"FIWB".includes(k)).sort()];
  const items = [el("span", { class: "label" }, "key")];
  for (const k of order.filter((k) => kinds.has(k))) {
    items.push(keyItem(css(kindColor(k, 0, 1)), k + ": " + (names[k] || k), k));
  }
  items.push(keyItem(c.idle, "idle (the bubble)", "idle"));
  const chunked = shown.some((r) => {  // a rank holding more than one stage (v > 1)
    const per = {};
    for (const e of r.data.events) (per[e.rank] = per[e.rank] || new Set()).add(e.stage);
    return Object.values(per).some((st) => st.size > 1);
  });
  if (chunked) items.push(keyItem(css(kindColor(order.find((k) => kinds.has(k)) || "F", 1, 2)),
    "darker: a later chunk of the rank (v > 1)", "chunk"));
  items.push(keyItem("#6699CC", "activation memory held (mem rows)", "memory"));
  if (lim !== null) items.push(keyItem("#CC3311", "over the memory limit (dashed: the limit)", "limit"));
  items.push(el("span", { class: "note" }, "numbers in a bar: the microbatch; a bar's tooltip " +
    "names the action (stage, kind, microbatch)"));
  return items;
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

function sweepChart(sweeps, current) {  // current: the m the view shows, marked by a line
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
