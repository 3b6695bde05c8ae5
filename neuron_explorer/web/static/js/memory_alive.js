// The allocations alive at the memory peak (a memory snapshot's profile: /api/p/NAME/memory's
// `alive`): the peak's cards, the largest, each with its size, line and module, and their sums.
import { h, card, dataTable, fmtBytes, fmtNs, pUrl, sourceUrl, section } from "./common.js";

const lineCell = (profile) => (r) => (r.file
  ? h("a", { href: sourceUrl(profile, r.file_id, r.line), class: "mem-line", title: r.file }, `${r.file.split("/").pop()}:${r.line}`)
  : h("span", { class: "note" }, "no Python frames"));

// The peak of a snapshot: where and when, and what of it the history saw allocated (a
// snapshot has no ops, so nothing is charged to one).
export function aliveCards(pk, alive, profile) {
  const before = alive.before_history;
  return [h("div", { class: "cards", id: "memory-peak" },
    card(`Peak ${pk.counter}`, fmtBytes(pk.value), `${pk.track}${pk.rank ? " rank " + pk.rank : ""}`),
    alive.timed
      ? card("At", fmtNs(pk.ts_ns), pk.step !== null ? `step ${pk.step}` : "in the snapshot's history")
      : card("At entry", pk.ts_ns.toLocaleString(), "of the history: a profiler's snapshot has no times, its entries are 1 ns apart"),
    card("Allocations alive", alive.count.toLocaleString(), `${fmtBytes(alive.bytes)}, listed below`),
    card("Allocated before the history", fmtBytes(before.bytes), `${before.count.toLocaleString()} allocations, with no line`)),
  h("p", { class: "note" }, "A memory snapshot records each allocation with its address and stack, so what was alive at the peak is known allocation by allocation: the rows below add up to the peak. ",
    h("a", { href: pUrl(profile, `/timeline?start_ns=${Math.max(0, pk.ts_ns - 500000)}&end_ns=${pk.ts_ns + 500000}`), id: "peak-timeline" }, "The timeline at the peak"))];
}

export function aliveSections(alive, profile) {
  if (!alive) return [];
  const line = lineCell(profile);
  const out = [section(`Allocations alive at the peak: ${alive.count.toLocaleString()}, ${fmtBytes(alive.bytes)}`, h("div", { id: "memory-alive" }, dataTable([
    { key: "bytes", label: "Size", num: true, fmt: fmtBytes },
    { key: "file", label: "Line", cell: line },
    { key: "func", label: "Function", cell: (r) => h("span", { class: "mono" }, r.func || "–") },
    { key: "module", label: "Module", cell: (r) => h("span", { class: "mono" }, r.module === null ? "–" : r.module || "(model)") },
    { key: "start_ns", label: "Allocated at", num: true, fmt: (v) => fmtNs(v), cell: (r) => (r.before_history ? h("span", { class: "note" }, "before the history") : fmtNs(r.start_ns)) },
  ], alive.largest, { compact: true, sortKey: "bytes" })))];
  const byLine = dataTable([
    { key: "file", label: "Line", cell: line },
    { key: "bytes", label: "Alive", num: true, fmt: fmtBytes },
    { key: "allocations", label: "Allocations", num: true },
  ], alive.by_line, { compact: true, sortKey: "bytes" });
  const byModule = dataTable([
    { key: "module", label: "Module (nn.Module path)", cell: (r) => h("span", { class: "mono" }, r.module) },
    { key: "bytes", label: "Alive", num: true, fmt: fmtBytes },
    { key: "allocations", label: "Allocations", num: true },
  ], alive.by_module, { compact: true, sortKey: "bytes" });
  const none = (what) => h("p", { class: "note" }, `The allocations alive at the peak have no ${what}.`);
  out.push(h("div", { class: "grid2", id: "memory-alive-sums" },
    section("Alive at the peak, by line", alive.by_line.length ? byLine : none("Python lines")),
    section("Alive at the peak, by module", alive.by_module.length ? byModule : none("module paths (the device's own snapshots record them)"))));
  return out;
}
