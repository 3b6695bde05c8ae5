"""The base of every page model: a frozen dataclass computed from a Profile by one analysis
function, whose `to_dict()` is the document the web's JSON twin returns, the CLI's `--json`
prints and agents read (the CLI's text and the web's HTML render the same object)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

import pyarrow as pa

from ..model.profile import Profile


def is_modeled(profile: Profile) -> bool:
    """Device times of a neuron capture come from the cost model, not from a measurement
    (every page says so)."""
    return profile.manifest.source == "capture" or bool(profile.manifest.device_spec)


_SCALARS = frozenset((int, float, str, bool))


def plain(x: Any) -> Any:
    """`x` as JSON-ready data: a dataclass as a dict of its fields, an Arrow table as a list of
    row dicts, tuples as lists; a field's own `to_dict()` wins (it may add derived keys)."""
    if x is None or type(x) in _SCALARS:  # most values of a large page: no other test needed
        return x
    if isinstance(x, pa.Table):
        return x.to_pylist()
    if is_dataclass(x) and not isinstance(x, type):
        own = getattr(x, "to_dict", None)
        if own is not None and getattr(type(x), "to_dict", None) is not PageModel.to_dict:
            return own()
        return {f.name: plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def fetch_rows(con, sql: str, params: list[Any] | tuple = ()) -> tuple[dict[str, Any], ...]:
    """The rows of a query on a DuckDB connection, as dicts keyed by column name."""
    rel = con.execute(sql, list(params))
    names = [d[0] for d in rel.description]
    return tuple(dict(zip(names, r, strict=True)) for r in rel.fetchall())


class PageModel:
    """Mixin of the page models (subclasses are frozen dataclasses): `to_dict()` is `plain`."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
