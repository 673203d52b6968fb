"""The IR verifier: checks the invariants every pass may rely on.

``verify(module)`` raises :class:`taskmap.errors.IRError` naming the function, the problem and the
offending statement.  With ``lowered=True`` it also checks what lowering produces: no
``MappingFor`` left, and every ``Load``/``Store`` indexed by one flat element offset.
"""
from __future__ import annotations

from typing import Any, NoReturn

from ..errors import IRError
from . import expr as E
from . import stmt as S
from .func import FuncKind, Function, Module
from .primitives import PrimCall, needs_gpu, problem
from .printer import stmt_str
from .types import MemScope

_GPU_KINDS = (FuncKind.GPU_KERNEL, FuncKind.DEVICE)
_MAX_LINES = 8  # of the offending statement, in the message


class _Verifier:
    def __init__(self, module: Module, lowered: bool) -> None:
        self.module = module
        self.lowered = lowered
        self.func: Function = module.functions[0]
        self.stmt: S.Stmt | None = None
        self.scopes: list[set[E.Var]] = []
        self.declared: set[E.Var] = set()
        self.assignable: set[E.Var] = set()
        self.loop_depth = 0

    # ------------------------------------------------------------------ reporting
    def fail(self, problem: str) -> NoReturn:
        text = f"in function {self.func.name!r}: {problem}"
        if self.stmt is not None:
            lines = stmt_str(self.stmt).splitlines()
            if len(lines) > _MAX_LINES:
                lines = lines[:_MAX_LINES] + ["..."]
            text += "\n" + "\n".join("    " + line for line in lines)
        raise IRError(text)

    # ------------------------------------------------------------------ scopes
    def visible(self, v: E.Var) -> bool:
        return any(v in scope for scope in self.scopes)

    def declare(self, v: E.Var) -> None:
        if v in self.declared:
            self.fail(f"variable {v.name!r} is declared twice")
        self.declared.add(v)
        self.scopes[-1].add(v)

    def block(self, body: S.Stmt, new_vars: tuple[E.Var, ...] = (), loop: bool = False) -> None:
        self.scopes.append(set())
        for v in new_vars:
            self.declare(v)
        self.loop_depth += loop
        self.check_stmt(body)
        self.loop_depth -= loop
        self.scopes.pop()

    # ------------------------------------------------------------------ functions
    def check_function(self, f: Function) -> None:
        self.func, self.stmt = f, None
        self.scopes, self.declared, self.loop_depth = [set()], set(), 0
        for p in f.params:
            if not isinstance(p, E.Var):
                self.fail(f"parameter {p!r} is not a variable")
            self.declare(p)
        self.assignable = {p for p in f.params if not p.is_tensor}
        self.check_stmt(f.body)

    # ------------------------------------------------------------------ statements
    def check_stmt(self, s: S.Stmt) -> None:
        if isinstance(s, S.Seq):
            for c in s.stmts:
                self.check_stmt(c)
            return
        outer, self.stmt = self.stmt, s
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is None:
            self.fail(f"unknown statement {type(s).__name__}")
        method(s)
        self.stmt = outer

    def stmt_Evaluate(self, s: S.Evaluate) -> None:
        if isinstance(s.expr, E.CallFunc):
            self.check_call(s.expr, as_value=False)
        elif isinstance(s.expr, PrimCall):
            self.check_prim(s.expr, as_value=False)
        else:
            self.check_expr(s.expr)

    def stmt_DeclScalar(self, s: S.DeclScalar) -> None:
        if s.init is not None:
            self.check_expr(s.init)
        if not isinstance(s.var, E.Var) or s.var.is_tensor:
            self.fail(f"DeclScalar declares {s.var!r}, which is not a scalar variable")
        self.declare(s.var)
        self.assignable.add(s.var)

    def stmt_DeclTensor(self, s: S.DeclTensor) -> None:
        if not isinstance(s.var, E.Var) or not s.var.is_tensor:
            self.fail(f"DeclTensor declares {s.var!r}, which is not a tensor variable")
        if s.scope is MemScope.SHARED and self.func.kind not in _GPU_KINDS:
            self.fail(f"shared-memory tensor {s.var.name!r} in a {self.func.kind.value} function "
                      "(only GPU kernels and device functions have shared memory)")
        self.declare(s.var)

    def stmt_Assign(self, s: S.Assign) -> None:
        self.check_expr(s.value)
        v = s.var
        if not isinstance(v, E.Var) or v.is_tensor:
            self.fail(f"assignment to {v!r}, which is not a scalar variable")
        if not self.visible(v):
            self.fail(f"assignment to variable {v.name!r}, which is not defined here")
        if v not in self.assignable:
            self.fail(f"assignment to variable {v.name!r}, which is not declared by DeclScalar "
                      "(loop variables are read-only)")

    def stmt_Store(self, s: S.Store) -> None:
        self.check_access(s.tensor, s.indices)
        self.check_expr(s.value)

    def stmt_For(self, s: S.For) -> None:
        if s.step == 0:
            self.fail("for loop with step 0")
        self.check_expr(s.start)
        self.check_expr(s.stop)
        if not isinstance(s.var, E.Var) or s.var.is_tensor:
            self.fail(f"loop variable {s.var!r} is not a scalar variable")
        self.block(s.body, (s.var,), loop=True)

    def stmt_MappingFor(self, s: S.MappingFor) -> None:
        if self.lowered:
            self.fail("MappingFor left in lowered IR (lower_mappings should have replaced it)")
        if len(s.vars) != s.mapping.ndim:
            self.fail(f"{len(s.vars)} loop variable(s) for the {s.mapping.ndim}-D tasks of {s.mapping!r}")
        if s.worker is not None:
            self.check_expr(s.worker)
        bound = s.vars if s.ordinal is None else (*s.vars, s.ordinal)
        self.block(s.body, bound, loop=True)

    def stmt_If(self, s: S.If) -> None:
        self.check_cond(s.cond)
        self.block(s.then)
        if s.else_ is not None:
            self.block(s.else_)

    def stmt_While(self, s: S.While) -> None:
        self.check_cond(s.cond)
        self.block(s.body, loop=True)

    def stmt_Break(self, s: S.Break) -> None:
        if self.loop_depth == 0:
            self.fail("break outside a loop")

    def stmt_Continue(self, s: S.Continue) -> None:
        if self.loop_depth == 0:
            self.fail("continue outside a loop")

    def stmt_Return(self, s: S.Return) -> None:
        ret = self.func.ret
        if s.value is not None and ret is None:
            self.fail("return with a value in a function that returns nothing")
        if s.value is None and ret is not None:
            self.fail(f"return without a value in a function returning {ret!r}")
        if s.value is not None:
            self.check_expr(s.value)

    def stmt_Barrier(self, s: S.Barrier) -> None:
        if self.func.kind not in _GPU_KINDS:
            self.fail(f"barrier in a {self.func.kind.value} function (only in GPU kernels and device functions)")

    # ------------------------------------------------------------------ expressions
    def check_cond(self, e: E.Expr) -> None:
        self.check_expr(e)
        try:
            e.dtype
        except TypeError:
            self.fail(f"condition {e!r} has no scalar type")

    def check_var(self, v: E.Var) -> None:
        if not self.visible(v):
            self.fail(f"variable {v.name!r} is used but not defined")

    def check_access(self, tensor: Any, indices: tuple[E.Expr, ...]) -> None:
        if not isinstance(tensor, E.Var) or not tensor.is_tensor:
            self.fail(f"{tensor!r} is indexed but is not a tensor variable")
        self.check_var(tensor)
        ndim = tensor.type.ndim
        if self.lowered and len(indices) != 1:
            self.fail(f"tensor {tensor.name!r} is indexed with {len(indices)} indices in lowered IR "
                      "(expected one flat index)")
        if not self.lowered and len(indices) != ndim:
            self.fail(f"tensor {tensor.name!r} has {ndim} dimension(s) but is indexed with {len(indices)} "
                      f"ind{'ex' if len(indices) == 1 else 'ices'}")
        for i in indices:
            self.check_expr(i)

    def check_call(self, e: E.CallFunc, as_value: bool) -> None:
        try:
            callee = self.module.lookup(e.name)
        except KeyError:
            self.fail(f"call of {e.name!r}, which is not a function of the module")
        n, want = len(e.args), len(callee.params)
        if n not in (want, want + len(callee.size_vars)):
            self.fail(f"call of {e.name!r} with {n} argument(s); it takes {want}")
        if as_value and e.ret is None:
            self.fail(f"the value of a call of {e.name!r}, which returns nothing, is used")
        if e.ret is not None and e.ret is not callee.ret:
            self.fail(f"call of {e.name!r} expects a result of type {e.ret!r}, the function returns "
                      f"{callee.ret!r}")
        for a in e.args:
            if isinstance(a, E.Var):
                self.check_var(a)  # tensors may be passed to helper functions
            else:
                self.check_expr(a)

    def check_prim(self, e: PrimCall, as_value: bool) -> None:
        spec = e.op.spec
        if needs_gpu(e.op) and self.func.kind not in _GPU_KINDS:
            self.fail(f"{spec.name}() in a {self.func.kind.value} function (only in GPU kernels and device functions)")
        if as_value and not spec.value:
            self.fail(f"the value of {spec.name}(), which has none, is used")
        bad = problem(e)
        if bad is not None:
            self.fail(bad[1])
        for i, a in enumerate(e.args):
            if i in spec.refs:
                self.check_access(a.tensor, a.indices)  # an element reference: checked like a load
            else:
                self.check_expr(a)

    def check_expr(self, e: E.Expr) -> None:
        if isinstance(e, E.Var):
            self.check_var(e)
            if e.is_tensor:
                self.fail(f"tensor {e.name!r} is used as a scalar value")
        elif isinstance(e, E.Special):
            if self.func.kind not in _GPU_KINDS:
                self.fail(f"{e!r} used in a {self.func.kind.value} function "
                          "(only in GPU kernels and device functions)")
        elif isinstance(e, E.Load):
            self.check_access(e.tensor, e.indices)
        elif isinstance(e, E.CallFunc):
            self.check_call(e, as_value=True)
        elif isinstance(e, PrimCall):
            self.check_prim(e, as_value=True)
        elif isinstance(e, (E.Binary, E.Compare)):
            self.check_expr(e.a)
            self.check_expr(e.b)
        elif isinstance(e, (E.Unary, E.Cast)):
            self.check_expr(e.a)
        elif isinstance(e, E.BitCast):
            bad = E.bitcast_problem(e.a.dtype, e.type)
            if bad is not None:
                self.fail(bad)
            self.check_expr(e.a)
        elif isinstance(e, E.Select):
            for c in (e.cond, e.a, e.b):
                self.check_expr(c)
        elif isinstance(e, E.Call):
            for a in e.args:
                self.check_expr(a)
        elif not isinstance(e, (E.Const, E.SizeVar)):
            self.fail(f"unknown expression {type(e).__name__}")


def verify(module: Module, *, lowered: bool = False) -> None:
    """Check the invariants of ``module``; raise :class:`IRError` on the first violation.

    Every variable is defined before use (parameters, declarations in an enclosing scope, loop
    variables in their body) and declared once; tensors are indexed with one index per dimension
    (one flat index when ``lowered``); assignments target declared scalars or scalar parameters;
    GPU-only constructs (``threadIdx``, barriers, warp primitives, ``cp_async``, ``mma``) appear in GPU
    kernels and device functions only; primitives have well-formed operands
    (:func:`~taskmap.ir.primitives.problem`); calls name functions of
    the module with the right number of arguments; returns match the function's result type.
    """
    v = _Verifier(module, lowered)
    for f in module.functions:
        v.check_function(f)
