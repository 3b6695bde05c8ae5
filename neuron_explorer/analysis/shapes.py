"""Reading tensor shapes recorded as text (JSON lists, or Python tuple reprs from the neuron
compiler's signatures) and the matmul dimensions they imply. Applied to distinct shape
signatures (a handful of rows), never per event."""

from __future__ import annotations

import json
import re
from math import prod

# aten matmul-like ops and how their inputs map to (M, K) x (K, N)
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")
MATMUL_OP_SQL = (
    "regexp_matches(coalesce(op_name, ''), '(^|[.:_])(mm|addmm|bmm|baddbmm|matmul|linear)([.]|$)')"
)
_INNER = re.compile(r"[\[(]\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*[\])]")


def parse_shapes(text: str | None) -> list[list[int]]:
    """Every innermost list of integers in `text`, e.g. "[[8, 16], [16]]" -> [[8, 16], [16]];
    "(((8, 130), torch.float32),)" -> [[8, 130]]."""
    if not text:
        return []
    try:
        v = json.loads(text)
        if isinstance(v, list) and all(
            isinstance(s, list) and all(isinstance(d, int) for d in s) for s in v
        ):
            return v
    except (TypeError, ValueError):
        pass
    out = []
    for m in _INNER.finditer(text):
        body = m.group(1)
        out.append([int(x) for x in body.split(",")] if body else [])
    return out


def _base(op: str) -> str:
    name = op.split("::")[-1]
    parts = [p for p in name.split(".") if p and p not in ("aten", "default", "Tensor", "out")]
    return parts[-1] if parts else name


def matmul_dims(op: str | None, shapes: str | None) -> tuple[int, int, int] | None:
    """(M, K, N) of a matmul-like op from its input shapes, or None when they do not fit."""
    if not op:
        return None
    kind = _base(op)
    s = [x for x in parse_shapes(shapes) if x]
    try:
        if kind in ("addmm", "baddbmm") and len(s) >= 3:
            s = s[1:]  # the bias comes first
        if kind == "linear" and len(s) >= 2:
            x, w = s[0], s[1]
            return prod(x[:-1]) or 1, x[-1], w[0]
        if kind in ("mm", "addmm", "bmm", "baddbmm", "matmul") and len(s) >= 2:
            a, b = s[0], s[1]
            batch = prod(a[:-2]) if len(a) > 2 else 1
            m = (a[-2] if len(a) >= 2 else 1) * batch
            return m, a[-1], b[-1] if len(b) >= 2 else 1
    except (IndexError, TypeError):
        return None
    return None
