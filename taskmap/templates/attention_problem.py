"""What the attention templates compute: :class:`AttentionProblem`, shared by the CPU and GPU
templates (see :mod:`.attention_kernels` for the kernels' argument layout).

``o[b] = softmax(q[b] @ k[kb]^T * scale + mask[mbi]) @ v[kb]`` for every flat batch ``b`` of
``bh``, with ``kb = b // kd % km`` and ``mbi = b // md % mm``: the operator layer folds the batch
and head dimensions of torch's ``(..., L, E)`` operands into ``bh`` and expresses broadcast
batch dimensions and grouped-query heads by those four integers.
"""
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .attention_kernels import MaskKind
from .matmul_problem import new_like, view


@dataclass(frozen=True)
class AttentionProblem:
    bh: int             # query batches (batch x heads)
    bk: int             # key / value batches
    L: int              # query rows
    S: int              # keys
    e: int              # head size of q, k
    ev: int             # head size of v
    dtype: str = "float32"
    mask: str = MaskKind.NONE
    mb: int = 1         # mask batches
    mask_rows: bool = True   # the mask has L rows (else 1, shared by every query row)
    causal: bool = False
    scale: float = 1.0
    kd: int = 1
    km: int = 1
    md: int = 1
    mm: int = 1

    def __post_init__(self) -> None:
        for name in ("bh", "bk", "L", "S", "e", "ev", "mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"AttentionProblem.{name} must be positive, got {getattr(self, name)}")

    @property
    def ml(self) -> int:
        return self.L if self.mask_rows else 1

    @property
    def flops(self) -> float:
        """Multiply-adds x 2 of both products (causal: the half below the diagonal)."""
        full = 2.0 * self.bh * self.L * self.S * (self.e + self.ev)
        return full / 2 if self.causal else full

    @property
    def mask_dtype(self) -> str:
        return "bool" if self.mask == MaskKind.BOOL else self.dtype

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        specs = [((self.bh, self.L, self.e), self.dtype), ((self.bk, self.S, self.e), self.dtype),
                 ((self.bk, self.S, self.ev), self.dtype)]
        if self.mask != MaskKind.NONE:
            specs.append(((self.mb, self.ml, self.S), self.mask_dtype))
        return specs

    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [((self.bh, self.L, self.ev), self.dtype)]


_DUMMY = np.zeros((1, 1, 1), np.float32)


def operand_views(p: AttentionProblem, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """q, k, v, mask (a 1x1x1 dummy without one), o as the kernels' 3-D views."""
    ops = [view(inputs[0], (p.bh, p.L, p.e)), view(inputs[1], (p.bk, p.S, p.e)), view(inputs[2], (p.bk, p.S, p.ev))]
    if p.mask != MaskKind.NONE:
        ops.append(view(inputs[3], (p.mb, p.ml, p.S)))
    else:
        ops.append(_dummy_like(outputs[0]))
    return ops + [view(outputs[0], (p.bh, p.L, p.ev))]


def _dummy_like(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return _DUMMY
    return new_like(x, (1, 1, 1), "float32")


def scalars(p: AttentionProblem) -> list[Any]:
    return [float(p.scale), p.kd, p.km, p.md, p.mm]


__all__ = ["AttentionProblem", "operand_views", "scalars"]
