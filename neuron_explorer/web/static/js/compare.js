import { api, h, mount, run, fmtNs, fmtDelta, dataTable, plot, pUrl, sourceUrl, enc, section, setModeled, card, qs, filteredTable } from "./common.js";
import { stackedTimelines } from "./compare_timeline.js";

const deltaCell = (v) => h("span", { class: v > 0 ? "pos" : v < 0 ? "neg" : null }, fmtDelta(v));
const pct = (r) => {
  const [a, b] = [r.a.time_ns, r.b.time_ns];
  if (a === undefined) return "new in B";
  if (b === undefined) return "gone in B";
  if (!a) return b ? "new" : "0%";
  return `${b >= a ? "+" : ""}${((b / a - 1) * 100).toFixed(0)}%`;
};
// the step compared (the document's job_steps, as diff and its gate): each whole step as long
// as its slowest rank; and what the median leaves aside: the steps far from it (a compile
// step) that a mean would be moved by
const OUTLIER = 2;  // a step over twice the median is named
const LOG_SPREAD = 10;  // the step chart's axis is logarithmic when a step is this many medians
function stepsNote(s, j) {
  if (!s.count || !j) return "no steps";
  const parts = [`median of ${j.count} whole steps${j.ranks > 1 ? `, each its slowest of ${j.ranks} ranks` : ""}`];
  const slow = (j.per_step || []).filter(([, , ns]) => ns > OUTLIER * j.median_ns);
  if (slow.length) parts.push(`outside the median: step ${slow.map(([st, , ns]) => `${st ?? "–"} (${fmtNs(ns)})`).join(", ")}; mean ${fmtNs(s.mean_ns)}`);
  if ((s.partial_last_steps || []).length) parts.push(`cut short: step ${s.partial_last_steps.map(([, st]) => st ?? "–").join(", ")}`);
  return parts.join(" · ");
}

async function picker() {
  const d = await api("/profiles");
  const names = d.profiles.filter((p) => !p.error).map((p) => p.name);
  const sel = (id, v) => h("select", { id }, names.map((n) => h("option", { value: n, selected: n === v }, n)));
  const a = sel("cmp-a", qs("a") || names[0]), b = sel("cmp-b", qs("b") || names[1] || names[0]);
  mount(h("h1", {}, "Compare two profiles"), section("Pick", h("div", { class: "sql-actions" }, "A ", a, " B ", b,
    h("button", { class: "btn primary", onclick: () => { location.href = `/compare?a=${enc(a.value)}&b=${enc(b.value)}`; } }, "Compare"))));
}

// what the rules found in one profile and not the other (matched by rule: titles carry numbers)
function findingsDiff(f, a, b) {
  if (!f || !f.available) return h("p", { class: "note" }, "Shown once both profiles are analysed.");
  const item = (x, name) => h("li", {}, h("a", { href: pUrl(name, "/findings") }, x.title), h("span", { class: "note" }, `  ${x.rule}`));
  return h("div", { class: "grid2", id: "findings-diff" },
    h("div", {}, h("h2", {}, `Appeared in B (${f.appeared.length})`), f.appeared.length ? h("ul", { class: "list-plain" }, f.appeared.map((x) => item(x, b))) : h("p", { class: "note" }, "none")),
    h("div", {}, h("h2", {}, `Went since A (${f.went.length})`), f.went.length ? h("ul", { class: "list-plain" }, f.went.map((x) => item(x, a))) : h("p", { class: "note" }, "none")));
}

run(async () => {
  const a = qs("a"), b = qs("b");
  if (!a || !b) return picker();
  const d = await api(`/compare?a=${enc(a)}&b=${enc(b)}`);
  setModeled(d.device_time_modeled);
  const none = { count: 0, mean_ns: null, median_ns: null, per_step: [] };  // a profile without steps
  const sa = d.steps.a || none, sb = d.steps.b || none;
  const ja = (d.job_steps || {}).a, jb = (d.job_steps || {}).b;
  const chart = h("div", { class: "chart", id: "compare-chart" });
  const ratio = ja && jb && ja.median_ns ? jb.median_ns / ja.median_ns : null;
  const sideVal = (side, key) => (r) => (r[side] && r[side][key] !== undefined ? fmtNs(r[side][key]) : "–");
  mount(
    h("h1", {}, "Compare ", h("a", { href: pUrl(a) }, a), " → ", h("a", { href: pUrl(b) }, b)),
    h("div", { class: "cards" },
      h("div", { class: "card", id: "cmp-card-a" }, h("div", { class: "card-label", title: a }, `A: ${a}`), h("div", { class: "card-value" }, fmtNs(ja ? ja.median_ns : null)), h("div", { class: "card-note" }, stepsNote(sa, ja))),
      h("div", { class: "card", id: "cmp-card-b" }, h("div", { class: "card-label", title: b }, `B: ${b}`), h("div", { class: "card-value" }, fmtNs(jb ? jb.median_ns : null)), h("div", { class: "card-note" }, stepsNote(sb, jb))),
      card("Change of the median step", d.step_ns_delta === null ? "–" : fmtDelta(d.step_ns_delta), ratio ? `${((ratio - 1) * 100).toFixed(1)}% step time` : "")),
    h("div", { class: "grid2" },
      section("Step time per step", chart),
      section("The median step of each, part by part", d.breakdown.length ? dataTable([
        { key: "label", label: "Part of the step" }, { key: "a", label: "A", num: true, fmt: fmtNs }, { key: "b", label: "B", num: true, fmt: fmtNs },
        { key: "delta", label: "Δ", num: true, cell: (r) => deltaCell(r.delta) }], d.breakdown, { compact: true, sortable: false })
        : h("p", { class: "note" }, "The step-time breakdown needs the analysis summary of both profiles."))),
    section("Timelines, stacked: the same step of each from its start, one time scale", stackedTimelines(a, b)),
    section("Ops, largest change first", filteredTable(d.ops, (rows) => dataTable([
      { key: "name", label: "Op", cell: (r) => h("span", { class: "mono" }, r.name) },
      { label: "A time", num: true, cell: sideVal("a", "time_ns") }, { label: "B time", num: true, cell: sideVal("b", "time_ns") },
      { key: "delta", label: "Δ", num: true, cell: (r) => deltaCell(r.delta) }, { label: "Δ%", num: true, cell: pct },
      { label: "A calls", num: true, cell: (r) => (r.a.count ?? "–") }, { label: "B calls", num: true, cell: (r) => (r.b.count ?? "–") },
    ], rows.slice(0, 100), { compact: true, sortable: false }), { param: "ops", placeholder: "Filter ops: name or /regex/" })),
    section("Source lines, largest change first", d.lines.length ? filteredTable(d.lines, (rows) => dataTable([
      { key: "file", label: "Line", cell: (r) => h("span", {}, h("a", { href: sourceUrl(r.b.time_ns !== undefined ? b : a, r.file_id, r.line) }, `${r.file.split("/").pop()}:${r.line}`)), title: (r) => r.file },
      { label: "A", num: true, cell: sideVal("a", "time_ns") }, { label: "B", num: true, cell: sideVal("b", "time_ns") },
      { key: "delta", label: "Δ", num: true, cell: (r) => deltaCell(r.delta) }, { label: "Δ%", num: true, cell: pct },
    ], rows.slice(0, 100), { compact: true, sortable: false }), { param: "lines", key: "file", placeholder: "Filter lines: file or /regex/" }) : h("p", { class: "note" }, "Neither profile has source lines.")),
    section("Kernels, largest change first" + (d.device_time_modeled ? " (modeled)" : ""), d.kernels.length ? filteredTable(d.kernels, (rows) => dataTable([
      { key: "name", label: "Kernel", cell: (r) => h("span", { class: "mono" }, r.name) },
      { label: "A time", num: true, cell: sideVal("a", "time_ns") }, { label: "B time", num: true, cell: sideVal("b", "time_ns") },
      { key: "delta", label: "Δ", num: true, cell: (r) => deltaCell(r.delta) }, { label: "Δ%", num: true, cell: pct },
      { label: "A launches", num: true, cell: (r) => (r.a.count ?? "–") }, { label: "B launches", num: true, cell: (r) => (r.b.count ?? "–") },
    ], rows.slice(0, 100), { compact: true, sortable: false }), { param: "kernels", placeholder: "Filter kernels: name or /regex/" }) : h("p", { class: "note" }, "Neither profile has device kernels.")),
    section("Findings that appeared or went", findingsDiff(d.findings, a, b)),
  );
  const trace = (s, name, color) => ({ type: "bar", name, x: s.per_step.map((_, i) => i), y: s.per_step.map((p) => p.dur_ns / 1e6), marker: { color } });
  // one compile step many times the others flattens them: a log axis then
  const spread = [sa, sb].some((s) => s.median_ns && s.max_ns > LOG_SPREAD * s.median_ns);
  plot(chart, [trace(sa, `A ${a}`, "#94a3b8"), trace(sb, `B ${b}`, "#3b82f6")],
    { barmode: "group", xaxis: { title: { text: "step (index in profile)" }, dtick: 1 }, yaxis: { title: { text: spread ? "ms (log scale)" : "ms" }, type: spread ? "log" : "linear" }, margin: { l: 60, r: 10, t: 30, b: 50 } });
});
