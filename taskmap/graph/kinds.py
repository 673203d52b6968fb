"""Operator kinds and their definitions: what graph passes and the runtime need to know.

Each :class:`OpKind` has one :class:`OpDef` (``kind.definition``), registered by
:mod:`.defs_injective` (element-wise and transform ops: a compute definition) and
:mod:`.defs_anchor` (matmul, conv, reductions, norms, pooling, attention, PyTorch fallback: a
runner calling :mod:`taskmap.ops`).  The facts:

* ``category`` — TVM's operator classes (:class:`OpCategory`): fusion groups are one anchor
  (REDUCTION / OUT_FUSABLE) plus INJECTIVE prologues (ELEMENTWISE ⊂ BROADCAST ⊂ INJECTIVE)
  and bijective epilogues; OPAQUE ops are never fused.
* ``infer(inputs, attrs) -> [(shape, dtype), ...]`` — shape and dtype inference; raises
  ``OpError`` on inputs the op cannot take.
* ``compute(nodes, attrs, out_shape) -> TensorNode`` — for ELEMENTWISE/BROADCAST/INJECTIVE
  kinds: the op as a compute definition (:mod:`taskmap.compute.nodes`) over ``tensor_input``
  nodes of the input shapes (0-d tensors are given as shape ``(1,)``); ``out_shape`` is the
  (kernel) output shape.  Fusion inlines these; the runtime schedules them with the rule-based
  scheduler.  ``taskmap.compute.is_bijective`` tells which reads are bijective.
* ``run(arrays, attrs) -> array | tuple`` — for anchor and opaque kinds: the ``taskmap.ops``
  function that runs it (arrays are torch tensors, numpy arrays or taskmap Tensors) —
  ``run_name`` names it, for reports.
"""
from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, fields
from typing import Any, Callable, Sequence

from ..errors import IRError


class OpCategory(enum.IntEnum):
    """TVM's operator pattern classes, ordered: a higher value is harder to fuse."""

    ELEMENTWISE = 0   # out[i] = f(in[i]) for every input (same shape)
    BROADCAST = 1     # element-wise with broadcast inputs
    INJECTIVE = 2     # every output element reads at most one element per input (transforms)
    REDUCTION = 3     # reduces some axes (sum, softmax, layer_norm, pooling)
    OUT_FUSABLE = 4   # complex-out-fusable anchors: matmul, conv — element-wise epilogues fuse
    OPAQUE = 5        # not fusable (PyTorch fallback, attention kernels)

    @property
    def is_injective(self) -> bool:
        return self <= OpCategory.INJECTIVE

    @property
    def is_anchor(self) -> bool:
        """Ops that own a kernel of their own (a fusion group's anchor)."""
        return self >= OpCategory.REDUCTION


class OpKind(enum.Enum):
    """Every graph operator; attributes in brackets (:mod:`taskmap.graph.attrs`)."""

    # element-wise / injective: compute definitions
    UNARY = enum.auto()          # [UnaryAttrs]
    BINARY = enum.auto()         # [BinaryAttrs] 1 or 2 inputs, broadcasting
    WHERE = enum.auto()          # [WhereAttrs] cond, a?, b?
    CAST = enum.auto()           # [CastAttrs]
    BATCH_NORM = enum.auto()     # [NormAttrs] x, mean, var, weight?, bias? (inference)
    RESHAPE = enum.auto()        # [ShapeAttrs]
    EXPAND = enum.auto()         # [ShapeAttrs] numpy broadcast_to
    PERMUTE = enum.auto()        # [PermuteAttrs]
    SLICE = enum.auto()          # [SliceAttrs]
    CONCAT = enum.auto()         # [AxisAttrs] any number of inputs
    PAD = enum.auto()            # [PadAttrs]
    GATHER = enum.auto()         # [AxisAttrs] torch.gather(x, axis, index)
    EMBEDDING = enum.auto()      # weight, indices -> weight[indices]
    # anchors: taskmap.ops runners
    MATMUL = enum.auto()         # torch.matmul semantics
    LINEAR = enum.auto()         # x, weight, bias?
    CONV2D = enum.auto()         # [Conv2dAttrs] x, weight, bias?
    MAX_POOL2D = enum.auto()     # [Pool2dAttrs]
    AVG_POOL2D = enum.auto()     # [Pool2dAttrs]
    ADAPTIVE_AVG_POOL2D = enum.auto()  # [AdaptivePoolAttrs]
    ADAPTIVE_MAX_POOL2D = enum.auto()  # [AdaptivePoolAttrs]
    REDUCE = enum.auto()         # [ReduceAttrs]
    SOFTMAX = enum.auto()        # [AxisAttrs]
    LOG_SOFTMAX = enum.auto()    # [AxisAttrs]
    LAYER_NORM = enum.auto()     # [NormAttrs] x, weight?, bias?
    ATTENTION = enum.auto()      # [AttentionAttrs] q, k, v, mask?
    CUMSUM = enum.auto()         # [AxisAttrs] running sums (prefix scan)
    CUMPROD = enum.auto()        # [AxisAttrs] running products
    LOGCUMSUMEXP = enum.auto()   # [AxisAttrs] running log-sum-exps (floats)
    CUMMAX = enum.auto()         # [AxisAttrs] running maxima, their indices
    CUMMIN = enum.auto()         # [AxisAttrs] running minima, their indices
    TOPK = enum.auto()           # [TopkAttrs] values, indices (sort: k = the axis' size)
    SCATTER = enum.auto()        # [ScatterAttrs] x, index, src (torch.scatter's shape rules)
    TORCH = enum.auto()          # [TorchAttrs] PyTorch fallback (opaque)

    @property
    def definition(self) -> "OpDef":
        try:
            return _DEFS[self]
        except KeyError:
            raise IRError(f"op kind {self.name} has no definition registered") from None


Shape = tuple[int, ...]
Infer = Callable[[Sequence[Any], Any], list[tuple[Shape, Any]]]


@dataclass(frozen=True)
class OpDef:
    """What an op kind is (see the module docstring)."""

    kind: OpKind
    category: OpCategory
    infer: Infer
    attrs_type: type | None = None
    compute: Callable[..., Any] | None = None
    run: Callable[[Sequence[Any], Any], Any] | None = None
    run_name: str = ""

    def __post_init__(self) -> None:
        if self.category.is_injective and self.compute is None:
            raise IRError(f"{self.kind.name}: injective op definitions need a compute definition")
        if not self.category.is_injective and self.run is None:
            raise IRError(f"{self.kind.name}: anchor op definitions need a runner")

    def default_attrs(self) -> Any:
        """The attributes an op gets when none are given: ``attrs_type()`` when every field has a
        default, else None (the builder then reports the missing attributes)."""
        t = self.attrs_type
        if t is None or any(f.default is MISSING and f.default_factory is MISSING for f in fields(t)):
            return None
        return t()


_DEFS: dict[OpKind, OpDef] = {}


def register_def(d: OpDef) -> OpDef:
    """Register the definition of ``d.kind`` (once)."""
    if d.kind in _DEFS:
        raise IRError(f"op kind {d.kind.name} is defined twice")
    _DEFS[d.kind] = d
    return d


def op_def(kind: OpKind) -> OpDef:
    return kind.definition


__all__ = ["OpCategory", "OpDef", "OpKind", "op_def", "register_def"]
