"""A cost model of one AWS Trainium NeuronCore: hardware specs, op lowering, and a scheduler.

Pure Python: it never imports torch, so the device backend can call it per op at dispatch time.
Its times are a model built from public figures, not a measurement (docs/costmodel.md).
"""

from .lowering import assemble, fuse, lower_op
from .ops import CATEGORIES, base_name, classify
from .plan import DMA, ENGINES, Compute, Instr, KernelPlan, TensorInfo, dtype_bytes
from .spec import (
    ENV_VAR,
    SPECS,
    DeviceSpec,
    EngineSpec,
    ModelPolicy,
    RuntimeSpec,
    get_spec,
    set_default_spec,
)
from .timeline import DeviceTimeline, InstrRun, KernelRun

__all__ = [
    "CATEGORIES",
    "DMA",
    "ENGINES",
    "ENV_VAR",
    "SPECS",
    "Compute",
    "DeviceSpec",
    "DeviceTimeline",
    "EngineSpec",
    "Instr",
    "InstrRun",
    "KernelPlan",
    "KernelRun",
    "ModelPolicy",
    "RuntimeSpec",
    "TensorInfo",
    "assemble",
    "base_name",
    "classify",
    "dtype_bytes",
    "fuse",
    "get_spec",
    "lower_op",
    "set_default_spec",
]
