// The timeline: every lane on one time axis, drawn on a canvas from the server's reduced window.
// Wheel or W/S zooms around the pointer, drag or A/D pans; each change asks the server for the
// new window. Canvas text is drawn with fillText, so names are never parsed as HTML. Drawing is
// timeline_draw.js, find timeline_find.js, the side panels timeline_panels.js.
import { api, h, mount, run, fmtNs, fmtNum, enc, section, setModeled, profile, qs, clean } from "./common.js";
import { Overview, COLOR_MODES } from "./timeline_overview.js";
import { eventPanel, spanPanel } from "./timeline_panels.js";
import { GUTTER, ROW, PIN_W, state, dom, draw, xOf, groupOf, hitAt } from "./timeline_draw.js";
import { find, findLine, findPath, findUi } from "./timeline_find.js";

// the server refuses times beyond ±2^62 ns; a double near that prints rounded up, so stay below
const URL_NS = 4e18;
const SIDE_W = 380; // the details side panel
let canvas, statusEl, detailsEl, tip, findBox, findCount, spanEl;

async function fetchCounters(s, e, width) {
  const d = await api(`/p/${enc(profile)}/counters?start_ns=${s}&end_ns=${e}&width_px=${width}`);
  return d.counters;
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
  const [d, counters] = await Promise.all([api(`/p/${enc(profile)}/timeline?start_ns=${s}&end_ns=${e}&width_px=${width}&window_only=true`),
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


// Shift+drag selects a span: what ran inside it (clipped), as Perfetto's area selection.
function nsAt(clientX) {
  const r = canvas.getBoundingClientRect();
  return state.view[0] + ((clientX - r.left - GUTTER) / (canvas.clientWidth - GUTTER)) * (state.view[1] - state.view[0]);
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
    tip.textContent = clean(`${state.win.names[rr.name[i]]} · ${rr.kind[i]} · ${fmtNs(rr.dur_ns[i])}` + (rr.count[i] > 1 ? ` · ${rr.count[i]} events merged (click to zoom)` : ""));
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
  Object.assign(dom, { canvas, ctx: canvas.getContext("2d"), wrap: h("div", { class: "tl-wrap" }, canvas) });
  statusEl = h("span", { class: "tl-status", id: "tl-status" });
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
        h("a", { href: "#", id: "tl-show-all", onclick: (x) => { x.preventDefault(); setView(d.extent.start_ns, Math.min(d.extent.end_ns, URL_NS)); } }, "show all")) : null,
      findBox, h("button", { id: "tl-find-prev", title: "Previous match (Shift+Enter)", onclick: () => find(findBox.value, -1) }, "▲"),
      h("button", { id: "tl-find-next", title: "Next match (Enter)", onclick: () => find(findBox.value, 1) }, "▼"), findCount,
      colors, statusEl,
      h("span", { class: "spacer" }),
      h("span", { class: "note" }, "wheel: zoom · drag: pan · Shift+drag: totals of a span · click: details · click a lane's name to fold it, its ○ to pin it · W/A/S/D · / find")),
    h("div", { class: "tl-body", style: { gridTemplateColumns: `minmax(0, 1fr) ${SIDE_W}px` } },
      h("div", { class: "tl-left" }, ovCanvas, dom.wrap, spanEl), detailsEl), tip);
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
  else if (qs("path")) await findPath(new URL(location.href).searchParams, 0).catch((e) => { findCount.textContent = e.message; });
  canvas.dataset.ready = "1";
});

