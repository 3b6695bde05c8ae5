// The allocations alive at the memory peak (a memory snapshot's profile: /api/p/NAME/memory's
// `alive`): the largest, each with its size, line and module, and their sums by line and module.
import { h, dataTable, fmtBytes, fmtNs, sourceUrl, section } from "./common.js";

const lineCell = (profile) => (r) => (r.file
  ? h("a", { href: sourceUrl(profile, r.file_id, r.line), class: "mem-line", title: r.file }, `${r.file.split("/").pop()}:${r.line}`)
  : h("span", { class: "note" }, "no Python frames"));

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
  out.push(h("div", { class: "grid2", id: "memory-alive-sums" }, section("Alive at the peak, by line", byLine), section("Alive at the peak, by module", byModule)));
  return out;
}
