"""Fleet scale: import one Kineto trace per rank as a Spark job into one rank-partitioned profile.

Each Spark task imports one rank's trace file into its part beside the profile (the same parts a
torch.distributed capture writes, model/combine.py); the driver then assembles the profile. The
parts and the profile must be on a file system every executor sees (local mode, or a shared
mount such as FSx or EFS). docs/fleet.md shows it with the cross-rank queries in Spark SQL.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import BadInputError
from .model import combine


def _import_part(item: tuple[int, str, str]) -> tuple[int, int | None, str]:
    """One Spark task: trace -> a part named by its rank; (file index, rank, part path)."""
    from .importers import DEFAULT_MEMORY_BUDGET, import_traces
    from .model import Profile

    index, trace, out = item
    tmp = combine.parts_dir(Path(out)) / f"file={index}"
    import_traces([trace], tmp, overwrite=True, memory_budget=DEFAULT_MEMORY_BUDGET)
    info = Profile.open(tmp).manifest.extra.get("kineto", [{}])[0].get("distributed", {})
    rank = info.get("rank")
    return index, rank if isinstance(rank, int) else None, str(tmp)


def import_with_spark(spark: Any, traces: Sequence[str | Path], out: str | Path) -> Path:
    """Import `traces` (one file per rank) with one Spark task each into the profile `out`.

    A trace's rank is its distributedInfo.rank, else its position in `traces`; two traces of
    one rank are refused, naming both.
    """
    out = Path(out)
    combine.parts_dir(out).mkdir(parents=True, exist_ok=True)
    items = [(i, str(Path(t).resolve()), str(out.resolve())) for i, t in enumerate(traces)]
    done = spark.sparkContext.parallelize(items, max(len(items), 1)).map(_import_part).collect()
    seen: dict[int, str] = {}
    for index, rank, part in sorted(done):
        rank = index if rank is None else rank
        if rank in seen:
            raise BadInputError(
                Path(items[index][1]), f"rank {rank} is also the rank of {seen[rank]}"
            )
        seen[rank] = items[index][1]
        dest = combine.part_path(out, rank)
        shutil.rmtree(dest, ignore_errors=True)  # a part left by an earlier run
        os.replace(part, dest)
    return combine.assemble(out, len(seen), run_id=f"spark:{spark.sparkContext.applicationId}")
