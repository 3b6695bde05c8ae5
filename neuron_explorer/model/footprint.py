"""What analysing a profile holds in memory, estimated from its Parquet footers before anything
reads its tables: the one estimate by which the import decides to cut an excerpt and how large,
and the server admits a profile's tables under its ceiling (web/memory.py). Sharing it means an
excerpt cut for a `--memory-budget` is one a server of that `--max-memory` can analyse again (its
stored analysis gone stale after an upgrade), not a 503.
"""

from __future__ import annotations

from .profile import Profile

# a profile's tables once read, a row of events: every page of a 400,000-event profile, visited,
# holds 280 MB (700 B an event); the import's analysis of an excerpt 640 B (benchmarks/README.md,
# "Excerpt"); plus what the footers say the columns hold uncompressed (~128 B an event on the
# big benchmark traces)
EVENT_BYTES = 768
# what the process holds beside the tables: interpreter, libraries, page models, what the import
# leaves in its process (a server holds 120-350 MB before it reads a large profile)
BASE_BYTES = 512 << 20


def tables_bytes(profile: Profile) -> int:
    """Bytes the profile's tables hold once read: its events at EVENT_BYTES each, plus the
    columns' uncompressed bytes from the footers."""
    return profile.footer_rows.get("events", 0) * EVENT_BYTES + profile.footer_bytes


def analysis_bytes(profile: Profile) -> int:
    """Bytes a process analysing `profile` whole needs: its tables and BASE_BYTES."""
    return BASE_BYTES + tables_bytes(profile)


def events_within(limit: int, profile: Profile) -> int:
    """How many of `profile`'s events an analysis within `limit` bytes may hold (at least one):
    an excerpt's columns take what the whole's take an event."""
    events = profile.footer_rows.get("events", 0)
    per_event = EVENT_BYTES + (profile.footer_bytes / events if events else 0)
    return max(1, int((limit - BASE_BYTES) // per_event))
