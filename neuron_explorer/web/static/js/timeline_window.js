// The window the timeline holds: the view and half a view on each side, at the view's
// resolution. A change of view that stays inside it (zoomed in at most twice past its
// resolution) draws from it alone; otherwise the server is asked in the background, 90 ms after
// the last change. The view, selection, marks, flags and pins follow into the URL.
import { api, fmtNs, fmtNum, enc, profile } from "./common.js";
import { GUTTER, state, dom, draw } from "./timeline_draw.js";
import { rangeText } from "./timeline_marks.js";

// the server refuses times beyond ±2^62 ns; a double near that prints rounded up, so stay below
export const URL_NS = 4000000000000000000n;
const PAD = 0.5;      // the held window: the view and this many views on each side
const FINER = 2;      // zoomed in past this many times the held resolution: fetch finer detail

export async function fetchCounters(s, e, width) {
  const d = await api(`/p/${enc(profile)}/counters?start_ns=${s}&end_ns=${e}&width_px=${width}`);
  return d.counters;
}


// ns after the origin as the exact integer the server reads (BigInt: no double rounding near 2^60)
export function absText(t) {
  const v = BigInt(state.origin) + BigInt(Math.round(t));
  return String(v > URL_NS ? URL_NS : v < -URL_NS ? -URL_NS : v);
}

const plotWidth = () => Math.max(100, dom.canvas.clientWidth - GUTTER);

// whether the held window (or `hd`: the one on its way) covers the view at a resolution fine
// enough to draw it
export function holds(hd = state.held) {
  const [s, e] = state.view;
  return !!hd && s >= hd.s && e <= hd.e && (e - s) / plotWidth() >= hd.nsPerPx / FINER;
}

// after every change of view: the URL follows, and the server is asked only when needed
let fetchTimer = null, urlTimer = null;
export function viewChanged(delay = 90) {
  clearTimeout(urlTimer);
  urlTimer = setTimeout(saveUrl, 150);
  if (state.win) updateStatus();
  // a slow server: a window on its way that will hold the view is waited for, not asked again
  if (!holds() && !holds(state.pending)) scheduleFetch(delay);
}

export function scheduleFetch(delay = 90) {
  clearTimeout(fetchTimer);
  fetchTimer = setTimeout(() => fetchWindow().catch((e) => { dom.status.textContent = "Could not load this window: " + e.message; }), delay);
}

export async function fetchWindow() {
  const id = ++state.reqId;
  state.fetches++;
  dom.status.dataset.fetches = state.fetches;
  const [v0, v1] = state.view, pad = (v1 - v0) * PAD;
  const s = absText(v0 - pad), e = absText(v1 + pad);
  const width = Math.min(8000, Math.round(plotWidth() * (1 + 2 * PAD)));
  state.pending = { s: v0 - pad, e: v1 + pad, nsPerPx: (v1 - v0 + 2 * pad) / width };
  const t0 = performance.now();
  let d, counters;
  try {
    [d, counters] = await Promise.all([api(`/p/${enc(profile)}/timeline?start_ns=${s}&end_ns=${e}&width_px=${width}&window_only=true`),
      fetchCounters(s, e, width).catch(() => null)]);
  } finally {
    if (id === state.reqId) state.pending = null;
  }
  if (id !== state.reqId) return;
  state.counters = counters;
  hold(d.window, d.device_time_modeled);
  draw();
  updateStatus(performance.now() - t0);
}

export function hold(win, modeled) {
  state.win = win;
  state.win.device_time_modeled = modeled;
  state.held = { s: win.start_ns - state.origin, e: win.end_ns - state.origin, nsPerPx: (win.end_ns - win.start_ns) / win.width_px };
}

// the view, the area selection, the marks, the flags and the pinned lanes: a reload restores them
export function saveUrl() {
  const url = new URL(location.href), p = url.searchParams;
  p.set("start_ns", absText(state.view[0])); p.set("end_ns", absText(state.view[1]));
  const put = (k, v) => (v ? p.set(k, v) : p.delete(k));
  put("sel", state.range && rangeText(state.range));
  put("sel_lanes", state.range && state.rangeLanes && state.rangeLanes.join(","));
  put("mark", state.mark && rangeText(state.mark));
  put("marks", state.marks.map(rangeText).join(","));
  put("flags", state.flags.map(Math.round).join(","));
  put("pins", [...state.pinned].join(","));
  if (state.selected === null) p.delete("event");
  history.replaceState(null, "", url);
}

export function updateStatus(ms) {
  const w = state.win;
  dom.status.textContent = `${fmtNs(state.view[1] - state.view[0])} window · ${fmtNum(w.events)} events → ${fmtNum(w.rects_count)} rectangles` +
    (w.merged ? ` (${fmtNum(w.merged)} events narrower than ${fmtNs(w.bucket_ns)} merged)` : "") + (ms ? ` · ${ms.toFixed(0)} ms` : "");
  dom.status.dataset.start = state.origin + state.view[0];
  dom.status.dataset.end = state.origin + state.view[1];
}
