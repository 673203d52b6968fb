"""The DSL driver: a Python function -> an IR :class:`~taskmap.ir.func.Module`.

``transpile(fn)`` parses ``fn``'s source, evaluates its parameter annotations, transpiles its
body (see :mod:`.exprs`, :mod:`.stmts`, and :mod:`.scope` for the rule on local names), decides
its kind (GPU kernel when it uses ``attrs``/``threadIdx``/``syncthreads``/``shared_tensor``...),
and returns a module with the function first and every device function it calls, transitively.
"""
from __future__ import annotations

import ast
from typing import Any

from ..errors import DSLError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType
from ..ir.expr import Expr, SizeVar, Var
from ..ir.func import FuncKind, Function, LaunchConfig, Module
from ..ir.functor import collect
from ..ir.primitives import PrimCall
from ..ir.types import MemScope, TensorType
from .builtins import DeviceFunction, _Attrs, const_int, is_tensor
from .scope import BindKind, Scope, scan_assignments
from .source import KernelSource
from .stmts import StmtVisitor

#: Re-transpiling is needed when a variable must be hoisted out of a block; this bounds it.
MAX_PASSES = 8


class Transpiler(StmtVisitor):
    """Transpiles one Python function (a kernel, or a device function when ``kind`` is DEVICE)."""

    def __init__(self, py_fn: Any, kind: FuncKind | None = None) -> None:
        self.src = KernelSource(py_fn)
        self.tree = self.src.tree
        self.requested_kind = kind
        self.is_device = kind is FuncKind.DEVICE
        self.info = scan_assignments(self.tree)
        self.hoists = {}
        self.params, self.ret = self.parse_header()
        self.gpu_use: tuple[ast.AST, str] | None = None
        self.callees: list[DeviceFunction] = []

    # ------------------------------------------------------------------ header
    def parse_header(self) -> tuple[tuple[Var, ...], ScalarType | None]:
        a = self.tree.args
        for what, bad in (("positional-only parameters", a.posonlyargs), ("*args", a.vararg),
                          ("keyword-only parameters", a.kwonlyargs), ("**kwargs", a.kwarg),
                          ("default parameter values", a.defaults)):
            if bad:
                node = bad[0] if isinstance(bad, list) else bad
                raise self.error(node, f"unsupported syntax: {what}")
        params = []
        for arg in a.args:
            if arg.annotation is None:
                raise self.error(arg, f"parameter '{arg.arg}' needs a type annotation, such as f32[64, 64] "
                                      "(a tensor) or i32 (a scalar)")
            t = self.eval_annotation(arg.annotation, f"parameter '{arg.arg}'", arg.arg)
            if isinstance(t, TensorType) and t.scope is not MemScope.GLOBAL:
                raise self.error(arg.annotation, f"parameter '{arg.arg}' must be a global tensor, got {t!r}")
            if not isinstance(t, (ScalarType, TensorType)):
                raise self.error(arg.annotation, f"invalid annotation for parameter '{arg.arg}': expected a "
                                                 "scalar type such as f32 or a tensor type such as f32[64, 64], "
                                                 f"got {self.value_str(t)}")
            params.append(Var(arg.arg, t))
        ret = None
        if self.tree.returns is not None:
            ret = self.eval_annotation(self.tree.returns, "the return value", "return")
            if ret is not None and not isinstance(ret, ScalarType):
                raise self.error(self.tree.returns, f"a function can only return a scalar type such as f32, "
                                                    f"got {self.value_str(ret)}")
            if ret is not None and not self.is_device:
                raise self.error(self.tree.returns, "a kernel cannot return a value; write results into a "
                                                    "tensor parameter (device functions use @taskmap.lang.func)")
        return tuple(params), ret

    def eval_annotation(self, node: ast.expr, what: str, name: str | None = None) -> Any:
        try:
            return self.src.eval_annotation(node, name)
        except DSLError:
            raise
        except Exception as e:
            raise self.error(node, f"cannot evaluate the annotation of {what}: {type(e).__name__}: {e}") from e

    # ------------------------------------------------------------------ body
    def run(self) -> Function:
        """Transpile the body; a second pass applies the hoisting the first one discovered."""
        for _ in range(MAX_PASSES):
            func = self.one_pass()
            if not self.new_hoist:
                return func
        raise self.error(self.tree, "internal error: variable hoisting did not converge")  # pragma: no cover

    def one_pass(self) -> Function:
        self.scope = Scope()
        self.block = []
        self.new_hoist = False
        self.first_dtype = {}
        self.launch: dict[str, tuple[Expr, Expr, Expr]] = {}
        self.min_blocks = 0
        self.gpu_use = None
        self.callees = []
        for p in self.params:
            self.scope.bind(p.name, BindKind.TENSOR if p.is_tensor else BindKind.PARAM, p)
        body = self.body(self.tree.body, None)
        return self.finish(body)

    def mark_gpu(self, node: ast.AST, what: str) -> None:
        if self.requested_kind is FuncKind.CPU_KERNEL:
            raise self.error(node, f"{what} can only be used in GPU kernels, but '{self.src.name}' is a CPU kernel")
        if self.gpu_use is None:
            self.gpu_use = (node, what)

    def set_kernel_attr(self, node: ast.Attribute, value: Any, vnode: ast.AST) -> None:
        attr = node.attr
        if attr not in _Attrs.NAMES:
            raise self.error(node, f"unknown kernel attribute attrs.{attr} (known: {', '.join(_Attrs.NAMES)})")
        if self.is_device:
            raise self.error(node, f"attrs.{attr} can only be set in kernels, not in device functions")
        if not self.scope.top_level:
            raise self.error(node, f"attrs.{attr} can only be set at the top level of the kernel body")
        if attr == "min_blocks":
            n = const_int(value)
            if n is None or n < 0:
                raise self.error(vnode, f"attrs.min_blocks must be a compile-time int >= 0 (0: no request), got "
                                        f"{self.value_str(value)}")
            self.min_blocks = n
            self.mark_gpu(node, "attrs.min_blocks")
            return
        vals = list(value) if isinstance(value, (tuple, list)) else [value]
        if not 1 <= len(vals) <= 3:
            raise self.error(vnode, f"attrs.{attr} takes 1 to 3 dimensions, got {len(vals)}")
        dims = []
        for v in vals:
            e = self.to_scalar(v, vnode)
            if not e.dtype.is_integer:
                raise self.error(vnode, f"attrs.{attr} must be integers, got a {e.dtype!r} value")
            if collect(e, (Var, E.Special, E.Load, E.CallFunc, PrimCall)):
                raise self.error(vnode, f"attrs.{attr} can only use compile-time values and symbolic sizes, "
                                        f"got {e!r}")
            if isinstance(e, E.Const) and e.value <= 0:
                raise self.error(vnode, f"attrs.{attr} must be positive, got {e.value}")
            dims.append(e)
        dims += [E.const(1)] * (3 - len(dims))
        self.launch[attr] = (dims[0], dims[1], dims[2])
        self.mark_gpu(node, f"attrs.{attr}")

    def call_device(self, df: DeviceFunction, node: ast.Call, args: list, kwargs: dict) -> Expr:
        if kwargs:
            raise self.error(node, f"device function '{df.name}' takes no keyword arguments")
        params, ret = device_signature(df)
        if len(args) != len(params):
            raise self.error(node, f"device function '{df.name}' takes {len(params)} argument(s) but "
                                   f"{len(args)} were given")
        out: list[Expr] = []
        for p, a, anode in zip(params, args, node.args):
            if p.is_tensor:
                pt: TensorType = p.type
                if not is_tensor(a):
                    raise self.error(anode, f"argument '{p.name}' of '{df.name}' must be a tensor {pt!r}, "
                                            f"got {self.value_str(a)}")
                at: TensorType = a.type
                if at.dtype is not pt.dtype or at.shape != pt.shape:
                    raise self.error(anode, f"argument '{p.name}' of '{df.name}' must be a tensor {pt!r}, "
                                            f"got tensor '{a.name}' of type {at!r}")
                out.append(a)
            else:
                out.append(E.cast(self.to_scalar(a, anode), p.type))
        if not df.compiling:
            _, _, uses_gpu = compile_device(df)
            if uses_gpu:
                self.mark_gpu(node, f"device function '{df.name}' (it uses GPU features)")
        if df not in self.callees:
            self.callees.append(df)
        return E.CallFunc(df.name, tuple(out), ret)

    # ------------------------------------------------------------------ the function
    def finish(self, body: S.Stmt) -> Function:
        name = self.src.name
        uses_gpu = self.gpu_use is not None or bool(collect(body, (E.Special, S.Barrier)))
        if self.requested_kind is not None:
            kind = self.requested_kind
        else:
            kind = FuncKind.GPU_KERNEL if uses_gpu else FuncKind.CPU_KERNEL
        if self.ret is not None and not collect(body, S.Return):
            raise self.error(self.tree, f"'{name}' declares a return type ({self.ret!r}) but never returns a value")
        launch = None
        if kind is FuncKind.GPU_KERNEL:
            if "block_dim" not in self.launch:
                why = f" (it uses {self.gpu_use[1]})" if self.gpu_use and "attrs" not in self.gpu_use[1] else ""
                raise self.error(self.tree, f"GPU kernel '{name}' must set attrs.block_dim{why}")
            one = (E.const(1), E.const(1), E.const(1))
            launch = LaunchConfig(grid_dim=self.launch.get("grid_dim", one), block_dim=self.launch["block_dim"],
                                  min_blocks=self.min_blocks)
        return Function(name, kind, self.params, body, self.ret, launch, self.size_vars(body, launch))

    def size_vars(self, body: S.Stmt, launch: LaunchConfig | None) -> tuple[SizeVar, ...]:
        """Symbolic sizes in parameter types, then launch dimensions, then the body; unique by name."""
        seen: dict[str, SizeVar] = {}
        roots: list[Any] = [d for p in self.params if p.is_tensor for d in p.type.shape]
        if launch is not None:
            roots += [*launch.grid_dim, *launch.block_dim]
        roots.append(body)
        for r in roots:
            for sv in collect(r, SizeVar):
                seen.setdefault(sv.name, sv)
        return tuple(seen.values())


# ----------------------------------------------------------------------------- device functions


def _device_transpiler(df: DeviceFunction) -> Transpiler:
    if df.transpiler is None:
        df.transpiler = Transpiler(df.fn, FuncKind.DEVICE)
    return df.transpiler


def device_signature(df: DeviceFunction) -> tuple[tuple[Var, ...], ScalarType | None]:
    """The parameters and return type of a device function (its body is not transpiled)."""
    t = _device_transpiler(df)
    return t.params, t.ret


def compile_device(df: DeviceFunction) -> tuple[Function, tuple[DeviceFunction, ...], bool]:
    """``(Function, callees, uses_gpu)`` of a device function, transpiled once and cached."""
    if df.compiled is None:
        t = _device_transpiler(df)
        df.compiling = True
        try:
            fn = t.run()
        finally:
            df.compiling = False
        uses_gpu = t.gpu_use is not None or bool(collect(fn.body, (E.Special, S.Barrier)))
        df.compiled = (fn, tuple(t.callees), uses_gpu)
    return df.compiled


# ----------------------------------------------------------------------------- entry point


def transpile(py_fn: Any, kind: FuncKind | None = None) -> Module:
    """Transpile a DSL function into a Module: the function first, then its helpers (each once)."""
    if isinstance(py_fn, DeviceFunction):
        entry, callees, _ = compile_device(py_fn)
        seen_ids = {id(py_fn)}
    else:
        t = Transpiler(py_fn, kind)
        entry = t.run()
        callees, seen_ids = tuple(t.callees), set()
    functions = [entry]
    owners: dict[str, Any] = {entry.name: py_fn}
    todo = list(callees)
    while todo:
        df = todo.pop(0)
        if id(df) in seen_ids:
            continue
        seen_ids.add(id(df))
        fn, more, _ = compile_device(df)
        if fn.name in owners:
            raise _device_transpiler(df).error(None, f"two different functions named '{fn.name}' are used in one "
                                                     "module; rename one of them")
        owners[fn.name] = df
        functions.append(fn)
        todo.extend(more)
    return Module(tuple(functions), entry.name)
