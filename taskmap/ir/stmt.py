"""Statements of the tensor IR (immutable dataclasses)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .dtypes import HOOKS
from .expr import Expr, Var
from .mapping import MappingLoopKind, TaskMapping
from .types import MemScope, TensorType


class ForKind(enum.Enum):
    SERIAL = "serial"
    UNROLL = "unroll"          # fully unrolled (the extent must be a constant)
    PARALLEL = "parallel"      # iterations spread over CPU cores (OpenMP)
    VECTORIZE = "vectorize"    # iterations are SIMD lanes


class BarrierScope(enum.Enum):
    BLOCK = "block"            # __syncthreads()


class Stmt:
    """Base of all statement nodes."""

    def __repr__(self) -> str:
        return HOOKS["stmt_str"](self)  # set by ir.printer


@dataclass(frozen=True, eq=False, repr=False)
class Evaluate(Stmt):
    """An expression evaluated for its effect (a call)."""

    expr: Expr


@dataclass(frozen=True, eq=False, repr=False)
class DeclScalar(Stmt):
    """Declares a mutable local scalar, optionally initialised."""

    var: Var
    init: Expr | None = None


@dataclass(frozen=True, eq=False, repr=False)
class DeclTensor(Stmt):
    """Declares a shared-memory or register tensor (``var.type`` is its TensorType)."""

    var: Var

    @property
    def type(self) -> TensorType:
        return self.var.type

    @property
    def scope(self) -> MemScope:
        return self.var.type.scope


@dataclass(frozen=True, eq=False, repr=False)
class Assign(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True, eq=False, repr=False)
class Store(Stmt):
    """``tensor[indices] = value``; ``stream``: a streaming store (the value is not read again
    soon: the CPU backend writes whole aligned vectors of it past the caches, non-temporally; CUDA
    stores it evict-first, ``st.global.cs``; HIP non-temporally)."""

    tensor: Var
    indices: tuple[Expr, ...]
    value: Expr
    stream: bool = False


@dataclass(frozen=True, eq=False, repr=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False, repr=False)
class For(Stmt):
    """``for var in range(start, stop, step)`` with a constant non-zero ``step``."""

    var: Var
    start: Expr
    stop: Expr
    step: int
    body: Stmt
    kind: ForKind = ForKind.SERIAL


@dataclass(frozen=True, eq=False, repr=False)
class MappingFor(Stmt):
    """``for vars in mapping.on(worker)``: the tasks of one worker (``worker`` set), or of all
    workers (``worker`` None) spread according to ``kind``.  Lowered to plain loops.

    ``ordinal``, when set, is bound to the task's position in its worker's task list
    (``for k, (i, j) in enumerate(m.on(w))``): a register-tile slot known after unrolling.
    """

    vars: tuple[Var, ...]
    mapping: TaskMapping
    worker: Expr | None
    kind: MappingLoopKind
    body: Stmt
    ordinal: Var | None = None


@dataclass(frozen=True, eq=False, repr=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(frozen=True, eq=False, repr=False)
class While(Stmt):
    cond: Expr
    body: Stmt


@dataclass(frozen=True, eq=False, repr=False)
class Break(Stmt):
    pass


@dataclass(frozen=True, eq=False, repr=False)
class Continue(Stmt):
    pass


@dataclass(frozen=True, eq=False, repr=False)
class Return(Stmt):
    value: Expr | None = None


@dataclass(frozen=True, eq=False, repr=False)
class Barrier(Stmt):
    scope: BarrierScope = BarrierScope.BLOCK


def seq(*stmts: Any) -> Stmt:
    """A sequence, flattening nested sequences and dropping ``None``."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            out.extend(s.stmts)
        elif isinstance(s, (list, tuple)):
            inner = seq(*s)
            out.extend(inner.stmts if isinstance(inner, Seq) else [inner])
        else:
            out.append(s)
    return out[0] if len(out) == 1 else Seq(tuple(out))
