"""Two ranks of one multi-rank profile side by side: analysis.rank_compare.rank_pair (steps,
ops, kernels, lines, modules and findings of each rank, and each collective's wait and transfer
on both), and the page that draws the two ranks' timelines on the job's one clock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query

from neuron_explorer.analysis.job import job_ending
from neuron_explorer.analysis.page import is_modeled
from neuron_explorer.analysis.rank_compare import default_pair, rank_pair, rank_times

from ..pages import Api, Page, Shell
from ..store import NotFound
from ..views.source import with_file_ids

if TYPE_CHECKING:
    from ..service import Service


def api_ranks(
    svc: Service, name: str, a: int | None = Query(None, ge=0), b: int | None = Query(None, ge=0)
) -> dict[str, Any]:
    """Rank `b` against rank `a` as `pair`, which is null for a profile of one rank; without
    them, the rank that waited longest against the one it waited for (rank_compare.default_pair);
    404 for a rank the profile does not hold. `job_ending` (analysis.job, with its `lines`)
    names the rank that failed first and the ranks that wrote nothing; null for a clean run.
    `every_rank` is rank_times's: each rank's busy and wait time over its steps, with the wait's
    definition; null for a profile of one rank."""
    p = svc.store.open(name)
    ranks = list(p.manifest.ranks)
    # the page's badge, shown for a neuron profile of one rank too (which has no pair)
    ending = job_ending(p.manifest)  # a rank that failed first, or wrote nothing, is named
    head = {"name": name, "ranks": ranks, "device_time_modeled": is_modeled(p),
            "job_ending": None if ending is None else {**ending.to_dict(), "lines": ending.lines()}}  # fmt: skip
    if len(ranks) < 2:
        return {**head, "every_rank": None, "pair": None}
    head["every_rank"] = svc.persisted(name, "rank_times", lambda p: rank_times(p).to_dict())
    if a is None or b is None:
        first, second = svc.persisted(name, "rank_default_pair", lambda p: list(default_pair(p)))
        a = first if a is None else a
        b = next(r for r in (second, first, *ranks) if r != a) if b is None else b
    for r in (a, b):
        if r not in ranks:
            raise NotFound(f"{name} has no rank {r} (ranks {ranks})")
    pair = svc.persisted(name, f"rank_pair_{a}_{b}",
                         lambda p: with_file_ids(rank_pair(p, a, b).to_dict()))  # fmt: skip
    return {**head, "pair": pair}


PAGES = (
    Page("ranks", "/p/{name}/ranks", api_ranks, Shell("Ranks", "ranks.js", plotly=False, tab="Ranks")),
)  # fmt: skip
API: tuple[Api, ...] = ()
