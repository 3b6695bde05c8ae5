// A step's critical path (/p/NAME/critical-path?step=&rank=): the chain of host calls, device
// work and waits that sets the step's length, drawn on the step's time axis by kind, its ops by
// share with what the step saves were each twice as fast, and a what-if replay box.
import { api, h, mount, run, fmtNs, fmtPct, dataTable, pUrl, enc, section, setModeled, card, qs, profile, timelineUrl } from "./common.js";

const CATEGORY_COLORS = { host: "#f59e0b", "device compute": "#10b981", dma: "#06b6d4", "collective wait": "#e11d48", transfer: "#8b5cf6" };

const block = (d, s, cls) => h("a", {
  class: cls, href: s.event_id >= 0 ? timelineUrl(profile, { id: s.event_id, start_ns: s.start_ns, dur_ns: s.dur_ns }) : null,
  title: `${s.label} (${s.category}): ${fmtNs(s.dur_ns)}`,
  style: `position:absolute;top:0;height:100%;left:${(100 * (s.start_ns - d.start_ns)) / Math.max(d.step_ns, 1)}%;width:${Math.max((100 * s.dur_ns) / Math.max(d.step_ns, 1), 0.05)}%;background:${CATEGORY_COLORS[s.category] || "#9ca3af"}`,
});
const lane = (id, children) => h("div", { id, style: "position:relative;height:22px;background:#f1f5f9;border-radius:4px;overflow:hidden;flex:1" }, ...children);

// the path on the step's axis: one block per piece, coloured by kind, each a link to the timeline;
// below it, the same pieces on the lanes they ran on (the host, each device queue, each rank)
function pathBar(d) {
  const legend = Object.entries(CATEGORY_COLORS).map(([k, c]) => h("span", { class: "cp-legend" },
    h("span", { style: `display:inline-block;width:10px;height:10px;margin:0 4px 0 12px;background:${c}` }), k));
  const lanes = new Map();
  for (const s of d.segments) {
    const key = `rank ${s.rank} · ${s.track}`;
    if (!lanes.has(key)) lanes.set(key, []);
    lanes.get(key).push(s);
  }
  const rows = [...lanes.entries()].map(([key, segs]) => h("div", { class: "cp-lane", style: "display:flex;align-items:center;gap:8px;margin-top:4px" },
    h("span", { class: "mono note", style: "width:200px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap", title: key }, key),
    lane(null, segs.map((s) => block(d, s, "cp-lane-seg")))));
  return h("div", {}, h("div", { id: "cp-bar", style: "position:relative;height:28px;background:#f1f5f9;border-radius:4px;overflow:hidden" },
    ...d.segments.map((s) => block(d, s, "cp-seg"))), h("div", { class: "note" }, ...legend), h("div", { id: "cp-lanes" }, ...rows));
}

// the timeline over the step's window, the path's events outlined (timeline_find.js findPath)
function pathOnTimeline(d) {
  const q = new URLSearchParams({ path: "1", start_ns: String(d.start_ns), end_ns: String(d.start_ns + d.step_ns) });
  if (d.label.startsWith("step ")) q.set("step", d.label.slice(5));
  q.set("rank", String(d.rank));
  for (const k of ["annotation", "instance"]) if (qs(k) !== null) q.set(k, qs(k));
  return pUrl(profile, `/timeline?${q}`);
}

function whatifBox(d) {
  const input = h("input", { id: "whatif-speedup", type: "text", size: 40, placeholder: "aten::mm=2, module=blocks.0:1.5" });
  const syncs = h("input", { id: "whatif-drop-syncs", type: "checkbox" });
  const out = h("div", { id: "whatif-result", class: "note" });
  const go = async () => {
    const q = new URLSearchParams();
    input.value.split(",").map((x) => x.trim()).filter(Boolean).forEach((x) => q.append("speedup", x));
    if (syncs.checked) q.set("drop_syncs", "true");
    if (d.label.startsWith("step ")) q.set("step", d.label.slice(5));
    for (const k of ["annotation", "instance"]) if (qs(k) !== null) q.set(k, qs(k));
    out.textContent = "Replaying…";
    try {
      const r = await api(`/p/${enc(profile)}/whatif?${q}`);
      out.textContent = `${r.changes.join("; ")}: step ${fmtNs(r.before_ns)} → ${fmtNs(r.after_ns)} (saves ${fmtNs(r.saving_ns)}, ${fmtPct(r.saving_share)})`;
    } catch (e) {
      out.textContent = String(e.message || e);
    }
  };
  return h("div", { class: "sql-actions" }, "Speed up ", input, h("label", {}, " ", syncs, " drop the host's syncs "),
    h("button", { class: "btn primary", id: "whatif-run", onclick: go }, "Replay"), out);
}

run(async () => {
  const q = new URLSearchParams();
  for (const k of ["step", "rank", "annotation", "instance"]) if (qs(k) !== null) q.set(k, qs(k));
  const d = await api(`/p/${enc(profile)}/critical-path${q.toString() ? "?" + q : ""}`);
  setModeled(d.modeled);
  const cards = Object.entries(d.by_category).filter(([, v]) => v).map(([k, v]) => card(k, fmtNs(v), fmtPct(v / d.step_ns)));
  mount(
    h("h1", {}, `Critical path: ${d.label}, rank ${d.rank}`),
    h("p", { class: "note" }, "The chain of host calls, device work and waits that sets the step's length. Made faster, only what is on it makes the step faster; ",
      "\"step saves at 2x\" replays the step with that op twice as fast."),
    h("div", { class: "cards" }, card("Step", fmtNs(d.step_ns), `${d.nodes} events in the graph`), ...cards),
    section("The path on the step's time axis", pathBar(d)),
    section("What sets the step's length", h("div", { id: "cp-ops" }, dataTable([
      { key: "label", label: "Op or span", cell: (r) => h("span", { class: "mono" }, r.label) },
      { key: "category", label: "Kind" },
      { key: "dur_ns", label: "On the path", num: true, fmt: fmtNs },
      { key: "share", label: "Share", num: true, fmt: fmtPct },
      { key: "segments", label: "Pieces", num: true },
      { key: "saving_if_2x_ns", label: "Step saves at 2x", num: true, fmt: (v) => (v === null ? "–" : fmtNs(v)) },
    ], d.ops, { compact: true }))),
    section("What if", whatifBox(d)),
    h("p", { class: "note" }, h("a", { id: "cp-timeline", href: pathOnTimeline(d) }, "Show the path on the timeline"),
      " (its events outlined, the rest faded)"),
  );
});
