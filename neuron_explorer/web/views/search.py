"""Find on the timeline: neuron_explorer.analysis.search computes it; this adapter answers a
refused pattern as the web's 400 (a QueryError) and keeps the route's call."""

from __future__ import annotations

from typing import Any

from neuron_explorer.analysis import search as _search
from neuron_explorer.analysis.search import MAX_MATCHES, MAX_NAMES, MAX_QUERY_CHARS, SearchError
from neuron_explorer.analysis.search_stream import NameCounter, name_counts, search_bounded

from .sql import QueryError

__all__ = ["MAX_MATCHES", "MAX_NAMES", "MAX_QUERY_CHARS", "NameCounter", "name_counts",
           "search_events"]  # fmt: skip


def search_events(
    con: Any, q: str, regex: bool = False, limit: int = MAX_MATCHES, profile: Any = None,
    counts: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """analysis.search.search of `profile` (matching names on `con`), or without a profile
    analysis.search.search_sql over `con`'s events; with the profile's name `counts`
    (search_stream.name_counts) search_stream.search_bounded; as its document."""
    try:
        if counts is not None:
            return search_bounded(profile, counts, q, regex, limit, con).to_dict()
        if profile is None:
            return _search.search_sql(con, q, regex, limit).to_dict()
        return _search.search(profile, q, regex, limit, con).to_dict()
    except SearchError as e:
        raise QueryError(str(e)) from None
