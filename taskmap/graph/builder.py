"""Building graphs: :class:`GraphBuilder` creates inputs, constants and ops, inferring each op's
output shapes and dtypes from its definition, and checking the attributes' type.

    b = GraphBuilder(device="cpu")
    x = b.input((1, 16), f32, name="x")
    w = b.constant(np.random.rand(8, 16).astype(np.float32), name="w")
    y = b.op(OpKind.LINEAR, [x, w])
    g = b.build([y])
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import IRError, OpError
from ..ir.dtypes import ScalarType, scalar_type
from .ir import Graph, Op, Tensor
from .kinds import OpKind


def infer(kind: OpKind, inputs: Sequence[Tensor], attrs: Any = None) -> list[tuple[tuple[int, ...], ScalarType]]:
    """Output (shape, dtype) pairs of ``kind`` on ``inputs`` (OpError when it cannot apply)."""
    d = kind.definition
    if attrs is None:
        attrs = d.default_attrs()
    if d.attrs_type is not None and not isinstance(attrs, d.attrs_type):
        raise IRError(f"{kind.name}: attributes must be a {d.attrs_type.__name__}, got {type(attrs).__name__}")
    return [(tuple(s), t) for s, t in d.infer(list(inputs), attrs)]


class GraphBuilder:
    """Accumulates ops in the order they are added (which must be a topological order)."""

    def __init__(self, device: str = "cpu", name: str = "graph") -> None:
        self.device = device
        self.name = name
        self._inputs: list[Tensor] = []
        self._ops: list[Op] = []
        self._count = 0

    def input(self, shape: Sequence[int], dtype: ScalarType | str, name: str = "") -> Tensor:
        t = Tensor(tuple(shape), scalar_type(dtype), self.device, name or f"x{len(self._inputs)}")
        self._inputs.append(t)
        return t

    def constant(self, data: np.ndarray, name: str = "") -> Tensor:
        """A constant holding ``data`` (numpy; kept without copying when already contiguous)."""
        data = np.asarray(data)
        data = data if data.flags.c_contiguous else data.copy(order="C")
        return Tensor(data.shape, scalar_type(data.dtype.name), self.device, name or f"c{self._next()}", data)

    def _next(self) -> int:
        self._count += 1
        return self._count

    def op(self, kind: OpKind, inputs: Sequence[Tensor], attrs: Any = None, name: str = "",
           source: str = "") -> Tensor:
        """Add one single-output op; returns its output."""
        outs = self.op_multi(kind, inputs, attrs, name, source)
        if len(outs) != 1:
            raise IRError(f"{kind.name} has {len(outs)} outputs; use op_multi")
        return outs[0]

    def op_multi(self, kind: OpKind, inputs: Sequence[Tensor], attrs: Any = None, name: str = "",
                 source: str = "", specs: Sequence[tuple[Sequence[int], ScalarType]] | None = None
                 ) -> tuple[Tensor, ...]:
        """Add one op; returns all its outputs.  ``specs`` gives the output (shape, dtype) pairs
        when they are known (opaque PyTorch ops); otherwise they are inferred."""
        for t in inputs:
            if not isinstance(t, Tensor):
                raise IRError(f"{kind.name}: inputs must be graph Tensors, got {type(t).__name__}")
        if attrs is None:
            attrs = kind.definition.default_attrs()
        if specs is None:
            try:
                specs = infer(kind, inputs, attrs)
            except OpError as e:
                raise OpError(f"{e}{f' (at {source})' if source else ''}") from None
        n = self._next()
        base = name or f"{kind.name.lower()}{n}"
        outs = tuple(Tensor(s, t, self.device, base if len(specs) == 1 else f"{base}.{k}")
                     for k, (s, t) in enumerate(specs))
        self._ops.append(Op(kind, tuple(inputs), outs, attrs, base, source))
        return outs

    def build(self, outputs: Sequence[Tensor]) -> Graph:
        return Graph(self._inputs, outputs, self._ops, self.name)


__all__ = ["GraphBuilder", "infer"]
