// The timeline: every lane on one time axis, drawn on a canvas from the server's reduced window.
// Wheel or W/S zooms around the pointer, drag or A/D pans; each change asks the server for the
// new window. Canvas text is drawn with fillText, so names are never parsed as HTML.
import { api, h, mount, run, fmtNs, fmtNum, enc, section, setModeled, profile, qs, clean } from "./common.js";
import { Overview, COLOR_MODES, colorFor, textColor } from "./timeline_overview.js";
import { eventPanel, spanPanel } from "./timeline_panels.js";

const GUTTER = 190, AXIS = 26, ROW = 17, LANE_GAP = 6, COUNTER_H = 36;
// the server refuses times beyond ±2^62 ns; a double near that prints rounded up, so stay below
const URL_NS = 4e18;
const PIN_W = 16;
const SIDE_W = 380; // the details side panel // the pin column at the right of the lane labels
const state = { lanes: [], extent: null, view: null, win: null, laneY: [], laneRows: [], rows: [], collapsed: new Set(), pinned: new Set(),
  selected: null, hits: [], reqId: 0, find: null, colorMode: "kind" };
let canvas, ctx, wrap, statusEl, detailsEl, tip, findBox, findCount, spanEl, overview;

function laneLabel(l) {
  const dev = l.layer === "host" ? (l.device || "host") : l.device;
  return `${l.rank ? "r" + l.rank + " " : ""}${dev} · ${l.track}`;
}

function groupOf(l) {  // lanes that fold into one row: a device's DMA queues
  return l.layer === "device" && /^DMA q\d+$/.test(l.track) ? `${l.rank}|${l.device}|DMA` : null;
}

// per lane, the deepest nesting drawn in this window: a lane is as tall as what is visible
function visibleDepth() {
  const d = new Array(state.lanes.length).fill(0);
  const r = state.win && state.win.rects;
  if (r) for (let i = 0; i < r.lane.length; i++) d[r.lane[i]] = Math.max(d[r.lane[i]], r.depth[i] + 1);
  return d;
}

function layout() {
  let y = AXIS;
  const seen = new Map();
  const depth = visibleDepth();
  state.rows = [];
  state.laneY = new Array(state.lanes.length).fill(AXIS);
  state.laneRows = new Array(state.lanes.length).fill(1);
  // pinned lanes first (in the order they were pinned), then the rest in the server's order
  const pins = [...state.pinned];
  const order = state.lanes.map((_, i) => i).sort((a, b) => (state.pinned.has(b) - state.pinned.has(a)) || (pins.indexOf(a) - pins.indexOf(b)) || a - b);
  for (const i of order) {
    const l = state.lanes[i], g = groupOf(l);
    if (g && state.collapsed.has(g)) {
      if (!seen.has(g)) {
        const row = { top: y, label: "", group: g, count: 0, lane: l, index: i, rows: 1 };
        seen.set(g, row); state.rows.push(row);
        y += ROW + LANE_GAP;
      }
      seen.get(g).count++;
      state.laneY[i] = seen.get(g).top;
      continue;
    }
    const folded = !g && state.collapsed.has(`lane:${i}`);
    const rows = folded ? 1 : Math.max(1, Math.min(l.depth, depth[i] || 1));
    state.rows.push({ top: y, lane: l, index: i, group: g, folded, rows });
    state.laneY[i] = y; state.laneRows[i] = rows;
    y += rows * ROW + LANE_GAP;
  }
  // counter tracks (memory over time) below the lanes, one per counter in the window
  state.counterRows = (state.counters || []).filter((c) => c.ts_ns.length).map((c) => {
    const row = { top: y, c }; y += COUNTER_H + LANE_GAP; return row;
  });
  return y + 4;
}

function drawCounters(width) {
  for (const { top, c } of state.counterRows) {
    const peak = Math.max(...c.max, 0) || 1;
    const yv = (v) => top + COUNTER_H - (COUNTER_H - 2) * (v / peak);
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER, top, width - GUTTER, COUNTER_H); ctx.clip();
    ctx.beginPath(); ctx.moveTo(xOf(c.ts_ns[0]), top + COUNTER_H);
    for (let i = 0; i < c.ts_ns.length; i++) {  // a step line through each bucket's maximum
      const x = xOf(c.ts_ns[i]), xn = i + 1 < c.ts_ns.length ? xOf(c.ts_ns[i + 1]) : xOf(c.ts_ns[i] + c.bucket_ns);
      ctx.lineTo(x, yv(c.max[i])); ctx.lineTo(xn, yv(c.max[i]));
    }
    ctx.lineTo(xOf(c.ts_ns[c.ts_ns.length - 1] + c.bucket_ns), top + COUNTER_H); ctx.closePath();
    ctx.fillStyle = "rgba(100,116,139,0.25)"; ctx.fill();
    ctx.strokeStyle = "#475569"; ctx.lineWidth = 1; ctx.stroke();
    ctx.restore();
    ctx.fillStyle = "#334155";
    const fmt = c.unit === "bytes" ? fmtNum(peak) + "B" : fmtNum(peak);
    ctx.fillText(clean(`${c.track} · ${c.name}`).slice(0, 30), 8, top + COUNTER_H / 2 - 6);
    ctx.fillStyle = "#64748b";
    ctx.fillText(`max in view ${fmt}`, 8, top + COUNTER_H / 2 + 7);
  }
}

async function fetchCounters(s, e, width) {
  const d = await api(`/p/${enc(profile)}/counters?start_ns=${s}&end_ns=${e}&width_px=${width}`);
  return d.counters;
}

function rowOf(lane, depth) {  // the y of an event at `depth` on `lane` (folded lanes: one row)
  return state.laneY[lane] + Math.min(depth, state.laneRows[lane] - 1) * ROW;
}

function xOf(ns) {
  const w = canvas.clientWidth - GUTTER;
  return GUTTER + ((ns - state.view[0]) / (state.view[1] - state.view[0])) * w;
}

function fmtTick(t, step) {  // enough decimals that neighbouring ticks differ
  const a = Math.abs(t) || step;
  const [scale, unit] = a >= 1e9 ? [1e9, "s"] : a >= 1e6 ? [1e6, "ms"] : a >= 1e3 ? [1e3, "µs"] : [1, "ns"];
  const decimals = Math.max(0, Math.min(9, Math.ceil(-Math.log10(step / scale) - 1e-9)));
  return (t / scale).toFixed(decimals) + " " + unit;
}

function niceStep(span, px) {
  const raw = span / Math.max(1, px / 110);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

function draw() {
  const dpr = window.devicePixelRatio || 1;
  const width = wrap.clientWidth - 2;
  const height = layout();
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px Inter, system-ui, sans-serif";
  ctx.textBaseline = "middle";
  // lane backgrounds
  state.rows.forEach((r, i) => {
    const hgt = r.rows * ROW;
    ctx.fillStyle = i % 2 ? "#fafbfc" : "#fff";
    ctx.fillRect(0, r.top - LANE_GAP / 2, width, hgt + LANE_GAP);
    if (i > 0 && r.lane.layer !== state.rows[i - 1].lane.layer) {
      ctx.fillStyle = "#cbd5e1"; ctx.fillRect(0, r.top - LANE_GAP / 2 - 1, width, 2);
    }
  });
  // rectangles
  state.hits = [];
  const win = state.win;
  if (win) {
    const r = win.rects, n = r.lane.length;
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER, AXIS, width - GUTTER, height - AXIS); ctx.clip();
    for (let i = 0; i < n; i++) {
      const lane = r.lane[i], y = rowOf(lane, r.depth[i]);
      const x0 = xOf(r.start_ns[i]), x1 = xOf(r.start_ns[i] + r.dur_ns[i]);
      if (x1 < GUTTER || x0 > width) continue;
      const x = Math.max(x0, GUTTER - 2), w = Math.max(1, Math.min(x1, width + 2) - x);
      const name = win.names[r.name[i]] || "";
      const merged = r.count[i] > 1;
      const found = state.find && (state.find.ids ? state.find.ids.has(r.id[i]) : state.find.names.has(name));
      // what a search did not match fades
      ctx.globalAlpha = (merged ? 0.55 : 1) * (state.find && !found ? 0.25 : 1);
      const fill = colorFor(state.colorMode, r.kind[i], name);
      ctx.fillStyle = fill;
      ctx.fillRect(x, y + 1, w, ROW - 2);
      ctx.globalAlpha = 1;
      if (found) { ctx.strokeStyle = "#d97706"; ctx.lineWidth = 2; ctx.strokeRect(x, y + 1, w, ROW - 2); }
      if (state.selected === r.id[i]) {
        ctx.strokeStyle = "#111827"; ctx.lineWidth = 2; ctx.strokeRect(x, y + 1, w, ROW - 2);
      }
      if (w > 36) {
        ctx.fillStyle = merged ? "#111827" : textColor(fill);
        const label = clean(merged ? `${name} ×${r.count[i]}` : name);
        const maxChars = Math.floor((w - 6) / 6.2);
        ctx.fillText(label.length > maxChars ? label.slice(0, Math.max(1, maxChars - 1)) + "…" : label, x + 3, y + ROW / 2);
      }
      state.hits.push([x, y, w, i]);
    }
    ctx.restore();
  }
  drawFlows(width);
  // gutter labels
  ctx.fillStyle = "#f3f4f6"; ctx.fillRect(0, 0, GUTTER, height);
  ctx.fillStyle = "#d1d5db"; ctx.fillRect(GUTTER - 1, 0, 1, height);
  state.rows.forEach((r) => {
    ctx.fillStyle = r.lane.layer === "host" ? "#1f2937" : "#065f46";
    let label = clean(laneLabel(r.lane));
    if (r.count) label = `▸ ${r.lane.device} · DMA (${r.count} queues)`;
    else label = (r.folded ? "▸ " : r.group || r.lane.depth > 1 ? "▾ " : "  ") + label;
    ctx.fillText(label.length > 28 ? label.slice(0, 27) + "…" : label, 8, r.top + ROW / 2);
    const pinned = state.pinned.has(r.index);
    ctx.fillStyle = pinned ? "#2563eb" : "#cbd5e1";
    ctx.fillText(pinned ? "●" : "○", GUTTER - PIN_W + 2, r.top + ROW / 2);
  });
  drawCounters(width);
  drawRange(height);
  // axis
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, AXIS);
  ctx.fillStyle = "#d1d5db"; ctx.fillRect(0, AXIS - 1, width, 1);
  const [s, e] = state.view, step = niceStep(e - s, width - GUTTER);
  ctx.fillStyle = "#4b5563";
  const t0 = state.extent.start_ns;
  for (let t = t0 + Math.ceil((s - t0) / step) * step; t <= e; t += step) {
    const x = xOf(t);
    ctx.fillRect(x, AXIS - 6, 1, 6);
    ctx.fillText(fmtTick(t - state.extent.start_ns, step), x + 3, AXIS / 2);
  }
  ctx.fillStyle = "#6b7280";
  ctx.fillText(state.win && state.win.device_time_modeled ? "time (device: modeled)" : "time", 8, AXIS / 2);
  if (overview) overview.draw(state.view, width);
}

let fetchTimer = null;
function scheduleFetch(delay = 90) {
  clearTimeout(fetchTimer);
  fetchTimer = setTimeout(() => fetchWindow().catch((e) => { statusEl.textContent = "Could not load this window: " + e.message; }), delay);
}

async function fetchWindow() {
  const id = ++state.reqId;
  const [s, e] = state.view.map((t) => Math.round(Math.max(-URL_NS, Math.min(URL_NS, t))));
  const width = Math.max(100, canvas.clientWidth - GUTTER);
  const t0 = performance.now();
  const [d, counters] = await Promise.all([api(`/p/${enc(profile)}/timeline?start_ns=${s}&end_ns=${e}&width_px=${width}`),
    fetchCounters(s, e, width).catch(() => null)]);
  if (id !== state.reqId) return;
  state.counters = counters;
  state.win = d.window;
  state.win.device_time_modeled = d.device_time_modeled;
  draw();
  updateStatus(performance.now() - t0);
  const url = new URL(location.href);
  url.searchParams.set("start_ns", s); url.searchParams.set("end_ns", e);
  history.replaceState(null, "", url);
}

function updateStatus(ms) {
  const w = state.win;
  statusEl.textContent = `${fmtNs(state.view[1] - state.view[0])} window · ${fmtNum(w.events)} events → ${fmtNum(w.rects_count)} rectangles` +
    (w.merged ? ` (${fmtNum(w.merged)} events narrower than ${fmtNs(w.bucket_ns)} merged)` : "") + (ms ? ` · ${ms.toFixed(0)} ms` : "");
  statusEl.dataset.start = state.view[0];
  statusEl.dataset.end = state.view[1];
}

function zoom(factor, atX) {
  const [s, e] = state.view;
  const w = canvas.clientWidth - GUTTER;
  const frac = atX === undefined ? 0.5 : Math.min(1, Math.max(0, (atX - GUTTER) / w));
  const pivot = s + (e - s) * frac;
  const span = Math.max(200, (e - s) * factor);
  state.view = [pivot - span * frac, pivot - span * frac + span];
  draw();
  scheduleFetch();
}

function pan(frac) {
  const span = state.view[1] - state.view[0];
  state.view = [state.view[0] + span * frac, state.view[1] + span * frac];
  draw();
  scheduleFetch();
}

function setView(s, e) {
  state.view = [s, Math.max(e, s + 100)];
  draw();
  scheduleFetch(0);
}

function hitAt(px, py) {
  for (let k = state.hits.length - 1; k >= 0; k--) {
    const [x, y, w, i] = state.hits[k];
    if (px >= x - 1 && px <= x + w + 1 && py >= y && py <= y + ROW) return i;
  }
  return -1;
}

function laneOf(e) {
  return state.lanes.findIndex((l) => l.rank === e.rank && l.layer === e.layer && l.track === e.track && (l.device || null) === (e.device || null));
}

function yOf(e, lane) {  // the row of an event drawn in this window, else its lane's first row
  const k = state.win ? state.win.rects.id.indexOf(e.id) : -1;
  return rowOf(lane, k >= 0 ? state.win.rects.depth[k] : 0) + ROW / 2;
}

function drawFlows(width) {
  const f = state.flowLinks;
  if (!f || f.ev.id !== state.selected) return;
  const from = laneOf(f.ev);
  if (from < 0) return;
  const y0 = yOf(f.ev, from), x0 = xOf(f.ev.start_ns);
  ctx.save();
  ctx.beginPath(); ctx.rect(GUTTER, AXIS, width - GUTTER, 1e6); ctx.clip();
  ctx.strokeStyle = "#db2777"; ctx.fillStyle = "#db2777"; ctx.lineWidth = 1.5;
  const ids = new Set(f.flows.map((p) => p.id));
  for (const p of f.flows) {
    if (ids.has(p.parent_id)) continue;  // draw to a kernel, not to each of its DMAs as well
    const to = laneOf(p);
    if (to < 0) continue;
    const y1 = yOf(p, to), x1 = xOf(p.start_ns);
    const [ax, ay, bx, by] = p.start_ns <= f.ev.start_ns ? [x1, y1, x0, y0] : [x0, y0, x1, y1];
    ctx.beginPath(); ctx.moveTo(ax, ay);
    const my = (ay + by) / 2;
    ctx.bezierCurveTo(ax, my, bx, my, bx, by); ctx.stroke();
    ctx.beginPath(); ctx.arc(bx, by, 3, 0, 2 * Math.PI); ctx.fill();
  }
  ctx.restore();
}

async function select(eventId) {
  state.selected = eventId;
  draw();
  const url = new URL(location.href);  // the selected event is part of the link
  url.searchParams.set("event", eventId); history.replaceState(null, "", url);
  detailsEl.replaceChildren(h("div", { class: "note" }, "Loading event…"));
  const d = await api(`/p/${enc(profile)}/events/${enc(eventId)}`);
  const ev = d.event;
  state.flowLinks = { ev, flows: d.flows };
  draw();
  detailsEl.replaceChildren(eventPanel(d, { startNs: state.extent.start_ns, modeled: state.win.device_time_modeled, onEvent: focusEvent }));
  return d;
}

// A click on a lane's label folds it into one row (or unfolds it; a device's DMA queues fold
// together); a click on its pin keeps it at the top.
function laneClick(row, onPin) {
  const toggle = (set, key) => { if (set.has(key)) set.delete(key); else set.add(key); };
  if (onPin && !row.count) toggle(state.pinned, row.index);
  else toggle(state.collapsed, row.group || `lane:${row.index}`);
  draw();
}

// Find: a name substring (any case), or /a regular expression/; the server matches every event
// and returns the first matches in time order, which Enter / Shift+Enter (or ▼ ▲) step through.
function parseFind(text) {
  const t = text.trim();
  const m = /^\/(.+)\/$/.exec(t);
  return m ? { q: m[1], regex: true } : { q: t, regex: false };
}

async function find(text, step) {
  const { q, regex } = parseFind(text);
  const url = new URL(location.href);
  if (!q && state.find && state.find.line) { stepFound(step); return; }  // a source line's events
  if (!q) {
    state.find = null; findCount.textContent = ""; draw();
    url.searchParams.delete("find"); history.replaceState(null, "", url);
    return;
  }
  if (!state.find || state.find.text !== text) {
    findCount.textContent = "searching…";
    let d;
    try {
      d = await api(`/p/${enc(profile)}/search?q=${enc(q)}&regex=${regex}`);
    } catch (e) {
      findCount.textContent = e.message; state.find = null; draw(); return;
    }
    state.find = { text, matches: d.matches, total: d.total, names: new Set(d.names), cursor: -1 };
    url.searchParams.set("find", text); history.replaceState(null, "", url);
  }
  stepFound(step);
}

function stepFound(step) {
  const f = state.find;
  if (!f.matches.length) { findCount.textContent = "no match"; draw(); return; }
  if (step) {
    f.cursor = (f.cursor + step + f.matches.length) % f.matches.length;
    focusEvent(f.matches[f.cursor]);
  } else draw();
  findCount.textContent = (f.line ? `line ${f.line}: ` : "") + `${f.cursor >= 0 ? f.cursor + 1 : "–"} / ${fmtNum(f.total)}` + (f.total > f.matches.length ? ` (first ${f.matches.length} in time order)` : "");
  findCount.dataset.total = f.total;
}

// ?line=FILE_ID:N (the source view's link): that line's events outlined, the rest faded
async function findLine(spec, step) {
  const m = /^([0-9a-f]{1,40}):(\d+)$/.exec(spec || "");
  if (!m) return;
  const d = await api(`/p/${enc(profile)}/source/${m[1]}/lines/${m[2]}/events`);
  state.find = { text: null, line: `${d.file.split("/").pop()}:${d.line}`, matches: d.matches, total: d.total, names: null,
    ids: new Set(d.matches.map((x) => x.id)), cursor: -1 };
  stepFound(step);
}

// Shift+drag selects a span: what ran inside it (clipped), as Perfetto's area selection.
function nsAt(clientX) {
  const r = canvas.getBoundingClientRect();
  return state.view[0] + ((clientX - r.left - GUTTER) / (canvas.clientWidth - GUTTER)) * (state.view[1] - state.view[0]);
}

function drawRange(height) {
  if (!state.range) return;
  const x0 = Math.max(GUTTER, xOf(state.range[0])), x1 = Math.min(canvas.clientWidth, xOf(state.range[1]));
  if (x1 <= x0) return;
  ctx.fillStyle = "rgba(37,99,235,0.12)"; ctx.fillRect(x0, AXIS, x1 - x0, height - AXIS);
  ctx.fillStyle = "#2563eb"; ctx.fillRect(x0, AXIS, 1, height - AXIS); ctx.fillRect(x1 - 1, AXIS, 1, height - AXIS);
}

async function showSpan(s, e) {
  state.range = [s, e]; draw();
  spanEl.replaceChildren(h("p", { class: "note" }, "Totalling the span…"));
  const d = await api(`/p/${enc(profile)}/span?start_ns=${Math.round(s)}&end_ns=${Math.round(e)}`);
  spanEl.replaceChildren(spanPanel(d));
  spanEl.dataset.events = d.events;
}

// the whole profile, or where its events are when a few strays lie far from the rest
function wholeView() {
  const w = state.fit || state.extent;
  setView(w.start_ns, w.end_ns);
}

function focusEvent(e) {
  const pad = Math.max(e.dur_ns * 2, 2000);
  setView(e.start_ns - pad, e.start_ns + e.dur_ns + pad);
  select(e.id);
}

function rectCenter(kind) {  // used by the browser tests: the whole rectangle of `kind` nearest the middle
  const mid = GUTTER + (canvas.clientWidth - GUTTER) / 2;
  let best = null;
  for (const [x, y, w, i] of state.hits) {
    if (state.win.rects.kind[i] !== kind || state.win.rects.count[i] !== 1 || w < 3 || x < GUTTER) continue;
    if (!best || Math.abs(x + w / 2 - mid) < Math.abs(best[0] + best[2] / 2 - mid)) best = [x, y, w, i];
  }
  if (!best) return null;
  const b = canvas.getBoundingClientRect();
  const [x, y, w, i] = best;
  return { x: b.left + x + w / 2, y: b.top + y + ROW / 2, id: state.win.rects.id[i] };
}

function wire() {
  let drag = null;
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect();
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) pan((e.deltaX || e.deltaY) / 1000);
    else zoom(Math.pow(1.0015, e.deltaY), e.clientX - r.left);
  }, { passive: false });
  canvas.addEventListener("mousedown", (e) => {
    if (e.shiftKey) { state.sel = { from: nsAt(e.clientX) }; return; }  // Shift+drag: select a span
    drag = { x: e.clientX, view: state.view.slice(), moved: false }; canvas.classList.add("dragging");
  });
  window.addEventListener("mouseup", (e) => {
    if (state.sel) {
      const a = state.sel.from, b = nsAt(e.clientX);
      state.sel = null;
      if (Math.abs(xOf(b) - xOf(a)) >= 3) showSpan(Math.min(a, b), Math.max(a, b)).catch((x) => { spanEl.textContent = x.message; });
      return;
    }
    canvas.classList.remove("dragging");
    const cr = canvas.getBoundingClientRect();
    if (drag && !drag.moved && e.clientX - cr.left < GUTTER) {
      const y = e.clientY - cr.top;
      const row = state.rows.find((r) => y >= r.top && y < r.top + r.rows * ROW);
      if (row) laneClick(row, e.clientX - cr.left >= GUTTER - PIN_W);
      drag = null;
      return;
    }
    if (drag && !drag.moved) {
      const r = canvas.getBoundingClientRect();
      const i = hitAt(e.clientX - r.left, e.clientY - r.top);
      if (i >= 0) {
        const rr = state.win.rects;
        if (rr.count[i] > 1) setView(rr.start_ns[i], rr.start_ns[i] + rr.dur_ns[i]);
        else select(rr.id[i]);
      }
    }
    if (drag && drag.moved) scheduleFetch(0);
    drag = null;
  });
  window.addEventListener("mousemove", (e) => {
    if (state.sel) {
      const a = state.sel.from, b = nsAt(e.clientX);
      state.range = [Math.min(a, b), Math.max(a, b)]; draw(); return;
    }
    const r = canvas.getBoundingClientRect();
    if (drag) {
      const dx = e.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      const span = drag.view[1] - drag.view[0];
      const shift = (-dx / (canvas.clientWidth - GUTTER)) * span;
      state.view = [drag.view[0] + shift, drag.view[1] + shift];
      draw();
      return;
    }
    const inside = e.clientX >= r.left && e.clientX <= r.right && e.clientY >= r.top && e.clientY <= r.bottom;
    const i = inside ? hitAt(e.clientX - r.left, e.clientY - r.top) : -1;
    if (i < 0) { tip.hidden = true; return; }
    const rr = state.win.rects;
    tip.textContent = `${state.win.names[rr.name[i]]} · ${rr.kind[i]} · ${fmtNs(rr.dur_ns[i])}` + (rr.count[i] > 1 ? ` · ${rr.count[i]} events merged (click to zoom)` : "");
    tip.style.left = e.clientX + 12 + "px"; tip.style.top = e.clientY + 14 + "px"; tip.hidden = false;
  });
  window.addEventListener("keydown", (e) => {
    if (e.target.closest("input, select, textarea")) return;
    if (e.key === "Escape" && state.range) { state.range = null; spanEl.replaceChildren(); draw(); return; }
    const k = e.key.toLowerCase();
    if (e.key === "/") { e.preventDefault(); findBox.focus(); return; }
    if (k === "w") zoom(0.7); else if (k === "s") zoom(1 / 0.7); else if (k === "a") pan(-0.2); else if (k === "d") pan(0.2);
  });
  window.addEventListener("resize", () => { draw(); scheduleFetch(); });
}

run(async () => {
  document.getElementById("app").classList.add("wide");
  const width = Math.max(400, document.getElementById("app").clientWidth - GUTTER - SIDE_W - 50);
  const s0 = qs("start_ns"), e0 = qs("end_ns");
  const q = s0 !== null && e0 !== null ? `&start_ns=${enc(s0)}&end_ns=${enc(e0)}` : "";
  const d = await api(`/p/${enc(profile)}/timeline?width_px=${width}${q}`);
  setModeled(d.device_time_modeled);
  Object.assign(state, { lanes: d.lanes, extent: d.extent, fit: d.fit, win: d.window });
  const groups = new Map();
  d.lanes.forEach((l) => { const g = groupOf(l); if (g) groups.set(g, (groups.get(g) || 0) + 1); });
  groups.forEach((n, g) => { if (n > 4) state.collapsed.add(g); });
  state.win.device_time_modeled = d.device_time_modeled;
  state.view = [d.window.start_ns, d.window.end_ns];
  state.counters = await fetchCounters(d.window.start_ns, d.window.end_ns, width).catch(() => null);
  canvas = h("canvas", { id: "tl-canvas" });
  ctx = canvas.getContext("2d");
  wrap = h("div", { class: "tl-wrap" }, canvas);
  statusEl = h("span", { class: "tl-status", id: "tl-status" });
  detailsEl = h("div", { class: "tl-details", id: "tl-details" }, section("Event", h("p", { class: "note" }, "Click an event for its details and its whole Python stack.")));
  const ovCanvas = h("canvas", { id: "tl-overview", title: "The whole profile: click or drag to move the view there" });
  overview = new Overview(ovCanvas, GUTTER, (t) => { const span = state.view[1] - state.view[0]; setView(t - span / 2, t + span / 2); });
  state.colorMode = qs("color") === "name" ? "name" : "kind";
  const colors = h("select", { id: "tl-color", title: "Colour the events by their category (kind) or by their name" },
    Object.entries(COLOR_MODES).map(([k, label]) => h("option", { value: k, selected: k === state.colorMode }, label)));
  colors.addEventListener("change", () => {
    state.colorMode = colors.value; draw();
    const url = new URL(location.href); url.searchParams.set("color", colors.value); history.replaceState(null, "", url);
  });
  tip = h("div", { class: "tl-tip", hidden: true });
  spanEl = h("div", { id: "tl-span" });
  findBox = h("input", { id: "tl-find", type: "search", placeholder: "Find: name or /regex/  ( / )", size: 24, value: qs("find") || "" });
  findBox.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); find(findBox.value, e.shiftKey ? -1 : 1); } });
  findBox.addEventListener("search", () => { if (!findBox.value) find("", 0); });
  findCount = h("span", { class: "note", id: "tl-find-count" });
  const steps = h("select", { id: "tl-step", title: "Show one step" }, h("option", { value: "" }, "All steps"),
    d.steps.map((s, i) => h("option", { value: i }, `Step ${s.step}${s.rank ? " rank " + s.rank : ""} · ${fmtNs(s.dur_ns)}`)));
  steps.addEventListener("change", () => {
    if (steps.value === "") wholeView();
    else { const s = d.steps[+steps.value]; setView(s.start_ns, s.start_ns + s.dur_ns); }
  });
  mount(
    h("div", { class: "tl-toolbar" },
      h("button", { id: "tl-zoom-in", title: "Zoom in (W)", onclick: () => zoom(0.5) }, "+"),
      h("button", { id: "tl-zoom-out", title: "Zoom out (S)", onclick: () => zoom(2) }, "−"),
      h("button", { title: "Pan left (A)", onclick: () => pan(-0.25) }, "◀"),
      h("button", { title: "Pan right (D)", onclick: () => pan(0.25) }, "▶"),
      h("button", { id: "tl-reset", onclick: wholeView }, "Whole profile"),
      steps,
      d.fit ? h("span", { class: "note", id: "tl-outside", title: "A few events lie far from the rest; the whole-profile view fits the others" },
        `${fmtNum(d.fit.outside_events)} stray events outside, up to ${fmtNs(d.extent.end_ns - d.fit.end_ns)} after the rest · `,
        h("a", { href: "#", id: "tl-show-all", onclick: (x) => { x.preventDefault(); setView(d.extent.start_ns, Math.min(d.extent.end_ns, URL_NS)); } }, "show all")) : null,
      findBox, h("button", { id: "tl-find-prev", title: "Previous match (Shift+Enter)", onclick: () => find(findBox.value, -1) }, "▲"),
      h("button", { id: "tl-find-next", title: "Next match (Enter)", onclick: () => find(findBox.value, 1) }, "▼"), findCount,
      colors, statusEl,
      h("span", { class: "spacer" }),
      h("span", { class: "note" }, "wheel: zoom · drag: pan · Shift+drag: totals of a span · click: details · click a lane's name to fold it, its ○ to pin it · W/A/S/D · / find")),
    h("div", { class: "tl-body", style: { gridTemplateColumns: `minmax(0, 1fr) ${SIDE_W}px` } },
      h("div", { class: "tl-left" }, ovCanvas, wrap, spanEl), detailsEl), tip);
  wire();
  // the overview is the first view (the whole profile, fit to where its events are)
  overview.setData(q ? (await api(`/p/${enc(profile)}/timeline?width_px=${width}`)).window : d.window, d.lanes);
  draw();
  updateStatus();
  window.neTimeline = { rectCenter, state, setView, laneClick };
  const ev = qs("event");
  if (ev !== null) {
    const d = await select(Number(ev));
    if (s0 === null && d) focusEvent(d.event);
  }
  // a deep link's search: highlighted, and its first match shown unless the link names a place
  if (findBox.value) await find(findBox.value, ev === null && s0 === null ? 1 : 0);
  else if (qs("line")) await findLine(qs("line"), ev === null && s0 === null ? 1 : 0).catch((e) => { findCount.textContent = e.message; });
  canvas.dataset.ready = "1";
});
