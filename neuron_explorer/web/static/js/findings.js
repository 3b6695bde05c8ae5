import { api, h, mount, run, fmtNs, fmtPct, findingChips, sourceUrl, timelineUrl, moduleUrl, pUrl, enc, section, setModeled, profile } from "./common.js";

function evidence(f) {
  const ev = f.evidence || {};
  const parts = [];
  if (ev.metrics && Object.keys(ev.metrics).length) {
    parts.push(h("div", {}, Object.entries(ev.metrics).map(([k, v]) => h("span", { class: "mono", style: { marginRight: "14px" } }, `${k}=${typeof v === "number" ? +v.toPrecision(4) : v}`))));
  }
  if (ev.ops && ev.ops.length) {
    parts.push(h("div", {}, "Ops: ", ev.ops.slice(0, 8).map((o, i) => h("span", {}, i ? ", " : "",
      h("a", { href: pUrl(profile, `/operators?op=${enc(o.label)}`) }, o.label), ` ${fmtNs(o.dur_ns)} ×${o.count}`))));
  }
  if (ev.source_lines && ev.source_lines.length) {
    parts.push(h("div", {}, "Lines: ", ev.source_lines.slice(0, 8).map((s, i) => h("span", {}, i ? ", " : "",
      s.file && s.line ? h("a", { href: sourceUrl(profile, s.file_id, s.line), class: "finding-line" }, `${s.file.split("/").pop()}:${s.line}`) : s.label,
      ` ${fmtNs(s.dur_ns)}`))));
  }
  // where in the model: the model lines (a library's modeling file too) and the modules
  if (ev.model_lines && ev.model_lines.length) {
    parts.push(h("div", {}, "Model lines: ", ev.model_lines.slice(0, 5).map((s, i) => h("span", {}, i ? ", " : "",
      s.file_id ? h("a", { href: sourceUrl(profile, s.file_id, s.line), class: "finding-model-line" }, `${s.file.split("/").pop()}:${s.line}`) : s.label,
      ` ${fmtNs(s.dur_ns)}`))));
  }
  if (ev.modules && ev.modules.length) {
    parts.push(h("div", {}, "Modules: ", ev.modules.slice(0, 5).map((m, i) => h("span", {}, i ? ", " : "",
      h("a", { href: moduleUrl(profile, m.label === "(model)" ? "" : m.label), class: "mono finding-module" }, m.label), ` ${fmtNs(m.dur_ns)}`))));
  }
  if (ev.event_ids && ev.event_ids.length) {
    parts.push(h("div", {}, "Events: ", ev.event_ids.slice(0, 12).map((id, i) => h("span", {}, i ? " " : "", h("a", { href: timelineUrl(profile, { id }) }, `#${id}`)))));
  }
  return h("div", { class: "evidence" }, parts);
}

// the saving is the replayed step's drop with the change named; findings touching the same
// time say so, since their savings do not add
function replayNote(f) {
  if (f.bound) return h("div", { class: "note bound" }, `Saving an upper bound: ${f.bound}.`);
  if (!f.replayed) return null;
  return h("div", { class: "note replayed" }, `Saving replayed: ${f.replayed}.`,
    f.overlaps && f.overlaps.length ? h("b", { class: "overlaps" }, ` Overlaps ${f.overlaps.join(", ")}: the savings do not add.`) : null);
}

run(async () => {
  const d = await api(`/p/${enc(profile)}/findings`);
  setModeled(d.device_time_modeled);  // the savings are modeled device time too
  const body = !d.findings.length ? h("p", { class: "note" }, "No rule found a problem in this profile.")
    : h("div", {}, d.findings.map((f) => h("div", { class: `finding sev-${f.severity}-b` },
      h("div", {}, findingChips(f), h("span", { class: "note mono" }, `  ${f.rule}`),
        h("span", { class: "note" }, `  · saves ${f.bound ? "at most " : ""}~${fmtNs(f.saving_ns)} (${fmtPct(f.saving_share)} of step time)`)),
      h("h3", {}, f.title), h("p", {}, f.detail), f.fix ? h("div", { class: "fix" }, h("b", {}, "Fix: "), f.fix) : null, replayNote(f), evidence(f))));
  // what fixing every replayed finding saves: one replay of all their changes together
  const total = d.replayed_total_ns == null ? null : h("p", { class: "note replayed-total" },
    `All ${d.findings.filter((f) => f.replayed).length} replayed changes together save ~${fmtNs(d.replayed_total_ns)} (${fmtPct(d.replayed_total_share)} of step time): one replay of them all at once, never more than the steps; the findings' own savings do not add where they overlap.`);
  mount(h("h1", {}, "Findings", h("span", { class: "note" }, `  ${d.findings.length} found: readiness problems first, then largest saving first`)), total, section("Findings", body));
});
