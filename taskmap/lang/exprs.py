"""Expressions of the kernel DSL: Python AST -> a Python value or an IR expression.

Evaluation is partial: a subexpression whose operands are all Python values (closure ints, tile
sizes, tuples, task mappings, config objects) is evaluated in Python at transpile time; once an
IR value is involved, IR is built. So ``BM * 2`` is an int, ``spatial(4, 8)`` a mapping, and
``a[i] * BM`` an IR ``Binary``.
"""
from __future__ import annotations

import ast
import builtins as py
import operator
import types
from dataclasses import dataclass
from typing import Any

from ..errors import DSLError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, f32, i32
from ..ir.expr import BinOp, CmpOp, Expr, Intrinsic, UnOp, Var, _Dim3
from ..ir.mapping import MappingOn, TaskMapping
from .builtins import (PY_INTRINSICS, Builtin, DeviceFunction, LoopRange, TensorSpec, _Attrs, describe,
                       intrinsic_call, is_ir, is_number, is_tensor, py_number, range_args)
from .source import KernelSource, syntax_name

BINOPS: dict[type, tuple[BinOp | None, Any]] = {
    ast.Add: (BinOp.ADD, operator.add), ast.Sub: (BinOp.SUB, operator.sub),
    ast.Mult: (BinOp.MUL, operator.mul), ast.Div: (BinOp.DIV, operator.truediv),
    ast.FloorDiv: (BinOp.FLOORDIV, operator.floordiv), ast.Mod: (BinOp.MOD, operator.mod),
    ast.BitAnd: (BinOp.BITAND, operator.and_), ast.BitOr: (BinOp.BITOR, operator.or_),
    ast.BitXor: (BinOp.BITXOR, operator.xor), ast.LShift: (BinOp.SHL, operator.lshift),
    ast.RShift: (BinOp.SHR, operator.rshift), ast.Pow: (None, operator.pow),
}
CMPOPS: dict[type, tuple[CmpOp | None, Any]] = {
    ast.Eq: (CmpOp.EQ, operator.eq), ast.NotEq: (CmpOp.NE, operator.ne),
    ast.Lt: (CmpOp.LT, operator.lt), ast.LtE: (CmpOp.LE, operator.le),
    ast.Gt: (CmpOp.GT, operator.gt), ast.GtE: (CmpOp.GE, operator.ge),
    ast.Is: (None, operator.is_), ast.IsNot: (None, operator.is_not),
    ast.In: (None, lambda a, b: a in b), ast.NotIn: (None, lambda a, b: a not in b),
}
UNARY_PY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}


@dataclass(frozen=True)
class TensorIndex:
    """A tensor indexed with some of its indices (``t[i]`` of a 2-D ``t``, inside ``t[i][j]``)."""

    tensor: Var
    indices: tuple[Expr, ...]


def has_ir(v: Any) -> bool:
    """Whether a value is, or contains, something only meaningful inside the kernel."""
    if isinstance(v, (Expr, TensorIndex, LoopRange, TensorSpec, S.Stmt)):
        return True
    if isinstance(v, (tuple, list)):
        return any(has_ir(x) for x in v)
    if isinstance(v, dict):
        return any(has_ir(x) for x in v.values())
    if isinstance(v, MappingOn):
        return has_ir(v.worker)
    return False


def exc_text(e: BaseException) -> str:
    return str(e) if isinstance(e, (TypeError, ValueError)) else f"{type(e).__name__}: {e}"


def indices_word(n: int) -> str:
    return f"{n} index" if n == 1 else f"{n} indices"


class ExprVisitor:
    """Evaluates expression nodes; subclasses provide name lookup and device-function calls."""

    src: KernelSource

    # ------------------------------------------------------------------ hooks
    def lookup(self, name: str, node: ast.AST) -> Any:
        raise NotImplementedError

    def call_device(self, df: DeviceFunction, node: ast.Call, args: list, kwargs: dict) -> Expr:
        raise NotImplementedError

    def mark_gpu(self, node: ast.AST, what: str) -> None:
        """Record that ``node`` uses a GPU-only feature (``threadIdx``, ``syncthreads``, ...)."""

    # ------------------------------------------------------------------ errors and conversions
    def error(self, node: ast.AST | None, message: str) -> DSLError:
        return self.src.error(node, message)

    def unsupported(self, node: ast.AST) -> DSLError:
        return self.error(node, f"unsupported syntax: {syntax_name(node)}")

    def value_str(self, v: Any) -> str:
        if is_tensor(v):
            return f"tensor '{v.name}'"
        if is_ir(v):
            return f"a run-time {v.dtype!r} value"
        return describe(v)

    def to_scalar(self, v: Any, node: ast.AST, like: Expr | None = None) -> Expr:
        """``v`` as a scalar IR expression (Python numbers become constants), or a DSLError."""
        if isinstance(v, Expr):
            if is_tensor(v):
                raise self.error(node, f"tensor '{v.name}' cannot be used as a scalar value; "
                                       "index it, as in t[i, j]")
            if isinstance(v, E.CallFunc) and v.ret is None:
                raise self.error(node, f"function '{v.name}' returns no value")
            return v
        if is_number(v):
            return E.as_expr(py_number(v), like=like)
        if isinstance(v, LoopRange):
            raise self.error(node, f"{v.what}(...) can only be used as the iterable of a for loop")
        if isinstance(v, TensorSpec):
            raise self.error(node, f"{v.what}(...) must be assigned to a variable, as in "
                                   f"`buf = {v.what}(f32, [64, 8])`")
        if isinstance(v, S.Stmt):
            raise self.error(node, "this call is a statement and has no value")
        raise self.error(node, f"cannot use {describe(v)} as a value in a kernel")

    def operand(self, v: Any, node: ast.AST) -> Any:
        """An IR scalar, or a Python number (left as is so that it adopts the other operand's type)."""
        return py_number(v) if is_number(v) else self.to_scalar(v, node)

    def to_bool(self, v: Any, node: ast.AST) -> Any:
        """A condition: a Python bool for compile-time values, else a bool IR expression."""
        if not is_ir(v):
            return bool(v)
        e = self.to_scalar(v, node)
        return e if e.dtype.is_bool else E.compare(CmpOp.NE, e, 0)

    def index_expr(self, v: Any, node: ast.AST) -> Expr:
        e = self.to_scalar(v, node)
        if not e.dtype.is_integer:
            raise self.error(node, f"tensor indices must be integers, got a {e.dtype!r} value")
        return e

    # ------------------------------------------------------------------ dispatch
    def eval(self, node: ast.AST) -> Any:
        method = getattr(self, "expr_" + type(node).__name__, None)
        if method is None:
            raise self.unsupported(node)
        try:
            return method(node)
        except DSLError:
            raise
        except Exception as e:  # IR construction (types) and compile-time Python evaluation
            raise self.error(node, exc_text(e)) from e

    def expr_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def expr_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id, node)

    def expr_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.eval(e) for e in node.elts)

    def expr_List(self, node: ast.List) -> list:
        return [self.eval(e) for e in node.elts]

    def expr_Attribute(self, node: ast.Attribute) -> Any:
        base = self.eval(node.value)
        attr = node.attr
        if isinstance(base, _Dim3):
            if attr not in ("x", "y", "z"):
                raise self.error(node, f"{base.reg.value} has no attribute '{attr}' (use .x, .y or .z)")
            self.mark_gpu(node, f"{base.reg.value}.{attr}")
            return getattr(base, attr)
        if isinstance(base, _Attrs):
            raise self.error(node, f"attrs.{attr} can only be assigned, as in `attrs.{attr} = ...`")
        if is_tensor(base):
            t = base.type
            if attr == "shape":
                return tuple(int(s.value) if isinstance(s, E.Const) else s for s in t.shape)
            if attr == "dtype":
                return t.dtype
            if attr == "ndim":
                return t.ndim
            raise self.error(node, f"tensor '{base.name}' has no attribute '{attr}' (only shape, dtype, ndim)")
        if is_ir(base):
            raise self.error(node, f"a run-time {base.dtype!r} value has no attribute '{attr}'")
        return getattr(base, attr)

    # ------------------------------------------------------------------ subscripts
    def index_nodes(self, sl: ast.AST) -> list[ast.AST]:
        elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        for e in elts:
            if isinstance(e, (ast.Slice, ast.Starred)):
                raise self.unsupported(e)
        return list(elts)

    def subscript(self, node: ast.Subscript) -> Any:
        """Evaluate ``node``; a tensor gives a (possibly partial) :class:`TensorIndex`."""
        base = self.subscript(node.value) if isinstance(node.value, ast.Subscript) else self.eval(node.value)
        nodes = self.index_nodes(node.slice)
        if is_tensor(base):
            base = TensorIndex(base, ())
        if isinstance(base, TensorIndex):
            idx = tuple(self.index_expr(self.eval(n), n) for n in nodes)
            total = base.indices + idx
            t = base.tensor
            if len(total) > t.type.ndim:
                raise self.error(node, f"tensor '{t.name}' has {t.type.ndim} dimensions but is indexed "
                                       f"with {indices_word(len(total))}")
            return TensorIndex(t, total)
        if is_ir(base):
            raise self.error(node, f"cannot index a run-time {base.dtype!r} scalar")
        keys = [self.eval(n) for n in nodes]
        key = keys[0] if not isinstance(node.slice, ast.Tuple) else tuple(keys)
        if has_ir(key):
            raise self.error(node.slice, f"cannot index {describe(base)} with a run-time value")
        try:
            return base[key]
        except Exception as e:
            raise self.error(node, exc_text(e)) from e

    def finish_index(self, ti: TensorIndex, node: ast.AST) -> TensorIndex:
        t = ti.tensor
        if len(ti.indices) != t.type.ndim:
            raise self.error(node, f"tensor '{t.name}' has {t.type.ndim} dimensions but is indexed "
                                   f"with {indices_word(len(ti.indices))}")
        return ti

    def expr_Subscript(self, node: ast.Subscript) -> Any:
        v = self.subscript(node)
        if isinstance(v, TensorIndex):
            ti = self.finish_index(v, node)
            return E.Load(ti.tensor, ti.indices)
        return v

    # ------------------------------------------------------------------ operators
    def binop(self, op: ast.operator, a: Any, b: Any, node: ast.AST, na: ast.AST, nb: ast.AST) -> Any:
        """``a op b``: in Python when both are Python values, else IR."""
        if type(op) not in BINOPS:
            raise self.error(node, f"unsupported syntax: {syntax_name(op)}")
        ir_op, py_op = BINOPS[type(op)]
        if not is_ir(a) and not is_ir(b):
            return py_op(a, b)
        x, y = self.operand(a, na), self.operand(b, nb)
        if ir_op is None:
            return self.power(x, y)
        return E.binary(ir_op, x, y)

    def power(self, x: Any, y: Any) -> Expr:
        if is_ir(x) and isinstance(y, (int, float)) and not isinstance(y, bool) and y in (1, 2, 3) \
                and (isinstance(y, int) or x.dtype.is_float):
            out = x
            for _ in range(int(y) - 1):
                out = out * x
            return out
        base = x if is_ir(x) else E.as_expr(x, like=y)
        return E.call(Intrinsic.POW, base, E.as_expr(y, like=base))

    def expr_BinOp(self, node: ast.BinOp) -> Any:
        a = self.eval(node.left)
        b = self.eval(node.right)
        return self.binop(node.op, a, b, node, node.left, node.right)

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.eval(node.operand)
        if not is_ir(v):
            return UNARY_PY[type(node.op)](v)
        e = self.to_scalar(v, node.operand)
        if isinstance(node.op, ast.USub):
            return E.Unary(UnOp.NEG, e)
        if isinstance(node.op, ast.UAdd):
            return e
        if isinstance(node.op, ast.Not):
            return E.logical_not(self.to_bool(e, node.operand))
        if not e.dtype.is_integer:
            raise self.error(node, f"operator ~ needs an integer operand, got {e.dtype!r}")
        return E.Unary(UnOp.BITNOT, e)

    def expr_BoolOp(self, node: ast.BoolOp) -> Any:
        is_and = isinstance(node.op, ast.And)
        parts: list[Expr] = []
        last: Any = None
        for sub in node.values:
            v = self.eval(sub)
            if is_ir(v):
                parts.append(self.to_bool(v, sub))
                continue
            if bool(v) != is_and:       # `and` with a false / `or` with a true compile-time value
                return v if not parts else E.const(not is_and)
            last = v                     # it does not decide the result: drop it
        if not parts:
            return last
        return E.logical_and(*parts) if is_and else E.logical_or(*parts)

    def expr_Compare(self, node: ast.Compare) -> Any:
        left, lnode = self.eval(node.left), node.left
        parts: list[Expr] = []
        for op, rnode in zip(node.ops, node.comparators):
            right = self.eval(rnode)
            ir_op, py_op = CMPOPS[type(op)]
            if not is_ir(left) and not is_ir(right):
                if not py_op(left, right):
                    return False if not parts else E.const(False)
            elif ir_op is None:
                raise self.error(node, f"unsupported syntax: '{type(op).__name__.lower()}' comparison of "
                                       "run-time values")
            else:
                parts.append(E.compare(ir_op, self.operand(left, lnode), self.operand(right, rnode)))
            left, lnode = right, rnode
        return E.logical_and(*parts) if parts else True

    def expr_IfExp(self, node: ast.IfExp) -> Any:
        c = self.eval(node.test)
        if not is_ir(c):
            return self.eval(node.body if c else node.orelse)
        cond = self.to_bool(c, node.test)
        a = self.operand(self.eval(node.body), node.body)
        b = self.operand(self.eval(node.orelse), node.orelse)
        return E.select(cond, a, b)

    # ------------------------------------------------------------------ calls
    def expr_Call(self, node: ast.Call) -> Any:
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise self.unsupported(a)
        for k in node.keywords:
            if k.arg is None:
                raise self.error(k.value, "unsupported syntax: **kwargs in a call")
        f = self.eval(node.func)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords}
        if isinstance(f, Builtin):
            return f.impl(self, node, args, kwargs)
        if isinstance(f, DeviceFunction):
            return self.call_device(f, node, args, kwargs)
        if f is py.range:
            return range_args(self, node, "range", S.ForKind.SERIAL, args, kwargs)
        if is_ir(f):
            raise self.error(node.func, f"{self.value_str(f)} is not callable")
        if not has_ir(args) and not has_ir(kwargs):
            try:
                return f(*args, **kwargs)
            except DSLError:
                raise
            except Exception as e:
                raise self.error(node, f"error while evaluating `{self.src.snippet(node)}` at compile time: "
                                       f"{type(e).__name__}: {e}") from e
        return self.call_with_ir(f, node, args, kwargs)

    def call_with_ir(self, f: Any, node: ast.Call, args: list, kwargs: dict) -> Any:
        """A Python callable applied to run-time values: casts, math, min/max, ``mapping.on(w)``."""
        name = getattr(f, "__name__", type(f).__name__)
        if kwargs:
            raise self.error(node, f"{name}() takes no keyword arguments when called with run-time values")

        def one_arg() -> Expr:
            if len(args) != 1:
                raise self.error(node, f"{name}() takes 1 argument here, got {len(args)}")
            return self.to_scalar(args[0], node.args[0])

        if isinstance(f, ScalarType):
            return E.cast(one_arg(), f)
        if f is py.float:
            return E.cast(one_arg(), f32)
        if f is py.int:
            return E.cast(one_arg(), i32)
        if f is py.bool:
            return self.to_bool(one_arg(), node)
        if f is py.min or f is py.max:
            return self.min_max(f is py.min, node, args)
        try:
            intr = PY_INTRINSICS.get(f)
        except TypeError:  # unhashable callable
            intr = None
        if intr is not None:
            return intrinsic_call(self, node, intr, args)
        if isinstance(f, types.MethodType) and isinstance(f.__self__, TaskMapping) and f.__name__ == "on":
            worker = one_arg()
            if not worker.dtype.is_integer:
                raise self.error(node.args[0], f"a worker index must be an integer, got {worker.dtype!r}")
            return MappingOn(f.__self__, worker)
        raise self.error(node, f"cannot call {name}() with run-time values: only DSL builtins, "
                               "@taskmap.lang.func device functions, casts and math functions accept them")

    def min_max(self, is_min: bool, node: ast.Call, args: list) -> Expr:
        vals = list(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else list(args)
        if len(vals) < 2:
            raise self.error(node, f"{'min' if is_min else 'max'}() needs at least 2 values")
        py_vals = [py_number(v) for v in vals if is_number(v)]
        ir_vals = [self.to_scalar(v, node) for v in vals if not is_number(v)]
        fold = E.minimum if is_min else E.maximum
        out: Any = ir_vals[0]
        for v in ir_vals[1:]:
            out = fold(out, v)
        if py_vals:
            out = fold(out, (py.min if is_min else py.max)(py_vals))
        return out
