"""The graph IR: a DAG of operators (:class:`Op`) over tensors (:class:`Tensor`).

Everything here is immutable.  A :class:`Tensor` is a value: shape, dtype, device, an optional
name and, for constants (weights), numpy ``data``.  An :class:`Op` reads ``inputs`` and writes
``outputs`` (tensors it creates); what it computes is its ``kind`` (an :class:`OpKind`, whose
:class:`~taskmap.graph.opdef.OpDef` holds the category, shape inference, compute definition or
runner) and its typed, frozen ``attrs`` (a small dataclass of :mod:`taskmap.graph.attrs`).  A
:class:`Graph` lists its inputs, outputs and ops in topological order; passes build new graphs
(``Graph(...)`` or :class:`~taskmap.graph.builder.GraphBuilder`) instead of editing one.

Tensors and ops compare by identity (``eq=False``) and are hashable, so they key dicts; the
graph answers ``producer(t)`` and ``consumers(t)`` from maps built once.  ``to_networkx()``
gives a ``networkx.DiGraph`` of ops (edges carry the tensor) for analyses.

Example (what the frontend builds for ``relu(x @ w)``)::

    b = GraphBuilder()
    x = b.input((8, 64), f32)
    w = b.constant(np.ones((64, 32), np.float32), name="w")
    y = b.op(OpKind.MATMUL, [x, w])
    z = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    g = b.build([z])
    print(g)            # see taskmap.graph.printer
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from ..errors import IRError as GraphError
from ..ir.dtypes import ScalarType

from .kinds import OpDef, OpKind
from .printer import graph_str

if TYPE_CHECKING:
    import networkx as nx

_IDS = itertools.count()


def _c_order(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous array (0-d arrays stay 0-d, unlike ``np.ascontiguousarray``)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


@dataclass(frozen=True, eq=False)
class Tensor:
    """A value of the graph: ``shape`` (static ints), ``dtype``, ``device`` ("cpu", "cuda:0", ...).

    ``data`` is set for constants (weights, folded values): a read-only C-contiguous numpy
    array of exactly this shape and dtype (bfloat16 constants are not supported yet)."""

    shape: tuple[int, ...]
    dtype: ScalarType
    device: str = "cpu"
    name: str = ""
    data: np.ndarray | None = field(default=None, repr=False)
    uid: int = field(default_factory=lambda: next(_IDS), repr=False)

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise GraphError(f"tensor {self.name or '?'}: negative dimension in {shape}")
        object.__setattr__(self, "shape", shape)
        if self.data is not None:
            d = _c_order(self.data)
            if d.shape != shape or d.dtype.name != self.dtype.name:
                raise GraphError(f"constant {self.name or '?'}: data is {d.dtype.name}{list(d.shape)}, the tensor "
                                 f"{self.dtype.name}{list(shape)}")
            if d.flags.writeable:
                d = d.view()
                d.flags.writeable = False
            object.__setattr__(self, "data", d)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.nbytes

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    def like(self, **changes: Any) -> "Tensor":
        """A new tensor (new identity) with some fields changed."""
        fields = dict(shape=self.shape, dtype=self.dtype, device=self.device, name=self.name, data=self.data)
        fields.update(changes)
        return Tensor(**fields)

    def __repr__(self) -> str:
        kind = "const " if self.is_constant else ""
        return f"Tensor({kind}{self.name or '%' + str(self.uid)}: {self.dtype.name}{list(self.shape)} {self.device})"


@dataclass(frozen=True, eq=False)
class Op:
    """One operator application: ``outputs = kind(inputs; attrs)``.

    ``attrs`` is the frozen attribute dataclass named by ``kind``'s definition
    (``op.definition.attrs_type``), or ``None`` for kinds without attributes.  ``source`` says
    where the op came from (e.g. the torch.fx node), for messages."""

    kind: OpKind
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    attrs: Any = None
    name: str = ""
    source: str = ""

    @property
    def definition(self) -> OpDef:
        """The kind's definition (category, inference, compute / runner)."""
        return self.kind.definition

    @property
    def output(self) -> Tensor:
        if len(self.outputs) != 1:
            raise GraphError(f"op {self.name or self.kind.name} has {len(self.outputs)} outputs, not one")
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"Op({self.name or self.kind.name.lower()}: {self.kind.name} {self.attrs!r})"


class Graph:
    """Inputs, outputs and ops in topological order (checked: every op input is a graph input,
    a constant, or the output of an earlier op; each tensor is produced once)."""

    def __init__(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], ops: Sequence[Op],
                 name: str = "graph") -> None:
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self._ops = tuple(ops)
        self.name = name
        self._check()

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return self._outputs

    @property
    def ops(self) -> tuple[Op, ...]:
        return self._ops

    def _check(self) -> None:
        known: set[Tensor] = set()
        for t in self._inputs:
            if t in known:
                raise GraphError(f"graph input {t!r} is listed twice")
            if t.is_constant:
                raise GraphError(f"graph input {t!r} is a constant; constants are not inputs")
            known.add(t)
        for op in self._ops:
            for t in op.inputs:
                if t not in known and not t.is_constant:
                    raise GraphError(f"op {op.name or op.kind.name} reads {t!r}, which is neither a graph input, a "
                                     "constant nor the output of an earlier op (ops must be in topological order)")
            for t in op.outputs:
                if t in known:
                    raise GraphError(f"op {op.name or op.kind.name} writes {t!r}, which already has a producer")
                known.add(t)
        for t in self._outputs:
            if t not in known and not t.is_constant:
                raise GraphError(f"graph output {t!r} is not computed by the graph")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_producers", "_consumers")}

    @functools.cached_property
    def _producers(self) -> dict[Tensor, tuple[Op, int]]:
        return {t: (op, k) for op in self._ops for k, t in enumerate(op.outputs)}

    @functools.cached_property
    def _consumers(self) -> dict[Tensor, list[Op]]:
        out: dict[Tensor, list[Op]] = {}
        for op in self._ops:
            for t in dict.fromkeys(op.inputs):
                out.setdefault(t, []).append(op)
        return out

    def producer(self, t: Tensor) -> Op | None:
        """The op that writes ``t`` (None for inputs and constants)."""
        hit = self._producers.get(t)
        return hit[0] if hit else None

    def consumers(self, t: Tensor) -> list[Op]:
        """The ops that read ``t``, in graph order (each once)."""
        return list(self._consumers.get(t, ()))

    def tensors(self) -> Iterator[Tensor]:
        """Every tensor once: inputs, then constants and op outputs in order of first appearance."""
        seen: set[Tensor] = set()
        for t in itertools.chain(self._inputs, (x for op in self._ops for x in (*op.inputs, *op.outputs)),
                                 self._outputs):
            if t not in seen:
                seen.add(t)
                yield t

    def constants(self) -> list[Tensor]:
        return [t for t in self.tensors() if t.is_constant]

    def to_networkx(self) -> "nx.DiGraph":
        """A DiGraph whose nodes are the ops (attribute ``op``) plus one node per graph input and
        constant (attribute ``tensor``); an edge ``a -> b`` carries ``tensor`` and ``index`` (which
        input of ``b`` it is)."""
        import networkx as nx  # noqa: PLC0415 - for analyses only: importing it costs compiles ~0.1 s

        g = nx.DiGraph()
        for t in self.tensors():
            if self.producer(t) is None:
                g.add_node(t, tensor=t)
        for op in self._ops:
            g.add_node(op, op=op)
            for k, t in enumerate(op.inputs):
                src = self.producer(t) or t
                g.add_edge(src, op, tensor=t, index=k)
        return g

    def __repr__(self) -> str:
        return f"Graph({self.name}: {len(self._inputs)} inputs, {len(self._ops)} ops, {len(self._outputs)} outputs)"

    def __str__(self) -> str:
        return graph_str(self)


__all__ = ["Graph", "Op", "Tensor"]
