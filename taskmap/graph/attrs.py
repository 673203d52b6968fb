"""Typed, frozen attributes of graph operators: one small dataclass per family of
:class:`~taskmap.graph.kinds.OpKind`, and the enums they use (no string-typed attributes).

Attributes are normalised by whoever builds the op (the frontend): axes are non-negative,
slices have explicit ``start``/``step``/``length``, shapes have no ``-1``.  They are hashable
(tuples, not lists), so ``(kind, attrs)`` keys caches and CSE tables.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..ir.dtypes import ScalarType

Scalar = bool | int | float


class UnaryFn(enum.Enum):
    """Element-wise unary functions; the value is the name in ``taskmap.ops.elementwise.UNARY``."""

    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    TANH = "tanh"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    SIGMOID = "sigmoid"
    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    HARDSWISH = "hardswish"
    ABS = "abs"
    NEG = "neg"
    RELU = "relu"
    RELU6 = "relu6"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"             # half to even
    TRUNC = "trunc"
    SIGN = "sign"
    RECIPROCAL = "reciprocal"
    SQUARE = "square"
    EXPM1 = "expm1"
    LOG1P = "log1p"
    SOFTPLUS = "softplus"       # beta 1, threshold 20 (others: composed by the frontend)
    MISH = "mish"
    HARDSIGMOID = "hardsigmoid"
    LOGSIGMOID = "logsigmoid"
    SELU = "selu"
    LGAMMA = "lgamma"


class BinaryFn(enum.Enum):
    """Element-wise binary functions; the value is the name in ``taskmap.ops.elementwise.BINARY``."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    FLOOR_DIVIDE = "floor_divide"     # div(rounding_mode="floor"), ``//``
    TRUNC_DIVIDE = "trunc_divide"     # div(rounding_mode="trunc")
    REMAINDER = "remainder"           # ``%``: the divisor's sign (Python's, torch.remainder)
    FMOD = "fmod"                     # the dividend's sign (C's, torch.fmod)
    ATAN2 = "atan2"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    BITWISE_AND = "bitwise_and"       # integers (bools: ``logical_and`` and friends, as where / compare)
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LEFT_SHIFT = "left_shift"
    RIGHT_SHIFT = "right_shift"       # arithmetic on signed integers, as torch


class ReduceFn(enum.Enum):
    """Reductions of :data:`OpKind.REDUCE` (``max``/``min`` give values only, like ``amax``)."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"
    VAR = "var"


class PadMode(enum.Enum):
    CONSTANT = "constant"
    REFLECT = "reflect"
    REPLICATE = "replicate"


@dataclass(frozen=True)
class UnaryAttrs:
    fn: UnaryFn


@dataclass(frozen=True)
class BinaryAttrs:
    """``a fn b``.  With ``scalar`` set the op has one input, the tensor operand, and the scalar
    is the right operand (left when ``scalar_first``): ``2.0 - x`` is ``SUB(x; scalar=2.0,
    scalar_first=True)``."""

    fn: BinaryFn
    scalar: Scalar | None = None
    scalar_first: bool = False


@dataclass(frozen=True)
class WhereAttrs:
    """``where(cond, a, b)``: inputs are ``cond`` then whichever of ``a``/``b`` is a tensor;
    a scalar operand is ``a_scalar``/``b_scalar`` (masked_fill is ``where(mask, value, x)``)."""

    a_scalar: Scalar | None = None
    b_scalar: Scalar | None = None


@dataclass(frozen=True)
class CastAttrs:
    dtype: ScalarType


@dataclass(frozen=True)
class ShapeAttrs:
    """The result shape of RESHAPE and EXPAND (no ``-1``)."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class PermuteAttrs:
    """Output dimension ``k`` is input dimension ``dims[k]``."""

    dims: tuple[int, ...]


@dataclass(frozen=True)
class SliceAttrs:
    """``x[..., start + step * i, ...]`` for ``i < length`` along ``axis`` (``step`` may be negative:
    ``flip`` is ``start = n - 1, step = -1``)."""

    axis: int
    start: int
    step: int
    length: int


@dataclass(frozen=True)
class TopkAttrs:
    """TOPK: the ``k`` largest (``largest=False``: smallest) along ``axis``, in order."""

    k: int
    axis: int
    largest: bool = True


@dataclass(frozen=True)
class ScatterAttrs:
    """SCATTER: ``x`` with ``src`` written (``reduce``: combined, ``"sum"`` / ``"prod"`` / ``"amax"`` /
    ``"amin"`` / ``"mean"``) at the positions ``index`` gives along ``axis`` (:func:`taskmap.ops.scatter`)."""

    axis: int
    reduce: str | None = None
    include_self: bool = True


@dataclass(frozen=True)
class AxisAttrs:
    """CONCAT, GATHER, SOFTMAX, LOG_SOFTMAX, CUMSUM, CUMPROD: the axis (non-negative)."""

    axis: int


@dataclass(frozen=True)
class PadAttrs:
    """``widths[d] = (before, after)`` for every dimension."""

    widths: tuple[tuple[int, int], ...]
    mode: PadMode = PadMode.CONSTANT
    value: float = 0.0


@dataclass(frozen=True)
class ReduceAttrs:
    fn: ReduceFn
    axes: tuple[int, ...]
    keepdim: bool = False
    correction: int = 0


@dataclass(frozen=True)
class NormAttrs:
    """LAYER_NORM (over the trailing ``normalized_shape``) and BATCH_NORM (inference; channel
    axis 1).  Inputs: x, then weight and bias when present (BATCH_NORM: x, mean, var, then
    weight and bias when present)."""

    eps: float
    normalized_shape: tuple[int, ...] = ()
    has_weight: bool = True
    has_bias: bool = True


@dataclass(frozen=True)
class MatmulAttrs:
    """MATMUL and LINEAR.  ``tf32``: f32 products may run on TF32 tensor cores (10-bit mantissas,
    f32 sums) — on a GPU, where PyTorch's setting allowed it when the graph was captured
    (``torch.backends.cuda.matmul``).  ``tf32x3``: f32 products run as 3xTF32 on tensor cores
    (each operand a tf32 high part plus a tf32 low part: about f32's accuracy) — on a GPU, when
    compiled with ``fp32_precision="3xtf32"``."""

    tf32: bool = False
    tf32x3: bool = False


@dataclass(frozen=True)
class Conv2dAttrs:
    """NCHW convolution (weight OIHW, optional bias as a third input); ``tf32`` and ``tf32x3`` as
    in :class:`MatmulAttrs` (PyTorch's setting: ``torch.backends.cudnn``, on by default)."""

    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    tf32: bool = False
    tf32x3: bool = False


@dataclass(frozen=True)
class Pool2dAttrs:
    """MAX_POOL2D / AVG_POOL2D on NCHW."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None


@dataclass(frozen=True)
class AdaptivePoolAttrs:
    output_size: tuple[int, int]


@dataclass(frozen=True)
class AttentionAttrs:
    """scaled_dot_product_attention(q, k, v[, mask]): inputs q, k, v and the mask when
    ``has_mask``."""

    is_causal: bool = False
    scale: float | None = None
    has_mask: bool = False


@dataclass(frozen=True)
class TorchAttrs:
    """An op run by PyTorch (fallback): ``target`` is a torch callable, or a method name for
    ``method=True``; ``args``/``kwargs`` are templates in which :class:`InputRef` ``k`` stands
    for input tensor ``k``.  A complex tensor among its results comes out as its real view
    (graphs have no complex dtype; :class:`InputRef` reads one back)."""

    target: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    method: bool = False
    description: str = ""


@dataclass(frozen=True)
class InputRef:
    """Input ``index`` of a :class:`TorchAttrs` op, inside its argument templates.  With
    ``complex``, the input holds a complex tensor as its real view (``torch.view_as_real``: a
    last axis of 2, real and imaginary parts) and the op reads it as the complex tensor."""

    index: int
    complex: bool = False


__all__ = ["AdaptivePoolAttrs", "AttentionAttrs", "AxisAttrs", "BinaryAttrs", "BinaryFn", "CastAttrs",
           "Conv2dAttrs", "InputRef", "NormAttrs", "PadAttrs", "PadMode", "PermuteAttrs", "Pool2dAttrs",
           "ReduceAttrs", "ReduceFn", "Scalar", "ScatterAttrs", "ShapeAttrs", "SliceAttrs", "TopkAttrs", "TorchAttrs",
           "UnaryAttrs", "UnaryFn", "WhereAttrs"]
