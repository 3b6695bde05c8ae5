// The module tree: device time by nn.Module path (which layer costs what), as an icicle chart
// and a table; self is a module's own forward work and its backward, total adds its submodules.
// ?module=PATH (every module named elsewhere links here) scrolls to that module's row, marks it,
// and offers its events on the timeline.
import { api, h, mount, run, fmtNs, dataTable, heatBar, section, setModeled, profile, plot, qs, moduleUrl, pUrl, enc } from "./common.js";

const ICICLE_H = 420;  // the chart's div is this tall, so the chart stays inside its panel
const modName = (m) => (m.path === "" ? "(model)" : m.path);
const label = (m) => (m.path === "" ? "(model)" : m.path.split(".").pop());
const parentOf = (path) => (path.includes(".") ? path.slice(0, path.lastIndexOf(".")) : "");

async function modules() {
  const d = await api(`/p/${encodeURIComponent(profile)}/modules`);
  setModeled(d.device_time_modeled);
  const modeled = d.device_time_modeled ? " (modeled)" : "";
  if (!d.modules.length) {
    mount(h("h1", {}, "Modules"), h("p", { class: "note" }, "No device work in this profile carries an nn.Module path (capture a model on the neuron device, or record the trace with with_modules=True)."));
    return;
  }
  const index = new Map(d.modules.map((m, i) => [m.path, String(i)]));
  const chart = h("div", { id: "module-icicle", class: "chart", style: { height: `${ICICLE_H}px` } });
  const max = Math.max(1, ...d.modules.map((m) => m.total_ns));
  const want = qs("module");
  const chosen = want === null ? null : d.modules.find((m) => m.path === want) || null;
  const timelineOf = (m) => pUrl(profile, `/timeline?module=${enc(m.path)}`);
  mount(
    h("h1", {}, "Modules", h("span", { class: "note" }, "  device time by nn.Module path, as model.named_modules() names it")),
    want === null ? null : chosen ? h("div", { class: "panel", id: "module-chosen" }, h("b", { class: "mono" }, modName(chosen)),
      h("span", { class: "note" }, `  total ${fmtNs(chosen.total_ns)} · self ${fmtNs(chosen.self_ns)} · ${chosen.kernels} kernels · `),
      h("a", { href: timelineOf(chosen), id: "module-timeline" }, "its kernels and ops on the timeline"))
      : h("p", { class: "warn", id: "module-chosen" }, `No module ${want} in this profile.`),
    section("Module tree" + modeled, chart),
    section("Modules", h("div", { id: "module-table" }, dataTable([
      { key: "path", label: "Module", cell: (m) => h("a", { class: "mono module-link", href: moduleUrl(profile, m.path), style: { paddingLeft: `${m.depth}em` } }, modName(m)) },
      { label: "", cell: (m) => h("a", { href: timelineOf(m), class: "tl-link", title: "its events on the timeline" }, "timeline") },
      { label: "", cell: (m) => heatBar(m.total_ns / max) },
      { key: "calls", label: "Calls", num: true },
      { key: "self_ns", label: "Self", num: true, fmt: fmtNs },
      { key: "total_ns", label: "Total", num: true, fmt: fmtNs },
      { key: "forward_ns", label: "Forward", num: true, fmt: fmtNs },
      { key: "backward_ns", label: "Backward", num: true, fmt: fmtNs },
      { key: "kernels", label: "Kernels", num: true },
    ], d.modules, { rowClass: (m) => (chosen && m.path === chosen.path ? "chosen" : null) }))),
  );
  const row = document.querySelector("#module-table tr.chosen");
  if (row) row.scrollIntoView({ block: "center" });
  // below each module its own work: by op, then by kernel (they add up to its self time)
  const ids = d.modules.map((m) => index.get(m.path));
  const parents = d.modules.map((m) => (m.path === "" ? "" : index.get(parentOf(m.path)) ?? ""));
  const labels = d.modules.map(label);
  const values = d.modules.map((m) => m.total_ns);
  const hover = d.modules.map((m) => `${m.path === "" ? "(model)" : m.path}: total ${fmtNs(m.total_ns)}, self ${fmtNs(m.self_ns)}`);
  const opIds = new Map();
  for (const r of d.ops || []) {
    const mod = index.get(r.module);
    if (mod === undefined) continue;
    const opKey = `${mod}/${r.op}`;
    if (!opIds.has(opKey)) {
      opIds.set(opKey, { id: `o${opIds.size}`, value: 0 });
      ids.push(opIds.get(opKey).id); parents.push(mod); labels.push(r.op); values.push(0); hover.push(r.op);
    }
    const op = opIds.get(opKey);
    op.value += r.dur_ns;
    values[ids.indexOf(op.id)] = op.value;
    ids.push(`k${ids.length}`); parents.push(op.id); labels.push(r.kernel); values.push(r.dur_ns);
    hover.push(`${r.kernel}: ${fmtNs(r.dur_ns)} in ${r.count} launches`);
  }
  plot(chart, [{ type: "icicle", branchvalues: "total", ids, parents, labels, values, hovertext: hover, hoverinfo: "text",
    level: chosen ? index.get(chosen.path) : undefined }],
    { height: ICICLE_H, margin: { t: chosen ? 30 : 10, l: 10, r: 10, b: 10 } });
  // a module clicked in the icicle is chosen as a link to it would (its row marked, its events
  // linked); clicking the chosen one again goes up to its parent. Ops and kernels zoom as usual.
  chart.on("plotly_icicleclick", (e) => {
    const p = e && e.points && e.points[0];
    const m = p && /^\d+$/.test(String(p.id)) ? d.modules[Number(p.id)] : null;
    if (!m) return true;
    const path = chosen && m.path === chosen.path && m.path !== "" ? parentOf(m.path) : m.path;
    history.pushState(null, "", moduleUrl(profile, path));
    run(modules);
    return false;
  });
}

window.addEventListener("popstate", () => run(modules));

run(modules);
