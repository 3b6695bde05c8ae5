"""Responses an agent can read: every tool's answer is cut to at most MAX_CHARS of JSON, by
clipping strings over MAX_STRING, then halving its longest lists (a columnar dict of equal-length lists is cut row-wise, so its
columns stay aligned) and saying what was cut, so no answer floods the agent's context."""

from __future__ import annotations

import json
from typing import Any

MAX_CHARS = 80_000  # about 20k tokens: a large answer, still a small share of a context window
MAX_STRING = 4_000  # one string (a finding's detail, an SQL value, a line of code) at most
_ROUNDS = 64


def size(doc: Any) -> int:
    return len(json.dumps(doc, separators=(",", ":"), default=str))


def bound(doc: dict[str, Any], max_chars: int = MAX_CHARS) -> dict[str, Any]:
    """`doc` within `max_chars`; when cut, `doc["truncated"]` maps each cut list's path to its
    length before and after, and says how to ask for less."""
    if size(doc) <= max_chars:
        return doc  # untouched: the same document the web and the CLI give
    doc = _clip_strings(doc)
    cuts: dict[str, list[int]] = {}
    for _ in range(_ROUNDS):
        if size(doc) <= max_chars:
            break
        found = _longest(doc, "")
        if found is None:
            break
        path, holder, key, n = found
        keep = n // 2
        if isinstance(holder[key], dict):  # columnar: every column cut to the same rows
            for col in holder[key]:
                holder[key][col] = holder[key][col][:keep]
        else:
            holder[key] = holder[key][:keep]
        cuts.setdefault(path, [n, keep])[1] = keep
    if cuts:
        doc["truncated"] = {
            "max_chars": max_chars,
            "lists": {p: {"rows": n, "kept": k} for p, (n, k) in cuts.items()},
            "hint": "ask for less: a narrower time window, a smaller limit or n, or a SQL query",
        }
    if size(doc) > max_chars:
        raise ValueError(f"the answer is over {max_chars} characters even when cut; ask for less")
    return doc


def _clip_strings(v: Any) -> Any:
    if isinstance(v, str):
        return (
            v
            if len(v) <= MAX_STRING
            else v[:MAX_STRING] + f"... [{len(v) - MAX_STRING} more characters]"
        )
    if isinstance(v, dict):
        return {k: _clip_strings(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clip_strings(x) for x in v]
    return v


def _rows(v: Any) -> int | None:
    """How many rows a list or a columnar dict (values all lists of one length) holds."""
    if isinstance(v, list):
        return len(v)
    if isinstance(v, dict) and len(v) >= 2 and all(isinstance(x, list) for x in v.values()):
        lengths = {len(x) for x in v.values()}
        return lengths.pop() if len(lengths) == 1 else None
    return None


def _longest(v: Any, path: str) -> tuple[str, Any, Any, int] | None:
    """(path, holder, key, rows) of the list (or columnar dict) with the most JSON, if any has
    more than one row."""
    best: tuple[int, tuple[str, Any, Any, int]] | None = None
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for key, child in items:
        child_path = f"{path}.{key}" if path else str(key)
        n = _rows(child)
        if n is not None and n > 1:
            s = size(child)
            if best is None or s > best[0]:
                best = (s, (child_path, v, key, n))
        if isinstance(child, (dict, list)) and not (isinstance(child, dict) and n is not None):
            inner = _longest(child, child_path)
            if inner is not None:
                s = size(inner[1][inner[2]])
                if best is None or s > best[0]:
                    best = (s, inner)
    return best[1] if best else None
