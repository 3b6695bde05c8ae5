// The timeline's panels, drawn from their JSON: one event in the side panel (its source line,
// its whole Python stack, its columns and relatives) and the totals of a selected span.
import { h, fmtNs, fmtNum, fmtPct, sourceUrl, moduleLink, profile, section, dataTable } from "./common.js";

// `d` is /api/p/NAME/events/ID; `onEvent(e)` shows a related event
export function eventPanel(d, { startNs, modeled, onEvent }) {
  const ev = d.event;
  const item = (e) => h("li", {}, h("a", { href: "#", onclick: (x) => { x.preventDefault(); onEvent(e); } }, `${e.kind} · ${e.name}`),
    h("span", { class: "note" }, `  ${e.track} · ${fmtNs(e.dur_ns)}`));
  const kv = h("dl", { class: "kv" });
  const add = (k, v) => { if (v !== null && v !== undefined && v !== "") kv.append(h("dt", {}, k), h("dd", {}, v instanceof Node ? v : typeof v === "object" ? JSON.stringify(v) : String(v))); };
  add("name", ev.name); add("kind", ev.kind); add("layer", ev.layer); add("track", `${ev.device || ""} ${ev.track}`);
  add("start", fmtNs(ev.start_ns - startNs)); add("duration", fmtNs(ev.dur_ns) + (ev.layer === "device" && modeled ? " (modeled)" : ""));
  add("op", ev.op_name); add("module", ev.module === null || ev.module === undefined ? null : moduleLink(profile, ev.module, "event-module")); add("step", ev.step); add("shapes", ev.shapes); add("dtypes", ev.dtypes);
  add("flops", ev.flops ? fmtNum(ev.flops) : null); add("bytes read", ev.bytes_read); add("bytes written", ev.bytes_written);
  add("id", ev.id); add("flow", ev.flow_id);
  for (const [k, v] of Object.entries(ev.args || {})) add(k, v);
  const src = d.source ? h("p", {}, "Source: ", h("a", { id: "event-source", href: sourceUrl(profile, d.source.file_id, d.source.line) }, `${d.source.file}:${d.source.line}`))
    : h("p", { class: "note" }, "No source line recorded for this event.");
  // the whole Python stack, innermost first; each frame opens its line in the source view
  const stack = d.stack && d.stack.length ? h("details", { id: "event-stack", open: true },
    h("summary", {}, `Python stack: ${d.stack.length} frames`),
    h("ol", { class: "list-plain" }, d.stack.map((f) => h("li", {},
      f.file_id ? h("a", { href: sourceUrl(profile, f.file_id, f.line), class: `frame scope-${f.scope}` }, `${f.file}:${f.line}`) : f.file,
      h("span", { class: "note" }, `  ${f.function || ""} · ${f.scope || ""}`))))) : null;
  // the side panel: the event, its source line and whole stack, then its relatives
  return section(`Event: ${ev.name}`, src, stack, kv,
    h("h2", {}, "Flow partners"), d.flows.length ? h("ul", { class: "list-plain" }, d.flows.map(item)) : h("p", { class: "note" }, "none"),
    h("h2", {}, "Enclosing"), d.ancestors.length ? h("ul", { class: "list-plain" }, d.ancestors.map(item)) : h("p", { class: "note" }, "none"),
    h("h2", {}, "Children"), d.children.length ? h("ul", { class: "list-plain" }, d.children.map(item)) : h("p", { class: "note" }, "none"));
}

// `d` is /api/p/NAME/span
export function spanPanel(d) {
  const modeled = d.device_time_modeled ? " (modeled)" : "";
  const t = (cols, rows) => (rows.length ? dataTable(cols, rows, { compact: true }) : h("p", { class: "note" }, "none"));
  const name = { key: "name", label: "Name", cell: (r) => h("span", { class: "mono" }, r.name) };
  const cnt = { key: "count", label: "Count", num: true }, tm = { key: "time_ns", label: "Time inside", num: true, fmt: fmtNs };
  return section(`Selected span: ${fmtNs(d.dur_ns)} · ${fmtNum(d.events)} events`,
    h("p", { class: "note" }, "Each event's time inside the span; nested events each count their own (Esc clears, a drag selects another, F fits it, M marks it)."),
    h("div", { class: "grid2" },
      h("div", {}, h("h2", {}, "By kind"), t([{ key: "layer", label: "Layer" }, { key: "kind", label: "Kind" }, cnt, tm], d.by_kind),
        h("h2", {}, "Device lanes" + modeled), t([{ key: "track", label: "Lane", cell: (r) => `${r.device || ""} ${r.track}` }, cnt, tm,
          { key: "busy", label: "Busy", num: true, fmt: fmtPct }], d.lanes)),
      h("div", {}, h("h2", {}, "Ops"), t([name, cnt, tm], d.ops), h("h2", {}, "Kernels" + modeled), t([name, cnt, tm], d.kernels))));
}
