import { api, h, mount, run, fmtNs, dataTable, heatBar, sourceUrl as fileUrl, timelineUrl, moduleLink, pUrl, enc, section, setModeled, profile, fileId, qs, nameMatcher, filteredTable } from "./common.js";

// Which frame is "the line" for device self time: your code, model code (the default: your
// code or a library's, such as transformers' modeling files) or every frame. Kept in ?level=.
const LEVELS = { user: "your code", model: "model code", all: "every frame" };
const level = LEVELS[qs("level")] ? qs("level") : "model";
const sourceUrl = (name, fid, line) => {
  const url = fileUrl(name, fid, line);
  if (level === "model") return url;
  const [path, hash] = url.split("#");
  return `${path}?level=${level}${hash ? "#" + hash : ""}`;
};
function levelPicker() {
  const sel = h("select", { id: "line-level", title: "which frame is the line" },
    Object.entries(LEVELS).map(([k, v]) => h("option", { value: k, selected: k === level ? "" : null }, v)));
  sel.addEventListener("change", () => {
    const url = new URL(location.href);
    if (sel.value === "model") url.searchParams.delete("level"); else url.searchParams.set("level", sel.value);
    location.href = url.toString();
  });
  return h("label", { class: "note" }, "  line: ", sel);
}

async function files() {
  const d = await api(`/p/${enc(profile)}/source?level=${level}`);
  setModeled(d.device_time_modeled);
  const modeled = d.device_time_modeled ? " (modeled)" : "";
  const max = Math.max(1, ...d.files.map((f) => f.host_ns + f.device_ns));
  mount(
    h("h1", {}, "Source", h("span", { class: "note" }, "  files and lines ranked by the time they account for"), levelPicker()),
    section("Files", d.files.length ? filteredTable(d.files, (rows) => dataTable([
      { key: "file", label: "File", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id), class: "file-link" }, r.file) },
      { label: "", cell: (r) => heatBar((r.host_ns + r.device_ns) / max) },
      { key: "host_ns", label: "Host", num: true, fmt: fmtNs },
      { key: "device_ns", label: "Device" + modeled, num: true, fmt: fmtNs },
      { key: "ops", label: "Ops", num: true }, { key: "lines", label: "Lines", num: true },
      { key: "has_source", label: "Code kept", fmt: (v) => (v ? "yes" : "no") },
    ], rows), { param: "files", key: "file", placeholder: "Filter files: path or /regex/" }) : h("p", { class: "note" }, "No events in this profile carry a source line (record with with_stack=True, or capture on the neuron device).")),
    section("Model files", d.model_files.length ? dataTable([
      { key: "file", label: "File", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id), class: "file-link model-file" }, r.file) },
      { key: "self_ns", label: "Device self" + modeled, num: true, fmt: fmtNs },
      { key: "total_ns", label: "Hottest line total", num: true, fmt: fmtNs },
      { key: "lines", label: "Lines", num: true },
      { key: "has_source", label: "Code kept", fmt: (v) => (v ? "yes" : "no") },
    ], d.model_files) : h("p", { class: "note" }, "No device work carries a Python stack.")),
    section("Hottest model lines", dataTable([
      { key: "file", label: "Line", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id, r.line), class: "model-line" }, `${r.file.split("/").pop()}:${r.line}`), title: (r) => r.file },
      { key: "func", label: "Function" },
      { key: "self_ns", label: "Device self" + modeled, num: true, fmt: fmtNs },
      { key: "total_ns", label: "Device total" + modeled, num: true, fmt: fmtNs },
    ], d.top_model_lines, { compact: true })),
    section("Hottest lines", dataTable([
      { key: "file", label: "Line", cell: (r) => h("a", { href: sourceUrl(profile, r.file_id, r.line) }, `${r.file.split("/").pop()}:${r.line}`), title: (r) => r.file },
      { key: "func", label: "Function" },
      { key: "host_ns", label: "Host", num: true, fmt: fmtNs },
      { key: "device_ns", label: "Device" + modeled, num: true, fmt: fmtNs },
      { key: "ops", label: "Ops", num: true },
    ], d.top_lines, { compact: true })),
  );
}

async function showLine(side, line, modeled) {
  side.replaceChildren(h("p", { class: "note" }, "Loading…"));
  const d = await api(`/p/${enc(profile)}/source/${enc(fileId)}/lines/${line}`);
  side.replaceChildren(section(`Line ${line}`,
    // every event of this line outlined on the timeline (its own line, model line or stack)
    h("p", {}, h("a", { id: "line-timeline", href: pUrl(profile, `/timeline?line=${enc(fileId)}:${line}`) }, "Show this line's events on the timeline ▸")),
    d.ops.length ? dataTable([
      { key: "name", label: "Op / kernel", cell: (r) => h("a", { href: r.layer === "host" && r.kind === "op" ? pUrl(profile, `/operators?op=${enc(r.name)}`) : timelineUrl(profile, { id: r.first_id }) }, r.name) },
      { key: "kind", label: "Kind" },
      { key: "count", label: "Calls", num: true },
      { key: "total_ns", label: "Time", num: true, fmt: (v, r) => fmtNs(v) + (r.layer === "device" && modeled ? "*" : "") },
    ], d.ops, { compact: true }) : h("p", { class: "note" }, "No events at this line."),
    d.events.length ? h("div", {}, h("h2", { style: { marginTop: "12px" } }, "Longest calls"),
      h("ul", { class: "list-plain", id: "line-events" }, d.events.map((e) => h("li", {},
        h("a", { href: timelineUrl(profile, e), class: "jump" }, `${e.name}`), h("span", { class: "note" }, `  step ${e.step ?? "–"} · ${fmtNs(e.dur_ns)} · show on timeline`))))) : null,
    d.kernels && d.kernels.length ? h("div", {}, h("h2", { style: { marginTop: "12px" } }, "Device work with this line on its stack"),
      h("ul", { class: "list-plain", id: "line-kernels" }, d.kernels.map((k) => h("li", {},
        h("a", { href: timelineUrl(profile, k), class: "jump" }, k.name),
        "  ", k.module === null || k.module === undefined ? null : moduleLink(profile, k.module), h("span", { class: "note" }, ` · step ${k.step ?? "–"} · ${fmtNs(k.dur_ns)}`))))) : null,
    modeled ? h("p", { class: "note" }, "* device time from the cost model") : null));
}

// Find in the file: a substring (any case) or /regex/ over the code; matching lines are marked,
// Enter (or ▼) goes to the next and Shift+Enter (▲) to the previous; kept in ?find=.
function codeFinder(rows) {
  const box = h("input", { type: "search", id: "src-find", class: "filter-box", placeholder: "Find in this file: text or /regex/", value: qs("find") || "" });
  const count = h("span", { class: "note", id: "src-find-count" });
  let hits = [], cursor = -1;
  const apply = () => {
    rows.forEach((tr) => tr.classList.remove("found", "current"));
    hits = []; cursor = -1;
    try {
      const m = nameMatcher(box.value);
      if (m) hits = rows.filter((tr) => m(tr.lastChild.textContent));
      count.textContent = m ? `${hits.length} lines` : "";
    } catch (e) { count.textContent = "bad regular expression: " + e.message; }
    hits.forEach((tr) => tr.classList.add("found"));
    const url = new URL(location.href);
    if (box.value.trim()) url.searchParams.set("find", box.value); else url.searchParams.delete("find");
    history.replaceState(null, "", url);
  };
  const go = (step) => {
    if (!hits.length) return;
    if (cursor >= 0) hits[cursor].classList.remove("current");
    cursor = (cursor + step + hits.length) % hits.length;
    hits[cursor].classList.add("current");
    hits[cursor].scrollIntoView({ block: "center" });
    count.textContent = `${cursor + 1} / ${hits.length} lines`;
  };
  box.addEventListener("input", apply);
  box.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); go(e.shiftKey ? -1 : 1); } });
  if (box.value) setTimeout(apply, 0);
  return h("div", { class: "filter-bar" }, box, h("button", { class: "btn", id: "src-find-prev", onclick: () => go(-1) }, "▲"),
    h("button", { class: "btn", id: "src-find-next", onclick: () => go(1) }, "▼"), count);
}

async function file() {
  const d = await api(`/p/${enc(profile)}/source/${enc(fileId)}?level=${level}`);
  setModeled(d.device_time_modeled);
  const modeled = d.device_time_modeled;
  const max = Math.max(1, d.max_ns);
  const maxTotal = Math.max(1, d.max_total_ns || 0);
  const side = h("div", { class: "sidepanel", id: "line-panel" }, section("Line", h("p", { class: "note" }, "Click a line to list its ops and jump to them on the timeline.")));
  const rows = d.lines.map((l) => {
    const total = l.host_ns + l.device_ns;
    // the heat gutter: host+device time at this line, or the device time under it (total)
    const heat = Math.max(total / max, (l.total_ns || 0) / maxTotal);
    const tr = h("tr", { id: `L${l.line}`, class: heat > 0.05 ? "hot" : null },
      h("td", { class: "ln" }, String(l.line)),
      h("td", { class: "hb" }, heat ? heatBar(heat) : ""),
      h("td", { class: "t", title: "host time" }, l.host_ns ? fmtNs(l.host_ns) : ""),
      h("td", { class: "t", title: "device time" + (modeled ? " (modeled)" : "") }, l.device_ns ? fmtNs(l.device_ns) : ""),
      h("td", { class: "t", title: "ops" }, l.ops ? String(l.ops) : ""),
      h("td", { class: "t self", title: "device self time: work whose innermost model line is this one" }, l.self_ns ? fmtNs(l.self_ns) : ""),
      h("td", { class: "t total", title: "device total time: work with this line anywhere on its stack" }, l.total_ns ? fmtNs(l.total_ns) : ""),
      h("td", { class: "src" }, l.code === null ? "" : l.code));
    tr.addEventListener("click", () => {
      document.querySelectorAll(".code tr.target").forEach((x) => x.classList.remove("target"));
      tr.classList.add("target");
      history.replaceState(null, "", `#L${l.line}`);
      showLine(side, l.line, modeled).catch((e) => console.warn(e));
    });
    return tr;
  });
  mount(
    h("h1", {}, d.name, h("span", { class: "note mono" }, "  " + d.file), levelPicker()),
    codeFinder(rows),
    d.has_source ? null : h("p", { class: "warn" }, "The text of this file was not kept in the profile; only the line numbers with their times are shown."),
    h("div", { class: "source-layout" },
      section("Code", h("table", { class: "code", id: "code" },
        h("thead", {}, h("tr", {}, h("th", {}, "line"), h("th", {}, ""), h("th", {}, "host"), h("th", {}, "device" + (modeled ? "*" : "")), h("th", {}, "ops"), h("th", {}, "self"), h("th", {}, "total"), h("th", {}, ""))),
        h("tbody", {}, rows))),
      side));
  const m = /^#L(\d+)$/.exec(location.hash);
  if (m) {
    const tr = document.getElementById(`L${m[1]}`);
    if (tr) { tr.scrollIntoView({ block: "center" }); tr.click(); }
  }
}

run(fileId ? file : files);
