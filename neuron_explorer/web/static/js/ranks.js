// Two ranks of one job side by side (/p/NAME/ranks?a=&b=): each collective's wait (for the
// last rank to arrive) apart from its transfer on both ranks, the ops and kernels of each, and
// the two ranks' timelines on the job's one clock, so one rank's wait lines up with the other's work.
import { api, h, mount, run, fmtNs, fmtBytes, fmtDelta, dataTable, pUrl, enc, section, setModeled, card, qs, profile, timelineUrl, filteredTable } from "./common.js";
import { stackedTimelines } from "./compare_timeline.js";

const deltaCell = (v) => h("span", { class: v > 0 ? "pos" : v < 0 ? "neg" : null }, fmtDelta(v));
const side = (s, key) => (r) => (r[s] && r[s][key] !== undefined && r[s][key] !== null ? fmtNs(r[s][key]) : "–");

function picker(d) {
  const sel = (id, v) => h("select", { id }, d.ranks.map((r) => h("option", { value: r, selected: r === v }, `rank ${r}`)));
  const a = sel("rank-a", d.a), b = sel("rank-b", d.b);
  return h("div", { class: "sql-actions" }, "A ", a, " B ", b, h("button", { class: "btn primary", id: "rank-show",
    onclick: () => { location.href = pUrl(profile, `/ranks?a=${enc(a.value)}&b=${enc(b.value)}`); } }, "Show"));
}

// the wait of a collective is the time its rank arrived before the last one: the rank that
// waited less is the one the other waited for
function waitedFor(r, a, b) {
  if (!r.a || !r.b) return "–";
  const dw = r.a.wait_ns - r.b.wait_ns;
  if (Math.abs(dw) < Math.max(r.a.transfer_ns, 1)) return "even";
  return dw > 0 ? `rank ${a} waited for rank ${b}` : `rank ${b} waited for rank ${a}`;
}

run(async () => {
  const doc = await api(`/p/${enc(profile)}/ranks${qs("a") !== null && qs("b") !== null ? `?a=${enc(qs("a"))}&b=${enc(qs("b"))}` : ""}`);
  setModeled(doc.device_time_modeled);  // a neuron profile of one rank has the badge too
  const d = doc.pair;
  // the rank that failed first (with its exception) and the ranks that wrote nothing, first
  const ending = doc.job_ending ? h("div", { class: "note warn", id: "job-ending" },
    doc.job_ending.lines.map((l) => h("p", {}, l))) : null;
  if (!d) return mount(h("h1", {}, "Ranks side by side"), ending, h("p", { class: "note", id: "one-rank" },
    `${profile} holds one rank (${doc.ranks.join(", ") || "none"}): there is nothing to put side by side.`));
  const c = d.comparison, none = { count: 0, mean_ns: null };
  const sa = c.steps.a || none, sb = c.steps.b || none;
  // each rank's wait for the others over its steps: its blocked host time while a collective
  // waited, overlapping waits counted once (every_rank.wait_definition says it all)
  const times = doc.every_rank.ranks, timeOf = (r) => times.find((t) => t.rank === r);
  const waited = (r) => (timeOf(r) ? fmtNs(timeOf(r).wait_ns) : "–");
  const share = (t) => (t.step_ns ? `${((100 * t.wait_ns) / t.step_ns).toFixed(1)}%` : "–");
  const ev = (x) => (x ? h("a", { href: timelineUrl(profile, { id: x.id }) }, `#${x.id}`) : "–");
  mount(
    h("h1", {}, "Ranks side by side: ", h("a", { href: pUrl(profile) }, profile)),
    ending,
    section("Pick two ranks", picker(d)),
    h("div", { class: "cards" },
      card(`Rank ${d.a}`, fmtNs(sa.mean_ns), `${sa.count} steps, mean`),
      card(`Rank ${d.b}`, fmtNs(sb.mean_ns), `${sb.count} steps, mean`),
      card("Change", c.step_ns_delta === null ? "–" : fmtDelta(c.step_ns_delta), `rank ${d.b} against rank ${d.a}`),
      card(`Rank ${d.a} waited`, waited(d.a), "host blocked while a collective waited for the last rank"),
      card(`Rank ${d.b} waited`, waited(d.b), "host blocked while a collective waited for the last rank")),
    section("Every rank: its own work (busy) and its wait for the others, over its steps",
      times.length ? h("div", { id: "rank-times" }, dataTable([
        { key: "rank", label: "Rank", num: true }, { key: "steps", label: "Steps", num: true },
        { key: "step_ns", label: "Steps' time", num: true, fmt: fmtNs }, { key: "busy_ns", label: "Busy", num: true, fmt: fmtNs },
        { key: "wait_ns", label: "Wait", num: true, fmt: fmtNs }, { label: "Wait share", num: true, cell: share },
      ], times, { compact: true, sortable: false })) : h("p", { class: "note" }, "No rank has recorded steps."),
      h("p", { class: "note", id: "wait-definition" }, doc.every_rank.wait_definition)),
    section("Collectives: wait (for the last rank to arrive, measured) and transfer" + (d.device_time_modeled ? " (modeled)" : ""),
      d.collectives.length ? h("div", { id: "rank-collectives" }, dataTable([
        { key: "name", label: "Collective", cell: (r) => h("span", { class: "mono" }, r.name) },
        { label: `rank ${d.a} calls`, num: true, cell: (r) => r.a.calls }, { label: `rank ${d.a} wait`, num: true, cell: side("a", "wait_ns") },
        { label: `rank ${d.a} transfer`, num: true, cell: side("a", "transfer_ns") },
        { label: `rank ${d.b} calls`, num: true, cell: (r) => r.b.calls }, { label: `rank ${d.b} wait`, num: true, cell: side("b", "wait_ns") },
        { label: `rank ${d.b} transfer`, num: true, cell: side("b", "transfer_ns") },
        { label: "Bytes", num: true, cell: (r) => fmtBytes(r.a.bytes || r.b.bytes) },
      ], d.collectives, { compact: true, sortable: false })) : h("p", { class: "note" }, "Neither rank ran a collective.")),
    section(`Each collective on both ranks, largest difference in wait first (${d.calls.length} of ${d.calls_total})`,
      d.calls.length ? h("div", { id: "rank-calls" }, dataTable([
        { key: "name", label: "Collective", cell: (r) => h("span", { class: "mono" }, r.name) }, { key: "match", label: "Group/#" },
        { key: "step", label: "Step", num: true }, { key: "bytes", label: "Bytes", num: true, fmt: fmtBytes },
        { label: `rank ${d.a} wait`, num: true, cell: side("a", "wait_ns") }, { label: `rank ${d.a} transfer`, num: true, cell: side("a", "transfer_ns") },
        { label: `rank ${d.b} wait`, num: true, cell: side("b", "wait_ns") }, { label: `rank ${d.b} transfer`, num: true, cell: side("b", "transfer_ns") },
        { label: "Who waited", cell: (r) => waitedFor(r, d.a, d.b) },
        { label: "Events", cell: (r) => h("span", {}, ev(r.a), " ", ev(r.b)) },
      ], d.calls.slice(0, 100), { compact: true, sortable: false })) : h("p", { class: "note" }, "No collective to match.")),
    section("Timelines, stacked: the two ranks on the job's one clock",
      stackedTimelines({ name: profile, rank: d.a, label: `rank ${d.a}` }, { name: profile, rank: d.b, label: `rank ${d.b}` }, { oneClock: true })),
    section("Ops, largest change first", h("div", { id: "rank-ops" }, filteredTable(c.ops, (rows) => dataTable([
      { key: "name", label: "Op", cell: (r) => h("span", { class: "mono" }, r.name) },
      { label: `rank ${d.a} time`, num: true, cell: side("a", "time_ns") }, { label: `rank ${d.b} time`, num: true, cell: side("b", "time_ns") },
      { key: "delta", label: "Δ", num: true, cell: (r) => deltaCell(r.delta) },
      { label: `rank ${d.a} calls`, num: true, cell: (r) => (r.a.count ?? "–") }, { label: `rank ${d.b} calls`, num: true, cell: (r) => (r.b.count ?? "–") },
    ], rows.slice(0, 100), { compact: true, sortable: false }), { param: "ops", placeholder: "Filter ops: name or /regex/" }))),
    section("Kernels, largest change first" + (d.device_time_modeled ? " (modeled)" : ""), c.kernels.length ? h("div", { id: "rank-kernels" }, dataTable([
      { key: "name", label: "Kernel", cell: (r) => h("span", { class: "mono" }, r.name) },
      { label: `rank ${d.a} time`, num: true, cell: side("a", "time_ns") }, { label: `rank ${d.b} time`, num: true, cell: side("b", "time_ns") },
      { key: "delta", label: "Δ", num: true, cell: (r) => deltaCell(r.delta) },
      { label: `rank ${d.a} launches`, num: true, cell: (r) => (r.a.count ?? "–") }, { label: `rank ${d.b} launches`, num: true, cell: (r) => (r.b.count ?? "–") },
    ], c.kernels.slice(0, 100), { compact: true, sortable: false })) : h("p", { class: "note" }, "Neither rank has device kernels.")),
  );
});
