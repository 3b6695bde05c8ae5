// The timeline: every lane on one time axis, drawn on a canvas from the server's reduced window.
// The page holds a window wider than the view (half a view each side) at a finer resolution:
// wheel or W/S zooms, Shift+drag or A/D pans, and both draw at once from what is held; the
// server is asked (in the background) only when the view leaves the held window or is zoomed
// past twice its resolution. A plain drag selects an area, as in Perfetto; the keys are
// timeline_keys.js. Canvas text is drawn with fillText, so names are never parsed as HTML.
// The held window is timeline_window.js, drawing timeline_draw.js, marks and flags
// timeline_marks.js, find timeline_find.js, the side panels timeline_panels.js.
import { api, h, mount, run, fmtNs, fmtNum, enc, section, setModeled, profile, qs, clean } from "./common.js";
import { Overview, COLOR_MODES } from "./timeline_overview.js";
import { eventPanel, spanPanel } from "./timeline_panels.js";
import { AXIS, GUTTER, ROW, PIN_W, state, dom, draw, xOf, groupOf, hitAt } from "./timeline_draw.js";
import { find, findLine, findModule, findPath, findUi } from "./timeline_find.js";
import { flagNear, parseRange, parseList } from "./timeline_marks.js";
import { URL_NS, fetchCounters, holds, viewChanged, fetchWindow, hold, saveUrl, updateStatus } from "./timeline_window.js";
import { spanFlame } from "./timeline_flame.js";
import { wireKeys, KEY_HINT } from "./timeline_keys.js";

const MIN_SPAN = 4;   // ns: the narrowest view
const SIDE_W = 380; // the details side panel
let canvas, statusEl, detailsEl, tip, findBox, findCount, spanEl;

function zoom(factor, atX) {
  const [s, e] = state.view;
  const w = canvas.clientWidth - GUTTER;
  const frac = atX === undefined ? 0.5 : Math.min(1, Math.max(0, (atX - GUTTER) / w));
  const pivot = s + (e - s) * frac;
  const span = Math.max(MIN_SPAN, (e - s) * factor);
  state.view = [pivot - span * frac, pivot - span * frac + span];
  draw();
  viewChanged();
}

function pan(frac) {
  const span = state.view[1] - state.view[0];
  state.view = [state.view[0] + span * frac, state.view[1] + span * frac];
  draw();
  viewChanged();
}

function setView(s, e) {  // absolute ns, as events' times
  const s0 = s - state.origin;
  state.view = [s0, s0 + Math.max(e - s, MIN_SPAN)];
  draw();
  viewChanged(0);
}


async function select(eventId) {
  state.selected = eventId;
  state.selectedEv = null;
  draw();
  const url = new URL(location.href);  // the selected event is part of the link
  url.searchParams.set("event", eventId); history.replaceState(null, "", url);
  detailsEl.replaceChildren(h("div", { class: "note" }, "Loading event…"));
  let d;
  try {
    d = await api(`/p/${enc(profile)}/events/${enc(eventId)}`);
  } catch (e) {  // said in the panel (a 503 says what to do), never an endless "Loading"
    if (state.selected === eventId) detailsEl.replaceChildren(section("Event", h("p", { class: "warn", id: "event-error" }, `Event ${eventId}: ${e.message}`)));
    return null;
  }
  if (state.selected !== eventId) return null;  // another event was clicked meanwhile
  const ev = d.event;
  state.selectedEv = ev;
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
  saveUrl();
}


// A drag selects an area: what ran inside it (clipped), as Perfetto's area selection.
function nsAt(clientX) {  // absolute ns under the pointer
  const r = canvas.getBoundingClientRect();
  return state.origin + state.view[0] + ((clientX - r.left - GUTTER) / (canvas.clientWidth - GUTTER)) * (state.view[1] - state.view[0]);
}

function showSelection() {  // the selection's duration, and the time between the first two flags
  const el = document.getElementById("tl-sel");
  const parts = [];
  if (state.range) parts.push(`selection ${fmtNs(state.range[1] - state.range[0])}` +
    (state.rangeLanes ? ` on ${state.rangeLanes.length} of ${state.lanes.length} lanes` : ""));
  const f = [...state.flags].sort((a, b) => a - b);
  if (f.length > 1) parts.push(`flags Δ ${fmtNs(f[f.length - 1] - f[0])}`);
  el.textContent = parts.join(" · ");
}

// the lanes whose rows lie between two heights on the canvas (a folded row: all its lanes); null
// when that is every lane
function lanesBetween(y0, y1) {
  const lo = Math.min(y0, y1), hi = Math.max(y0, y1), out = new Set();
  for (const r of state.rows) {
    if (r.top + r.rows * ROW < lo || r.top > hi) continue;
    if (r.count) state.lanes.forEach((l, i) => { if (groupOf(l) === r.group) out.add(i); });
    else out.add(r.index);
  }
  return out.size && out.size < state.lanes.length ? [...out].sort((a, b) => a - b) : null;
}

async function showSpan(s, e, lanes = null) {
  s = Math.round(s); e = Math.max(Math.round(e), s + 1);
  state.range = [s, e]; state.rangeLanes = lanes; draw(); showSelection(); saveUrl();
  spanEl.replaceChildren(h("p", { class: "note" }, "Totalling the span…"));
  delete spanEl.dataset.events;
  const q = `start_ns=${s}&end_ns=${e}` + (lanes ? `&lanes=${lanes.join(",")}` : "");
  const [d, flame] = await Promise.all([api(`/p/${enc(profile)}/span?${q}`), api(`/p/${enc(profile)}/span/flame?${q}`).catch((x) => x)]);
  if (!state.range || state.range[0] !== s || state.range[1] !== e) return;  // replaced meanwhile
  spanEl.replaceChildren(spanPanel(d), flame instanceof Error
    ? h("p", { class: "warn", id: "span-flame-error" }, `No flame graph for this span: ${flame.message}`) : spanFlame(flame));
  spanEl.dataset.events = d.events;
}

function clearSelection() {
  state.range = null; state.rangeLanes = null; state.mark = null; state.selected = null; state.selectedEv = null; state.flowLinks = null;
  spanEl.replaceChildren(); draw(); showSelection(); saveUrl();
}

// the selection as a time range: the area selected, else the selected event
function selectionRange() {
  if (state.range) return state.range;
  const ev = state.selectedEv;
  return ev ? [ev.start_ns, ev.start_ns + Math.max(ev.dur_ns, 1)] : null;
}

function addFlag(ns) {
  const i = flagNear(ns);
  if (i >= 0) state.flags.splice(i, 1); else state.flags.push(Math.round(ns));
  draw(); showSelection(); saveUrl();
}

// the page's side of the keys (timeline_keys.js calls these)
const actions = {
  zoom, pan, clearSelection, findFocus: () => findBox.focus(),
  fit() {
    const r = selectionRange();
    if (!r) return false;
    const pad = Math.max((r[1] - r[0]) * 0.05, 1);
    setView(r[0] - pad, r[1] + pad);
    return true;
  },
  mark(keep) {
    const r = selectionRange();
    if (!r) return false;
    if (keep) { state.marks.push(r.slice()); state.mark = null; }
    else state.mark = state.mark && state.mark[0] === r[0] && state.mark[1] === r[1] ? null : r.slice();
    draw(); saveUrl();
    return true;
  },
  toggleDetails() {
    document.querySelector(".tl-body").classList.toggle("no-details");
    draw(); viewChanged(0);
  },
  flag(step) {  // centre the view on the next (or previous) flag after the view's centre
    const f = [...state.flags].sort((a, b) => a - b);
    if (!f.length) return false;
    const mid = state.origin + (state.view[0] + state.view[1]) / 2;
    const next = step > 0 ? f.find((t) => t > mid + 0.5) : [...f].reverse().find((t) => t < mid - 0.5);
    const t = next === undefined ? (step > 0 ? f[0] : f[f.length - 1]) : next;
    const half = (state.view[1] - state.view[0]) / 2;
    setView(t - half, t + half);
    return true;
  },
};

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
    const r = canvas.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    tip.hidden = true;  // not over what a drag selects
    if (x >= GUTTER && y < AXIS) { addFlag(nsAt(e.clientX)); return; }  // the ruler: a flag
    if (x >= GUTTER && !e.shiftKey && e.button === 0) { state.sel = { from: nsAt(e.clientX), x: e.clientX, y }; return; }
    drag = { x: e.clientX, view: state.view.slice(), moved: false }; canvas.classList.add("dragging");
  });
  window.addEventListener("mouseup", (e) => {
    if (state.sel) {
      const a = state.sel.from, b = nsAt(e.clientX), start = state.sel;
      state.sel = null;
      const lanes = lanesBetween(start.y, e.clientY - canvas.getBoundingClientRect().top);
      if (Math.abs(e.clientX - start.x) >= 3) { showSpan(Math.min(a, b), Math.max(a, b), lanes).catch((x) => { spanEl.textContent = x.message; }); return; }
      drag = { moved: false };  // no drag: a click, on an event or a merged rectangle
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
    if (drag && drag.moved) viewChanged(0);
    drag = null;
  });
  window.addEventListener("mousemove", (e) => {
    if (state.sel) {
      if (Math.abs(e.clientX - state.sel.x) < 3) return;
      const a = state.sel.from, b = nsAt(e.clientX);
      state.range = [Math.min(a, b), Math.max(a, b)];
      state.rangeLanes = lanesBetween(state.sel.y, e.clientY - canvas.getBoundingClientRect().top);
      draw(); showSelection(); return;
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
    tip.textContent = clean(`${state.win.names[rr.name[i]]} · ${rr.kind[i]} · ${fmtNs(rr.dur_ns[i])}` + (rr.count[i] > 1 ? ` · ${rr.count[i]} events merged (click to zoom)` : ""));
    tip.style.left = e.clientX + 12 + "px"; tip.style.top = e.clientY + 14 + "px"; tip.hidden = false;
  });
  wireKeys(actions);
  window.addEventListener("resize", () => { draw(); viewChanged(); });
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
  state.origin = d.extent.start_ns;
  hold(d.window, d.device_time_modeled);
  // the view from the link exactly (BigInt), else the server's first window
  const rel = (text, dflt) => { try { return Number(BigInt(text) - BigInt(state.origin)); } catch { return dflt - state.origin; } };
  state.view = q ? [rel(s0, d.window.start_ns), rel(e0, d.window.end_ns)] : [d.window.start_ns - state.origin, d.window.end_ns - state.origin];
  state.pinned = new Set(parseList(qs("pins"), Number).filter((i) => Number.isInteger(i) && i >= 0 && i < d.lanes.length));
  state.flags = parseList(qs("flags"), Number);
  state.marks = parseList(qs("marks"), parseRange);
  state.mark = parseRange(qs("mark"));
  state.counters = await fetchCounters(d.window.start_ns, d.window.end_ns, width).catch(() => null);
  canvas = h("canvas", { id: "tl-canvas" });
  Object.assign(dom, { canvas, ctx: canvas.getContext("2d"), wrap: h("div", { class: "tl-wrap" }, canvas) });
  statusEl = dom.status = h("span", { class: "tl-status", id: "tl-status" });
  detailsEl = h("div", { class: "tl-details", id: "tl-details" }, section("Event", h("p", { class: "note" }, "Click an event for its details and its whole Python stack.")));
  const ovCanvas = h("canvas", { id: "tl-overview", title: "The whole profile: click or drag to move the view there" });
  const overview = dom.overview = new Overview(ovCanvas, GUTTER, (t) => { const span = state.view[1] - state.view[0]; setView(t - span / 2, t + span / 2); });
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
  Object.assign(findUi, { count: findCount, focusEvent });
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
        h("a", { href: "#", id: "tl-show-all", onclick: (x) => { x.preventDefault(); setView(d.extent.start_ns, Math.min(d.extent.end_ns, Number(URL_NS))); } }, "show all")) : null,
      findBox, h("button", { id: "tl-find-prev", title: "Previous match (Shift+Enter)", onclick: () => find(findBox.value, -1) }, "▲"),
      h("button", { id: "tl-find-next", title: "Next match (Enter)", onclick: () => find(findBox.value, 1) }, "▼"), findCount,
      colors, statusEl,
      h("span", { class: "spacer" }),
      h("span", { class: "tl-sel", id: "tl-sel" }),
      h("span", { class: "note" }, KEY_HINT)),
    h("div", { class: "tl-body", style: { gridTemplateColumns: `minmax(0, 1fr) ${SIDE_W}px` } },
      h("div", { class: "tl-left" }, ovCanvas, dom.wrap, spanEl), detailsEl), tip);
  wire();
  // the overview is the first view (the whole profile, fit to where its events are)
  overview.setData(q ? (await api(`/p/${enc(profile)}/timeline?width_px=${width}`)).window : d.window, d.lanes);
  draw();
  updateStatus();
  window.neTimeline = { rectCenter, state, setView, laneClick, holds, fetchWindow };  // for the tests and the benchmark
  showSelection();
  const sel = parseRange(qs("sel"));
  const selLanes = parseList(qs("sel_lanes"), Number).filter((i) => Number.isInteger(i) && i >= 0 && i < d.lanes.length);
  if (sel) await showSpan(sel[0], sel[1], selLanes.length ? selLanes : null).catch((x) => { spanEl.textContent = x.message; });
  const ev = qs("event");
  if (ev !== null) {
    const d = await select(Number(ev));
    if (s0 === null && d) focusEvent(d.event);
  }
  // a deep link's search: highlighted, and its first match shown unless the link names a place
  if (findBox.value) await find(findBox.value, ev === null && s0 === null ? 1 : 0);
  else if (qs("line")) await findLine(qs("line"), ev === null && s0 === null ? 1 : 0).catch((e) => { findCount.textContent = e.message; });
  else if (qs("module") !== null) await findModule(qs("module"), ev === null && s0 === null ? 1 : 0).catch((e) => { findCount.textContent = e.message; });
  else if (qs("path")) await findPath(new URL(location.href).searchParams, 0).catch((e) => { findCount.textContent = e.message; });
  canvas.dataset.ready = "1";
});

