// Shared helpers for every page. All text goes into the DOM through textContent (h() below),
// never through innerHTML, so event names and source code are always shown, never run.
// Text from a profile may carry bidi controls (a right-to-left override makes `evil\u202Egnp.py`
// read as `evilyp.png`, and reorders the UI text around it): every string shown is passed
// through clean(), which shows each control as a visible U+FFFD instead.
const BIDI = /[\u202A-\u202E\u2066-\u2069\u200E\u200F\u061C]/g;
export const clean = (s) => String(s).replace(BIDI, "\uFFFD");
// plotly renders its strings as a subset of HTML (<a href>, <span style>, <b>...): text from a
// profile is escaped before it reaches a chart (plotly turns the entities back into characters).
export const plotText = (s) => clean(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

export const profile = document.body.dataset.profile || "";
export const fileId = document.body.dataset.fileId || "";
export const app = document.getElementById("app");

export async function api(path) {
  const res = await fetch("/api" + path);
  let body = null;
  try { body = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) throw new Error((body && (body.error || detailText(body.detail))) || `${res.status} ${res.statusText}`);
  return body;
}

// FastAPI's validation errors are a list of {loc, msg}: a sentence, never "[object Object]"
function detailText(detail) {
  if (!Array.isArray(detail)) return detail ? String(detail) : "";
  return detail.map((d) => `${(d.loc || []).slice(1).join(".") || "request"}: ${d.msg}`).join("; ");
}

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "text") el.textContent = clean(v);
    else el.setAttribute(k, v === true ? "" : k === "title" ? clean(v) : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(clean(c)));
  }
  return el;
}

export function mount(...nodes) {
  app.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined && n !== false));
}

export function showError(err) {
  mount(h("div", { class: "error-box" }, h("h2", {}, "Could not load this page"),
    h("p", {}, String(err && err.message ? err.message : err)),
    h("p", {}, h("a", { href: "/" }, "Back to the profiles"))));
}

export function setModeled(flag) {
  const b = document.getElementById("modeled-badge");
  if (b) b.hidden = !flag;
}

export function fmtNs(ns) {
  if (ns === null || ns === undefined || Number.isNaN(ns)) return "–";
  const a = Math.abs(ns);
  if (a >= 1e9) return (ns / 1e9).toFixed(a >= 1e10 ? 1 : 2) + " s";
  if (a >= 1e6) return (ns / 1e6).toFixed(a >= 1e8 ? 0 : a >= 1e7 ? 1 : 2) + " ms";
  if (a >= 1e3) return (ns / 1e3).toFixed(a >= 1e5 ? 0 : a >= 1e4 ? 1 : 2) + " µs";
  return Math.round(ns) + " ns";
}

export function fmtNum(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  const a = Math.abs(x);
  const units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [v, u] of units) if (a >= v) return (x / v).toPrecision(digits) + " " + u;
  return Number.isInteger(x) ? String(x) : x.toPrecision(digits);
}

export const fmtBytes = (b) => (b === null || b === undefined ? "–" : fmtNum(b) + "B");
export const fmtPct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");

export function fmtDelta(ns) {
  if (ns === null || ns === undefined) return "–";
  return (ns > 0 ? "+" : ns < 0 ? "−" : "±") + fmtNs(Math.abs(ns));
}

export function qs(name) {
  return new URLSearchParams(location.search).get(name);
}

export const enc = encodeURIComponent;
export const pUrl = (name, rest = "") => `/p/${enc(name)}${rest}`;
export const sourceUrl = (name, fid, line) => `${pUrl(name, "/source/" + enc(fid))}${line ? "#L" + line : ""}`;
// the Modules page at one module ("" is the model itself)
export const moduleUrl = (name, path) => pUrl(name, `/modules?module=${enc(path)}`);
export const moduleLink = (name, path, cls = "") => h("a", { href: moduleUrl(name, path), class: `mono module-link ${cls}`.trim() }, path === "" ? "(model)" : path);
export const timelineUrl = (name, ev) =>
  pUrl(name, `/timeline?event=${enc(ev.id)}` + (ev.start_ns !== undefined && ev.start_ns !== null ? `&start_ns=${Math.max(0, ev.start_ns - (ev.dur_ns || 1000) * 3)}&end_ns=${ev.start_ns + (ev.dur_ns || 1000) * 4}` : ""));

export function card(label, value, note) {
  return h("div", { class: "card" }, h("div", { class: "card-label", title: label }, label),
    h("div", { class: "card-value" }, value), note ? h("div", { class: "card-note" }, note) : null);
}

export function section(title, ...body) {
  return h("section", { class: "panel" }, h("h2", { title: typeof title === "string" ? title : null }, title), ...body);
}

export function severityChip(sev) {
  return h("span", { class: `sev sev-${sev || "low"}` }, sev || "low");
}

// Readiness findings (the model does not run right on the device) rank before performance ones.
export function findingChips(f) {
  const chips = [severityChip(f.severity)];
  if (f.category === "readiness") chips.push(" ", h("span", { class: "sev cat-readiness", title: "a porting problem: the step leaves the device or computes differently there; ranked before performance findings" }, "readiness"));
  return h("span", {}, ...chips);
}

// A sortable table. columns: [{key, label, fmt?, num?, cell?(row) -> Node|string, title?}]
export function dataTable(columns, rows, opts = {}) {
  let sortKey = opts.sortKey || null;
  let desc = opts.desc !== undefined ? opts.desc : true;
  const tbody = h("tbody");
  const headRow = h("tr");
  const thead = h("thead", {}, headRow);
  const table = h("table", { class: "data" + (opts.compact ? " compact" : "") }, thead, tbody);
  const render = () => {
    const sorted = rows.slice();
    if (sortKey) {
      sorted.sort((a, b) => {
        const x = a[sortKey], y = b[sortKey];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        const r = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return desc ? -r : r;
      });
    }
    tbody.replaceChildren(...sorted.flatMap((r) => {
      const tr = h("tr", { class: opts.rowClass ? opts.rowClass(r) : null });
      for (const c of columns) {
        const v = c.cell ? c.cell(r) : c.fmt ? c.fmt(r[c.key], r) : r[c.key];
        const td = h("td", { class: c.num ? "num" : null, title: c.title ? c.title(r) : null }, v === null || v === undefined ? "–" : v);
        if (!td.title && td.textContent.length > 24) td.title = td.textContent;  // cut to one line: whole on hover
        tr.append(td);
      }
      if (opts.onRowClick) {
        tr.classList.add("clickable");
        tr.addEventListener("click", (e) => { if (!e.target.closest("a")) opts.onRowClick(r, tr); });
      }
      return [tr];
    }));
  };
  headRow.replaceChildren(...columns.map((c) => {
    const th = h("th", { class: c.num ? "num" : null, title: c.help || null }, c.label);
    if (c.key && opts.sortable !== false) {
      th.classList.add("sortable");
      th.addEventListener("click", () => {
        if (sortKey === c.key) desc = !desc; else { sortKey = c.key; desc = !!c.num; }
        headRow.querySelectorAll("th").forEach((x) => x.classList.remove("asc", "desc"));
        th.classList.add(desc ? "desc" : "asc");
        render();
      });
    }
    return th;
  }));
  render();
  return table;
}

export function heatBar(frac, cls = "") {
  const f = Math.max(0, Math.min(1, frac || 0));
  return h("span", { class: "heat " + cls }, h("span", { style: { width: (100 * f).toFixed(1) + "%" } }));
}

const PLOT_FONT = { family: "Inter, system-ui, -apple-system, Segoe UI, sans-serif", size: 12, color: "#1f2937" };

export function plot(el, data, layout = {}) {
  const base = {
    font: PLOT_FONT, margin: { l: 60, r: 20, t: 30, b: 40 }, paper_bgcolor: "#fff", plot_bgcolor: "#fff",
    xaxis: { gridcolor: "#eef0f3", zerolinecolor: "#d6dae0" }, yaxis: { gridcolor: "#eef0f3", zerolinecolor: "#d6dae0" },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, hoverlabel: { font: { family: PLOT_FONT.family } },
  };
  const merged = { ...base, ...layout, xaxis: escapeTitle({ ...base.xaxis, ...(layout.xaxis || {}) }), yaxis: escapeTitle({ ...base.yaxis, ...(layout.yaxis || {}) }) };
  if (merged.title) merged.title = escapeTitle({ title: merged.title }).title;
  return window.Plotly.newPlot(el, data.map(escapeTrace), merged, { displaylogo: false, responsive: true });
}

// Titles are drawn as HTML too, and may carry what a profile names (a counter's unit).
function escapeTitle(part) {
  const t = part.title;
  if (typeof t === "string") return { ...part, title: plotText(t) };
  if (t && typeof t.text === "string") return { ...part, title: { ...t, text: plotText(t.text) } };
  return part;
}

// Every string of a trace that plotly may render (categories, labels, legend names, hover
// text) is escaped; templates (hovertemplate) are ours and keep their markup: a profile's
// string put into one is escaped with plotText where it is put in.
const PLOT_TEXT_KEYS = ["x", "y", "text", "hovertext", "name", "labels", "parents"];
function escapeTrace(trace) {
  const out = { ...trace };
  for (const k of PLOT_TEXT_KEYS) {
    const v = out[k];
    if (typeof v === "string") out[k] = plotText(v);
    else if (Array.isArray(v)) out[k] = v.map((x) => (typeof x === "string" ? plotText(x) : x));
  }
  return out;
}

export const KIND_COLORS = {
  step: "#94a3b8", op: "#3b82f6", annotation: "#a78bfa", python: "#cbd5e1", runtime: "#f59e0b",
  compile: "#ef4444", fallback: "#dc2626", sync: "#e11d48", copy: "#14b8a6", kernel: "#10b981",
  instruction: "#22c55e", dma: "#06b6d4", collective: "#8b5cf6", gpu_kernel: "#10b981",
  gpu_memcpy: "#06b6d4", gpu_memset: "#0ea5e9", gpu_annotation: "#c4b5fd", memory: "#64748b", other: "#9ca3af",
};

export async function run(render) {
  try {
    await render();
  } catch (e) {
    console.warn(e);
    showError(e);
  }
}

// The filter boxes' language, as the timeline's find: a name substring (any case), or /regex/.
// Returns null for an empty filter; throws on a malformed regular expression.
export function nameMatcher(text) {
  const t = (text || "").trim();
  if (!t) return null;
  const m = /^\/(.+)\/$/.exec(t);
  if (m) { const re = new RegExp(m[1]); return (s) => re.test(s || ""); }
  const low = t.toLowerCase();
  return (s) => (s || "").toLowerCase().includes(low);
}

// A filter box over a table: redraws `render(rows)` into the returned element on each change
// and keeps the filter in the URL (?PARAM=), so a link carries it.
export function filteredTable(rows, render, { param = "filter", placeholder = "Filter: name or /regex/", key = "name" } = {}) {
  const box = h("input", { type: "search", class: "filter-box", id: `${param}-box`, placeholder, value: qs(param) || "" });
  const count = h("span", { class: "note", id: `${param}-count` });
  const holder = h("div");
  const apply = () => {
    let shown = rows;
    try {
      const m = nameMatcher(box.value);
      if (m) shown = rows.filter((r) => m(r[key]));
      count.textContent = m ? `${shown.length} of ${rows.length}` : "";
    } catch (e) {
      count.textContent = "bad regular expression: " + e.message;
    }
    holder.replaceChildren(render(shown));
    const url = new URL(location.href);
    if (box.value.trim()) url.searchParams.set(param, box.value); else url.searchParams.delete(param);
    history.replaceState(null, "", url);
  };
  box.addEventListener("input", apply);
  apply();
  return h("div", { class: "filtered" }, h("div", { class: "filter-bar" }, box, " ", count), holder);
}
