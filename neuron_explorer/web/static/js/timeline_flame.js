// The flame graph of the area selection (/api/p/NAME/span/flame): each path of names as a box
// as wide as its time inside the selection, children under their parent, the heaviest first,
// coloured by kind as the timeline is. A click on a box fills the width with it (its path above
// says where it is; a click there goes back up). Names are text nodes, never parsed as HTML.
import { h, fmtNs, fmtNum, section, clean } from "./common.js";
import { colorFor, textColor } from "./timeline_overview.js";

const ROW_H = 17;

export function spanFlame(d) {
  const nodes = d.nodes, kids = nodes.map(() => []);
  for (const n of nodes) if (n.parent >= 0) kids[n.parent].push(n);
  const graph = h("div", { class: "span-flame", id: "span-flame" });
  const path = h("p", { class: "note", id: "span-flame-path" });
  graph.dataset.nodes = nodes.length - 1;
  graph.dataset.total = d.total_ns;

  function show(root) {  // `root` fills the width; its descendants below it
    const top = root.id === 0 ? 0 : root.depth - 1, total = Math.max(1, root.total_ns);
    const boxes = [];
    let depth = top;
    const place = (n, x) => {
      depth = Math.max(depth, n.depth);
      const fill = colorFor("kind", n.kind, n.name);
      boxes.push(h("div", {
        class: "fr", "data-node": n.id,
        title: clean(`${n.name} · ${n.kind} · ${fmtNs(n.total_ns)} inside (${fmtNs(n.self_ns)} self) · ${fmtNum(n.count)} events · click to fill the width`),
        style: { left: `${x * 100}%`, width: `${(n.total_ns / total) * 100}%`, top: `${(n.depth - 1 - top) * ROW_H}px`, background: fill, color: textColor(fill) },
        onclick: () => show(n),
      }, clean(n.name)));
      let cx = x;
      for (const c of kids[n.id]) { place(c, cx); cx += c.total_ns / total; }
    };
    if (root.id === 0) { let cx = 0; for (const c of kids[0]) { place(c, cx); cx += c.total_ns / total; } }
    else place(root, 0);
    graph.replaceChildren(...boxes);
    graph.style.height = `${Math.max(1, depth - top) * ROW_H + 2}px`;
    graph.dataset.root = root.id;
    const up = [];
    for (let n = root; n; n = n.parent >= 0 ? nodes[n.parent] : null) up.unshift(n);
    path.replaceChildren(...up.flatMap((n, i) => [i ? " › " : "",
      n === root ? clean(n.id ? n.name : "the whole selection") : h("a", { href: "#", onclick: (e) => { e.preventDefault(); show(n); } }, clean(n.id ? n.name : "the whole selection"))]));
  }
  show(nodes[0]);
  return section("Flame graph of the selection",
    h("p", { class: "note" }, `Each box: the time its events spend inside the selection, summed by their nesting path (${fmtNs(d.total_ns)} at the top level)` +
      (d.dropped ? `; ${fmtNum(d.dropped)} paths under 0.1% left out.` : ".")),
    nodes.length > 1 ? [path, graph] : h("p", { class: "note" }, "No event with a duration lies in the selection."));
}
