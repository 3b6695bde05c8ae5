"""Reading a pickle that may be hostile: only the builtin containers and scalars a memory
snapshot holds (dict, list, tuple, str, bytes, int, float, bool, None) come out of it.

Those need no class lookup, so every global a pickle names (`os.system` in a REDUCE, any
class to build) is refused, and so is a persistent id: unpickling never imports or calls
anything. Anything else wrong with the file is one line naming it (errors.BadInputError).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from ..errors import BadInputError

MAX_BYTES = 4 << 30  # a snapshot of millions of entries is a few GB; more is not one


class _Refused(Exception):
    pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"it names {module}.{name}, which a memory snapshot never holds")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds a persistent id, which a memory snapshot never holds")


def load(path: str | Path, what: str = "a memory snapshot") -> Any:
    """The object pickled in `path`, built of builtin containers and scalars only."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise BadInputError(path, f"{size} bytes is too large for {what}")
        data = path.read_bytes()
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise BadInputError(path, f"refused: not {what}: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, OverflowError, MemoryError, RecursionError, UnicodeError) as exc:  # fmt: skip
        raise BadInputError(path, f"not {what} (a broken pickle: {exc})") from None
