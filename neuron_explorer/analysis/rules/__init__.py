"""Every built-in rule. Adding a rule is one new module here plus one import line below."""

from . import (  # noqa: F401 - each module registers its rule
    collective_outliers,
    collective_share,
    compile_dominated,
    cpu_fallback,
    cuda_sync,
    dataloader_stall,
    device_idle_gaps,
    float64_downcast,
    fp32_matmul,
    host_device_copies,
    host_sync,
    launch_bound,
    memory_bound_op,
    recompilation,
    small_dma,
    step_time_outliers,
    straggler,
    tensor_engine_padding,
    unfused_optimizer,
)
