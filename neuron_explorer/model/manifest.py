"""manifest.json: what a profile is, where it came from, and how many rows each table has."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..vocab.device_spec import SpecFigures
from .schema import FORMAT, SCHEMA_VERSION


@dataclass(frozen=True)
class Step:
    """One training step (ProfilerStep#N) on one rank."""

    step: int
    rank: int
    start_ns: int
    dur_ns: int


@dataclass(frozen=True)
class Manifest:
    source: str  # "capture" | "kineto"
    origin_unix_ns: int
    ranks: tuple[int, ...] = (0,)
    producer: str = ""
    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION
    device_spec: dict[str, Any] | None = None  # the modeled chip's DeviceSpec, for captures
    devices: tuple[dict[str, Any], ...] = ()  # deviceProperties of a Kineto trace
    torch_version: str = ""
    host: str = ""
    steps: tuple[Step, ...] = ()
    row_counts: dict[str, int] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()  # the files the profile was made from
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @property
    def spec(self) -> SpecFigures:
        """The device spec's figures, read by attribute (all None without a device spec); the
        manifest itself keeps the JSON form, `device_spec`."""
        return SpecFigures.from_dict(self.device_spec)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw["ranks"] = tuple(kw.get("ranks", (0,)))
        kw["devices"] = tuple(kw.get("devices", ()))
        kw["inputs"] = tuple(kw.get("inputs", ()))
        kw["steps"] = tuple(Step(**s) for s in kw.get("steps", ()))
        return cls(**kw)
