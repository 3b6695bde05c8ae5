import { api, h, mount, run, fmtNs, fmtNum, fmtPct, dataTable, findingChips, plot, pUrl, sourceUrl, enc, card, section, setModeled, profile } from "./common.js";
// a job's steady-state figures leave out each rank's first step (the ranks' start-up skew)
const steadyNote = (st) => ((st.left_out || []).length
  ? ` · each rank's first step left out (ranks started ${fmtNs(st.startup_skew_ns)} apart)` : "");


function findingList(name, findings, pending) {
  if (!findings && pending) return h("p", { class: "note", id: "findings-pending" }, "analysing… the rules run in the background; their findings show here when they finish.");
  if (!findings) return h("p", { class: "note" }, "Findings appear here once the analysis is available.");
  if (!findings.length) return h("p", { class: "note" }, "No findings: no rule matched this profile.");
  return h("ul", { class: "list-plain" }, findings.map((f) => h("li", {}, findingChips(f), " ",
    h("a", { href: pUrl(name, "/findings") }, f.title), h("span", { class: "note" }, `  saves ~${fmtNs(f.saving_ns)} (${fmtPct(f.saving_share)})`))));
}

// A large profile's summary comes before its rules have run (analysis_pending): the findings
// page's twin answers once they finish, and fills the list and the card in.
function fillFindings(name) {
  api(`/p/${enc(name)}/findings`).then((doc) => {
    document.getElementById("findings-pending")?.replaceWith(findingList(name, doc.findings.slice(0, 5)));
    const value = document.querySelector("#findings-card .card-value");
    if (value) value.textContent = String(doc.findings.length);
  }).catch((e) => console.warn(e));
}

function findingsCard(d) {
  const c = card("Findings", d.findings_total === null ? "…" : String(d.findings_total));
  c.id = "findings-card";
  return c;
}

// one stacked bar per step: the breakdown's parts (summary.breakdown.parts), which add up to
// the step; the overlaps (breakdown.overlap) are not parts and are not stacked
const PART_COLORS = { device_compute_ns: "#10b981", communication_ns: "#8b5cf6", dma_ns: "#06b6d4", idle_compile_ns: "#ef4444", idle_fallback_ns: "#b91c1c", idle_sync_ns: "#f59e0b", idle_collective_ns: "#c084fc", idle_dataload_ns: "#a16207", idle_host_ns: "#d1d5db" };

function breakdownChart(el, s, modeled) {
  const steps = s.steps || [];
  const x = steps.map((r, i) => (r.step === null ? `#${i}` : `#${r.step}`) + (r.rank ? ` r${r.rank}` : ""));
  const parts = (s.breakdown.parts || []).filter((p) => p.ns > 0);
  const traces = parts.map((p) => ({ type: "bar", name: p.label + (p.key.startsWith("idle_") ? "" : modeled), x,
    y: steps.map((r) => Number(r[p.key] || 0) / 1e6), marker: { color: PART_COLORS[p.key] },
    hovertemplate: `${p.label}: %{y:.3f} ms<extra>%{x}</extra>` }));
  const layout = { barmode: "stack", xaxis: { type: "category", title: { text: "step" } }, yaxis: { title: { text: "ms (the parts add up to the step)" } },
    margin: { l: 60, r: 10, t: 10, b: 80 }, legend: { orientation: "h", y: -0.3, font: { size: 11 } } };
  return plot(el, traces, layout);
}

function readinessBlock(r) {
  if (!r) return null;
  const tbl = (rows, cols, empty) => (rows && rows.length ? dataTable(cols, rows, { compact: true }) : h("p", { class: "note" }, empty));
  const lineCol = { key: "line", label: "Line", cell: (x) => (x.file ? `${x.file.split("/").pop()}:${x.line}` : "–"), title: (x) => x.file || "" };
  return section("Neuron readiness",
    h("div", { class: "cards" },
      card("CPU fallback ops", String((r.fallback_ops || []).length)),
      card("float64 downcasts", String((r.downcasts || []).length)),
      card("Recompiles", String((r.recompiles || []).reduce((a, x) => a + (x.recompiles || 0), 0))),
      card("Host syncs", String((r.syncs || []).reduce((a, x) => a + (x.calls || 0), 0)), ".item(), .cpu(), print"),
      card("Compile time", fmtNs(r.compile_ns)),
      card("First step", fmtNs(r.first_step_ns)),
      card("Steady step", fmtNs(r.steady_step_ns), "median after the first")),
    h("div", { class: "grid3" },
      h("div", {}, h("h2", {}, "Fallbacks to the CPU"), tbl(r.fallback_ops, [{ key: "op", label: "Op" }, lineCol, { key: "calls", label: "Calls", num: true }, { key: "dur_ns", label: "Time", num: true, fmt: fmtNs }], "Every op ran on the device.")),
      h("div", {}, h("h2", {}, "float64 downcast to float32"), tbl(r.downcasts, [{ key: "op", label: "Op" }, lineCol, { key: "calls", label: "Calls", num: true }], "No float64 tensors.")),
      h("div", {}, h("h2", {}, "Recompiles"), tbl(r.recompiles, [{ key: "op", label: "Op / graph" }, { key: "recompiles", label: "Times", num: true }, { key: "dur_ns", label: "Time", num: true, fmt: fmtNs }], "No recompiles.")),
      h("div", {}, h("h2", {}, "Host syncs in the step"), tbl(r.syncs, [{ key: "what", label: "Sync" }, lineCol, { key: "calls", label: "Calls", num: true }, { key: "wait_ns", label: "Wait", num: true, fmt: fmtNs }], "No host syncs."))));
}

// A GPU trace (imported, measured, no device spec) leads with what its users read first: where
// the GPU's time went (compute, communication, memcpy/memset, idle), communication overlap, the
// top kernels and each rank's device. Every number is the summary's own (analysis/summary).
const isGpu = (d) => !d.device_time_modeled && !d.manifest.device_spec && (d.summary.devices || []).length > 0;
const DEVICE_PARTS = [["compute_ns", "compute", "#10b981"], ["communication_ns", "communication", "#8b5cf6"],
  ["transfer_ns", "memcpy / memset alone", "#06b6d4"], ["idle_ns", "idle", "#d1d5db"]];

function deviceRows(s) {
  return s.devices.map((x) => ({ ...x, label: `${x.rank ? "rank " + x.rank + " " : ""}${x.device}`,
    transfer_ns: Math.max(0, (x.busy_ns || 0) - (x.compute_ns || 0) - (x.communication_ns || 0)),
    busy: x.window_ns ? x.busy_ns / x.window_ns : null }));
}

function gpuSummary(d) {
  const s = d.summary, b = s.breakdown;
  const part = (k) => ((b.parts || []).find((p) => p.key === k) || { ns: 0 }).ns;
  const idle = (b.parts || []).filter((p) => p.key.startsWith("idle_")).reduce((a, p) => a + p.ns, 0);
  const hidden = ((b.overlap || []).find((o) => o.key === "comm_overlap_ns") || { ns: 0 }).ns;
  const share = (v) => (b.steps_ns ? v / b.steps_ns : null);
  const rows = deviceRows(s);
  const stepChart = h("div", { class: "chart", id: "step-chart", style: { height: "340px" } });
  const devChart = h("div", { class: "chart", id: "gpu-devices-chart", style: { height: Math.min(340, 110 + 34 * rows.length) + "px" } });
  const ranks = s.ranks_table ? section("Ranks", dataTable([
    { key: "rank", label: "Rank", num: true }, { key: "steps", label: "Steps", num: true },
    { key: "median_step_ns", label: "Median step", num: true, fmt: fmtNs }, { key: "compute_ns", label: "Compute", num: true, fmt: fmtNs },
    { key: "communication_ns", label: "Communication", num: true, fmt: fmtNs }, { key: "wait_ns", label: "Collective wait", num: true, fmt: fmtNs },
    { key: "idle_ns", label: "Device idle", num: true, fmt: fmtNs },
    { key: "overlap", label: "Comm/compute overlap", num: true, fmt: (v) => (v == null ? "-" : fmtPct(v)) }], s.ranks_table.rows, { compact: true })) : null;
  mount(
    h("h1", {}, profile, h("span", { class: "note" }, `  ${d.manifest.source} · ${d.devices.join(", ")} · measured GPU times`)),
    h("div", { class: "cards", id: "gpu-cards" },
      card("Steps", String((d.steps && d.steps.count) || (s.step_stats ? s.step_stats.count : 0)), !d.steps ? "no ProfilerStep spans"
        : s.step_stats && (s.step_stats.partial_last_steps || []).length ? "the last step is partial (the profiler stopped in it)" : ""),
      card(s.step_stats ? "Step time" : "Profiled time", fmtNs(s.step_stats ? s.step_stats.median_ns : b.steps_ns), s.step_stats ? `median · min ${fmtNs(s.step_stats.min_ns)} · max ${fmtNs(s.step_stats.max_ns)}${steadyNote(s.step_stats)}` : "whole trace, no steps"),
      card("GPU compute", fmtPct(share(part("device_compute_ns"))), fmtNs(part("device_compute_ns"))),
      card("Communication", fmtPct(share(part("communication_ns"))), `${fmtNs(part("communication_ns"))} not hidden by compute`),
      card("Comm. overlap", fmtNs(hidden), "communication hidden under compute"),
      card("memcpy / memset", fmtPct(share(part("dma_ns"))), `${fmtNs(part("dma_ns"))} with nothing else running`),
      card("GPU idle", fmtPct(share(idle)), fmtNs(idle)),
      findingsCard(d)),
    h("div", { class: "grid2" },
      section("Step time breakdown", stepChart),
      section("Each device's time", devChart)),
    section("Top device kernels", s.top_kernels && s.top_kernels.length ? dataTable([
      { key: "name", label: "Kernel", cell: (r) => h("span", { class: "mono clip", title: r.name }, r.name) },
      { key: "type", label: "Type" }, { key: "device", label: "Device" },
      { key: "calls", label: "Calls", num: true }, { key: "total_ns", label: "Total", num: true, fmt: fmtNs },
      { key: "mean_ns", label: "Mean", num: true, fmt: fmtNs }, { key: "share", label: "Share", num: true, fmt: fmtPct },
    ], s.top_kernels, { compact: true }) : h("p", { class: "note" }, "No GPU kernels in this trace.")),
    section("Devices", h("div", { id: "gpu-devices" }, dataTable([
      { key: "label", label: "Rank · device" }, { key: "kernels", label: "Kernels", num: true },
      { key: "collectives", label: "Collectives", num: true }, { key: "transfers", label: "memcpy/memset", num: true },
      { key: "busy", label: "Busy", num: true, fmt: fmtPct }, { key: "compute_ns", label: "Compute", num: true, fmt: fmtNs },
      { key: "communication_ns", label: "Communication", num: true, fmt: fmtNs }, { key: "transfer_ns", label: "memcpy/memset alone", num: true, fmt: fmtNs },
      { key: "idle_ns", label: "Idle", num: true, fmt: fmtNs }], rows, { compact: true }))),
    ranks,
    section("Top findings", findingList(profile, d.findings, d.analysis_pending)),
    h("div", { class: "grid2" }, section("Top ops", topOps(d, "")), section("Top source lines", topLines(d, ""))),
  );
  breakdownChart(stepChart, s, "");
  if (d.analysis_pending) fillFindings(profile);
  plot(devChart, DEVICE_PARTS.map(([k, label, color]) => ({ type: "bar", orientation: "h", name: label,
    y: rows.map((r) => r.label), x: rows.map((r) => (r.window_ns ? (100 * (r[k] || 0)) / r.window_ns : 0)), marker: { color },
    hovertemplate: `${label}: %{x:.1f}%<extra>%{y}</extra>` })),
  { barmode: "stack", xaxis: { title: { text: "% of the device's window (first to last GPU work)" }, range: [0, 100] },
    yaxis: { automargin: true, autorange: "reversed" }, margin: { l: 110, r: 20, t: 40, b: 50 } });
}

function topOps(d, modeled) {
  return dataTable([
    { key: "name", label: "Op", cell: (r) => h("a", { href: pUrl(profile, `/operators?op=${enc(r.name)}`) }, r.name) },
    { key: "count", label: "Calls", num: true },
    { key: "host_self_ns", label: "Host self", num: true, fmt: fmtNs },
    { key: "device_ns", label: "Device" + modeled, num: true, fmt: fmtNs },
  ], d.top_ops, { compact: true });
}

function topLines(d, modeled) {
  return d.top_lines.length ? dataTable([
    { key: "file", label: "Line", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id, r.line) }, `${r.file.split("/").pop()}:${r.line}`), title: (r) => r.file },
    { key: "func", label: "Function" },
    { key: "host_ns", label: "Host", num: true, fmt: fmtNs },
    { key: "device_ns", label: "Device" + modeled, num: true, fmt: fmtNs },
  ], d.top_lines, { compact: true }) : h("p", { class: "note" }, "No source lines in this profile.");
}

run(async () => {
  const d = await api(`/p/${enc(profile)}`);
  setModeled(d.device_time_modeled);
  if (isGpu(d)) { gpuSummary(d); return; }
  const s = d.summary;
  const modeled = d.device_time_modeled ? " (modeled)" : "";
  const stepChart = h("div", { class: "chart", id: "step-chart", style: { height: "340px" } });
  const busyChart = h("div", { class: "chart", id: "busy-chart", style: { height: "340px" } });
  const b = s.breakdown;
  const share = (v) => (v === null || v === undefined || !b.steps_ns ? null : v / b.steps_ns);
  mount(
    h("h1", {}, profile, h("span", { class: "note" }, `  ${d.manifest.source} · ${d.devices.join(", ") || "host only"}${d.manifest.device_spec ? " · " + (d.manifest.device_spec.name || "") + " (modeled)" : ""}`)),
    h("div", { class: "cards" },
      card("Steps", String((d.steps && d.steps.count) || (s.step_stats ? s.step_stats.count : 0)), !d.steps ? "no ProfilerStep spans"
        : s.step_stats && (s.step_stats.partial_last_steps || []).length ? "the last step is partial (the profiler stopped in it)" : ""),
      card(s.step_stats ? "Step time" : "Profiled time", fmtNs(s.step_stats ? s.step_stats.median_ns : b.steps_ns), s.step_stats ? `median · min ${fmtNs(s.step_stats.min_ns)} · max ${fmtNs(s.step_stats.max_ns)}${steadyNote(s.step_stats)}` : "whole trace, no steps"),
      b.device_compute_ns !== null ? card("Device compute" + modeled, fmtPct(share(b.device_compute_ns)), fmtNs(b.device_compute_ns)) : null,
      b.device_idle_ns !== null ? card("Device idle" + modeled, fmtPct(share(b.device_idle_ns)), fmtNs(b.device_idle_ns)) : null,
      s.mfu === null ? null : card("MFU", fmtPct(s.mfu), "TensorE vs bf16 peak"),
      s.mbu === null ? null : card("MBU", fmtPct(s.mbu), "HBM vs peak"),
      card("Events", fmtNum(s.n_events)),
      findingsCard(d)),
    h("div", { class: "grid2" },
      section("Step time breakdown" + modeled, stepChart),
      section((s.engines.length ? "Engine utilization" : "Device busy") + modeled, busyChart)),
    readinessBlock(s.readiness),
    section("Top findings", findingList(profile, d.findings, d.analysis_pending)),
    h("div", { class: "grid2" }, section("Top ops", topOps(d, modeled)), section("Top source lines", topLines(d, modeled))),
    // device kernels and collectives by time; type is HTA's (computation | communication)
    s.top_kernels && s.top_kernels.length ? section("Top device kernels" + modeled, dataTable([
      { key: "name", label: "Kernel" },
      { key: "type", label: "Type" },
      { key: "calls", label: "Calls", num: true },
      { key: "total_ns", label: "Total", num: true, fmt: fmtNs },
      { key: "mean_ns", label: "Mean", num: true, fmt: fmtNs },
      { key: "share", label: "Share", num: true, fmt: fmtPct },
    ], s.top_kernels, { compact: true })) : null,
  );
  breakdownChart(stepChart, s, modeled);
  if (d.analysis_pending) fillFindings(profile);
  const engines = s.engines; // by rank, in the engines' order (the server's: vocab/engines.py)
  const util = engines.length ? engines.map((e) => [`${e.rank ? "r" + e.rank + " " : ""}${e.engine}`, e.utilization])
    : s.devices.map((x) => [`${x.rank ? "r" + x.rank + " " : ""}${x.device}`, x.window_ns ? x.busy_ns / b.steps_ns : 0]);
  if (util.length) {
    busyChart.style.height = Math.min(340, 90 + 34 * util.length) + "px";
    plot(busyChart, [{ type: "bar", orientation: "h", y: util.map((u) => u[0]), x: util.map((u) => 100 * u[1]), marker: { color: "#10b981" },
      hovertemplate: "%{y}: %{x:.1f}% busy<extra></extra>" }],
      { xaxis: { title: { text: "% of step time busy" }, range: [0, 100] }, yaxis: { automargin: true, autorange: "reversed" }, margin: { l: 110, r: 20, t: 10, b: 50 } });
  } else {
    busyChart.replaceWith(h("p", { class: "note" }, "No device work in this profile (host only)."));
  }
});
