"""The op registry of the PyTorch frontend and the :class:`Converter` handlers build graphs with.

A handler converts one torch call into graph ops.  It is registered for every way the call can
appear in an ``fx`` graph — a function (``torch.relu``, ``torch.nn.functional.relu``,
``operator.add``), a method name (``"relu"`` for ``x.relu()``), an ``nn.Module`` class (for
``call_module`` nodes; the handler then gets the module first), or a custom operator's qualified
name (``"transformers::grouped_mm_fallback"``: its packet and overloads, which may not exist until the
library that defines them is imported)::

    @register(torch.relu, torch.nn.functional.relu, "relu", torch.nn.ReLU)
    def relu(cv, x, inplace=False):
        return cv.unary(UnaryFn.RELU, x)

Handlers receive the node's arguments with fx nodes replaced by their values: graph
:class:`~taskmap.graph.Tensor` objects (constants carry numpy data), Python numbers, tuples...
A handler that cannot convert a particular call raises :class:`NotConvertible` with the
reason; the importer then reports the op as unsupported (or, with fallback, runs it in PyTorch).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...errors import UnsupportedError
from ...graph import (BinaryAttrs, BinaryFn, CastAttrs, GraphBuilder, MatmulAttrs, OpKind, PermuteAttrs, ReduceFn,
                      ShapeAttrs, SliceAttrs, Tensor, UnaryAttrs, UnaryFn, WhereAttrs)
from ...ir.dtypes import ScalarType, bf16, scalar_type
from ...runtime.args import torch_view
from .precision import Tf32

Handler = Callable[..., Any]
_FUNCTIONS: dict[Any, Handler] = {}
_METHODS: dict[str, Handler] = {}
_MODULES: dict[type, Handler] = {}
_CUSTOM_OPS: dict[str, Handler] = {}


class NotConvertible(UnsupportedError):
    """A registered op called in a way the frontend does not handle (the message says why)."""


@dataclass(frozen=True)
class Unavailable:
    """A result of an op that the handler does not compute (ATen's ``embedding_bag`` returns the bags'
    positions and sizes beside their values): the import stops, naming ``reason``, if anything reads
    it."""

    reason: str


def register(*targets: Any) -> Callable[[Handler], Handler]:
    """Register a handler for torch functions, method names (str), nn.Module classes and custom
    operators (``"namespace::name"``)."""
    def deco(fn: Handler) -> Handler:
        for t in targets:
            if isinstance(t, str) and "::" in t:
                _CUSTOM_OPS[t] = fn
            elif isinstance(t, str):
                _METHODS[t] = fn
            elif isinstance(t, type) and issubclass(t, torch.nn.Module):
                _MODULES[t] = fn
            else:
                _FUNCTIONS[t] = fn
        return fn
    return deco


def lookup(op: str, target: Any) -> Handler | None:
    """The handler of an fx node (``op`` is call_function / call_method / call_module)."""
    if op == "call_method":
        return _METHODS.get(target)
    if op == "call_module":
        for cls in type(target).__mro__:
            if cls in _MODULES:
                return _MODULES[cls]
        return None
    if isinstance(target, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        packet = target if isinstance(target, torch._ops.OpOverloadPacket) else target.overloadpacket
        if packet._qualified_op_name in _CUSTOM_OPS:
            return _CUSTOM_OPS[packet._qualified_op_name]
    return _FUNCTIONS.get(target)


def registered() -> dict[str, list[Any]]:
    """Everything registered: functions, method names, module classes (for coverage checks)."""
    return {"functions": list(_FUNCTIONS), "methods": sorted(_METHODS), "modules": list(_MODULES),
            "custom": sorted(_CUSTOM_OPS)}


def torch_dtype(t: ScalarType) -> torch.dtype:
    return getattr(torch, t.name)


def from_torch_dtype(d: torch.dtype) -> ScalarType:
    return scalar_type(str(d).replace("torch.", ""))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A constant's data: shares memory with ``t`` when it is a contiguous CPU tensor (bfloat16:
    an array of ``ml_dtypes``' bfloat16 over the same bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype != torch.bfloat16:
        return t.numpy()
    try:
        return t.view(torch.int16).numpy().view(bf16.numpy_dtype)
    except TypeError as exc:
        raise NotConvertible(f"a bfloat16 constant: {exc}") from None


def to_torch(t: Tensor) -> torch.Tensor:
    """A constant's value as a torch tensor (no copy: do not write to it)."""
    assert t.data is not None
    return torch_view(t.data)


def as_index(v: Any) -> Any:
    """A 0-d integer constant as the Python int PyTorch reads it as (``__index__``); other
    values as they are."""
    if isinstance(v, Tensor) and v.is_constant and v.ndim == 0 and v.dtype.is_integer:
        return int(to_torch(v).item())
    return v


def norm_axis(axis: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= axis < n:
        raise NotConvertible(f"axis {axis} out of range for {ndim} dimensions")
    return axis % n


@dataclass
class Converter:
    """What handlers build with: the graph builder plus helpers for common patterns."""

    builder: GraphBuilder
    source: str = ""
    prefix: str = ""                      # call_module: the module's path (names its parameters)
    cache: dict[int, tuple[Any, Tensor]] | None = None  # id(torch tensor) -> (it, its constant): shared weights
    tf32: Tf32 = Tf32()                   # PyTorch's TF32 settings at capture (the ops' ``tf32`` attribute)
    cast_to: ScalarType | None = None     # torch.autocast's dtype for this op's floating parameters

    # ------------------------------------------------------------------ basics

    def op(self, kind: OpKind, inputs: Sequence[Tensor], attrs: Any = None) -> Tensor:
        if kind in (OpKind.MATMUL, OpKind.LINEAR) and attrs is None:
            attrs = MatmulAttrs(self.tf32.matmul, self.tf32.x3 and not self.tf32.matmul)
        elif kind is OpKind.CONV2D:
            attrs = replace(attrs, tf32=self.tf32.conv, tf32x3=self.tf32.x3 and not self.tf32.conv)
        elif kind is OpKind.CONCAT and len(inputs) > 1:     # empty parts add nothing (Phi-3's rotary pass-through)
            kept = [t for t in inputs if t.shape[attrs.axis] > 0]
            if len(kept) == 1:
                return kept[0]
            inputs = kept or inputs[:1]
        out = self.builder.op(kind, list(inputs), attrs, source=self.source)
        if kind is OpKind.REDUCE and inputs[0].numel == 0 and out.numel > 0:
            return self._empty_reduction(attrs.fn, out)
        return out

    def _empty_reduction(self, fn: ReduceFn, out: Tensor) -> Tensor:
        """A reduction over an empty axis: its identity (sum 0, product 1; mean and variance NaN),
        as torch; max / min of nothing are errors there too."""
        fills = {ReduceFn.SUM: 0, ReduceFn.PROD: 1, ReduceFn.MEAN: np.nan, ReduceFn.VAR: np.nan}
        if fn not in fills:
            raise NotConvertible(f"{fn.value} over an empty dimension")
        return self.const(np.full(out.shape, fills[fn], dtype=out.dtype.name))

    def sub(self, prefix: str) -> "Converter":
        """The same converter for the submodule at ``prefix`` (names its parameters)."""
        return replace(self, prefix=prefix)

    def const(self, value: Any, dtype: ScalarType | None = None, name: str = "") -> Tensor:
        """A constant from a torch tensor, numpy array or Python number (torch tensors once each)."""
        if isinstance(value, torch.Tensor):
            if self.cache is not None and id(value) in self.cache:
                return self.cache[id(value)][1]
            data = to_numpy(value)
            t = self.builder.constant(data, name)
            if self.cache is not None:
                self.cache[id(value)] = (value, t)  # keeps the tensor alive: its id stays unique
            return t
        else:
            data = np.asarray(value, dtype=dtype.numpy_dtype if dtype else None)
            if data.dtype == np.float64 and dtype is None:
                data = data.astype(np.float32)
        return self.builder.constant(data, name)

    def param(self, value: Any, name: str) -> Tensor | None:
        """A module's parameter or buffer (``name`` under the module's path) as a constant."""
        if value is None or isinstance(value, Tensor):
            return value
        t = self.const(value, name=f"{self.prefix}.{name}" if self.prefix else name)
        return self.cast(t, self.cast_to) if self.cast_to is not None and t.dtype.is_float else t

    def tensor(self, x: Any, like: Tensor | None = None) -> Tensor:
        """``x`` as a graph tensor (numbers become constants of ``like``'s dtype)."""
        if isinstance(x, Tensor):
            return x
        return self.const(x, like.dtype if like is not None else None)

    # ------------------------------------------------------------------ element-wise

    def unary(self, fn: UnaryFn, x: Tensor) -> Tensor:
        return self.op(OpKind.UNARY, [x], UnaryAttrs(fn))

    def binary(self, fn: BinaryFn, a: Any, b: Any) -> Tensor:
        """``a fn b`` where either may be a Python number (kept as an attribute)."""
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            raise NotConvertible("torch tensors must be graph tensors here")
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            return self.op(OpKind.BINARY, [a, b], BinaryAttrs(fn))
        if isinstance(a, Tensor):
            return self.op(OpKind.BINARY, [a], BinaryAttrs(fn, _number(b)))
        if isinstance(b, Tensor):
            return self.op(OpKind.BINARY, [b], BinaryAttrs(fn, _number(a), scalar_first=True))
        raise NotConvertible("a binary op without tensor operands")

    def where_scalar(self, cond: Tensor, value: Any, x: Tensor) -> Tensor:
        """``value if cond else x`` (``value`` a Python number)."""
        return self.op(OpKind.WHERE, [cond, x], WhereAttrs(a_scalar=value))

    def cast(self, x: Tensor, dtype: ScalarType) -> Tensor:
        return x if x.dtype is dtype else self.op(OpKind.CAST, [x], CastAttrs(dtype))

    # ------------------------------------------------------------------ shapes

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = infer_shape(x.numel, shape)
        return x if shape == x.shape else self.op(OpKind.RESHAPE, [x], ShapeAttrs(shape))

    def permute(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        dims = tuple(norm_axis(d, x.ndim) for d in dims)
        return x if dims == tuple(range(x.ndim)) else self.op(OpKind.PERMUTE, [x], PermuteAttrs(dims))

    def slice(self, x: Tensor, axis: int, start: int | None, stop: int | None, step: int | None = 1) -> Tensor:
        axis = norm_axis(axis, x.ndim)
        n = x.shape[axis]
        step = 1 if step is None else int(step)
        if step <= 0:
            raise NotConvertible("slices with a non-positive step")
        b, e, _ = slice(start, stop, step).indices(n)
        length = max(0, -(-(e - b) // step))
        if b == 0 and step == 1 and length == n:
            return x
        return self.op(OpKind.SLICE, [x], SliceAttrs(axis, b if length else 0, step, length))

    def expand(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(s) for s in shape)
        return x if shape == x.shape else self.op(OpKind.EXPAND, [x], ShapeAttrs(shape))


def _number(v: Any) -> bool | int | float:
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    raise NotConvertible(f"operand of type {type(v).__name__}")


def infer_shape(numel: int, shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise NotConvertible(f"shape {shape} has more than one -1")
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if known == 0 or numel % known:
            raise NotConvertible(f"cannot view {numel} elements as {shape}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    total = 1
    for s in shape:
        total *= s
    if total != numel:
        raise NotConvertible(f"cannot view {numel} elements as {shape}")
    return shape


__all__ = ["Converter", "NotConvertible", "from_torch_dtype", "infer_shape", "lookup", "norm_axis", "register",
           "registered", "to_numpy", "to_torch", "torch_dtype"]
