// The call tree and flame graph of host time: by Python call path (the stacks the profile
// holds) or by nn.Module path (?by=module). The flame graph is an icicle drawn root at the
// bottom; the tree table opens along the heaviest path, and a click on a row folds or unfolds it.
// The two are linked: a frame clicked in the flame graph opens and marks its row, a row clicked
// focuses the flame graph on it; a focus change redraws at once (no zoom animation). Frames are
// coloured by category (the node's kind), library (a frame's package, an op's namespace) or
// module (the top nn.Module, when grouped by module), kept in ?color=.
import { api, h, mount, run, fmtNs, fmtPct, heatBar, section, setModeled, profile, plot, qs, enc, pUrl, sourceUrl, moduleUrl, nameMatcher } from "./common.js";

const OPEN_DEPTH = 40; // the heaviest path opens this deep on load
const FLAME_DEPTH = 14; // levels drawn at once: a click on a frame zooms into it
const PALETTE = ["#3b82f6", "#10b981", "#f59e0b", "#8b5cf6", "#ef4444", "#06b6d4", "#84cc16", "#ec4899", "#f97316", "#64748b", "#14b8a6", "#a855f7"];
const LEGEND_MAX = 12;

function byLink(by, current, label) {
  if (by === current) return h("strong", {}, label);
  return h("a", { href: pUrl(profile, `/calltree${by === "stack" ? "" : "?by=" + by}`), id: `by-${by}` }, label);
}

async function calltree() {
  const by = qs("by") === "module" ? "module" : "stack";
  const d = await api(`/p/${enc(profile)}/calltree?by=${by}`);
  setModeled(d.device_time_modeled);  // a capture's host clock holds the runtime's modeled costs
  const nodes = d.nodes;
  // a module node's whole path (its name is its last part), for its link to the Modules page
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const pathOf = (n) => {
    if (!n || n.kind !== "module") return undefined;
    if (n.name === "(model)") return "";
    if (n.name.startsWith("(")) return undefined;  // work outside every module
    const up = pathOf(byId.get(n.parent));
    return up === undefined ? undefined : up ? `${up}.${n.name}` : n.name;
  };
  for (const n of nodes) if (n.kind === "module") n.path = pathOf(n);
  const head = h("h1", {}, "Call tree", h("span", { class: "note" }, "  host time: self is a node's own, total adds its callees; every rank added together"));
  const picker = h("p", { class: "note", id: "calltree-by" }, "Group by: ", byLink("stack", by, "Python call path"), " · ",
    byLink("module", by, "nn.Module path"),
    d.has_modules ? h("span", {}, " · device time by module: ", h("a", { href: pUrl(profile, "/modules"), id: "modules-link" }, "Modules page")) : null);
  if (nodes.length <= 1) {
    mount(head, picker, h("p", { class: "note" }, "This profile has no host spans to build a call tree from."));
    return;
  }
  const notes = [];
  if (by === "stack" && !d.has_stacks) notes.push("No Python stacks in this profile (record the trace with with_stack=True, or capture on the neuron device): the tree nests framework ops only.");
  if (d.dropped_nodes) notes.push(`${d.dropped_nodes} smallest nodes are left out (their time stays in their callers' totals).`);
  const chart = h("div", { id: "flame", class: "chart", style: { height: "440px" } });
  const legend = h("div", { id: "flame-legend", class: "legend" });
  const modes = by === "module" ? ["category", "library", "module"] : ["category", "library"];
  let mode = modes.includes(qs("color")) ? qs("color") : "category";
  const colorSel = h("select", { id: "flame-color" }, modes.map((m) => h("option", { value: m, selected: m === mode }, `Colour by ${m}`)));
  const holder = h("div", { id: "calltree-table" });
  mount(head, picker, ...notes.map((n) => h("p", { class: "note" }, n)),
    section(`Flame graph · ${fmtNs(d.total_ns)} of host time in ${d.events} events`, h("div", { class: "filter-bar" }, colorSel, legend), chart),
    section("Call tree", holder));
  const tree = treeTable(nodes, d.total_ns, (n) => fl.focus(n.id));
  const fl = flame(chart, nodes, byId, (n) => tree.reveal(n.id));
  const recolor = () => {
    const keys = colorKeys(nodes, byId, mode);
    const colors = paletteOf(keys);
    fl.recolor(keys.map((k) => colors.get(k)));
    legend.replaceChildren(...[...colors].slice(0, LEGEND_MAX).map(([k, c]) => h("span", { class: "legend-item" }, h("i", { style: { background: c } }), k)));
  };
  colorSel.addEventListener("change", () => {
    mode = colorSel.value;
    const url = new URL(location.href); url.searchParams.set("color", mode); history.replaceState(null, "", url);
    recolor();
  });
  recolor();
  holder.append(tree.el);
}

// what colours a node: its kind, its library (a frame's package, an op's namespace) or the top
// module it runs in (a node outside modules inherits its nearest module ancestor's)
function colorKeys(nodes, byId, mode) {
  if (mode === "category") return nodes.map((n) => n.kind);
  if (mode === "library") return nodes.map(libraryOf);
  const top = (n) => {
    for (let m = n; m; m = byId.get(m.parent)) if (m.kind === "module" && m.path !== undefined) return m.path === "" ? "(model)" : m.path.split(".")[0];
    return "(outside modules)";
  };
  return nodes.map(top);
}

function libraryOf(n) {
  if (n.file) {
    const f = n.file.replace(/\\/g, "/");
    const m = /(?:site|dist)-packages\/([^/]+)/.exec(f);
    if (m) return m[1].replace(/\.py$/, "");
    if (f.startsWith("<")) return "python";
    return f.includes("/") ? f.split("/")[0] + "/" : "your code";
  }
  const ns = /^([A-Za-z_][\w.]*)::/.exec(n.name);
  return ns ? ns[1] : n.kind;
}

// the same key, the same colour, heaviest keys first in the palette
function paletteOf(keys) {
  const order = new Map();
  for (const k of keys) order.set(k, (order.get(k) || 0) + 1);
  const out = new Map();
  [...order.keys()].forEach((k, i) => out.set(k, PALETTE[i % PALETTE.length]));
  return out;
}

// the flame graph; focus(id) shows a node's subtree at once, without plotly's zoom animation
function flame(el, nodes, byId, onPick) {
  const ids = nodes.map((n) => String(n.id));
  const parents = nodes.map((n) => (n.parent < 0 ? "" : String(n.parent)));
  const labels = nodes.map((n) => shortName(n));
  const hover = nodes.map((n) => `${n.name}: total ${fmtNs(n.total_ns)}, self ${fmtNs(n.self_ns)}`);
  let level = "";
  plot(el, [{ type: "icicle", branchvalues: "total", ids, parents, labels, values: nodes.map((n) => n.total_ns),
    hovertext: hover, hoverinfo: "text", maxdepth: FLAME_DEPTH, tiling: { orientation: "v", flip: "y" },
    pathbar: { visible: true, side: "top", thickness: 20 } }],
  { height: 440, margin: { t: 30, l: 10, r: 10, b: 10 } });
  const parentsOf = new Set(nodes.map((n) => n.parent));
  const focus = (id) => {
    let n = byId.get(id);
    if (n && !parentsOf.has(n.id) && n.parent >= 0) n = byId.get(n.parent);  // a leaf: its caller
    if (!n) return;
    id = n.id;
    level = n.parent < 0 ? "" : String(id);
    el.dataset.level = level;
    window.Plotly.restyle(el, { level: [level] });
  };
  el.on("plotly_icicleclick", (e) => {
    const p = e && e.points && e.points[0];
    if (!p) return false;
    const id = Number(p.id);
    // a click on the frame shown at the root goes up one level, as plotly's own click does
    const target = String(id) === level ? byId.get(id).parent : id;
    focus(target < 0 ? 0 : target);
    onPick(byId.get(id));
    return false;  // plotly's own zoom animates for about a second: drawn at once instead
  });
  return { focus, recolor: (colors) => window.Plotly.restyle(el, { "marker.colors": [colors] }) };
}

// a frame's function name first, so a narrow box still says which function it is
function shortName(n) {
  if ((n.kind === "frame" || n.kind === "python") && n.file) {
    const i = n.name.lastIndexOf("): ");
    const fn = i >= 0 ? n.name.slice(i + 3) : n.name;
    return `${fn} · ${n.file.split("/").pop()}:${n.line}`;
  }
  return n.name;
}

function treeTable(nodes, totalNs, onPick) {
  const children = new Map(nodes.map((n) => [n.id, []]));
  for (const n of nodes) if (n.parent >= 0) children.get(n.parent).push(n);
  for (const c of children.values()) c.sort((a, b) => b.total_ns - a.total_ns);
  const open = new Set([0]);
  for (let n = nodes[0], i = 0; n && i < OPEN_DEPTH; i++) { // open the heaviest path
    open.add(n.id);
    n = children.get(n.id)[0];
    if (n && n.total_ns < 0.05 * totalNs) break;
  }
  let found = new Set(), current = null;
  const tbody = h("tbody");
  const table = h("table", { class: "data compact calltree" },
    h("thead", {}, h("tr", {}, h("th", {}, "Function / span"), h("th", {}, ""), h("th", { class: "num" }, "Total"),
      h("th", { class: "num" }, "Total %"), h("th", { class: "num" }, "Self"), h("th", { class: "num" }, "Events"), h("th", {}, ""))), tbody);
  const render = () => {
    const rows = [];
    const walk = (n) => {
      rows.push(row(n, children.get(n.id).length > 0, open.has(n.id), totalNs, found.has(n.id), n.id === current, () => {
        if (open.has(n.id)) open.delete(n.id); else open.add(n.id);
        current = n.id;
        render();
        onPick(n);
      }));
      if (open.has(n.id)) for (const c of children.get(n.id)) walk(c);
    };
    walk(nodes[0]);
    tbody.replaceChildren(...rows);
  };
  render();
  // find: a name substring or /regex/; the matching nodes are marked and every path to them
  // opened; the count says how much host time they hold (a match inside a match counted once)
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const box = h("input", { type: "search", id: "calltree-find", class: "filter-box", placeholder: "Find: function, op or /regex/", value: qs("find") || "" });
  const count = h("span", { class: "note", id: "calltree-find-count" });
  const apply = () => {
    found = new Set();
    try {
      const m = nameMatcher(box.value);
      if (m) for (const n of nodes) if (n.id !== 0 && m(n.name)) found.add(n.id);
      let held = 0;
      for (const id of found) {
        let p = byId.get(id).parent, inner = false;
        while (p >= 0) { open.add(p); inner ||= found.has(p); p = byId.get(p).parent; }
        if (!inner) held += byId.get(id).total_ns;
      }
      count.textContent = m ? `${found.size} nodes · ${fmtNs(held)} (${fmtPct(held / Math.max(1, totalNs))} of host time)` : "";
      count.dataset.nodes = found.size;
      count.dataset.heldNs = held;
    } catch (e) { count.textContent = "bad regular expression: " + e.message; }
    render();
    const url = new URL(location.href);
    if (box.value.trim()) url.searchParams.set("find", box.value); else url.searchParams.delete("find");
    history.replaceState(null, "", url);
  };
  box.addEventListener("input", apply);
  if (box.value) apply();
  // a frame picked in the flame graph: every row above it opened, its row marked and shown
  const reveal = (id) => {
    for (let p = byId.get(id).parent; p >= 0; p = byId.get(p).parent) open.add(p);
    current = id;
    render();
    const tr = tbody.querySelector(`tr[data-node="${id}"]`);
    if (tr) tr.scrollIntoView({ block: "nearest" });
  };
  return { el: h("div", {}, h("div", { class: "filter-bar" }, box, count), table), reveal };
}

function row(n, hasKids, isOpen, totalNs, isFound, isCurrent, toggle) {
  const twisty = hasKids ? (isOpen ? "▾ " : "▸ ") : "  ";
  const name = h("span", { class: "mono", style: { paddingLeft: `${Math.min(n.depth, 60) * 0.9}em` } }, twisty, n.name);
  let link = null;
  if (n.file_id) link = h("a", { href: sourceUrl(profile, n.file_id, n.line), class: "src-link" }, "source");
  else if (n.kind === "module" && n.path !== undefined) link = h("a", { href: moduleUrl(profile, n.path), class: "module-link" }, "module");
  else if (n.kind !== "frame" && n.kind !== "module" && n.kind !== "root") link = h("a", { href: pUrl(profile, `/timeline?find=${enc(n.name)}`), class: "tl-link" }, "timeline");
  const tr = h("tr", { class: "clickable" + (isOpen ? " open" : "") + (isFound ? " found" : "") + (isCurrent ? " current" : ""), "data-node": n.id, "data-kind": n.kind },
    h("td", { title: n.name }, name), h("td", {}, heatBar(n.total_ns / Math.max(1, totalNs))),
    h("td", { class: "num" }, fmtNs(n.total_ns)), h("td", { class: "num" }, fmtPct(n.total_ns / Math.max(1, totalNs))),
    h("td", { class: "num" }, fmtNs(n.self_ns)), h("td", { class: "num" }, n.events ? String(n.events) : "–"), h("td", {}, link));
  tr.addEventListener("click", (e) => { if (!e.target.closest("a")) toggle(); });
  return tr;
}

run(calltree);
