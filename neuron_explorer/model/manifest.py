"""manifest.json: what a profile is, where it came from, and how many rows each table has."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..vocab.device_spec import SpecFigures
from .bounds import int64
from .schema import FORMAT, SCHEMA_VERSION


@dataclass(frozen=True)
class Step:
    """One training step (ProfilerStep#N) on one rank."""

    step: int
    rank: int
    start_ns: int
    dur_ns: int


EMPTY_STEPS = '\n  "steps": [],\n'
STEP_JSON = (
    '    {\n      "dur_ns": %d,\n      "rank": %d,\n      "start_ns": %d,\n      "step": %d\n    }'
)


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
        """The manifest as indented JSON, keys sorted. The steps (one a step and rank: 64,000
        at 10 GB) are written by a template, the rest by json: the same text as json writes
        of the whole, a tenth of the time (asdict's copy and the pure-Python indented encoder
        took 7 us a step: 0.45 s at 10 GB)."""
        text = json.dumps(asdict(replace(self, steps=())), indent=2, sort_keys=True)
        if not self.steps:
            return text
        fields = [(s.dur_ns, s.rank, s.start_ns, s.step) for s in self.steps]
        if not all(type(v) is int for f in fields for v in f):
            return json.dumps(asdict(self), indent=2, sort_keys=True)  # a template writes ints
        # a top-level key is the only `"steps": []` after a newline and two spaces (a
        # newline in a string is written escaped); the keys sorted, one follows it
        steps = ",\n".join(STEP_JSON % f for f in fields)
        return text.replace(EMPTY_STEPS, f'\n  "steps": [\n{steps}\n  ],\n', 1)

    @property
    def spec(self) -> SpecFigures:
        """The device spec's figures, read by attribute (all None without a device spec); the
        manifest itself keeps the JSON form, `device_spec`."""
        return SpecFigures.from_dict(self.device_spec)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw["ranks"] = tuple(int64(r, "a rank") for r in _list(kw.get("ranks", (0,)), "ranks"))
        kw["devices"] = tuple(kw.get("devices", ()))
        kw["inputs"] = tuple(kw.get("inputs", ()))
        kw["steps"] = tuple(_step(s) for s in _list(kw.get("steps", ()), "steps"))
        int64(kw.get("origin_unix_ns", 0), "origin_unix_ns")
        counts = kw.get("row_counts", {})
        if not isinstance(counts, dict):
            raise ValueError("row_counts is not an object")
        for table, n in counts.items():
            if int64(n, f"row_counts.{table}") < 0:
                raise ValueError(f"row_counts.{table} is negative")
        return cls(**kw)


def _list(value: Any, what: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} is not a list")
    return value


def _step(d: Any) -> Step:
    """A step of the manifest, its numbers checked: a step of `Infinity` or 1e30 ns would
    fail much later, in whatever adds it to a time."""
    if not isinstance(d, dict):
        raise ValueError("a step is not an object")
    step = Step(**d)
    for f in ("step", "rank", "start_ns", "dur_ns"):
        int64(getattr(step, f), f"step {d.get('step')!r:.20}: {f}")
    return step
