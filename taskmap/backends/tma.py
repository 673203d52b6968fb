"""The tensor maps a GPU kernel's ``tma_load`` calls need: one per (tensor parameter, box, swizzle),
in the order of their first use.  The CUDA codegen appends them to the kernel's parameters (after
the symbolic sizes) and the launcher makes them from the arguments' addresses and sizes."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedError
from ..ir.func import Function
from ..ir.functor import collect
from ..ir.primitives import Prim, PrimCall


@dataclass(frozen=True)
class TensorMapSpec:
    param: int          # the index of the tensor parameter in the kernel's parameters
    rows: int           # the box: rows x cols elements (one batch)
    cols: int
    swizzle: int        # 0 or 128

    def key(self) -> tuple[int, int, int, int]:
        return (self.param, self.rows, self.cols, self.swizzle)


def tma_calls(func: Function) -> list[PrimCall]:
    return [c for c in collect(func.body, PrimCall) if c.op is Prim.TMA_LOAD]


def spec_of(func: Function, call: PrimCall) -> TensorMapSpec:
    """The tensor map of one ``tma_load`` of ``func``: its source must be a parameter of ``func``."""
    src = call.args[1].tensor  # type: ignore[attr-defined]
    for i, p in enumerate(func.params):
        if p is src:
            rows, cols, swizzle = (int(a.value) for a in call.args[3:6])  # type: ignore[attr-defined]
            return TensorMapSpec(i, rows, cols, swizzle)
    raise UnsupportedError(f"{func.name}: tma_load() reads '{src.name}', which is not a parameter of the kernel: "
                           "a tensor map describes a kernel argument (call tma_load in the kernel itself)")


def tensor_maps(func: Function) -> tuple[TensorMapSpec, ...]:
    """The distinct tensor maps of ``func``'s ``tma_load`` calls, in the order of first use."""
    out: dict[tuple[int, int, int, int], TensorMapSpec] = {}
    for call in tma_calls(func):
        spec = spec_of(func, call)
        out.setdefault(spec.key(), spec)
    return tuple(out.values())


__all__ = ["TensorMapSpec", "spec_of", "tensor_maps", "tma_calls"]
