import { api, h, mount, run, fmtNs, fmtNum, fmtBytes, dataTable, plot, pUrl, sourceUrl, timelineUrl, enc, section, setModeled, profile, qs, clean, filteredTable } from "./common.js";

async function expand(row, tr, modeled) {
  const next = tr.nextElementSibling;
  if (next && next.classList.contains("detail-row")) { next.remove(); tr.classList.remove("expanded"); return; }
  tr.classList.add("expanded");
  const cell = h("td", { colspan: tr.children.length }, h("span", { class: "note" }, "Loading…"));
  tr.after(h("tr", { class: "detail-row" }, cell));
  const d = await api(`/p/${enc(profile)}/operators/detail?op=${enc(row.name)}`);
  const tl = (r) => h("a", { href: timelineUrl(profile, { id: r.first_id, start_ns: r.first_start_ns, dur_ns: r.total_ns / r.count }), class: "jump" }, "timeline");
  cell.replaceChildren(h("div", { class: "grid3" },
    h("div", {}, h("h2", {}, "Kernels" + modeled), d.kernels.length ? dataTable([
      { key: "name", label: "Kernel" }, { key: "track", label: "Lane" }, { key: "count", label: "Calls", num: true },
      { key: "total_ns", label: "Time", num: true, fmt: fmtNs }, { label: "", cell: tl }], d.kernels, { compact: true }) : h("p", { class: "note" }, "No device work launched by this op.")),
    h("div", {}, h("h2", {}, "Instructions and DMA" + modeled), d.instructions.length ? dataTable([
      { key: "name", label: "Instruction" }, { key: "track", label: "Engine" }, { key: "count", label: "Count", num: true },
      { key: "total_ns", label: "Time", num: true, fmt: fmtNs }, { key: "bytes", label: "Bytes", num: true, fmt: fmtBytes }], d.instructions, { compact: true })
      : h("p", { class: "note" }, "No instruction-level events (only neuron profiles have them).")),
    h("div", {}, h("h2", {}, "Source lines"), d.lines.length ? dataTable([
      { key: "file", label: "Line", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id, r.line), class: "op-line" }, `${r.file.split("/").pop()}:${r.line}`), title: (r) => r.file },
      { key: "count", label: "Calls", num: true }, { key: "total_ns", label: "Host", num: true, fmt: fmtNs }], d.lines, { compact: true })
      : h("p", { class: "note" }, "No source lines recorded for this op."))));
}

run(async () => {
  const d = await api(`/p/${enc(profile)}/operators`);
  setModeled(d.device_time_modeled);
  const modeled = d.device_time_modeled ? " (modeled)" : "";
  const ops = d.operators;
  const chart = h("div", { class: "chart", id: "ops-chart" });
  const roof = h("div", { class: "chart", id: "roofline-chart" });
  const cols = [
    { key: "name", label: "Op", cell: (r) => h("span", { class: "mono" }, "▸ ", r.name) },
    { key: "count", label: "Calls", num: true },
    { key: "host_self_ns", label: "Host self", num: true, fmt: fmtNs },
    { key: "host_total_ns", label: "Host total", num: true, fmt: fmtNs },
    { key: "launches", label: "Launches", num: true },
    { key: "device_ns", label: "Device" + modeled, num: true, fmt: fmtNs },
    { key: "flops", label: "FLOPs", num: true, fmt: (v) => (v ? fmtNum(v) : "–") },
    { key: "bytes", label: "Bytes", num: true, fmt: (v) => (v ? fmtBytes(v) : "–") },
    { key: "intensity", label: "FLOP/byte", num: true, fmt: (v) => (v ? v.toFixed(1) : "–"), help: "arithmetic intensity" },
  ];
  let table;
  const filtered = filteredTable(ops, (rows) => (table = dataTable(cols, rows, { onRowClick: (r, tr) => expand(r, tr, modeled).catch((e) => console.warn(e)) })),
    { placeholder: "Filter ops: name or /regex/" });
  mount(
    h("h1", {}, "Operators", h("span", { class: "note" }, `  ${ops.length} framework ops · click a row for its kernels, instructions and lines`)),
    // the roofline needs a device spec (peak FLOP/s and bandwidth): without one, no half-empty panel
    d.roofline ? h("div", { class: "grid2" }, section("Time by op (top 15)", chart), section("Roofline" + modeled, roof))
      : section("Time by op (top 15)", chart, h("p", { class: "note", id: "no-roofline" }, "No roofline: this profile has no device spec (peak FLOP/s and memory bandwidth); neuron captures carry one.")),
    section("All ops", filtered),
  );
  const top = ops.slice(0, 15).reverse();
  chart.style.height = Math.max(300, 90 + 30 * top.length) + "px";
  roof.style.height = chart.style.height;
  plot(chart, [
    { type: "bar", orientation: "h", name: "host self", y: top.map((o) => o.name), x: top.map((o) => o.host_self_ns / 1e6), marker: { color: "#3b82f6" } },
    { type: "bar", orientation: "h", name: "device" + modeled, y: top.map((o) => o.name), x: top.map((o) => o.device_ns / 1e6), marker: { color: "#10b981" } },
  ], { barmode: "group", xaxis: { title: { text: "ms" } }, yaxis: { automargin: true, tickfont: { family: "ui-monospace, Menlo, Consolas, monospace", size: 11 } }, margin: { l: 10, r: 10, t: 30, b: 50 } });
  if (d.roofline) {
    const pts = ops.filter((o) => o.intensity && o.achieved_flops_per_s);
    const peak = d.roofline.peak_flops_per_s, bw = d.roofline.peak_bytes_per_s;
    const xs = [0.01, peak / bw, 1e5];
    plot(roof, [
      { type: "scatter", mode: "lines", name: "roof", x: xs, y: xs.map((x) => Math.min(peak, x * bw)), line: { color: "#111827", width: 2 }, hoverinfo: "skip" },
      { type: "scatter", mode: "markers", name: "ops", x: pts.map((o) => o.intensity), y: pts.map((o) => o.achieved_flops_per_s), text: pts.map((o) => o.name),
        marker: { size: pts.map((o) => 6 + 14 * Math.sqrt(o.device_ns / Math.max(...pts.map((p) => p.device_ns)))), color: "#f97316", opacity: 0.8 },
        hovertemplate: "%{text}<br>%{x:.1f} FLOP/byte<br>%{y:.3s}FLOP/s<extra></extra>" },
    ], { xaxis: { type: "log", title: { text: "arithmetic intensity (FLOP/byte)" } }, yaxis: { type: "log", title: { text: "FLOP/s" } }, margin: { l: 70, r: 10, t: 30, b: 50 } });
  }
  const want = qs("op");
  if (want) {
    const tr = [...table.querySelectorAll("tbody tr")].find((r) => r.firstChild.textContent === "▸ " + clean(want));
    if (tr) { tr.scrollIntoView({ block: "center" }); tr.click(); }
  }
});
