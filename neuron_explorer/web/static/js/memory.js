// Memory over time: every counter of the profile on one chart (each bucket's maximum, so the
// peak is drawn as it was), the peak of memory_allocated, and what was held at the peak by op
// and by source line (the baseline held when the step began, plus what the step's ops hold);
// for a memory snapshot, which has no ops, the allocations alive at the peak instead.
import { api, h, mount, run, fmtNs, fmtBytes, dataTable, plot, pUrl, sourceUrl, moduleLink, enc, card, section, setModeled, profile, plotText } from "./common.js";
import { aliveCards, aliveSections } from "./memory_alive.js";

const fmtVal = (unit) => (v) => (unit === "bytes" ? fmtBytes(v) : v === null || v === undefined ? "–" : String(v));

run(async () => {
  const d = await api(`/p/${enc(profile)}/memory`);
  setModeled(d.device_time_modeled);
  if (!d.counters.length) {
    mount(h("h1", {}, "Memory"), h("p", { class: "note", id: "no-memory" },
      "This profile has no memory counters. Neuron captures record device memory; torch.profiler traces have them when recorded with profile_memory=True."));
    return;
  }
  const chart = h("div", { class: "chart", id: "memory-chart", style: { height: "360px" } });
  const pk = d.peak;
  const parts = [h("h1", {}, "Memory", h("span", { class: "note" }, `  ${d.counters.length} counters · ${d.counters.reduce((n, c) => n + c.samples, 0).toLocaleString()} samples`))];
  if (pk && d.alive) parts.push(...aliveCards(pk, d.alive, profile));
  else if (pk) {
    parts.push(h("div", { class: "cards", id: "memory-peak" },
      card(`Peak ${pk.counter}`, fmtVal(pk.unit)(pk.value), `${pk.track}${pk.rank ? " rank " + pk.rank : ""}`),
      card("At", fmtNs(pk.ts_ns), pk.step !== null ? `step ${pk.step}` : "outside the steps"),
      card("Held when the step began", fmtVal(pk.unit)(pk.baseline), `${pk.since_ns !== null ? "at " + fmtNs(pk.since_ns) : "no step: the first sample"}; ${fmtVal(pk.unit)(pk.baseline_held)} of it still held at the peak`),
      card("Allocated in the step, held at the peak", fmtVal(pk.unit)(pk.charged), "charged to ops below")),
      h("p", { class: "note" }, "Each rise of the counter is charged to the innermost host op running when it was sampled; a counter has no addresses, so each fall is taken from what is held in proportion to the holdings (then from what the step began with): no op or line is charged more than it allocated, and the rows add up to the peak less the start still held. ",
        h("a", { href: pUrl(profile, `/timeline?start_ns=${Math.max(0, pk.ts_ns - 500000)}&end_ns=${pk.ts_ns + 500000}`), id: "peak-timeline" }, "The timeline at the peak")));
  }
  parts.push(section("Counters over time", chart));
  if (pk && !d.alive) {
    const unit = fmtVal(pk.unit);
    parts.push(h("div", { class: "grid2" },
      section("Held at the peak, by op", dataTable([
        { key: "op", label: "Op", cell: (r) => (r.op.startsWith("(") ? r.op : h("a", { href: pUrl(profile, `/operators?op=${enc(r.op)}`), class: "mono" }, r.op)) },
        { key: "held_bytes", label: "Held", num: true, fmt: unit },
        { key: "allocated_bytes", label: "Allocated", num: true, fmt: unit },
        { key: "allocations", label: "Allocations", num: true },
      ], pk.by_op, { compact: true, sortKey: "held_bytes" })),
      section("Held at the peak, by source line", pk.by_line.length ? dataTable([
        { key: "file", label: "Line", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id, r.line), class: "mem-line" }, `${r.file.split("/").pop()}:${r.line}`), title: (r) => r.file },
        { key: "op", label: "Op", cell: (r) => h("span", { class: "mono" }, r.op || "–") },
        { key: "held_bytes", label: "Held", num: true, fmt: unit },
        { key: "allocated_bytes", label: "Allocated", num: true, fmt: unit },
      ], pk.by_line, { compact: true, sortKey: "held_bytes" }) : h("p", { class: "note" }, "The ops holding memory at the peak have no source lines."))));
    if (pk.by_module && pk.by_module.length) parts.push(section("Held at the peak, by module", dataTable([
      { key: "module", label: "Module (nn.Module path)", cell: (r) => moduleLink(profile, r.module === "(model)" ? "" : r.module) },
      { key: "held_bytes", label: "Held", num: true, fmt: unit },
      { key: "allocated_bytes", label: "Allocated", num: true, fmt: unit },
    ], pk.by_module, { compact: true, sortKey: "held_bytes" })));
  }
  parts.push(...aliveSections(d.alive, profile));
  mount(...parts);
  const traces = d.counters.map((c) => ({
    type: "scatter", mode: "lines", name: `${c.track} ${c.name}`, x: c.ts_ns.map((t) => t / 1e6), y: c.max, line: { width: 1.5, shape: "hv" },
    // the unit comes from the profile: escaped, as plotly renders templates as HTML
    hovertemplate: `%{x:.3f} ms: %{y:.4s}${c.unit === "bytes" ? "B" : ""}<extra>${plotText(c.unit)}</extra>`,
  }));
  if (pk) traces.push({ type: "scatter", mode: "markers", name: "peak", x: [pk.ts_ns / 1e6], y: [pk.value], marker: { size: 10, color: "#dc2626", symbol: "diamond" }, hoverinfo: "skip" });
  plot(chart, traces, { xaxis: { title: { text: "time (ms)" } }, yaxis: { title: { text: pk ? pk.unit : "" } }, margin: { l: 70, r: 10, t: 30, b: 50 } });
});
