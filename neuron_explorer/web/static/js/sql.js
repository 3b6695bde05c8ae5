// The SQL box: a query over the profile's tables, with the schema beside it (each column's
// type, unit and meaning; a click puts its name into the query) and the queries run before
// (kept in the browser, newest first, shared by every profile).
import { api, h, mount, run, dataTable, enc, section, profile, qs } from "./common.js";

const HISTORY_KEY = "ne.sql.history", HISTORY_MAX = 30;
const pastQueries = () => { try { return JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]"); } catch (e) { return []; } };
function remember(q) {
  const kept = [q, ...pastQueries().filter((x) => x !== q)].slice(0, HISTORY_MAX);
  localStorage.setItem(HISTORY_KEY, JSON.stringify(kept));
}

function schemaPanel(schema, box) {
  const insert = (text) => {
    const [a, b] = [box.selectionStart, box.selectionEnd];
    box.setRangeText(text, a, b, "end");
    box.focus();
  };
  return h("div", { id: "sql-schema" }, schema.map((t) => h("details", { open: t.table === "events" },
    h("summary", { title: t.doc }, h("b", { class: "mono" }, t.table), h("span", { class: "note" }, ` ${t.columns.length} columns`)),
    h("ul", { class: "list-plain schema-cols" }, t.columns.map((c) => h("li", { title: c.doc },
      h("a", { href: "#", class: "mono", onclick: (e) => { e.preventDefault(); insert(c.name); } }, c.name),
      h("span", { class: "note" }, ` ${c.type}${c.unit ? " · " + c.unit : ""}`)))))));
}

run(async () => {
  const meta = await api(`/p/${enc(profile)}/sql`);
  const box = h("textarea", { id: "sql-input", spellcheck: "false" });
  box.value = qs("q") || meta.examples[0].sql;
  const limit = h("input", { id: "sql-limit", type: "number", min: 1, max: meta.max_rows, value: qs("limit") || 1000, style: { width: "90px" } });
  const out = h("div", { id: "sql-result" });
  const csv = h("a", { id: "sql-csv", class: "btn", href: "#" }, "Download CSV");
  const go = async () => {
    const q = box.value;
    const url = new URL(location.href);
    url.searchParams.set("q", q); url.searchParams.set("limit", limit.value);
    history.replaceState(null, "", url);
    csv.href = `/api/p/${enc(profile)}/sql.csv?q=${enc(q)}&limit=${enc(limit.value)}`;
    out.replaceChildren(h("p", { class: "note" }, "Running…"));
    remember(q);
    drawHistory();
    try {
      const d = await api(`/p/${enc(profile)}/sql?q=${enc(q)}&limit=${enc(limit.value)}`);
      const r = d.result;
      const rows = r.rows.map((row) => Object.fromEntries(row.map((v, i) => [String(i), v])));
      const cols = r.columns.map((c, i) => ({ key: String(i), label: c, num: rows.length > 0 && typeof rows[0][String(i)] === "number" }));
      out.replaceChildren(
        h("p", { class: "note", id: "sql-status" }, `${r.row_count} row${r.row_count === 1 ? "" : "s"} in ${r.elapsed_ms} ms` + (r.truncated ? ` · stopped at the limit of ${limit.value} rows` : "")),
        h("div", { class: "result-wrap" }, dataTable(cols, rows, { compact: true })));
    } catch (e) {
      out.replaceChildren(h("p", { class: "warn", id: "sql-error" }, e.message));
    }
  };
  const runBtn = h("button", { class: "btn primary", id: "sql-run", onclick: go }, "Run  (Ctrl+Enter)");
  box.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); go(); } });
  const hist = h("ol", { class: "list-plain", id: "sql-history" });
  const drawHistory = () => hist.replaceChildren(...pastQueries().map((q) => h("li", {},
    h("a", { href: "#", class: "mono sql-past", title: q, onclick: (e) => { e.preventDefault(); box.value = q; go(); } }, q.replace(/\s+/g, " ")))));
  drawHistory();
  mount(
    h("h1", {}, "SQL", h("span", { class: "note" }, `  DuckDB over this profile's tables (${meta.tables.join(", ")}) · read only · at most ${meta.max_rows} rows and ${meta.timeout_s} s`)),
    section("Query", h("div", { class: "sql-box" }, box),
      h("div", { class: "sql-actions" }, runBtn, h("label", {}, "row limit ", limit), csv,
        h("span", { class: "note" }, "Tables as Parquet: ", meta.tables.map((t, i) => h("span", {}, i ? ", " : "", h("a", { href: `/api/p/${enc(profile)}/tables/${t}.parquet` }, t))))),
      h("div", { class: "sql-actions examples" }, h("span", { class: "note" }, "Examples:"),
        meta.examples.map((ex) => h("button", { class: "btn", onclick: () => { box.value = ex.sql; go(); } }, ex.title)))),
    h("div", { class: "sql-side" }, section("Result", out),
      h("div", {}, section("Schema", meta.schema ? schemaPanel(meta.schema, box) : null), section("History", hist))));
  if (qs("q")) go();
});
