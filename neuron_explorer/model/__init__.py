"""The profile model: schema, manifest, reading and writing. The base of `explorer`."""

from .io import ProfileWriter
from .manifest import Manifest, Step
from .profile import Profile, is_profile
from .schema import COUNTERS, EVENTS, FORMAT, SCHEMA_VERSION, STACKS, TABLES

__all__ = [
    "COUNTERS", "EVENTS", "FORMAT", "SCHEMA_VERSION", "STACKS", "TABLES",
    "Manifest", "Profile", "ProfileWriter", "Step", "is_profile",
]  # fmt: skip
