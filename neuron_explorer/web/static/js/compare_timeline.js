// Two timelines stacked (the compare page): the same step of A and B, each drawn from its own
// step start, on one time scale, so a longer op or a later kernel shows as a shift. The wheel
// zooms both around the pointer, a drag pans both; each change asks both servers' windows.
// A side may be one rank of a job's profile ({ name, rank, label }: the ranks page): it draws
// only that rank's lanes, and with `oneClock` both sides share one time axis, the job's clock,
// from the earlier of the two ranks' starts of the step, so a wait on one rank lines up with
// the work of the other.
import { api, h, enc, fmtNs, clean } from "./common.js";
import { colorFor, textColor, ownLane } from "./timeline_overview.js";

const GUTTER = 150, AXIS = 22, ROW = 14, GAP = 4, MAX_ROWS = 3;

export function stackedTimelines(a, b, { oneClock = false } = {}) {
  const st = { sides: [], offset: 0, span: 1, step: 0, req: 0, base: 0, oneClock };
  const status = h("span", { class: "note", id: "cmp-tl-status" });
  const stepSel = h("select", { id: "cmp-tl-step", title: "Which step of each profile" });
  const holder = h("div", { id: "cmp-timelines" }, h("div", { class: "tl-toolbar" }, "Step ", stepSel,
    h("button", { id: "cmp-tl-in", onclick: () => zoom(st, 0.5) }, "+"), h("button", { id: "cmp-tl-out", onclick: () => zoom(st, 2) }, "−"),
    h("button", { id: "cmp-tl-reset", onclick: () => reset(st) }, "Whole step"), status));
  st.status = status;
  init(st, holder, stepSel, [a, b]).catch((e) => { status.textContent = "Could not load the timelines: " + e.message; });
  return holder;
}

async function init(st, holder, stepSel, names) {
  const width = Math.max(400, holder.clientWidth || 1200);
  const specs = names.map((n) => (typeof n === "string" ? { name: n } : n));
  const first = await Promise.all(specs.map((s) => api(`/p/${enc(s.name)}/timeline?width_px=${width}`)));
  st.sides = specs.map(({ name, rank, label }, i) => {
    const canvas = h("canvas", { id: `cmp-tl-${"ab"[i]}`, class: "cmp-tl" });
    holder.append(h("div", { class: "tl-wrap cmp-tl-wrap" }, canvas));
    wire(st, canvas);
    // one step per index; a profile without steps is one "step" from its first event
    const rank0 = rank ?? Math.min(...first[i].steps.map((s) => s.rank || 0));  // the first rank's steps
    const steps = first[i].steps.filter((s) => (s.rank || 0) === rank0);
    return { name, rank, label: label || name, canvas, lanes: first[i].lanes, win: null,
      steps: steps.length ? steps : [{ step: null, start_ns: first[i].extent.start_ns, dur_ns: first[i].extent.end_ns - first[i].extent.start_ns }] };
  });
  const n = Math.min(...st.sides.map((s) => s.steps.length));
  for (let i = 0; i < n; i++) stepSel.append(h("option", { value: i }, `#${i} (${st.sides.map((s) => s.steps[i].step ?? "–").join(" / ")})`));
  stepSel.addEventListener("change", () => { st.step = Number(stepSel.value); reset(st); });
  reset(st);
}

function reset(st) {
  st.offset = 0;
  const steps = st.sides.map((s) => s.steps[st.step]);
  st.base = Math.min(...steps.map((s) => s.start_ns));
  st.span = st.oneClock ? Math.max(...steps.map((s) => s.start_ns + s.dur_ns - st.base), 1000)
    : Math.max(...steps.map((s) => s.dur_ns), 1000);
  fetchBoth(st);
}

// where a side's view starts: each side's own step start, or the one clock's
const viewStart = (st, side) => (st.oneClock ? st.base : side.steps[st.step].start_ns) + st.offset;

function zoom(st, factor, frac = 0.5) {
  const pivot = st.offset + st.span * frac;
  st.span = Math.max(1000, st.span * factor);
  st.offset = pivot - st.span * frac;
  fetchBoth(st);
}

let timer = null;
function fetchBoth(st, delay = 60) {
  clearTimeout(timer);
  timer = setTimeout(async () => {
    const id = ++st.req;
    const wins = await Promise.all(st.sides.map((s) => {
      const w = Math.max(100, s.canvas.parentElement.clientWidth - GUTTER - 4);
      const s0 = Math.round(viewStart(st, s));
      // the lanes and steps came with the first view: a window asks for its rects only
      return api(`/p/${enc(s.name)}/timeline?start_ns=${s0}&end_ns=${s0 + Math.round(st.span)}&width_px=${w}&window_only=true`);
    }));
    if (id !== st.req) return;
    st.sides.forEach((s, i) => { s.win = wins[i].window; draw(st, s, i); });
    st.status.textContent = `${fmtNs(st.span)} from ${fmtNs(st.offset)} after ${st.oneClock ? "the step's first start on either" : "each step's start"} · A ${fmtNs(st.sides[0].steps[st.step].dur_ns)}, B ${fmtNs(st.sides[1].steps[st.step].dur_ns)}`;
    st.status.dataset.span = st.span;
    st.sides.forEach((s) => { s.canvas.dataset.ready = "1"; });
  }, delay);
}

function draw(st, side, index) {
  const { canvas, win, lanes } = side;
  const used = new Map();  // lanes with work in view, rows up to MAX_ROWS each
  const mine = (l) => (side.rank === undefined || (lanes[l].rank || 0) === side.rank) && !ownLane(lanes[l]);
  for (let i = 0; i < win.rects.lane.length; i++) if (mine(win.rects.lane[i])) used.set(win.rects.lane[i], Math.max(used.get(win.rects.lane[i]) || 0, Math.min(MAX_ROWS, win.rects.depth[i] + 1)));
  const order = [...used.keys()].sort((x, y) => x - y);
  const top = new Map();
  let y = AXIS;
  for (const l of order) { top.set(l, y); y += used.get(l) * ROW + GAP; }
  canvas.dataset.ranks = [...new Set(order.map((l) => lanes[l].rank || 0))].join(",");  // the ranks drawn
  const width = canvas.parentElement.clientWidth - 2, height = y + 4, dpr = window.devicePixelRatio || 1;
  Object.assign(canvas.style, { width: width + "px", height: height + "px" });
  canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.font = "10px Inter, system-ui, sans-serif"; ctx.textBaseline = "middle";
  const t0 = viewStart(st, side);
  const xOf = (t) => GUTTER + ((t - t0) / st.span) * (width - GUTTER);
  const r = win.rects;
  for (let i = 0; i < r.lane.length; i++) {
    if (r.depth[i] >= MAX_ROWS || !mine(r.lane[i])) continue;
    const x0 = Math.max(GUTTER, xOf(r.start_ns[i])), x1 = Math.min(width, xOf(r.start_ns[i] + r.dur_ns[i]));
    if (x1 < GUTTER) continue;
    const name = win.names[r.name[i]] || "", ry = top.get(r.lane[i]) + r.depth[i] * ROW;
    const fill = colorFor("kind", r.kind[i], name);
    ctx.fillStyle = fill; ctx.fillRect(x0, ry + 1, Math.max(1, x1 - x0), ROW - 2);
    if (x1 - x0 > 40) { ctx.fillStyle = textColor(fill); ctx.fillText(clean(name).slice(0, Math.floor((x1 - x0) / 6)), x0 + 2, ry + ROW / 2); }
  }
  ctx.fillStyle = "#f3f4f6"; ctx.fillRect(0, 0, GUTTER, height);
  ctx.fillStyle = "#1f2937";
  for (const l of order) {
    const lane = lanes[l];
    ctx.fillText(clean(`${lane.rank ? "r" + lane.rank + " " : ""}${lane.device || "host"} · ${lane.track}`).slice(0, 24), 6, top.get(l) + ROW / 2);
  }
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, AXIS);
  ctx.fillStyle = "#111827"; ctx.font = "11px Inter, system-ui, sans-serif";
  ctx.fillText(`${"AB"[index]}: ${clean(side.label)}`.slice(0, 22), 6, AXIS / 2);
  ctx.fillStyle = "#4b5563";
  for (let k = 0; k <= 5; k++) {  // the same ticks on both: time since each step's (or the first) start
    const x = GUTTER + (k / 5) * (width - GUTTER - 40);
    ctx.fillRect(x, AXIS - 5, 1, 5);
    ctx.fillText(fmtNs(st.offset + (k / 5) * (width - GUTTER - 40) / (width - GUTTER) * st.span), x + 2, AXIS / 2);
  }
}

function wire(st, canvas) {
  let drag = null;
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect();
    zoom(st, Math.pow(1.0015, e.deltaY), Math.min(1, Math.max(0, (e.clientX - r.left - GUTTER) / (r.width - GUTTER))));
  }, { passive: false });
  canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, offset: st.offset }; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    st.offset = drag.offset - ((e.clientX - drag.x) / (canvas.clientWidth - GUTTER)) * st.span;
    fetchBoth(st, 120);
  });
  window.addEventListener("mouseup", () => { drag = null; });
}
