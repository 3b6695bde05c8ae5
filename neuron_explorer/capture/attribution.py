"""Where each runtime event of a capture belongs: its user line, its whole stack, its module and
its model line, with backward work inheriting all four from the forward op it differentiates.

The runtime hands each event its interned stack (frames innermost first, each with its scope:
user, library, torch or stdlib; docs/format.md). Here each distinct stack gets a stack_id of
the profile (after the host trace's own stacks) and its model frame: the innermost frame that
is user or library code, i.e. outside torch and the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..model.schema import STACKS, conform
from ..vocab.frames import is_own_file

MODEL_SCOPES = frozenset({"user", "library"})


@dataclass(frozen=True)
class Attribution:
    """The source columns of one event, in the events schema's terms."""

    src: tuple[str, int, str] | None  # innermost user frame
    stack_id: int | None
    module: str | None
    model: tuple[str, int, str] | None  # innermost frame outside torch and the stdlib


NOWHERE = Attribution(None, None, None, None)


class Attributor:
    """Attributions for a capture's runtime events, and the stacks table rows they name."""

    def __init__(self, runtime: Sequence[Any], first_stack_id: int) -> None:
        self._first = first_stack_id
        self._ids: dict[int, int] = {}  # id(stack tuple) -> stack_id
        self._stacks: list[tuple] = []
        self._model: dict[int, tuple | None] = {}
        self.forward: dict[int, Attribution] = {}
        self._memo: dict[tuple, Attribution] = {}
        for e in runtime:
            if e.seq_nr >= 0 and not e.is_backward and (e.stack or e.src_file):
                if e.seq_nr not in self.forward:
                    self.forward[e.seq_nr] = self._own(e)

    def _stack_id(self, stack: tuple) -> int | None:
        if not stack:
            return None
        sid = self._ids.get(id(stack))
        if sid is None:
            sid = self._ids[id(stack)] = self._first + len(self._stacks)
            self._stacks.append(stack)
            self._model[id(stack)] = next(
                ((f, n, fn) for f, n, fn, scope in stack if scope in MODEL_SCOPES), None
            )
        return sid

    def _own(self, e: Any) -> Attribution:
        # a few hundred distinct call sites recur over thousands of events: build each once
        key = (id(e.stack), e.module, e.src_file, e.src_line, e.src_func)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._build(e)
        return found

    def _build(self, e: Any) -> Attribution:
        src = None
        if e.src_file and e.src_line and not is_own_file(e.src_file):
            src = (e.src_file, e.src_line, e.src_func or "")
        sid = self._stack_id(e.stack)
        model = self._model.get(id(e.stack)) if e.stack else None
        return Attribution(src, sid, e.module, model)

    def of(self, e: Any) -> Attribution:
        """Backward work takes its forward op's attribution (by autograd sequence number),
        except compiled kernels, whose FX node already names the forward code."""
        fwd = self.forward.get(e.seq_nr) if e.seq_nr >= 0 else None
        if fwd is not None and e.is_backward and not (e.args and "fx_nodes" in e.args):
            return fwd
        own = self._own(e)
        if own.src is None and fwd is not None:
            return fwd if own.stack_id is None else Attribution(fwd.src, own.stack_id,
                                                                own.module or fwd.module,
                                                                own.model or fwd.model)  # fmt: skip
        return own

    def table(self) -> pa.Table:
        """The stacks table rows of every stack handed out (one row per frame)."""
        cols: dict[str, list] = {c: [] for c in ("stack_id", "depth", "file", "line", "function",
                                                 "scope")}  # fmt: skip
        for i, stack in enumerate(self._stacks):
            for depth, (file, line, func, scope) in enumerate(stack):
                cols["stack_id"].append(self._first + i)
                cols["depth"].append(depth)
                cols["file"].append(file)
                cols["line"].append(line)
                cols["function"].append(func)
                cols["scope"].append(scope)
        return conform(STACKS, cols)
