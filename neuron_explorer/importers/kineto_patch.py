"""The events table's args column: the decoded args texts (in memory, or spilled to disk by
the streaming import) with the few rows that need more patched in, made a row group at a time
so the column is never copied whole."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .kineto_spill import SpilledText


@dataclass(frozen=True)
class PatchedText:
    """A text column given as base values with some rows replaced, materialised by `take` (a
    block at a time as assemble writes the rows in order), so it is never copied whole."""

    base: pa.Array | SpilledText  # SpilledText: the streaming import's, on disk
    patched: np.ndarray  # the rows replaced, sorted (not an index a row: a few rows have one)
    texts: pa.Array  # their texts, in that order

    def take(self, rows: np.ndarray) -> pa.Array:
        block = self.base.take(rows)
        if not self.patched.size:
            return block
        at = np.minimum(np.searchsorted(self.patched, rows), self.patched.size - 1)
        hit = self.patched[at] == rows
        if hit.any():
            block = pc.replace_with_mask(block, hit, self.texts.take(at[hit]))
        return block


def args_column(
    base: pa.Array | SpilledText, other: dict[int, tuple[str, str]], extra: dict[int, str]
) -> PatchedText:
    """The rows' args as JSON text (`base`, in memory or spilled); rows of unknown
    categories (`other`) also keep their cat and ph, and rows whose fwdbwd flow could not take
    flow_id (`extra`) keep the Kineto flow id."""
    patch = sorted(set(other) | set(extra))
    at = base.text if isinstance(base, SpilledText) else (lambda i: base[i].as_py())
    texts = [_patched_args(at(i), other.get(i), extra.get(i)) for i in patch]
    return PatchedText(base, np.array(patch, dtype=np.int64), pa.array(texts, base.type))


def _patched_args(raw: str | None, tag: tuple[str, str] | None, flow: str | None) -> str:
    a = msgspec.json.decode(raw) if raw else {}
    a = a if isinstance(a, dict) else {"args": a}
    if tag is not None:
        a = {"cat": tag[0], "ph": tag[1], **a}
    if flow is not None:
        a["fwdbwd_flow"] = flow
    return msgspec.json.encode(a).decode()
