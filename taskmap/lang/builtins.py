"""The DSL's builtins: ``attrs``, ``syncthreads``, shared/register tensors, math, loop builders,
``symbol`` and ``@func`` device functions.

Each function-like builtin is a :class:`Builtin`: the transpiler calls its ``impl`` with the
evaluated arguments to build IR; called in plain Python it raises a clear ``TypeError``.
"""
from __future__ import annotations

import ast
import builtins as py
import functools
import inspect
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType
from ..ir.expr import Expr, Intrinsic, SizeVar, Var
from ..ir.stmt import ForKind
from ..ir.types import MemScope

# ----------------------------------------------------------------------------- value predicates


def is_ir(v: Any) -> bool:
    return isinstance(v, Expr)


def is_tensor(v: Any) -> bool:
    return isinstance(v, Var) and v.is_tensor


def is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating))


def py_number(v: Any) -> Any:
    """A Python bool/int/float for a Python or numpy number."""
    return v.item() if isinstance(v, (np.generic,)) else v


def describe(v: Any, limit: int = 50) -> str:
    """A short description of a Python value for error messages."""
    text = repr(v)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} (a Python {type(v).__name__})"


# ----------------------------------------------------------------------------- markers


class Builtin:
    """A DSL function: builds IR inside kernels, refuses to run in plain Python.

    ``impl(ctx, node, args, kwargs)`` gets the transpiler (for ``error``/``to_scalar``/...), the
    ``ast.Call`` node, and the evaluated arguments.
    """

    def __init__(self, name: str, impl: Callable[..., Any], doc: str = "") -> None:
        self.name = name
        self.impl = impl
        self.__doc__ = doc or f"DSL builtin {name}()"
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.name}() can only be called inside a @taskmap.kernel function")

    def __repr__(self) -> str:
        return f"<taskmap.lang builtin {self.name}>"


class _Attrs:
    """``attrs.grid_dim = ...`` / ``attrs.block_dim = ...`` set a GPU kernel's launch dimensions;
    ``attrs.min_blocks = n`` (a compile-time int; 0, the default, asks nothing) asks the GPU
    compiler to fit ``n`` blocks on one multiprocessor at once, by keeping the registers per thread
    low enough (CUDA's ``__launch_bounds__(threads, n)``; HIP's minimum waves per SIMD of that
    occupancy).  CPU builds ignore it."""

    __slots__ = ()
    NAMES = ("grid_dim", "block_dim", "min_blocks")

    def __getattr__(self, name: str) -> Any:
        raise TypeError(f"attrs.{name} can only be used inside a @taskmap.kernel function")

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"attrs.{name} can only be set inside a @taskmap.kernel function")

    def __repr__(self) -> str:
        return "taskmap.lang.attrs"


attrs = _Attrs()


@dataclass(frozen=True)
class LoopRange:
    """``range``/``unroll``/``parallel``/``vectorize(...)``: only valid as a for loop's iterable."""

    start: Any
    stop: Any
    step: int
    kind: ForKind
    what: str
    stream: bool = False      # ``vectorize(..., stream=True)``: the loop's stores are streaming


@dataclass(frozen=True)
class TensorSpec:
    """``shared_tensor``/``register_tensor(...)``: only valid as the value of ``name = ...``."""

    dtype: ScalarType
    shape: tuple[int, ...]
    scope: MemScope
    what: str


# ----------------------------------------------------------------------------- helpers


def check_args(ctx: Any, node: ast.Call, name: str, args: list, kwargs: dict, lo: int, hi: int) -> None:
    if kwargs:
        raise ctx.error(node, f"{name}() takes no keyword arguments")
    if not lo <= len(args) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise ctx.error(node, f"{name}() takes {want} argument(s), got {len(args)}")


def _arg_node(node: ast.Call, i: int) -> ast.AST:
    return node.args[i] if i < len(node.args) else node


def scalar_args(ctx: Any, node: ast.Call, args: list) -> list[Expr]:
    """IR expressions for ``args``; Python numbers take the type of the first IR argument."""
    like = next((a for a in args if is_ir(a) and not is_tensor(a)), None)
    return [ctx.to_scalar(a, _arg_node(node, i), like=like) for i, a in enumerate(args)]


def intrinsic_call(ctx: Any, node: ast.Call, fn: Intrinsic, args: list) -> Expr:
    if len(args) != fn.arity:
        raise ctx.error(node, f"{fn.fname}() takes {fn.arity} argument(s), got {len(args)}")
    return E.call(fn, *scalar_args(ctx, node, args))


def const_int(v: Any) -> int | None:
    """``v`` as a Python int if it is a compile-time integer (or an integer IR constant)."""
    if isinstance(v, E.Const) and v.dtype.is_integer:
        return int(v.value)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        return None
    return operator.index(v)


def range_args(ctx: Any, node: ast.Call, what: str, kind: ForKind, args: list, kwargs: dict) -> LoopRange:
    """``what(stop)`` / ``what(start, stop[, step])`` with a compile-time non-zero step."""
    check_args(ctx, node, what, args, kwargs, 1, 3)
    start, stop = (0, args[0]) if len(args) == 1 else (args[0], args[1])
    step = 1
    if len(args) == 3:
        step = const_int(args[2])
        if step is None:
            raise ctx.error(node.args[2], f"the step of {what}() must be a compile-time int, "
                                          f"got {ctx.value_str(args[2])}")
        if step == 0:
            raise ctx.error(node.args[2], f"the step of {what}() must not be zero")
    bounds = []
    for i, v in ((0, start), (0 if len(args) == 1 else 1, stop)):
        c = const_int(v)
        if c is not None:
            bounds.append(c)
            continue
        e = ctx.to_scalar(v, _arg_node(node, i))
        if not e.dtype.is_integer:
            raise ctx.error(_arg_node(node, i), f"the bounds of {what}() must be integers, got {e.dtype!r}")
        bounds.append(e)
    if kind is ForKind.UNROLL and not all(isinstance(b, int) for b in bounds):
        raise ctx.error(node, "unroll() needs compile-time bounds (the loop is fully unrolled)")
    return LoopRange(bounds[0], bounds[1], step, kind, what)


def _loop_builder(what: str, kind: ForKind) -> Builtin:
    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> LoopRange:
        return range_args(ctx, node, what, kind, args, kwargs)
    return Builtin(what, impl, f"``for i in {what}(n)`` / ``{what}(start, stop[, step])``: a {kind.value} loop.")


def _vectorize(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> LoopRange:
    kwargs = dict(kwargs)
    stream = kwargs.pop("stream", False)
    if not isinstance(stream, bool):
        raise ctx.error(node, f"vectorize(): stream= must be a compile-time bool, got {ctx.value_str(stream)}")
    r = range_args(ctx, node, "vectorize", ForKind.VECTORIZE, args, kwargs)
    return LoopRange(r.start, r.stop, r.step, r.kind, r.what, stream)


def _tensor_builder(what: str, scope: MemScope) -> Builtin:
    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> TensorSpec:
        check_args(ctx, node, what, args, kwargs, 2, 2)
        dtype, shape = args
        if not isinstance(dtype, ScalarType):
            raise ctx.error(node.args[0], f"the first argument of {what}() must be a scalar type such as "
                                          f"f32, got {ctx.value_str(dtype)}")
        dims = shape if isinstance(shape, (tuple, list)) else (shape,)
        ints = [const_int(d) for d in dims]
        if not dims or any(d is None or d <= 0 for d in ints):
            raise ctx.error(node.args[1], f"the shape of {what}() must be a list of compile-time positive "
                                          f"ints, got {ctx.value_str(shape)}")
        if scope is MemScope.SHARED:
            ctx.mark_gpu(node, "shared_tensor()")
        return TensorSpec(dtype, tuple(ints), scope, what)  # type: ignore[arg-type]
    return Builtin(what, impl, f"``buf = {what}(f32, [64, 8])`` declares a {scope.value}-memory tensor.")


def _math_builtin(fn: Intrinsic) -> Builtin:
    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
        check_args(ctx, node, fn.fname, args, kwargs, fn.arity, fn.arity)
        return intrinsic_call(ctx, node, fn, args)
    return Builtin(fn.fname, impl, f"The math intrinsic {fn.fname} on IR values.")


def _syncthreads(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    check_args(ctx, node, "syncthreads", args, kwargs, 0, 0)
    ctx.mark_gpu(node, "syncthreads()")
    return S.Barrier()


def _cast(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
    check_args(ctx, node, "cast", args, kwargs, 2, 2)
    if not isinstance(args[1], ScalarType):
        raise ctx.error(node.args[1], f"cast() needs a scalar type such as f32, got {ctx.value_str(args[1])}")
    return E.cast(ctx.to_scalar(args[0], node.args[0]), args[1])


def _bitcast(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
    check_args(ctx, node, "bitcast", args, kwargs, 2, 2)
    if not isinstance(args[1], ScalarType):
        raise ctx.error(node.args[1], f"bitcast() needs a scalar type such as i32, got {ctx.value_str(args[1])}")
    x = ctx.to_scalar(args[0], node.args[0])
    bad = E.bitcast_problem(x.dtype, args[1])
    if bad is not None:
        raise ctx.error(node, bad)
    return E.bitcast(x, args[1])


def _select(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Any:
    check_args(ctx, node, "select", args, kwargs, 3, 3)
    cond, a, b = args
    if not is_ir(cond):
        return a if cond else b
    a, b = scalar_args(ctx, node, [a, b]) if (is_ir(a) or is_ir(b)) else (a, b)
    for v, i in ((a, 1), (b, 2)):
        if not is_ir(v) and not is_number(v):
            ctx.to_scalar(v, node.args[i])  # raises
    return E.select(ctx.to_bool(cond, node.args[0]), py_number(a), py_number(b))


# ----------------------------------------------------------------------------- the builtins

syncthreads = Builtin("syncthreads", _syncthreads, "``syncthreads()``: a barrier over the thread block.")
shared_tensor = _tensor_builder("shared_tensor", MemScope.SHARED)
register_tensor = _tensor_builder("register_tensor", MemScope.REGISTER)
unroll = _loop_builder("unroll", ForKind.UNROLL)
parallel = _loop_builder("parallel", ForKind.PARALLEL)
vectorize = Builtin("vectorize", _vectorize, "``for i in vectorize(n)`` / ``vectorize(start, stop[, step])``: "
                    "a vectorize loop; ``stream=True``: its stores are streaming (past the caches on the CPU).")
cast = Builtin("cast", _cast, "``cast(x, f16)``: convert a value to a scalar type.")
bitcast = Builtin("bitcast", _bitcast, "``bitcast(x, i32)``: the bits of ``x`` read as another type of the "
                  "same size (f32 <-> i32/u32, f16/bf16 <-> i16/u16, f64 <-> i64/u64).")
select = Builtin("select", _select, "``select(cond, a, b)``: ``a if cond else b`` as an expression.")

exp = _math_builtin(Intrinsic.EXP)
exp2 = _math_builtin(Intrinsic.EXP2)
expm1 = _math_builtin(Intrinsic.EXPM1)
log = _math_builtin(Intrinsic.LOG)
log1p = _math_builtin(Intrinsic.LOG1P)
log2 = _math_builtin(Intrinsic.LOG2)
sqrt = _math_builtin(Intrinsic.SQRT)
rsqrt = _math_builtin(Intrinsic.RSQRT)
sigmoid = _math_builtin(Intrinsic.SIGMOID)
silu = _math_builtin(Intrinsic.SILU)
tanh = _math_builtin(Intrinsic.TANH)
erf = _math_builtin(Intrinsic.ERF)
sin = _math_builtin(Intrinsic.SIN)
cos = _math_builtin(Intrinsic.COS)
tan = _math_builtin(Intrinsic.TAN)
asin = _math_builtin(Intrinsic.ASIN)
acos = _math_builtin(Intrinsic.ACOS)
atan = _math_builtin(Intrinsic.ATAN)
sinh = _math_builtin(Intrinsic.SINH)
cosh = _math_builtin(Intrinsic.COSH)
asinh = _math_builtin(Intrinsic.ASINH)
acosh = _math_builtin(Intrinsic.ACOSH)
atanh = _math_builtin(Intrinsic.ATANH)
floor = _math_builtin(Intrinsic.FLOOR)
ceil = _math_builtin(Intrinsic.CEIL)
round = _math_builtin(Intrinsic.ROUND)
trunc = _math_builtin(Intrinsic.TRUNC)
pow = _math_builtin(Intrinsic.POW)
fmod = _math_builtin(Intrinsic.FMOD)
atan2 = _math_builtin(Intrinsic.ATAN2)
lgamma = _math_builtin(Intrinsic.LGAMMA)
fma = _math_builtin(Intrinsic.FMA)

#: Python functions that become intrinsics when called on IR values (``math.exp(x)``, ``abs(x)``).
PY_INTRINSICS: dict[Any, Intrinsic] = {
    math.exp: Intrinsic.EXP, math.log: Intrinsic.LOG, math.log2: Intrinsic.LOG2,
    math.sqrt: Intrinsic.SQRT, math.tanh: Intrinsic.TANH, math.erf: Intrinsic.ERF,
    math.sin: Intrinsic.SIN, math.cos: Intrinsic.COS, math.floor: Intrinsic.FLOOR,
    math.ceil: Intrinsic.CEIL, math.pow: Intrinsic.POW, math.fabs: Intrinsic.ABS,
    **{getattr(math, n): getattr(Intrinsic, n.upper()) for n in ("tan", "asin", "acos", "atan", "sinh", "cosh",
                                                                 "asinh", "acosh", "atanh")},
    math.trunc: Intrinsic.TRUNC, math.fmod: Intrinsic.FMOD, math.atan2: Intrinsic.ATAN2, math.lgamma: Intrinsic.LGAMMA,
    math.expm1: Intrinsic.EXPM1, math.log1p: Intrinsic.LOG1P,
    py.abs: Intrinsic.ABS, py.round: Intrinsic.ROUND, py.pow: Intrinsic.POW,
}
for _name, _fn in (("exp2", Intrinsic.EXP2), ("fma", Intrinsic.FMA)):
    if hasattr(math, _name):
        PY_INTRINSICS[getattr(math, _name)] = _fn


def symbol(name: str) -> SizeVar:
    """A symbolic size named ``name``; its value is read from the arguments' shapes at launch."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"symbol() needs a name that is a Python identifier, got {name!r}")
    return SizeVar(name)


# ----------------------------------------------------------------------------- device functions


class DeviceFunction:
    """A helper device function (``@taskmap.lang.func``), callable from kernels and helpers.

    It is transpiled to a ``FuncKind.DEVICE`` Function on first use and cached; the fields
    ``transpiler``, ``compiled`` and ``compiling`` are managed by :mod:`taskmap.lang.transpiler`.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not inspect.isfunction(fn):
            raise TypeError(f"@func needs a function defined with def, got {fn!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name: str = fn.__name__
        self.transpiler: Any = None   # a Transpiler holding the parsed signature
        self.compiled: Any = None     # (Function, callees, uses_gpu) once transpiled
        self.compiling = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"device function '{self.name}' can only be called inside a @taskmap.kernel "
                        "function (or another @taskmap.lang.func)")

    def __repr__(self) -> str:
        return f"<taskmap device function {self.name}>"


def func(fn: Callable[..., Any] | None = None) -> Any:
    """Decorator marking a helper device function: ``@func`` or ``@func()``."""
    if fn is None:
        return DeviceFunction
    return DeviceFunction(fn)
