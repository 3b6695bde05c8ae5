"""The events' source-line and module columns from the python stacks (pystacks): dictionary
columns over the distinct frames, codes a row rather than a text a row (the texts would be the
mapping's largest columns), and which frames the rows name (the sources to keep)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from . import pystacks


def dict_take(dictionary: pa.Array, codes: np.ndarray) -> pa.DictionaryArray:
    """A dictionary column: `codes` (-1: null) into `dictionary`."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), dictionary)


def stack_columns(stacks: pystacks.Stacks) -> dict[str, Any]:
    """The frame columns as dictionaries over the distinct frames (codes, not a text per row:
    the rows' texts would be the mapping's largest columns)."""
    frames, user_frame, model = stacks.frames, stacks.user_frame, stacks.model_frame
    uf = pa.array(user_frame, mask=user_frame < 0)
    mf = pa.array(model, mask=model < 0)
    files = _by_frame([f.file for f in frames])
    lines = pa.array([f.line for f in frames], pa.int32())
    funcs = _by_frame([f.func for f in frames])
    modules = dict_take(pa.array(stacks.modules, pa.string()), stacks.module)
    return {
        "stack_id": stacks.stack_id,
        "src_file": files(user_frame), "src_line": lines.take(uf), "src_func": funcs(user_frame),
        "model_file": files(model), "model_line": lines.take(mf), "model_func": funcs(model),
        "module": modules,
    }  # fmt: skip


def frames_used(n: int, *per_row: np.ndarray) -> np.ndarray:
    """The frames some row names (user and model files: the sources to keep), marked in place
    rather than the rows' frames joined and sorted (two copies of a column per row)."""
    seen = np.zeros(n + 1, dtype=bool)  # the last slot takes -1, no frame
    for frames in per_row:
        seen[frames] = True
    return np.flatnonzero(seen[:n])


def _by_frame(texts: list[str]) -> Callable[[np.ndarray], pa.DictionaryArray]:
    """Rows' frame indices (-1: none) -> a dictionary column of the frames' `texts`."""
    encoded = pa.array(texts, pa.string()).dictionary_encode()
    code = np.append(encoded.indices.to_numpy(zero_copy_only=False), -1)
    return lambda frame: dict_take(encoded.dictionary, code[frame])
