// Keys on every page: `?` shows every key (these and the page's own), `g` then a letter opens a
// tab (the letter is underlined in the help), `/` focuses the page's search or filter box, Esc
// closes the help. A page adds its keys with pageKeys(); keys typed into a text box are left
// to the box. Loaded by every page (pages.py), imported by a page that adds keys.

const GLOBAL = [["?", "show this list of keys"], ["g then a letter", "open a tab (letters below)"],
  ["/", "focus the search or filter box"], ["Esc", "close this list"]];
const page = { title: "", keys: [], handler: null };
let help = null, pendingG = 0;

// `keys` is a list of [key, what it does] for the help; `handler(e)` returns true when it took the key
export function pageKeys(title, keys, handler) {
  Object.assign(page, { title, keys, handler });
}

// each tab's letter: the first letter of its name not taken by an earlier tab
export function tabLetters() {
  const taken = new Set(), out = [];
  for (const a of document.querySelectorAll("nav.tabs a")) {
    const name = a.textContent.trim();
    const letter = [...name.toLowerCase()].find((c) => /[a-z]/.test(c) && !taken.has(c));
    if (!letter) continue;
    taken.add(letter);
    out.push({ letter, name, href: a.getAttribute("href") });
  }
  return out;
}

function table(title, rows) {
  const t = document.createElement("table");
  t.className = "keys";
  const cap = t.createCaption(); cap.textContent = title;
  for (const [k, what] of rows) {
    const tr = t.insertRow();
    const kc = tr.insertCell(); kc.className = "key";
    for (const part of k.split(" then ")) {
      if (kc.childNodes.length) kc.append(" then ");
      const kbd = document.createElement("kbd"); kbd.textContent = part; kc.append(kbd);
    }
    tr.insertCell().textContent = what;
  }
  return t;
}

export function toggleHelp(show = !help) {
  if (help) { help.remove(); help = null; }
  if (!show) return;
  help = document.createElement("div");
  help.id = "keys-help"; help.className = "keys-help"; help.setAttribute("role", "dialog");
  const box = document.createElement("div");
  const h = document.createElement("h2"); h.textContent = "Keys";
  box.append(h, table("Every page", GLOBAL));
  if (page.keys.length) box.append(table(page.title, page.keys));
  const tabs = tabLetters();
  if (tabs.length) box.append(table("Tabs", tabs.map((t) => [`g then ${t.letter}`, t.name])));
  help.append(box);
  help.addEventListener("click", (e) => { if (e.target === help) toggleHelp(false); });
  document.body.append(help);
}

function searchBox() {
  return document.querySelector("input[type=search], input.filter, #sql-input");
}

window.addEventListener("keydown", (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.target.closest && e.target.closest("input, select, textarea, [contenteditable]")) {
    if (e.key === "Escape") e.target.blur();
    return;
  }
  if (e.key === "?") { e.preventDefault(); toggleHelp(); return; }
  if (help && e.key === "Escape") { toggleHelp(false); return; }
  if (pendingG && Date.now() - pendingG < 1500) {
    pendingG = 0;
    const tab = tabLetters().find((t) => t.letter === e.key.toLowerCase());
    if (tab) { e.preventDefault(); location.href = tab.href; }
    return;
  }
  if (page.handler && page.handler(e)) { e.preventDefault(); return; }
  if (e.key === "g") { pendingG = Date.now(); return; }
  if (e.key === "/") {
    const box = searchBox();
    if (box) { e.preventDefault(); box.focus(); }
  }
});
