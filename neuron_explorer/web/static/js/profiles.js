import { api, h, mount, run, fmtNs, fmtNum, dataTable, findingChips, pUrl, enc, section } from "./common.js";

const POLL_MS = 3000;
const chosen = new Set(); // kept across refreshes of the list

run(async () => render(await api("/profiles")));

function render(data) {
  const button = h("button", { class: "btn primary", disabled: true, id: "compare-btn" }, "Compare the two selected");
  button.addEventListener("click", () => {
    const [a, b] = [...chosen];
    location.href = `/compare?a=${enc(a)}&b=${enc(b)}`;
  });
  const update = () => { button.disabled = chosen.size !== 2; };
  const cols = [
    { label: "", cell: (r) => {
      const box = h("input", { type: "checkbox", class: "pick", "data-name": r.name, disabled: !!r.error || r.reading_s !== undefined, checked: chosen.has(r.name) });
      box.addEventListener("change", () => {
        if (box.checked) chosen.add(r.name); else chosen.delete(r.name);
        if (chosen.size > 2) { const first = [...chosen][0]; chosen.delete(first); document.querySelector(`input.pick[data-name="${CSS.escape(first)}"]`).checked = false; }
        update();
      });
      return box;
    } },
    { key: "name", label: "Profile", cell: (r) => r.error || r.reading_s !== undefined ? h("span", {}, r.name) : h("a", { href: pUrl(r.name) }, r.name) },
    { key: "source", label: "Source" },
    { key: "devices", label: "Devices", cell: (r) => (r.devices || []).join(", ") + (r.device_spec ? ` (${r.device_spec}, modeled)` : "") },
    { key: "events", label: "Events", num: true, fmt: (v) => fmtNum(v) },
    { key: "step_count", label: "Steps", num: true },
    { key: "step_mean_ns", label: "Step time", num: true, fmt: fmtNs },
    { key: "top_finding", label: "Top finding", cell: (r) => r.error ? h("span", { class: "pos" }, "cannot open: " + r.error)
      : r.reading_s !== undefined ? h("span", { class: "note reading" }, `still reading (${Math.round(r.reading_s)} s so far)…`)
      : r.top_finding ? h("span", {}, findingChips(r.top_finding), " ", h("a", { href: pUrl(r.name, "/findings") }, r.top_finding.title))
      : r.analysis_pending ? h("span", { class: "note" }, "analysing…") : "" },
  ];
  update();
  const skipped = data.skipped || [];
  mount(
    h("h1", {}, "Profiles"),
    h("p", { class: "note" }, `Serving ${data.root}. Select two profiles to compare them.`),
    section("Profiles", dataTable(cols, data.profiles.map(stepColumns), { sortKey: "name", desc: false }), h("div", { class: "sql-actions" }, button)),
    skipped.length ? section("Not served", h("p", { class: "note" }, "Profiles in this folder that the server does not show, and why:"),
      h("ul", { class: "list-plain", id: "skipped" }, skipped.map((s) => h("li", {}, h("span", { class: "mono" }, s.name), " — ", s.reason)))) : null,
  );
  // large profiles are analysed in the background: ask the list again (never reload the page,
  // which would lose what is ticked) until their top finding is known
  if (data.profiles.some((r) => r.analysis_pending || r.reading_s !== undefined)) setTimeout(() => api("/profiles").then(render).catch((e) => console.warn(e)), POLL_MS);
}

// a row's step statistics (analysis.steps, as the summary page's) as the two sortable columns
function stepColumns(r) {
  const st = r.steps;
  return { ...r, step_count: st ? st.count : r.error ? null : 0, step_mean_ns: st ? Math.round(st.mean_ns) : null };
}
