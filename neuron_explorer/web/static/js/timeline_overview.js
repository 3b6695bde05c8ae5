// Parts of the timeline that need none of its state: the overview strip (the whole profile's
// activity, host above and device below, with the window in view as a box: click or drag on it
// to move there), the colour schemes (by category, the event's kind; or by name, one hue per
// op or kernel name) and which lanes are the profiler's own.
import { KIND_COLORS } from "./common.js";

export const OVERVIEW_H = 34;

// the profiler's own threads: Kineto's markers ("PyTorch Profiler (0)", "Iteration Start",
// "Record Window End") each on a thread of their own, one named after the profiler and one
// nameless. A lane holding nothing else is not drawn (the lanes' table and the SQL keep it).
const OWN_TRACK = /^thread(?: (?:Trace )?PyTorch Profiler)?\s*$/, OWN_MAX_EVENTS = 3;
export const ownLane = (l) => l.layer === "host" && OWN_TRACK.test(l.track || "") && l.events <= OWN_MAX_EVENTS;

export class Overview {
  constructor(canvas, gutter, onJump) {
    this.canvas = canvas; this.gutter = gutter; this.onJump = onJump;
    this.win = null; this.lanes = [];
    let dragging = false;
    const jump = (e) => {
      if (!this.win) return;
      const r = canvas.getBoundingClientRect();
      const frac = (e.clientX - r.left - gutter) / Math.max(1, r.width - gutter);
      if (frac < 0 || frac > 1) return;
      this.onJump(this.win.start_ns + frac * (this.win.end_ns - this.win.start_ns));
    };
    canvas.addEventListener("mousedown", (e) => { dragging = true; jump(e); });
    window.addEventListener("mousemove", (e) => { if (dragging) jump(e); });
    window.addEventListener("mouseup", () => { dragging = false; });
  }

  setData(win, lanes) { this.win = win; this.lanes = lanes; }

  draw(view, width) {
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    c.style.width = width + "px"; c.style.height = OVERVIEW_H + "px";
    c.width = Math.round(width * dpr); c.height = Math.round(OVERVIEW_H * dpr);
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#f8fafc"; ctx.fillRect(0, 0, width, OVERVIEW_H);
    ctx.fillStyle = "#6b7280"; ctx.font = "11px Inter, system-ui, sans-serif"; ctx.textBaseline = "middle";
    ctx.fillText("overview", 8, OVERVIEW_H / 2);
    const w = this.win;
    if (!w) return;
    const span = Math.max(1, w.end_ns - w.start_ns), plotW = width - this.gutter;
    const xOf = (t) => this.gutter + ((t - w.start_ns) / span) * plotW;
    const half = (OVERVIEW_H - 4) / 2;
    const r = w.rects;
    for (let i = 0; i < r.lane.length; i++) {  // host work in the top half, device below
      const host = (this.lanes[r.lane[i]] || {}).layer === "host";
      ctx.fillStyle = host ? "rgba(59,130,246,0.45)" : "rgba(16,185,129,0.55)";
      const x0 = xOf(r.start_ns[i]), x1 = xOf(r.start_ns[i] + r.dur_ns[i]);
      ctx.fillRect(x0, host ? 2 : 2 + half, Math.max(1, x1 - x0), half);
    }
    const v0 = Math.max(this.gutter, xOf(view[0])), v1 = Math.min(width, xOf(view[1]));
    ctx.strokeStyle = "#2563eb"; ctx.lineWidth = 2;
    ctx.fillStyle = "rgba(37,99,235,0.10)";
    ctx.fillRect(v0, 1, Math.max(2, v1 - v0), OVERVIEW_H - 2);
    ctx.strokeRect(v0, 1, Math.max(2, v1 - v0), OVERVIEW_H - 2);
    c.dataset.viewStart = view[0]; c.dataset.viewEnd = view[1];
  }
}

function hash(name) {
  let x = 0;
  for (let i = 0; i < Math.min(name.length, 48); i++) x = (x * 31 + name.charCodeAt(i)) | 0;
  return x >>> 0;
}

function shade(hex, amt) {
  const n = parseInt(hex.slice(1), 16);
  const f = (c) => Math.max(0, Math.min(255, Math.round(c + (amt > 0 ? (255 - c) * amt : c * amt))));
  return `rgb(${f(n >> 16)},${f((n >> 8) & 255)},${f(n & 255)})`;
}

function hslRgb(hue, s, l) {  // as rgb(), which textColor reads
  const k = (n) => (n + hue / 30) % 12, a = s * Math.min(l, 1 - l);
  const f = (n) => Math.round(255 * (l - a * Math.max(-1, Math.min(k(n) - 3, 9 - k(n), 1))));
  return `rgb(${f(0)},${f(8)},${f(4)})`;
}

export const COLOR_MODES = { kind: "Colour by category", name: "Colour by name" };

// "kind": the category's colour, a little lighter or darker per name; "name": a hue per name
export function colorFor(mode, kind, name) {
  if (mode === "name") return hslRgb(hash(name) % 360, 0.55, 0.6);
  return shade(KIND_COLORS[kind] || "#9ca3af", (hash(name) % 5) * 0.07 - 0.14);
}

export function textColor(rgb) {
  const [r, g, b] = rgb.match(/\d+/g).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 150 ? "#111827" : "#fff";
}
