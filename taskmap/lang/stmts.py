"""Statements of the kernel DSL: assignments, loops, branches, returns (Python AST -> IR Stmt).

Local names follow the rule documented in :mod:`taskmap.lang.scope`.
"""
from __future__ import annotations

import ast
from typing import Any

from ..errors import DSLError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, i32
from ..ir.expr import Expr, Var
from ..ir.functor import IRRewriter, collect
from ..ir.primitives import PrimCall
from ..ir.mapping import MappingLoop, MappingLoopKind, MappingOn, TaskMapping
from ..ir.types import tensor_type
from .builtins import LoopRange, TensorSpec, _Attrs, is_ir, is_number, is_tensor, py_number
from .exprs import ExprVisitor, TensorIndex, exc_text
from .scope import AssignmentInfo, BindKind, Frame, LoopKind, Scope, target_names
from .source import _MISSING


def is_size_expr(e: Expr) -> bool:
    """Whether ``e`` only depends on constants and symbolic sizes (so it can stay compile-time)."""
    return not collect(e, (Var, E.Special, E.Load, E.CallFunc, PrimCall))


class StmtVisitor(ExprVisitor):
    """Builds the statements of one function body; the driver (``Transpiler``) sets the state."""

    info: AssignmentInfo
    scope: Scope
    block: list[S.Stmt]
    hoists: dict[int, dict[str, ScalarType]]   # id(compound stmt) -> names declared before it
    new_hoist: bool
    first_dtype: dict[str, ScalarType]
    is_device: bool
    ret: ScalarType | None

    def set_kernel_attr(self, node: ast.Attribute, value: Any, vnode: ast.AST) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ blocks
    def emit(self, s: S.Stmt) -> None:
        self.block.append(s)

    def body(self, stmts: list[ast.stmt], frame: Frame | None, bind: list[tuple[str, Var]] = ()) -> S.Stmt:
        """Transpile ``stmts`` into one statement, inside a new block when ``frame`` is given."""
        saved, self.block = self.block, []
        try:
            if frame is None:
                for s in stmts:
                    self.stmt(s)
            else:
                with self.scope.block(frame):
                    for name, var in bind:
                        self.scope.bind(name, BindKind.LOOP, var)
                    for s in stmts:
                        self.stmt(s)
            return S.seq(*self.block) if self.block else S.Seq(())
        finally:
            self.block = saved

    def stmt(self, node: ast.stmt) -> None:
        for name, dtype in self.hoists.get(id(node), {}).items():
            b = self.scope.get(name)
            if b is None or not self.scope.visible(b):
                var = Var(name, dtype)
                self.emit(S.DeclScalar(var))
                self.scope.bind(name, BindKind.SCALAR, var)
        method = getattr(self, "stmt_" + type(node).__name__, None)
        if method is None:
            raise self.unsupported(node)
        try:
            method(node)
        except DSLError:
            raise
        except Exception as e:
            raise self.error(node, exc_text(e)) from e

    # ------------------------------------------------------------------ names
    def lookup(self, name: str, node: ast.AST) -> Any:
        b = self.scope.get(name)
        if b is not None:
            if self.scope.visible(b):
                return b.value
            if b.kind is BindKind.SCALAR:     # first assigned in a block that is closed now: hoist it
                frame = b.frames[self.scope.common(b)]
                slot = self.hoists.setdefault(id(frame.node), {})
                if name not in slot:
                    slot[name] = self.first_dtype.get(name, b.value.dtype)
                    self.new_hoist = True
                return b.value
            if b.kind is BindKind.CONST and self.info.single_site(name):
                return b.value
            if b.kind is BindKind.CONST:
                raise self.error(node, f"'{name}' was bound to a compile-time value inside a run-time loop or "
                                       "branch and cannot be used outside it")
            if b.kind is BindKind.LOOP:
                raise self.error(node, f"loop variable '{name}' cannot be used after its loop")
            raise self.error(node, f"tensor '{name}' is declared inside a loop or branch and cannot be "
                                   "used outside it")
        if name in self.info.assigned:
            hint = " (to carry a value across loop iterations, assign it before the loop)" \
                if self.scope.innermost_loop() is not None else ""
            raise self.error(node, f"local variable '{name}' is referenced before assignment{hint}")
        value = self.src.lookup_outer(name)
        if value is _MISSING:
            raise self.error(node, f"name '{name}' is not defined")
        return value

    def declare(self, name: str, e: Expr) -> Var:
        var = Var(name, e.dtype)
        self.emit(S.DeclScalar(var, e))
        self.scope.bind(name, BindKind.SCALAR, var)
        self.first_dtype.setdefault(name, e.dtype)
        return var

    def assign_name(self, name: str, value: Any, target: ast.AST, vnode: ast.AST) -> None:
        b = self.scope.get(name)
        visible = b is not None and self.scope.visible(b)
        if isinstance(value, TensorSpec):
            if visible:
                raise self.error(target, f"cannot declare tensor '{name}': the name is already defined")
            var = Var(name, tensor_type(value.dtype, value.shape, value.scope))
            self.emit(S.DeclTensor(var))
            self.scope.bind(name, BindKind.TENSOR, var)
            return
        if isinstance(value, (LoopRange, S.Stmt, TensorIndex)):
            self.to_scalar(value, vnode)  # raises a precise error
        if visible:
            assert b is not None
            if b.kind is BindKind.TENSOR:
                raise self.error(target, f"cannot assign to tensor '{name}'; store into its elements, "
                                         f"as in {name}[...] = value")
            if b.kind is BindKind.LOOP:
                raise self.error(target, f"cannot assign to loop variable '{name}'")
            if b.kind in (BindKind.SCALAR, BindKind.PARAM):
                e = self.to_scalar(value, vnode)
                self.emit(S.Assign(b.value, E.cast(e, b.value.dtype)))
                return
            if is_ir(value) or is_number(value):
                raise self.error(target, f"'{name}' holds the compile-time value {self.value_str(b.value)} and "
                                         "cannot be reassigned a run-time value")
            if not self.scope.same_block(b):
                raise self.error(target, f"cannot rebind the compile-time name '{name}' inside a run-time "
                                         "loop or branch")
            self.scope.bind(name, BindKind.CONST, value)
            return
        if is_tensor(value):
            self.scope.bind(name, BindKind.TENSOR, value)    # an alias of a tensor
        elif not is_ir(value) and not is_number(value):
            self.scope.bind(name, BindKind.CONST, value)     # mappings, tuples, config objects...
        elif self.info.single_site(name) and (is_number(value) or is_size_expr(value)):
            self.scope.bind(name, BindKind.CONST, py_number(value))
        else:
            self.declare(name, self.to_scalar(value, vnode))

    # ------------------------------------------------------------------ assignments
    def stmt_Assign(self, node: ast.Assign) -> None:
        value = self.eval(node.value)
        for target in node.targets:
            self.assign(target, value, node.value)

    def assign(self, target: ast.AST, value: Any, vnode: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.assign_name(target.id, value, target, vnode)
        elif isinstance(target, ast.Subscript):
            self.store(target, value, vnode)
        elif isinstance(target, (ast.Tuple, ast.List)):
            self.assign_tuple(target, value, vnode)
        elif isinstance(target, ast.Attribute):
            base = self.eval(target.value)
            if not isinstance(base, _Attrs):
                raise self.error(target, "unsupported syntax: assignment to an attribute (only attrs.grid_dim "
                                         "and attrs.block_dim can be set)")
            self.set_kernel_attr(target, value, vnode)
        else:
            raise self.unsupported(target)

    def assign_tuple(self, target: ast.Tuple | ast.List, value: Any, vnode: ast.AST) -> None:
        for elt in target.elts:
            if isinstance(elt, ast.Starred):
                raise self.unsupported(elt)
        if not isinstance(value, (tuple, list)):
            raise self.error(vnode, f"cannot unpack {self.value_str(value)} into {len(target.elts)} names")
        if len(value) != len(target.elts):
            raise self.error(target, f"cannot unpack {len(value)} values into {len(target.elts)} targets")
        # Evaluate every value before assigning any target, so that `a, b = b, a` swaps.
        overwrites = any(isinstance(t, ast.Subscript) or self._bound_scalar(t) for t in target.elts)
        values = list(value)
        if overwrites:
            for k, v in enumerate(values):
                if is_ir(v) and not is_tensor(v) and not isinstance(v, E.Const):
                    tmp = Var("tmp", self.to_scalar(v, vnode).dtype)
                    self.emit(S.DeclScalar(tmp, v))
                    values[k] = tmp
        for elt, v in zip(target.elts, values):
            self.assign(elt, v, vnode)

    def _bound_scalar(self, t: ast.AST) -> bool:
        names = target_names(t)
        return any((b := self.scope.get(n)) is not None and self.scope.visible(b)
                   and b.kind in (BindKind.SCALAR, BindKind.PARAM) for n in names)

    def store_target(self, target: ast.Subscript) -> TensorIndex:
        ti = self.subscript(target)
        if not isinstance(ti, TensorIndex):
            raise self.error(target, f"can only assign to elements of tensors, not of {self.value_str(ti)}")
        return self.finish_index(ti, target)

    def store(self, target: ast.Subscript, value: Any, vnode: ast.AST) -> None:
        ti = self.store_target(target)
        e = self.to_scalar(value, vnode)
        self.emit(S.Store(ti.tensor, ti.indices, E.cast(e, ti.tensor.dtype)))

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        value = self.eval(node.value)
        t = node.target
        if isinstance(t, ast.Name):
            cur = self.lookup(t.id, t)
            self.assign_name(t.id, self.binop(node.op, cur, value, node, t, node.value), t, node.value)
        elif isinstance(t, ast.Subscript):
            ti = self.store_target(t)
            cur = E.Load(ti.tensor, ti.indices)
            new = self.to_scalar(self.binop(node.op, cur, value, node, t, node.value), node)
            self.emit(S.Store(ti.tensor, ti.indices, E.cast(new, ti.tensor.dtype)))
        else:
            raise self.unsupported(t)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if not isinstance(node.target, ast.Name):
            raise self.error(node.target, "unsupported syntax: annotated assignment to a non-name")
        name = node.target.id
        dtype = self.eval(node.annotation)
        if isinstance(dtype, str):
            dtype = self.src.eval_text(dtype)
        if not isinstance(dtype, ScalarType):
            raise self.error(node.annotation, f"local variables can only be annotated with a scalar type such as "
                                              f"f32 (got {self.value_str(dtype)}); declare tensors with "
                                              "shared_tensor() or register_tensor()")
        value = None if node.value is None else self.eval(node.value)
        init = None if node.value is None else E.cast(self.to_scalar(value, node.value), dtype)
        b = self.scope.get(name)
        if b is not None and self.scope.visible(b):
            if b.kind in (BindKind.SCALAR, BindKind.PARAM) and b.value.dtype is dtype:
                if init is not None:
                    self.emit(S.Assign(b.value, init))
                return
            raise self.error(node.target, f"'{name}' is already defined")
        var = Var(name, dtype)
        self.emit(S.DeclScalar(var, init))
        self.scope.bind(name, BindKind.SCALAR, var)
        self.first_dtype.setdefault(name, dtype)

    # ------------------------------------------------------------------ simple statements
    def stmt_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):
            return  # docstrings and other bare constants
        v = self.eval(node.value)
        if isinstance(v, S.Stmt):
            self.emit(v)
        elif isinstance(v, (LoopRange, TensorSpec)):
            self.to_scalar(v, node.value)  # raises: these need a for loop / an assignment
        elif is_ir(v) and not is_tensor(v) and collect(v, (E.CallFunc, PrimCall)):
            self.emit(S.Evaluate(v))

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def _loop_control(self, node: ast.stmt, what: str) -> None:
        f = self.scope.innermost_loop()
        if f is None:
            raise self.error(node, f"'{what}' outside loop")
        if f.loop is LoopKind.MAPPING:
            raise self.error(node, f"'{what}' is not supported directly inside a task-mapping loop")

    def stmt_Break(self, node: ast.Break) -> None:
        self._loop_control(node, "break")
        self.emit(S.Break())

    def stmt_Continue(self, node: ast.Continue) -> None:
        self._loop_control(node, "continue")
        self.emit(S.Continue())

    def stmt_Return(self, node: ast.Return) -> None:
        value = None if node.value is None else self.eval(node.value)
        if value is None:
            if self.ret is not None:
                raise self.error(node, f"'{self.src.name}' must return a {self.ret!r} value")
            self.emit(S.Return())
            return
        if self.ret is None:
            what = "a kernel" if not self.is_device else "a function without a return annotation (-> f32)"
            raise self.error(node.value, f"{what} cannot return a value")
        self.emit(S.Return(E.cast(self.to_scalar(value, node.value), self.ret)))

    def stmt_Assert(self, node: ast.Assert) -> None:
        c = self.eval(node.test)
        if is_ir(c):
            raise self.error(node.test, "assert needs a compile-time condition (run-time asserts are not supported)")
        if not c:
            msg = "" if node.msg is None else f": {self.eval(node.msg)}"
            raise self.error(node, f"assertion failed{msg}")

    # ------------------------------------------------------------------ control flow
    def stmt_If(self, node: ast.If) -> None:
        c = self.eval(node.test)
        if not is_ir(c):  # compile-time condition: only the branch taken, no new block
            for s in node.body if c else node.orelse:
                self.stmt(s)
            return
        cond = self.to_bool(c, node.test)
        then = self.body(node.body, Frame(node))
        els = self.body(node.orelse, Frame(node)) if node.orelse else None
        self.emit(S.If(cond, then, els))

    def stmt_While(self, node: ast.While) -> None:
        if node.orelse:
            raise self.error(node, "unsupported syntax: while ... else")
        c = self.eval(node.test)
        if not is_ir(c) and not c:
            return
        cond = self.to_bool(c, node.test) if is_ir(c) else E.const(True)
        self.emit(S.While(cond, self.body(node.body, Frame(node, LoopKind.RANGE))))

    def stmt_For(self, node: ast.For) -> None:
        if node.orelse:
            raise self.error(node, "unsupported syntax: for ... else")
        if self.enumerate_for(node):
            return
        it = self.eval(node.iter)
        if isinstance(it, LoopRange):
            self.range_for(node, it)
        elif isinstance(it, MappingOn):
            self.mapping_for(node, it.mapping, it.worker, MappingLoopKind.SEQUENTIAL)
        elif isinstance(it, MappingLoop):
            self.mapping_for(node, it.mapping, None, it.kind, stream=it.stream)
        elif isinstance(it, TaskMapping):
            self.mapping_for(node, it, None, MappingLoopKind.SEQUENTIAL)
        else:
            raise self.error(node.iter, f"cannot iterate over {self.value_str(it)} in a kernel: use range(), "
                                        "unroll(), parallel(), vectorize() or a task mapping")

    def range_for(self, node: ast.For, r: LoopRange) -> None:
        if not isinstance(node.target, ast.Name):
            raise self.error(node.target, f"a {r.what}() loop needs a single loop variable")
        var = Var(node.target.id, i32)
        body = self.body(node.body, Frame(node, LoopKind.RANGE), [(var.name, var)])
        if r.stream:
            body = _Streaming().visit(body)
        start, stop = E.as_expr(r.start), E.as_expr(r.stop)
        self.emit(S.For(var, start, stop, r.step, body, r.kind))

    def enumerate_for(self, node: ast.For) -> bool:
        """``for k, (i, j) in enumerate(m.on(w))``: a mapping loop that also binds each task's
        position in its worker's task list.  Returns False if ``node`` is not such a loop."""
        it = node.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate"
                and len(it.args) == 1 and not it.keywords and self.lookup(it.func.id, it.func) is enumerate):
            return False
        inner = self.eval(it.args[0])
        if isinstance(inner, MappingOn):
            m, worker, kind = inner.mapping, inner.worker, MappingLoopKind.SEQUENTIAL
        elif isinstance(inner, MappingLoop):
            m, worker, kind = inner.mapping, None, inner.kind
        elif isinstance(inner, TaskMapping):
            m, worker, kind = inner, None, MappingLoopKind.SEQUENTIAL
        else:
            raise self.error(it.args[0], f"enumerate() in a kernel takes a task mapping loop, got {self.value_str(inner)}")
        t = node.target
        if not (isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == 2 and isinstance(t.elts[0], ast.Name)):
            raise self.error(t, "write enumerate loops over task mappings as `for k, (i, j) in enumerate(...)`")
        self.mapping_for(node, m, worker, kind, target=t.elts[1], ordinal_name=t.elts[0].id)
        return True

    def mapping_for(self, node: ast.For, m: TaskMapping, worker: Any, kind: MappingLoopKind,
                    target: ast.AST | None = None, ordinal_name: str | None = None, stream: bool = False) -> None:
        t = node.target if target is None else target
        elts = t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]
        for e in elts:
            if not isinstance(e, ast.Name):
                raise self.error(e, "the targets of a task-mapping loop must be plain names")
        if len(elts) != m.ndim:
            raise self.error(t, f"the task mapping {m!r} has {m.ndim}-D tasks but the loop has "
                                f"{len(elts)} loop variable(s)")
        w = None
        if worker is not None:
            w = self.to_scalar(worker, node.iter)
            if not w.dtype.is_integer:
                raise self.error(node.iter, f"a worker index must be an integer, got {w.dtype!r}")
        vars_ = tuple(Var(e.id, i32) for e in elts)  # type: ignore[union-attr]
        ordinal = Var(ordinal_name, i32) if ordinal_name is not None else None
        bind = [(v.name, v) for v in (*vars_, *([ordinal] if ordinal is not None else []))]
        body = self.body(node.body, Frame(node, LoopKind.MAPPING), bind)
        if stream:
            body = _Streaming().visit(body)
        self.emit(S.MappingFor(vars_, m, w, kind, body, ordinal))


class _Streaming(IRRewriter):
    """Marks the stores of a ``vectorize(stream=True)`` loop's body as streaming."""

    def visit_Store(self, s: S.Store) -> S.Stmt:
        return S.Store(s.tensor, s.indices, s.value, True)
