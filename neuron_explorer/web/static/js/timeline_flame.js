// The flame graph of the area selection (/api/p/NAME/span/flame): each path of names as a box
// as wide as its time inside the selection, children under their parent, the heaviest first,
// coloured by kind as the timeline is. Names are text nodes, never parsed as HTML.
import { h, fmtNs, fmtNum, section, clean } from "./common.js";
import { colorFor, textColor } from "./timeline_overview.js";

const ROW_H = 17;

export function spanFlame(d) {
  const nodes = d.nodes, kids = nodes.map(() => []);
  for (const n of nodes) if (n.parent >= 0) kids[n.parent].push(n);
  const total = Math.max(1, d.total_ns);
  const boxes = [];
  let depth = 0;
  const place = (n, x) => {  // x and width as fractions of the whole selection
    depth = Math.max(depth, n.depth);
    const w = n.total_ns / total;
    if (n.parent >= 0 && w * 100 >= 0.05) {
      const fill = colorFor("kind", n.kind, n.name);
      boxes.push(h("div", {
        class: "fr", "data-node": n.id,
        title: clean(`${n.name} · ${n.kind} · ${fmtNs(n.total_ns)} inside (${fmtNs(n.self_ns)} self) · ${fmtNum(n.count)} events`),
        style: { left: `${x * 100}%`, width: `${w * 100}%`, top: `${(n.depth - 1) * ROW_H}px`, background: fill, color: textColor(fill) },
      }, clean(n.name)));
    }
    let cx = x;
    for (const c of kids[n.id]) { place(c, cx); cx += c.total_ns / total; }
  };
  place(nodes[0], 0);
  const graph = h("div", { class: "span-flame", id: "span-flame", style: { height: `${Math.max(1, depth) * ROW_H + 2}px` } }, boxes);
  graph.dataset.nodes = nodes.length - 1;
  graph.dataset.total = d.total_ns;
  return section("Flame graph of the selection",
    h("p", { class: "note" }, `Each box: the time its events spend inside the selection, summed by their nesting path (${fmtNs(d.total_ns)} at the top level)` +
      (d.dropped ? `; ${fmtNum(d.dropped)} paths under 0.1% left out.` : ".")),
    nodes.length > 1 ? graph : h("p", { class: "note" }, "No event with a duration lies in the selection."));
}
