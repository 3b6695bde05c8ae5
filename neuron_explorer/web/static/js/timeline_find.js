// Find on the timeline: a name substring (any case) or /a regular expression/ matched by the
// server over every event, a source line's events (?line=) or an nn.Module's (?module=, the
// Modules page's link: the module and its submodules); matches are outlined, the rest
// fade, and Enter / Shift+Enter (or ▼ ▲) step through them in time order.
import { api, fmtNum, enc, profile } from "./common.js";
import { draw, state } from "./timeline_draw.js";

// set once by the page: the count's element and how to show one event
export const findUi = { count: null, focusEvent: null };

// Find: a name substring (any case), or /a regular expression/; the server matches every event
// and returns the first matches in time order, which Enter / Shift+Enter (or ▼ ▲) step through.
function parseFind(text) {
  const t = text.trim();
  const m = /^\/(.+)\/$/.exec(t);
  return m ? { q: m[1], regex: true } : { q: t, regex: false };
}

export async function find(text, step) {
  const { q, regex } = parseFind(text);
  const url = new URL(location.href);
  if (!q && state.find && state.find.line) { stepFound(step); return; }  // a source line's events
  if (!q) {
    state.find = null; findUi.count.textContent = ""; draw();
    url.searchParams.delete("find"); history.replaceState(null, "", url);
    return;
  }
  if (!state.find || state.find.text !== text) {
    findUi.count.textContent = "searching…";
    let d;
    try {
      d = await api(`/p/${enc(profile)}/search?q=${enc(q)}&regex=${regex}`);
    } catch (e) {
      findUi.count.textContent = e.message; state.find = null; draw(); return;
    }
    state.find = { text, matches: d.matches, total: d.total, names: new Set(d.names), cursor: -1 };
    url.searchParams.set("find", text); history.replaceState(null, "", url);
  }
  stepFound(step);
}

function stepFound(step) {
  const f = state.find;
  if (!f.matches.length) { findUi.count.textContent = "no match"; draw(); return; }
  if (step) {
    f.cursor = (f.cursor + step + f.matches.length) % f.matches.length;
    findUi.focusEvent(f.matches[f.cursor]);
  } else draw();
  findUi.count.textContent = (f.line ? `${f.line}: ` : f.label ? `${f.label}: ` : "") + `${f.cursor >= 0 ? f.cursor + 1 : "–"} / ${fmtNum(f.total)}` + (f.total > f.matches.length ? ` (first ${f.matches.length} in time order)` : "");
  findUi.count.dataset.total = f.total;
}

// ?line=FILE_ID:N (the source view's link): that line's events outlined, the rest faded
export async function findLine(spec, step) {
  const m = /^([0-9a-f]{1,40}):(\d+)$/.exec(spec || "");
  if (!m) return;
  const d = await api(`/p/${enc(profile)}/source/${m[1]}/lines/${m[2]}/events`);
  state.find = { text: null, line: `line ${d.file.split("/").pop()}:${d.line}`, matches: d.matches, total: d.total, names: null,
    ids: new Set(d.matches.map((x) => x.id)), cursor: -1 };
  stepFound(step);
}


// ?module=PATH (the Modules page's link): the events run in that module or below it
export async function findModule(path, step) {
  const d = await api(`/p/${enc(profile)}/modules/events?module=${enc(path)}`);
  state.find = { text: null, line: `module ${path === "" ? "(model)" : path}`, matches: d.matches, total: d.total, names: null,
    ids: new Set(d.matches.map((x) => x.id)), cursor: -1 };
  stepFound(step);
}

// ?path=1 (the critical-path page's link, with its step, rank, annotation and instance): the
// events on the step's critical path outlined, the rest faded, stepped through in time order
export async function findPath(params, step) {
  const q = new URLSearchParams();
  for (const k of ["step", "rank", "annotation", "instance"]) if (params.get(k) !== null) q.set(k, params.get(k));
  const d = await api(`/p/${enc(profile)}/critical-path${q.toString() ? "?" + q : ""}`);
  const byId = new Map();
  for (const s of d.segments) if (s.event_id >= 0 && !byId.has(s.event_id)) byId.set(s.event_id, { id: s.event_id, start_ns: s.start_ns, dur_ns: s.dur_ns });
  const matches = [...byId.values()].sort((a, b) => a.start_ns - b.start_ns);
  state.find = { text: null, label: `critical path of ${d.label}`, matches, total: matches.length, names: null, ids: new Set(byId.keys()), cursor: -1 };
  stepFound(step);
}
