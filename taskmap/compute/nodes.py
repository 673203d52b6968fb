"""Compute definitions: what an operator computes, as a small DAG of tensor nodes.

Three kinds of node, all immutable (nodes compare by identity, like IR variables)::

    x = tensor_input("x", f32, [n, 64])                          # an input (a kernel argument)
    e = compute("e", [n, 64], lambda i, j: exp(x[i, j]))         # one IR expression per element
    s = reduce("s", [n], lambda i, k: e[i, k], [64], "sum")      # a reduction over k

``fcompute`` receives one IR index expression per axis (output axes, then reduction axes for
``reduce``) and returns an IR expression; indexing a node, ``x[i, j]``, builds an IR ``Load`` of
the node's tensor variable (``node.var``).  The nodes a definition reads are found while
``fcompute`` runs (every ``node[...]`` call is recorded), so ``node.inputs`` is exact.

Shapes are ints or symbolic sizes (``SizeVar``, or a string naming one).  The facts fusion and
scheduling need — injective, bijective, index maps — are in :mod:`.analysis`.
"""
from __future__ import annotations

import enum
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import ComputeError
from ..ir import expr as E
from ..ir.dtypes import ScalarType, bf16, f16, f32, scalar_type
from ..ir.expr import Expr, SizeVar, Var
from ..ir.functor import collect
from ..ir.printer import _Names, expr_str
from ..ir.types import TensorType

Dim = int | SizeVar


class ReduceOp(enum.Enum):
    """How a reduction combines its values."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"

    def identity(self, dtype: ScalarType) -> E.Const:
        """The neutral element in ``dtype`` (the lowest / highest finite value for max / min)."""
        if self is ReduceOp.SUM:
            return E.const(0, dtype)
        if self is ReduceOp.PROD:
            return E.const(1, dtype)
        if dtype.is_bool:
            return E.const(self is ReduceOp.MIN, dtype)
        if dtype.is_float:
            return E.const(float("-inf") if self is ReduceOp.MAX else float("inf"), dtype)
        bits = dtype.nbytes * 8
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.is_signed else (0, (1 << bits) - 1)
        return E.const(lo if self is ReduceOp.MAX else hi, dtype)

    def combine(self, a: Any, b: Any) -> Expr:
        """``a ⊕ b`` as an IR expression.  Float max / min propagate NaN (as numpy and torch do)
        and are written as selects, which CPU vector loops keep vectorized (``fmaxf`` is not)."""
        a = E.as_expr(a, like=b if isinstance(b, Expr) else None)
        b = E.as_expr(b, like=a)
        if self is ReduceOp.SUM:
            return a + b
        if self is ReduceOp.PROD:
            return a * b
        if not a.dtype.is_float:
            return E.maximum(a, b) if self is ReduceOp.MAX else E.minimum(a, b)
        better = E.compare(E.CmpOp.GT if self is ReduceOp.MAX else E.CmpOp.LT, a, b)
        return E.select(E.logical_or(better, E.compare(E.CmpOp.NE, a, a)), a, b)


def accumulator_type(dtype: ScalarType) -> ScalarType:
    """The type a reduction accumulates in: f32 for 16-bit floats, else the value's own type."""
    return f32 if dtype in (f16, bf16) else dtype


# ----------------------------------------------------------------------------- recording reads

_LOCAL = threading.local()


def _recording() -> list[list["TensorNode"]]:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


def _dims(shape: Sequence[Any], what: str) -> tuple[Dim, ...]:
    if isinstance(shape, (int, str, SizeVar)):
        shape = (shape,)
    out: list[Dim] = []
    for s in shape:
        if isinstance(s, str):
            s = SizeVar(s)
        elif isinstance(s, E.Const) and s.dtype.is_integer:
            s = int(s.value)
        if isinstance(s, bool) or not isinstance(s, (int, SizeVar)):
            raise ComputeError(f"{what}: dimensions must be ints or symbolic sizes, got {s!r}")
        if isinstance(s, int) and s <= 0:
            raise ComputeError(f"{what}: dimensions must be positive, got {tuple(shape)}")
        out.append(s)
    return tuple(out)


def _axes(fcompute: Callable[..., Any], count: int, prefix: str, what: str) -> tuple[Var, ...]:
    """Index variables named after ``fcompute``'s parameters (checking that it takes ``count``)."""
    try:
        sig = inspect.signature(fcompute).parameters.values()
    except (TypeError, ValueError):
        sig = []
    params = [p.name for p in sig if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in sig if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in sig)
    if sig and (len(required) > count or (len(params) < count and not variadic)):
        raise ComputeError(f"{what}: fcompute must take {count} index argument(s), it takes {len(params)}")
    names = params if len(params) == count else [f"{prefix}{k}" for k in range(count)]
    return tuple(Var(n, E.i32) for n in names)


# ----------------------------------------------------------------------------- nodes


@dataclass(frozen=True, eq=False, repr=False)
class TensorNode:
    """Base of the DAG nodes: a named tensor of ``dtype`` and ``shape``."""

    name: str
    dtype: ScalarType
    shape: tuple[Dim, ...]
    var: Var = field(init=False)

    def __post_init__(self) -> None:
        dims = tuple(E.as_expr(s) for s in self.shape)
        object.__setattr__(self, "var", Var(self.name, TensorType(self.dtype, dims)))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def inputs(self) -> tuple["TensorNode", ...]:
        return ()

    @property
    def is_static(self) -> bool:
        """Whether every dimension is an int."""
        return all(isinstance(s, int) for s in self.shape)

    def __getitem__(self, idx: Any) -> E.Load:
        items = idx if isinstance(idx, tuple) else (idx,)
        if len(items) != self.ndim:
            raise ComputeError(f"{self.name} has {self.ndim} dimension(s) but is indexed with {len(items)}")
        stack = _recording()
        if stack:
            stack[-1].append(self)
        indices = []
        for i in items:
            e = E.as_expr(i)
            if not e.dtype.is_integer:
                raise ComputeError(f"{self.name} indexed with a {e.dtype!r} value; indices must be integers")
            indices.append(E.cast(e, E.i32))
        return E.Load(self.var, tuple(indices))

    def _shape_str(self) -> str:
        return "[" + ", ".join(str(s) if isinstance(s, int) else s.name for s in self.shape) + "]"

    def __repr__(self) -> str:
        return dag_str(self)


@dataclass(frozen=True, eq=False, repr=False)
class TensorInput(TensorNode):
    """An input tensor of the operator (a kernel argument)."""

    def line(self, names: _Names) -> str:
        return f"{self.name} = tensor_input({self.name!r}, {self.dtype!r}, {self._shape_str()})"


@dataclass(frozen=True, eq=False, repr=False)
class ComputeNode(TensorNode):
    """``out[axes] = value``: one expression per element, no reduction at this node."""

    axes: tuple[Var, ...] = ()
    value: Expr = E.const(0)
    reads: tuple[TensorNode, ...] = ()

    @property
    def inputs(self) -> tuple[TensorNode, ...]:
        return self.reads

    def line(self, names: _Names) -> str:
        ax = ", ".join(names(a) for a in self.axes)
        return f"{self.name}[{ax}] = {expr_str(self.value, names)}"


@dataclass(frozen=True, eq=False, repr=False)
class ReduceNode(TensorNode):
    """``out[axes] = op over red_axes in reduce_shape of value`` (accumulated in ``acc_dtype``)."""

    axes: tuple[Var, ...] = ()
    reduce_axes: tuple[Var, ...] = ()
    reduce_shape: tuple[Dim, ...] = ()
    op: ReduceOp = ReduceOp.SUM
    value: Expr = E.const(0)
    reads: tuple[TensorNode, ...] = ()

    @property
    def inputs(self) -> tuple[TensorNode, ...]:
        return self.reads

    @property
    def acc_dtype(self) -> ScalarType:
        return accumulator_type(self.value.dtype)

    def line(self, names: _Names) -> str:
        ax = ", ".join(names(a) for a in self.axes)
        red = ", ".join(f"{names(a)} < {s}" for a, s in zip(self.reduce_axes, self.reduce_shape))
        return f"{self.name}[{ax}] = {self.op.value}({expr_str(self.value, names)} for {red})"


# ----------------------------------------------------------------------------- constructors


def tensor_input(name: str, dtype: ScalarType | str, shape: Sequence[Any]) -> TensorInput:
    """An input of ``dtype`` and ``shape`` (ints, ``SizeVar``s or size names)."""
    return TensorInput(name, scalar_type(dtype), _dims(shape, f"tensor_input({name!r})"))


def _trace(name: str, fcompute: Callable[..., Any], args: tuple[Var, ...]) -> tuple[Expr, tuple[TensorNode, ...]]:
    stack = _recording()
    stack.append([])
    try:
        value = fcompute(*args)
    finally:
        seen = stack.pop()
    if isinstance(value, TensorNode):
        raise ComputeError(f"{name}: fcompute returned the tensor {value.name}; index it (as in {value.name}[i, j])")
    try:
        value = E.as_expr(value)
    except TypeError as e:
        raise ComputeError(f"{name}: fcompute must return an IR expression or a number ({e})") from None
    by_var = {id(n.var): n for n in seen}
    reads: dict[int, TensorNode] = {}
    for load in collect(value, E.Load):
        node = by_var.get(id(load.tensor))
        if node is None:
            raise ComputeError(f"{name}: fcompute loads {load.tensor.name}, which is not a node of a compute "
                               "definition (index tensor_input/compute/reduce nodes)")
        reads.setdefault(id(node.var), node)
    return value, tuple(reads.values())


def compute(name: str, shape: Sequence[Any], fcompute: Callable[..., Any],
            dtype: ScalarType | str | None = None) -> ComputeNode:
    """``out[i0, .., ik] = fcompute(i0, .., ik)`` for every index of ``shape``."""
    dims = _dims(shape, f"compute({name!r})")
    axes = _axes(fcompute, len(dims), "i", f"compute({name!r})")
    value, reads = _trace(name, fcompute, axes)
    if dtype is not None:
        value = E.cast(value, scalar_type(dtype))
    return ComputeNode(name, value.dtype, dims, axes, value, reads)


def reduce(name: str, shape: Sequence[Any], fcompute: Callable[..., Any], reduce_shape: Sequence[Any],
           op: ReduceOp | str = "sum", dtype: ScalarType | str | None = None) -> ReduceNode:
    """``out[i..] = op(fcompute(i.., k..) for k.. in reduce_shape)``; ``op`` is sum, max, min or prod.

    The result has ``dtype`` (default: the value's type); 16-bit floats accumulate in f32."""
    try:
        rop = op if isinstance(op, ReduceOp) else ReduceOp(op)
    except ValueError:
        raise ComputeError(f"reduce({name!r}): unknown reduction {op!r}; use one of "
                           f"{[o.value for o in ReduceOp]}") from None
    dims = _dims(shape, f"reduce({name!r})")
    rdims = _dims(reduce_shape, f"reduce({name!r}) reduce_shape")
    if not rdims:
        raise ComputeError(f"reduce({name!r}): reduce_shape needs at least one dimension")
    axes = _axes(fcompute, len(dims) + len(rdims), "i", f"reduce({name!r})")
    value, reads = _trace(name, fcompute, axes)
    out_t = scalar_type(dtype) if dtype is not None else value.dtype
    return ReduceNode(name, out_t, dims, axes[:len(dims)], axes[len(dims):], rdims, rop, value, reads)


# ----------------------------------------------------------------------------- traversal, printing


def walk(node: TensorNode) -> list[TensorNode]:
    """Every node of the DAG under ``node``, producers before consumers (``node`` last)."""
    order: list[TensorNode] = []
    seen: set[int] = set()

    def go(n: TensorNode) -> None:
        if id(n) in seen:
            return
        seen.add(id(n))
        for i in n.inputs:
            go(i)
        order.append(n)

    go(node)
    return order


def graph_inputs(node: TensorNode) -> list[TensorInput]:
    """The ``tensor_input`` leaves of the DAG, in the order they are first read."""
    return [n for n in walk(node) if isinstance(n, TensorInput)]


def dag_str(node: TensorNode) -> str:
    """The DAG as lines ``name[axes] = expression`` (inputs as their constructor calls)."""
    names = _Names()
    for n in walk(node):
        names(n.var)  # node names take precedence over axis names
    return "\n".join(n.line(names) for n in walk(node))  # type: ignore[attr-defined]


__all__ = ["ComputeError", "ComputeNode", "Dim", "ReduceNode", "ReduceOp", "TensorInput", "TensorNode",
           "accumulator_type", "compute", "dag_str", "graph_inputs", "reduce", "tensor_input", "walk"]
