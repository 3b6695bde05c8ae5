"""Every built-in rule, in the order they run: the explicit `RULES` tuple. Adding a rule is one
new module here plus one line in RULES."""

from __future__ import annotations

from ...errors import ExplorerError
from ..rule import Rule
from .collective_outliers import CollectiveOutliers
from .collective_share import CollectiveShare
from .compile_dominated import CompileDominated
from .cpu_fallback import CpuFallback
from .cuda_sync import CudaSync
from .dataloader_stall import DataloaderStall
from .device_idle_gaps import DeviceIdleGaps
from .float64_downcast import Float64Downcast
from .fp32_matmul import Fp32Matmul
from .hbm_capacity import HbmCapacity
from .host_device_copies import HostDeviceCopies
from .host_sync import HostSync
from .launch_bound import LaunchBound
from .memory_bound_op import MemoryBoundOp
from .pipeline_bubbles import PipelineBubbles
from .recompilation import Recompilation
from .small_dma import SmallDma
from .step_time_outliers import StepTimeOutliers
from .straggler import Straggler
from .tensor_engine_padding import TensorEnginePadding
from .unfused_optimizer import UnfusedOptimizer

RULES: tuple[Rule, ...] = (
    CollectiveOutliers(),
    CollectiveShare(),
    CompileDominated(),
    CpuFallback(),
    CudaSync(),
    DataloaderStall(),
    DeviceIdleGaps(),
    Float64Downcast(),
    Fp32Matmul(),
    HbmCapacity(),
    HostDeviceCopies(),
    HostSync(),
    LaunchBound(),
    MemoryBoundOp(),
    PipelineBubbles(),
    Recompilation(),
    SmallDma(),
    StepTimeOutliers(),
    Straggler(),
    TensorEnginePadding(),
    UnfusedOptimizer(),
)
_BY_ID = {r.id: r for r in RULES}
if len(_BY_ID) != len(RULES):
    raise ValueError("two rules share an id")


def all_rules() -> dict[str, Rule]:
    """The rules by id, in RULES order."""
    return dict(_BY_ID)


def get_rule(rule_id: str) -> Rule:
    if rule_id not in _BY_ID:
        raise ExplorerError(f"unknown rule {rule_id!r}; known rules: {', '.join(sorted(_BY_ID))}")
    return _BY_ID[rule_id]
