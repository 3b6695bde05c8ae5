// What the user puts on the timeline besides the view, as Perfetto does: the area selection's
// marks (M marks it until the next M, Shift+M keeps it), flags on the ruler with the time
// between each neighbouring pair, and the ruler's ticks. Times are absolute ns, as events'.
import { fmtNs } from "./common.js";
import { AXIS, GUTTER, state, dom, xOf } from "./timeline_draw.js";

const MARK_FILL = "rgba(245,158,11,0.16)", MARK_EDGE = "#d97706", FLAG = "#be123c";

export function niceStep(span, px) {  // a 1-2-5 step about 110 px apart, at least 1 ns
  const raw = Math.max(span / Math.max(1, px / 110), 1);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

export function fmtTick(t, step) {  // enough decimals that neighbouring ticks differ
  const a = Math.abs(t) || step;
  const [scale, unit] = a >= 1e9 ? [1e9, "s"] : a >= 1e6 ? [1e6, "ms"] : a >= 1e3 ? [1e3, "µs"] : [1, "ns"];
  const decimals = Math.max(0, Math.min(9, Math.ceil(-Math.log10(step / scale) - 1e-9)));
  return (t / scale).toFixed(decimals) + " " + unit;
}

function area(ctx, [s, e], height, width) {
  const x0 = Math.max(GUTTER, xOf(s)), x1 = Math.min(width, xOf(e));
  if (x1 < x0) return;
  ctx.fillStyle = MARK_FILL; ctx.fillRect(x0, AXIS, Math.max(1, x1 - x0), height - AXIS);
  ctx.fillStyle = MARK_EDGE; ctx.fillRect(x0, AXIS, 1, height - AXIS); ctx.fillRect(Math.max(x0, x1 - 1), AXIS, 1, height - AXIS);
}

// after the ruler is drawn: marked areas, then the flags and the time between neighbours
export function drawMarks(height, width) {
  const { ctx } = dom;
  ctx.save();
  ctx.beginPath(); ctx.rect(GUTTER, 0, width - GUTTER, height); ctx.clip();
  for (const m of state.marks) area(ctx, m, height, width);
  if (state.mark) area(ctx, state.mark, height, width);
  const flags = [...state.flags].sort((a, b) => a - b);
  ctx.textBaseline = "middle";
  flags.forEach((t, i) => {
    const x = xOf(t);
    ctx.fillStyle = FLAG; ctx.fillRect(x, 0, 1, height);
    ctx.beginPath(); ctx.moveTo(x, 2); ctx.lineTo(x + 9, 6); ctx.lineTo(x, 10); ctx.fill();
    if (i === 0) return;
    const xp = xOf(flags[i - 1]), label = "Δ " + fmtNs(t - flags[i - 1]);
    const tw = ctx.measureText(label).width + 8, mid = (xp + x) / 2;
    ctx.fillStyle = "#fff1f2"; ctx.fillRect(mid - tw / 2, AXIS - 13, tw, 12);
    ctx.fillStyle = FLAG; ctx.fillText(label, mid - tw / 2 + 4, AXIS - 7);
  });
  ctx.restore();
}

// the flag nearest `ns` within a few pixels, for a second click that removes it
export function flagNear(ns) {
  return state.flags.findIndex((t) => Math.abs(xOf(t) - xOf(ns)) <= 4);
}

// the URL's form of the marks and flags: integers, comma separated; ranges as START-END
export const rangeText = ([s, e]) => `${Math.round(s)}_${Math.round(e)}`;
export function parseRange(text) {
  const m = /^(-?\d+)_(-?\d+)$/.exec(text || "");
  return m && +m[2] > +m[1] ? [+m[1], +m[2]] : null;
}
export const parseList = (text, one) => (text ? text.split(",").map(one).filter((x) => x !== null && (typeof x !== "number" || Number.isFinite(x))) : []);
