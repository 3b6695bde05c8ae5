"""Which engine work an op name stands for: categories by name, GEMM shapes by op signature."""

from __future__ import annotations

from functools import lru_cache
from math import prod

from .plan import TensorInfo

VIEW = "view"  # no device work
COPY = "copy"  # DMA only
MATMUL = "matmul"  # TensorE
ELEMENTWISE = "elementwise"  # VectorE
TRANSCENDENTAL = "transcendental"  # ScalarE
GATHER = "gather"  # GpSimdE
REDUCTION = "reduction"  # VectorE
NORM = "norm"  # VectorE statistics + ScalarE normalise
SOFTMAX = "softmax"  # VectorE max/sum + ScalarE exp
FILL = "fill"  # writes without reading: VectorE memset / GpSimd iota and RNG
CUSTOM = "custom"  # a kernel the user declared (costmodel/custom.py): its own, never fused
COLLECTIVE = "collective"  # a compiled graph's collective, on the collective cores (graph.py)
CATEGORIES = (
    CUSTOM,
    COLLECTIVE,
    VIEW,
    COPY,
    MATMUL,
    ELEMENTWISE,
    TRANSCENDENTAL,
    GATHER,
    REDUCTION,
    NORM,
    SOFTMAX,
    FILL,
)

_VIEWS = frozenset(
    "view _unsafe_view reshape _reshape_alias as_strided t transpose expand expand_as permute "
    "squeeze unsqueeze slice select alias detach unflatten flatten narrow view_as split "
    "split_with_sizes chunk unbind diagonal lift_fresh empty empty_like empty_strided "
    "new_empty new_empty_strided resize set numpy_t mt mh movedim moveaxis unfold "
    "_neg_view _conj real imag view_as_real view_as_complex swapaxes swapdims "
    "tensor_split hsplit vsplit unsafe_split unsafe_chunk indices values "
    "lift lift_fresh_copy _local_scalar_dense output_nr is_same_size wait_tensor".split()
)
_COPIES = frozenset(
    "copy _copy_from _copy_from_and_resize clone cat concat concatenate stack hstack vstack "
    "contiguous repeat tile flip roll constant_pad_nd pad reflection_pad1d reflection_pad2d "
    "replication_pad1d replication_pad2d _to_copy to rot90 narrow_copy slice_scatter "
    "select_scatter as_strided_scatter diagonal_scatter expand_copy permute_copy t_copy "
    "transpose_copy view_copy unsqueeze_copy squeeze_copy split_copy alias_copy "
    "slice_copy select_copy detach_copy".split()
)
_MATMUL_PREFIXES = ("mm", "bmm", "addmm", "matmul", "linear", "conv", "_conv", "cudnn_conv",
                    "mkldnn_conv", "baddbmm", "addbmm", "_scaled_dot_product", "scaled_dot_product",
                    "einsum", "tensordot", "addmv", "mv", "dot", "vdot", "outer", "ger", "addr",
                    "_addmm_activation", "slow_conv", "thnn_conv", "bilinear", "_efficient_attention",
                    "_flash_attention", "kron", "_grouped_mm")  # fmt: skip
_GATHER_WORDS = ("gather", "scatter", "index", "embedding", "masked", "take", "put", "nonzero",
                 "nll_loss", "sort", "topk", "unique", "bincount", "one_hot", "searchsorted",
                 "bucketize", "histc", "kthvalue", "median", "mode", "multinomial", "grid_sampler",
                 "upsample", "max_pool", "max_unpool", "adaptive_max_pool", "_unsafe_index")  # fmt: skip
_TRANSCENDENTAL_WORDS = ("exp", "log", "tanh", "sigmoid", "gelu", "silu", "mish", "softplus",
                         "elu", "erf", "rsqrt", "sqrt", "pow", "sin", "cos", "tan", "atan",
                         "asin", "acos", "sinh", "cosh", "reciprocal", "lgamma", "digamma",
                         "polygamma", "i0", "sinc", "logit", "hardswish", "hardsigmoid",
                         "softshrink", "rrelu", "glu", "prelu", "celu", "selu")  # fmt: skip
_SOFTMAX_WORDS = ("softmax", "logsumexp", "cross_entropy")
_NORM_WORDS = ("layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm",
               "_batch_norm", "local_response_norm", "weight_norm")  # fmt: skip
_REDUCTION_WORDS = ("sum", "mean", "amax", "amin", "argmax", "argmin", "var", "std", "norm",
                    "prod", "all", "any", "cumsum", "cumprod", "cummax", "cummin", "aminmax",
                    "count_nonzero", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                    "avg_pool", "adaptive_avg_pool", "trace", "dist", "cdist", "pdist",
                    "binary_cross_entropy", "kl_div", "nansum", "nanmean", "max", "min")  # fmt: skip
_FILL = frozenset(
    "fill zero zeros ones full zeros_like ones_like full_like arange linspace logspace "
    "scalar_tensor new_zeros new_ones new_full rand randn randint randperm rand_like "
    "randn_like randint_like normal uniform bernoulli random exponential geometric "
    "cauchy log_normal eye tril_indices triu_indices iota".split()
)
# Names a prefix rule would misfile (maximum is elementwise, not a max reduction).
_ELEMENTWISE = frozenset(
    "maximum minimum fmax fmin clamp clamp_min clamp_max clip where logical_and logical_or "
    "logical_not logical_xor sign signbit sgn".split()
)


def base_name(op: str) -> str:
    """'aten::add_.Tensor' -> 'add': namespace, overload and in-place suffix removed."""
    name = op.rsplit("::", 1)[-1].split(".", 1)[0]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return name.lower()


@lru_cache(maxsize=4096)
def classify(op: str) -> str:
    """The category of an op name; unknown names are elementwise (VectorE)."""
    name = base_name(op)
    if name.startswith("_foreach_"):
        inner = name.removeprefix("_foreach_")
        return TRANSCENDENTAL if inner.startswith(_TRANSCENDENTAL_WORDS) else ELEMENTWISE
    if name in _VIEWS:
        return VIEW
    if name in _ELEMENTWISE:
        return ELEMENTWISE
    if name in _FILL:
        return FILL
    if name in _COPIES:
        return COPY
    if name.startswith(_MATMUL_PREFIXES) and not name.startswith(("masked", "index")):
        return MATMUL
    if any(w in name for w in _GATHER_WORDS):
        return GATHER
    if any(w in name for w in _SOFTMAX_WORDS):
        return SOFTMAX
    if any(w in name for w in _NORM_WORDS):
        return NORM
    if any(name.startswith(w) or name.startswith("_" + w) for w in _TRANSCENDENTAL_WORDS):
        return TRANSCENDENTAL
    if any(name.startswith(w) or name.startswith("_" + w) for w in _REDUCTION_WORDS):
        return REDUCTION
    return ELEMENTWISE


_ROW_GATHERS = ("gather", "index_select", "embedding", "take", "nll_loss", "_unsafe_index")
_WRITES_INTO = ("scatter", "put", "index_add", "index_copy", "index_fill", "backward")


def reads_gathered_rows(op: str) -> bool:
    """True for gathers that read only the rows they fetch (embedding, index_select, ...)."""
    name = base_name(op)
    if any(w in name for w in _WRITES_INTO):
        return False
    return name == "index" or any(w in name for w in _ROW_GATHERS)


def is_multi_tensor(op: str) -> bool:
    """_foreach_* and _fused_* (optimizer) ops: the same work over lists of tensors."""
    return base_name(op).startswith(("_foreach_", "_fused_"))


def first_list(op: str, inputs: tuple[TensorInfo, ...]) -> tuple[TensorInfo, ...]:
    """The first tensor list of a multi-tensor op, from how many lists its signature takes.

    Shapes cannot tell lists apart (a model's layers repeat), so the count comes from the name:
    `.List` overloads take two lists (addcmul/addcdiv/lerp one more), fused Adam four.
    """
    tensors = [t for t in inputs if t.shape != ()]  # 0-dim entries are scalars and step counts
    name = base_name(op)
    overload = op.rsplit(".", 1)[-1] if "." in op.rsplit("::", 1)[-1] else ""
    if "adam" in name:
        lists = 5 if len(tensors) % 4 and not len(tensors) % 5 else 4  # amsgrad adds a list
    elif "sgd" in name:
        lists = 3 if not len(tensors) % 3 else 2  # momentum buffers
    elif name.endswith(("addcmul", "addcdiv")):
        lists = 3
    elif name.endswith("lerp"):
        lists = 3 if overload == "List" else 2
    else:
        lists = 2 if overload == "List" else 1
    return tuple(tensors[: max(1, len(tensors) // lists)])


def multi_tensor_passes(op: str) -> tuple[int, int]:
    """(VectorE passes per element, tensor lists written) of a multi-tensor op."""
    name = base_name(op)
    if "adam" in name:  # exp_avg lerp, exp_avg_sq mul+addcmul, sqrt, div, add
        return 6, 3
    if "sgd" in name:  # momentum buffer and param
        return 2, 2
    return 1, 1


# A GEMM problem: `batch` independent (M x K) @ (K x N) products.
Gemm = tuple[int, int, int, int]


def _mk(batch: int, m: int, k: int, n: int) -> Gemm:
    return (max(1, batch), max(1, m), max(1, k), max(1, n))


def gemms(op: str, inputs: tuple[TensorInfo, ...], outputs: tuple[TensorInfo, ...]) -> list[Gemm]:
    """The GEMMs a TensorE op performs, from its tensor shapes (convolutions as implicit GEMM).

    Raises on shapes it cannot read; the caller falls back to elementwise lowering.
    """
    name = base_name(op)
    mats = [t for t in inputs if len(t.shape) >= 1]
    out = outputs[0] if outputs else None
    if "scaled_dot_product" in name or "attention" in name:
        q, key, value = _qkv(inputs, "backward" in name)
        batch = prod(q.shape[:-2])
        seq_q, emb, seq_k, emb_v = q.shape[-2], q.shape[-1], key.shape[-2], value.shape[-1]
        fwd = [_mk(batch, seq_q, emb, seq_k), _mk(batch, seq_q, seq_k, emb_v)]
        if "backward" in name:  # recompute scores, then dV, dP, dQ, dK
            return fwd[:1] + [_mk(batch, seq_k, seq_q, emb_v), _mk(batch, seq_q, emb_v, seq_k),
                              _mk(batch, seq_q, seq_k, emb), _mk(batch, seq_k, seq_q, emb)]  # fmt: skip
        return fwd
    if name.startswith(("conv", "_conv", "cudnn_conv", "mkldnn_conv", "slow_conv", "thnn_conv")):
        return _conv_gemms(name, inputs, outputs)
    if name in ("addmm", "baddbmm", "addbmm", "addmv", "addr", "_addmm_activation"):
        mats = mats[1:3]
    if name == "_grouped_mm" and len(mats) >= 3 and len(mats[2].shape) == 1:
        return grouped_gemms(mats[0].shape, mats[1].shape, mats[2].shape[0])
    if name.startswith("linear"):
        x, w = mats[0], mats[1]
        k = x.shape[-1]
        n = w.shape[0] if len(w.shape) == 2 else 1
        return [_mk(1, x.numel // max(k, 1), k, n)]
    a, b = mats[0], mats[1]
    if name in ("bmm", "baddbmm") or (len(a.shape) == 3 and len(b.shape) == 3):
        return [_mk(a.shape[0], a.shape[-2], a.shape[-1], b.shape[-1])]
    if len(a.shape) == 1 and len(b.shape) == 1:
        if name in ("outer", "ger", "addr"):
            return [_mk(1, a.shape[0], 1, b.shape[0])]
        return [_mk(1, 1, a.shape[0], 1)]
    k = a.shape[-1]
    n = b.shape[-1] if len(b.shape) >= 2 else 1
    rows = (out.numel // n) if out is not None else a.numel // max(k, 1)
    return [_mk(1, rows, k, n)]


def uniform_groups(total: int, groups: int) -> list[tuple[int, int]]:
    """(groups, size) pairs splitting `total` rows into `groups` as evenly as can be: the
    expected split of uniform routing (runtime/routing.py), no group empty unless rows run out."""
    size, more = divmod(total, max(groups, 1))
    return [(c, s) for c, s in ((more, size + 1), (groups - more, size)) if c and s]


def grouped_gemms(a: tuple[int, ...], b: tuple[int, ...], groups: int) -> list[Gemm]:
    """The GEMMs of a grouped matmul `a @ b` whose jagged dim is cut into `groups` by offsets
    (torch's `_grouped_mm`): a (S, K) @ b (G, K, N) cuts the rows, (K, S) @ (S, N) the
    contraction (the weight gradient), (G, M, K) @ (K, N) the columns. The offsets' values are
    data, and a kernel is priced by its shapes, so the groups are uniform routing's."""
    if len(a) == 2 and len(b) == 3:
        return [_mk(c, s, a[1], b[2]) for c, s in uniform_groups(a[0], groups)]
    if len(a) == 2 and len(b) == 2:
        return [_mk(c, a[0], s, b[1]) for c, s in uniform_groups(a[1], groups)]
    if len(a) == 3 and len(b) == 2:
        return [_mk(c, a[1], a[2], s) for c, s in uniform_groups(b[1], groups)]
    raise ValueError(f"no grouped matmul of shapes {a} and {b}")


def _qkv(inputs: tuple[TensorInfo, ...], backward: bool) -> tuple[TensorInfo, ...]:
    ts = [t for t in inputs if len(t.shape) >= 2]
    if backward:  # (grad_out, q, k, v, out, ...)
        ts = ts[1:]
    if len(ts) < 3:
        raise ValueError("attention needs q, k and v")
    return ts[0], ts[1], ts[2]


def _conv_gemms(name: str, inputs, outputs) -> list[Gemm]:
    """Implicit GEMM: rows = batch x output pixels, contraction = in-channels x kernel window."""
    ts = [t for t in inputs if len(t.shape) >= 3]
    if "backward" in name:  # (grad_out, input, weight): grad_input and grad_weight GEMMs
        grad_out, x, w = ts[0], ts[1], ts[2]
        groups = max(1, x.shape[1] // max(w.shape[1], 1))
        rows = grad_out.shape[0] * prod(grad_out.shape[2:])
        window = w.shape[1] * prod(w.shape[2:])
        o = w.shape[0] // groups
        return [_mk(groups, rows, o, window), _mk(groups, o, rows, window)]
    x, w = ts[0], ts[1]
    groups = max(1, x.shape[1] // max(w.shape[1], 1))
    out = outputs[0]
    rows = out.shape[0] * prod(out.shape[2:])
    return [_mk(groups, rows, w.shape[1] * prod(w.shape[2:]), w.shape[0] // groups)]
