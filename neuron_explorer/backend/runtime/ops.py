"""The ops that run on the neuron device: one table, by category and engine (docs/device.md).

Anything not listed runs as a CPU fallback (copies out, CPU compute, copies back) with a
one-time warning. Views and metadata ops need no kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Category:
    """A family of supported ops and the engine their kernels mostly use."""

    name: str
    engine: str
    ops: tuple[str, ...]


CATEGORIES: tuple[Category, ...] = (
    Category("matmul", "TensorE", (
        "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
        "aten::convolution", "aten::convolution_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::_grouped_mm",
    )),
    Category("elementwise", "VectorE", (
        "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_",
        "aten::div", "aten::div_", "aten::neg", "aten::abs", "aten::clamp", "aten::clamp_",
        "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max", "aten::maximum",
        "aten::minimum", "aten::where", "aten::relu", "aten::relu_", "aten::threshold_backward",
        "aten::addcmul", "aten::addcmul_", "aten::addcdiv", "aten::addcdiv_", "aten::lerp",
        "aten::lerp_", "aten::masked_fill", "aten::masked_fill_", "aten::eq", "aten::ne",
        "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::logical_not", "aten::logical_and",
        "aten::logical_or", "aten::bitwise_not", "aten::sign", "aten::fill_", "aten::zero_",
        "aten::copy_", "aten::clone", "aten::_to_copy", "aten::ones_like", "aten::zeros_like",
        "aten::full_like", "aten::empty_like", "aten::pow", "aten::pow_", "aten::reciprocal",
        "aten::square", "aten::floor", "aten::ceil", "aten::round", "aten::trunc",
        "aten::isnan", "aten::isinf", "aten::nan_to_num", "aten::hardtanh", "aten::rsub",
        "aten::bitwise_and", "aten::bitwise_or", "aten::remainder", "aten::fmod",
        "aten::floor_divide", "aten::isin", "aten::new_zeros", "aten::new_ones", "aten::new_full",
        "aten::new_empty", "aten::new_empty_strided",
        "aten::hardtanh_backward", "aten::leaky_relu", "aten::leaky_relu_backward",
        "aten::_foreach_add", "aten::_foreach_add_", "aten::_foreach_sub", "aten::_foreach_sub_",
        "aten::_foreach_mul", "aten::_foreach_mul_", "aten::_foreach_div", "aten::_foreach_div_",
        "aten::_foreach_addcmul_", "aten::_foreach_addcdiv_", "aten::_foreach_lerp_",
        "aten::_foreach_neg", "aten::_foreach_maximum_", "aten::_foreach_reciprocal_",
        "aten::_foreach_pow", "aten::_foreach_copy_", "aten::_foreach_zero_",
        "aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_sgd_",
    )),
    Category("transcendental", "ScalarE", (
        "aten::exp", "aten::exp_", "aten::log", "aten::log_", "aten::sqrt", "aten::sqrt_",
        "aten::rsqrt", "aten::tanh", "aten::tanh_backward", "aten::sigmoid",
        "aten::sigmoid_backward", "aten::gelu", "aten::gelu_backward", "aten::silu",
        "aten::silu_backward", "aten::erf", "aten::sin", "aten::cos", "aten::log1p",
        "aten::expm1", "aten::softplus", "aten::_foreach_sqrt", "aten::_foreach_sqrt_",
        "aten::_softmax", "aten::_softmax_backward_data", "aten::_log_softmax",
        "aten::_log_softmax_backward_data", "aten::_safe_softmax", "aten::logsumexp",
        "aten::elu", "aten::elu_backward", "aten::hardswish", "aten::mish", "aten::mish_backward",
        "aten::glu", "aten::log_sigmoid_forward", "aten::log_sigmoid_backward",
        "aten::softplus_backward", "aten::atan2", "aten::_foreach_exp",
    )),
    Category("reduction", "VectorE", (
        "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min",
        "aten::argmax", "aten::argmin", "aten::var", "aten::var_mean", "aten::std",
        "aten::prod", "aten::norm", "aten::linalg_vector_norm", "aten::_foreach_norm",
        "aten::native_layer_norm", "aten::native_layer_norm_backward",
        "aten::native_batch_norm", "aten::native_batch_norm_backward",
        "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional",
        "aten::_native_batch_norm_legit_no_training", "aten::nll_loss_forward",
        "aten::nll_loss_backward", "aten::mse_loss", "aten::mse_loss_backward", "aten::all",
        "aten::any", "aten::cumsum", "aten::cumprod", "aten::nll_loss2d_forward",
        "aten::nll_loss2d_backward", "aten::binary_cross_entropy_with_logits", "aten::max_pool2d_with_indices",
        "aten::max_pool2d_with_indices_backward", "aten::avg_pool2d",
        "aten::avg_pool2d_backward", "aten::_adaptive_avg_pool2d",
        "aten::_adaptive_avg_pool2d_backward", "aten::histc", "aten::native_group_norm",
        "aten::native_group_norm_backward", "aten::_weight_norm_interface",
        "aten::_weight_norm_interface_backward", "aten::_ctc_loss", "aten::_ctc_loss_backward",
    )),
    Category("gather/scatter", "GpSimdE", (
        "aten::index", "aten::index_select", "aten::gather", "aten::scatter",
        "aten::scatter_add", "aten::scatter_add_", "aten::index_put", "aten::index_put_",
        "aten::_index_put_impl_", "aten::embedding", "aten::embedding_dense_backward",
        "aten::index_add", "aten::index_add_", "aten::index_copy", "aten::index_copy_",
        "aten::cat", "aten::stack", "aten::arange",
        "aten::tril", "aten::triu", "aten::one_hot", "aten::constant_pad_nd",
        "aten::select_backward", "aten::slice_backward", "aten::_unsafe_index",
        "aten::repeat", "aten::flip", "aten::roll", "aten::sort", "aten::topk",
        "aten::native_channel_shuffle", "aten::scatter_", "aten::masked_scatter",
        "aten::masked_scatter_", "aten::eye",
        "aten::upsample_nearest2d", "aten::upsample_nearest2d_backward",
        # FSDP2's copies into and out of its collectives' flat buffers (torch.distributed.fsdp)
        "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat",
    )),
    Category("random", "GpSimdE", (
        "aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::native_dropout",
        "aten::native_dropout_backward", "aten::random_", "aten::randperm",
    )),
    Category("factory", "DMA", (
        "aten::empty", "aten::empty_strided", "aten::zeros", "aten::ones", "aten::full",
        "aten::scalar_tensor", "aten::lift_fresh", "aten::lift_fresh_copy",
    )),
)  # fmt: skip

ENGINE_OF: dict[str, str] = {op: c.engine for c in CATEGORIES for op in c.ops}
CATEGORY_OF: dict[str, str] = {op: c.name for c in CATEGORIES for op in c.ops}

# Ops that only change metadata: no kernel, no compile, never a fallback.
NO_KERNEL = frozenset({
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::empty", "aten::empty_strided",
    "aten::_local_scalar_dense", "aten::set_", "aten::resize_", "aten::_unsafe_view",
    "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::is_pinned",
    "aten::_pin_memory", "aten::record_stream", "aten::_reshape_alias", "aten::t_",
    "aten::transpose_", "aten::squeeze_", "aten::unsqueeze_", "aten::as_strided_",
    "aten::swapdims_", "aten::swapaxes_", "aten::resize_as_", "aten::detach_",
})  # fmt: skip


def supported_ops() -> list[str]:
    """Every op the device runs (sorted); views run too and need no kernel."""
    return sorted(ENGINE_OF)


def is_supported(func: torch._ops.OpOverload) -> bool:
    return func._schema.name in ENGINE_OF or func.is_view or func._schema.name in NO_KERNEL
