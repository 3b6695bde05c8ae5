// The timeline's keys, Perfetto's: W/S zoom, A/D pan, F fits the selection, M marks it (Shift+M
// keeps the mark), Q shows or hides the details panel, `.` and `,` move to the next and previous
// flag, Esc clears the selection. `?` lists them with every page's keys (keys.js).
import { pageKeys } from "./keys.js";

export const KEYS = [
  ["W / S", "zoom in / out (or the wheel)"], ["A / D", "pan left / right (or Shift+drag)"],
  ["drag", "select an area: its totals and flame graph"], ["click", "an event's details"],
  ["F", "fit the view to the selection (area or event)"], ["M", "mark the selection (M again: unmark)"],
  ["Shift+M", "keep the mark (several marks)"], ["Q", "show or hide the details panel"],
  ["click the ruler", "put a flag (click it again: remove); two flags show the time between"],
  [". / ,", "move to the next / previous flag"], ["Esc", "clear the selection and the mark"],
  ["/", "find an event by name or /regex/"],
];
export const KEY_HINT = "drag: select · Shift+drag: pan · wheel or W/A/S/D · F fit · M mark · click the ruler: flag · ? every key";

// `a` is the page's actions; each returns false when there was nothing to act on
export function wireKeys(a) {
  pageKeys("Timeline", KEYS, (e) => {
    switch (e.key) {
      case "w": case "W": a.zoom(0.7); return true;
      case "s": case "S": a.zoom(1 / 0.7); return true;
      case "a": case "A": a.pan(-0.2); return true;
      case "d": case "D": a.pan(0.2); return true;
      case "f": case "F": return a.fit() !== false;
      case "m": return a.mark(false) !== false;
      case "M": return a.mark(true) !== false;
      case "q": case "Q": a.toggleDetails(); return true;
      case ".": return a.flag(1) !== false;
      case ",": return a.flag(-1) !== false;
      case "Escape": a.clearSelection(); return true;
      case "/": a.findFocus(); return true;
      default: return false;
    }
  });
}
