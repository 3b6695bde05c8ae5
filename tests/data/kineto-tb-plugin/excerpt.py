"""Cut whole ProfilerStep windows out of a TensorBoard-plugin sample trace (see README.md):
python excerpt.py SAMPLE OUT FIRST_STEP LAST_STEP."""

import gzip
import json
import sys

src, out, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with gzip.open(src, "rb") as f:
    doc = json.load(f)
events = doc if isinstance(doc, list) else doc["traceEvents"]
steps = {e["name"]: e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
lo = steps[f"ProfilerStep#{first}"]["ts"]
hi = steps[f"ProfilerStep#{last}"]["ts"] + steps[f"ProfilerStep#{last}"]["dur"]
kept = [e for e in events if e.get("ph") == "M" or lo <= e.get("ts", lo - 1) < hi]
body = ",\n".join(json.dumps(e) for e in kept)
if isinstance(doc, list):  # the top-level array form, as the sample is written
    text = "[\n" + body + "\n]\n"
else:
    top = {k: v for k, v in doc.items() if k != "traceEvents"}
    text = json.dumps(top)[:-1] + ', "traceEvents": [\n' + body + "\n]}\n"
with gzip.open(out, "wt") as f:
    f.write(text)
print(out, len(kept), "events")
