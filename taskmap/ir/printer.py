"""A readable, Python-like text form of the IR (``repr`` of every node uses it)."""
from __future__ import annotations

from typing import Any

from . import expr as E
from . import stmt as S
from .dtypes import HOOKS
from .func import Function
from .primitives import PrimCall
from .types import TensorType

_PREC = {
    E.BinOp.OR: 1, E.BinOp.AND: 2,
    E.BinOp.BITOR: 4, E.BinOp.BITXOR: 5, E.BinOp.BITAND: 6, E.BinOp.SHL: 7, E.BinOp.SHR: 7,
    E.BinOp.ADD: 8, E.BinOp.SUB: 8,
    E.BinOp.MUL: 9, E.BinOp.DIV: 9, E.BinOp.FLOORDIV: 9, E.BinOp.MOD: 9,
}


class _Names:
    """Stable, unique display names for variables (two distinct ``i`` print as ``i`` and ``i_1``)."""

    def __init__(self) -> None:
        self.by_var: dict[int, str] = {}
        self.used: set[str] = set()
        self.keep: list[Any] = []

    def __call__(self, v: E.Var) -> str:
        name = self.by_var.get(id(v))
        if name is None:
            base, name, k = v.name, v.name, 0
            while name in self.used:
                k += 1
                name = f"{base}_{k}"
            self.used.add(name)
            self.by_var[id(v)] = name
            self.keep.append(v)
        return name


def expr_str(e: Any, names: _Names | None = None, prec: int = 0) -> str:
    names = names or _Names()
    if isinstance(e, E.Const):
        if e.dtype.is_bool:
            return "True" if e.value else "False"
        text = repr(e.value)
        return text if e.dtype.short in ("i32", "f32") else f"{e.dtype.short}({text})"
    if isinstance(e, E.Var):
        return names(e)
    if isinstance(e, E.SizeVar):
        return e.name
    if isinstance(e, E.Special):
        return f"{e.reg.value}()" if e.reg.is_warp else f"{e.reg.value}.{'xyz'[e.dim]}"
    if isinstance(e, E.Binary):
        if e.op in (E.BinOp.MIN, E.BinOp.MAX):
            return f"{e.op.value}({expr_str(e.a, names)}, {expr_str(e.b, names)})"
        p = _PREC[e.op]
        text = f"{expr_str(e.a, names, p)} {e.op.value} {expr_str(e.b, names, p + 1)}"
        return f"({text})" if p < prec else text
    if isinstance(e, E.Compare):
        text = f"{expr_str(e.a, names, 4)} {e.op.value} {expr_str(e.b, names, 4)}"
        return f"({text})" if prec > 3 else text
    if isinstance(e, E.Unary):
        sep = " " if e.op is E.UnOp.NOT else ""
        return f"{e.op.value}{sep}{expr_str(e.a, names, 10)}"
    if isinstance(e, E.Cast):
        return f"{e.type.short}({expr_str(e.a, names)})"
    if isinstance(e, E.BitCast):
        return f"bitcast({expr_str(e.a, names)}, {e.type.short})"
    if isinstance(e, E.Select):
        text = f"{expr_str(e.a, names, 1)} if {expr_str(e.cond, names, 1)} else {expr_str(e.b, names, 1)}"
        return f"({text})" if prec > 0 else text
    if isinstance(e, E.Load):
        return f"{names(e.tensor)}[{', '.join(expr_str(i, names) for i in e.indices)}]"
    if isinstance(e, E.Call):
        return f"{e.fn.fname}({', '.join(expr_str(a, names) for a in e.args)})"
    if isinstance(e, E.CallFunc):
        return f"{e.name}({', '.join(expr_str(a, names) for a in e.args)})"
    if isinstance(e, PrimCall):  # element references print as &t[i, j]
        refs = e.op.spec.refs
        args = [("&" if i in refs else "") + expr_str(a, names) for i, a in enumerate(e.args)]
        return f"{e.op.spec.name}({', '.join(args)})"
    return f"<{type(e).__name__}>"


def _type_str(t: Any) -> str:
    return repr(t) if isinstance(t, TensorType) else t.short


def stmt_lines(s: Any, names: _Names, indent: int = 0) -> list[str]:
    pad = "    " * indent
    ex = lambda e: expr_str(e, names)  # noqa: E731
    body = lambda b: stmt_lines(b, names, indent + 1)  # noqa: E731
    if isinstance(s, S.Seq):
        return [line for c in s.stmts for line in stmt_lines(c, names, indent)] or [pad + "pass"]
    if isinstance(s, S.Evaluate):
        return [pad + ex(s.expr)]
    if isinstance(s, S.DeclScalar):
        init = f" = {ex(s.init)}" if s.init is not None else ""
        return [f"{pad}{names(s.var)}: {s.var.type.short}{init}"]
    if isinstance(s, S.DeclTensor):
        return [f"{pad}{names(s.var)}: {s.var.type!r}"]
    if isinstance(s, S.Assign):
        return [f"{pad}{names(s.var)} = {ex(s.value)}"]
    if isinstance(s, S.Store):
        hint = "  # stream" if s.stream else ""
        return [f"{pad}{names(s.tensor)}[{', '.join(ex(i) for i in s.indices)}] = {ex(s.value)}{hint}"]
    if isinstance(s, S.For):
        step = f", {s.step}" if s.step != 1 else ""
        kind = "" if s.kind is S.ForKind.SERIAL else f"  # {s.kind.value}"
        head = f"{pad}for {names(s.var)} in range({ex(s.start)}, {ex(s.stop)}{step}):{kind}"
        return [head, *body(s.body)]
    if isinstance(s, S.MappingFor):
        vs = ", ".join(names(v) for v in s.vars)
        if s.ordinal is not None:
            vs = f"{names(s.ordinal)}, ({vs})"
        src = f"{s.mapping!r}.on({ex(s.worker)})" if s.worker is not None else f"{s.mapping!r}"
        kind = "" if s.worker is not None else f"  # {s.kind.name.lower()}"
        return [f"{pad}for {vs} in {src}:{kind}", *body(s.body)]
    if isinstance(s, S.If):
        lines = [f"{pad}if {ex(s.cond)}:", *body(s.then)]
        if s.else_ is not None:
            lines += [f"{pad}else:", *body(s.else_)]
        return lines
    if isinstance(s, S.While):
        return [f"{pad}while {ex(s.cond)}:", *body(s.body)]
    if isinstance(s, S.Break):
        return [pad + "break"]
    if isinstance(s, S.Continue):
        return [pad + "continue"]
    if isinstance(s, S.Return):
        return [pad + ("return" if s.value is None else f"return {ex(s.value)}")]
    if isinstance(s, S.Barrier):
        return [pad + "syncthreads()"]
    return [f"{pad}<{type(s).__name__}>"]


def func_str(f: Function, names: _Names | None = None) -> str:
    names = names or _Names()
    params = ", ".join(f"{names(p)}: {_type_str(p.type)}" for p in f.params)
    ret = f" -> {f.ret.short}" if f.ret is not None else ""
    lines = [f"def {f.name}({params}){ret}:  # {f.kind.value}"]
    if f.launch is not None:
        grid = ", ".join(expr_str(d, names) for d in f.launch.grid_dim)
        block = ", ".join(expr_str(d, names) for d in f.launch.block_dim)
        lines.append(f"    # grid_dim=({grid}) block_dim=({block})")
    lines += stmt_lines(f.body, names, 1)
    return "\n".join(lines)


def stmt_str(s: Any) -> str:
    return "\n".join(stmt_lines(s, _Names()))


HOOKS["expr_str"] = lambda e: expr_str(e)
HOOKS["stmt_str"] = stmt_str
HOOKS["func_str"] = func_str
