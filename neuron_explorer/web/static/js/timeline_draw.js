// The timeline's drawing: the lanes laid out from the window's nesting (folded and pinned
// lanes), the rectangles, flows, counter tracks, span selection and axis on one canvas. The
// page (timeline.js) owns the state's changes and the requests; this module only reads them.
import { fmtNum, clean } from "./common.js";
import { colorFor, textColor, ownLane } from "./timeline_overview.js";
import { drawMarks, niceStep, fmtTick } from "./timeline_marks.js";

export const AXIS = 26, ROW = 17, LANE_GAP = 6, COUNTER_H = 36;
// the lane label column: widened by dragging its edge, kept for the next visit (importers
// read the live binding)
const GUTTER_MIN = 120, GUTTER_MAX = 900;
const clampGutter = (px) => Math.round(Math.max(GUTTER_MIN, Math.min(GUTTER_MAX, px)));
export let GUTTER = clampGutter(Number(localStorage.getItem("ne.tl.gutter")) || 190);
export const PIN_W = 16; // the pin column at the right of the lane labels
export const state = { lanes: [], extent: null, view: null, win: null, laneY: [], laneRows: [], rows: [], collapsed: new Set(), pinned: new Set(),
  selected: null, hits: [], reqId: 0, find: null, colorMode: "kind", hiddenLanes: new Set(),
  // `view` is [start, end] in ns after `origin` (the profile's first ns): a double near 2^60
  // is 256 ns apart from the next, an offset from the origin is not (zoom to single ns there)
  origin: 0, held: null, pending: null, fetches: 0, range: null, rangeLanes: null, marks: [], mark: null, flags: [] };
export const dom = { canvas: null, ctx: null, wrap: null, overview: null, status: null };  // set once by the page

export function laneLabel(l) {
  const dev = l.layer === "host" ? (l.device || "host") : l.device;
  return `${l.rank ? "r" + l.rank + " " : ""}${dev} · ${l.track}`;
}

export function groupOf(l) {  // lanes that fold into one row: a device's DMA queues
  return l.layer === "device" && /^DMA q\d+$/.test(l.track) ? `${l.rank}|${l.device}|DMA` : null;
}

// per lane, the deepest nesting drawn in this window: a lane is as tall as what is visible
function visibleDepth() {
  const d = new Array(state.lanes.length).fill(0);
  const r = state.win && state.win.rects;
  if (r) for (let i = 0; i < r.lane.length; i++) d[r.lane[i]] = Math.max(d[r.lane[i]], r.depth[i] + 1);
  return d;
}

export function layout() {
  let y = AXIS;
  const seen = new Map();
  const depth = visibleDepth();
  state.rows = [];
  state.laneY = new Array(state.lanes.length).fill(AXIS);
  state.laneRows = new Array(state.lanes.length).fill(1);
  // pinned lanes first (in the order they were pinned), then the rest in the server's order
  const pins = [...state.pinned];
  const order = state.lanes.map((_, i) => i).sort((a, b) => (state.pinned.has(b) - state.pinned.has(a)) || (pins.indexOf(a) - pins.indexOf(b)) || a - b);
  state.hiddenLanes = new Set(order.filter((i) => ownLane(state.lanes[i])));
  for (const i of order) {
    if (state.hiddenLanes.has(i)) continue;
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
  const { ctx } = dom;
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


export function rowOf(lane, depth) {  // the y of an event at `depth` on `lane` (folded lanes: one row)
  return state.laneY[lane] + Math.min(depth, state.laneRows[lane] - 1) * ROW;
}

export function xOf(ns) {  // an absolute ns (an event's start) to its x on the canvas
  return xRel(ns - state.origin);
}

export function xRel(t) {  // ns after the origin to x
  const w = dom.canvas.clientWidth - GUTTER;
  return GUTTER + ((t - state.view[0]) / (state.view[1] - state.view[0])) * w;
}

// `text` cut with an ellipsis to `px` wide (a binary search on its measured width)
function fitText(ctx, text, px) {
  if (ctx.measureText(text).width <= px) return text;
  let lo = 0, hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (ctx.measureText(text.slice(0, mid) + "…").width <= px) lo = mid; else hi = mid - 1;
  }
  return text.slice(0, lo) + "…";
}

// a handle over the label column's edge: dragging it widens the column
function gutterHandle(height) {
  if (!dom.gutter) {
    const hd = dom.gutter = document.createElement("div");
    hd.id = "tl-gutter-handle"; hd.className = "tl-gutter-handle"; hd.title = "Drag to widen the lane names";
    let dragging = false;
    hd.addEventListener("pointerdown", (e) => { e.preventDefault(); e.stopPropagation(); dragging = true; hd.setPointerCapture(e.pointerId); });
    hd.addEventListener("pointermove", (e) => {
      if (!dragging) return;
      GUTTER = clampGutter(e.clientX - dom.canvas.getBoundingClientRect().left);
      draw();
    });
    hd.addEventListener("pointerup", () => { dragging = false; localStorage.setItem("ne.tl.gutter", String(GUTTER)); });
    dom.wrap.append(hd);
  }
  Object.assign(dom.gutter.style, { left: `${GUTTER - 3}px`, height: `${height}px` });
}

export function draw() {
  const { canvas, ctx, wrap, overview } = dom;
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
      const lane = r.lane[i];
      if (state.hiddenLanes.has(lane)) continue;
      const y = rowOf(lane, r.depth[i]);
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
    ctx.fillText(fitText(ctx, label, GUTTER - PIN_W - 12), 8, r.top + ROW / 2);
    const pinned = state.pinned.has(r.index);
    ctx.fillStyle = pinned ? "#2563eb" : "#cbd5e1";
    ctx.fillText(pinned ? "●" : "○", GUTTER - PIN_W + 2, r.top + ROW / 2);
  });
  drawCounters(width);
  drawRange(height);
  gutterHandle(height);
  // axis: ticks counted from the origin (an integer k times the step: no sum that stops
  // moving when the step is below a double's spacing)
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, AXIS);
  ctx.fillStyle = "#d1d5db"; ctx.fillRect(0, AXIS - 1, width, 1);
  const [s, e] = state.view, step = niceStep(e - s, width - GUTTER);
  ctx.fillStyle = "#4b5563";
  state.ticks = [];  // the ruler's labels, read by the browser tests
  for (let k = Math.ceil(s / step); k * step <= e; k++) {
    const x = xRel(k * step), label = fmtTick(k * step, step);
    ctx.fillRect(x, AXIS - 6, 1, 6);
    ctx.fillText(label, x + 3, AXIS / 2);
    state.ticks.push(label);
  }
  ctx.fillStyle = "#6b7280";
  ctx.fillText(state.win && state.win.device_time_modeled ? "time (device: modeled)" : "time", 8, AXIS / 2);
  drawMarks(height, width);
  if (overview) { overview.gutter = GUTTER; overview.draw([state.origin + s, state.origin + e], width); }
}


export function hitAt(px, py) {
  for (let k = state.hits.length - 1; k >= 0; k--) {
    const [x, y, w, i] = state.hits[k];
    if (px >= x - 1 && px <= x + w + 1 && py >= y && py <= y + ROW) return i;
  }
  return -1;
}

export function laneOf(e) {
  return state.lanes.findIndex((l) => l.rank === e.rank && l.layer === e.layer && l.track === e.track && (l.device || null) === (e.device || null));
}

function yOf(e, lane) {  // the row of an event drawn in this window, else its lane's first row
  const k = state.win ? state.win.rects.id.indexOf(e.id) : -1;
  return rowOf(lane, k >= 0 ? state.win.rects.depth[k] : 0) + ROW / 2;
}

function drawFlows(width) {
  const { ctx } = dom;
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


export function drawRange(height) {  // the area selected: its time range, on its lanes
  const { canvas, ctx } = dom;
  if (!state.range) return;
  const x0 = Math.max(GUTTER, xOf(state.range[0])), x1 = Math.min(canvas.clientWidth, xOf(state.range[1]));
  if (x1 <= x0) return;
  const on = state.rangeLanes && new Set(state.rangeLanes);
  const bands = on ? state.rows.filter((r) => on.has(r.index)).map((r) => [r.top - LANE_GAP / 2, r.rows * ROW + LANE_GAP]) : [[AXIS, height - AXIS]];
  for (const [y, hgt] of bands) {
    ctx.fillStyle = "rgba(37,99,235,0.12)"; ctx.fillRect(x0, y, x1 - x0, hgt);
    ctx.fillStyle = "#2563eb"; ctx.fillRect(x0, y, 1, hgt); ctx.fillRect(x1 - 1, y, 1, hgt);
  }
}

