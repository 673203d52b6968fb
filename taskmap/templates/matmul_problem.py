"""What a matmul template computes: :class:`MatmulProblem`, shared by the CPU, SIMT and tensor-core
templates, and the workspace buffers their kernels borrow.

A problem is a batch of ``C[b] = A[b] @ B[b] (+ bias)`` with ``A[b]`` of shape ``(m, k)`` and
``B[b]`` of shape ``(k, n)`` — or ``(n, k)`` with ``trans_b`` (a ``linear`` weight) — all
row-major.  An operand that is not batched (``a_batched=False``) is one matrix shared by every
batch (a broadcast).  With ``b_groups`` B holds that many matrices and batch ``j`` multiplies by
matrix ``bidx[j]`` (a mixture of experts' blocks of rows, each with its expert's weights: see
:mod:`taskmap.frontend.torch.ops_moe`); ``bidx`` is an int64 vector of ``batch`` entries, an input
after the bias.  Its kernels take 3-D views: ``a (ba, m, k)``, ``b (bb, k, n)`` or
``(bb, n, k)``, ``bias (n,)``, ``c (batch, m, n)``, where ``ba``/``bb`` are ``batch`` or 1.
Sizes are symbolic in the kernels: one kernel serves every shape with the same schedule and
flags, and the problem's sizes only steer the schedule choice.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..runtime.args import is_torch_tensor, view
from ..runtime.tensor import Tensor, empty


@dataclass(frozen=True)
class MatmulProblem:
    """``c[batch, m, n] = a[batch?, m, k] @ b[batch?, k, n] (+ bias[n])``; dtypes by name."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str = "float32"          # of a and b
    out_dtype: str = "float32"      # of c (and bias)
    a_batched: bool = True
    b_batched: bool = True
    trans_b: bool = False           # b is stored (n, k): c = a @ b^T
    bias: bool = False              # added along the last dimension of c as stored
    trans_c: bool = False           # c is stored (n, m) (CPU template only)
    const_a: bool = False           # a is a constant (a compiled graph's weights): packed once, beforehand
    const_b: bool = False           # b is a constant (CPU template: see ``MatmulCpuTemplate.pack_constants``)
    tf32: bool = False              # f32 products may run on TF32 tensor cores (10-bit mantissas, f32 sums)
    tf32x3: bool = False            # ... as 3xTF32: each operand a tf32 high part plus a tf32 low part, the
                                    # products hi*hi + hi*lo + lo*hi on tensor cores (~f32 accuracy)
    b_groups: int = 0               # B holds this many matrices, batch j takes matrix bidx[j] (0: B as batched)

    def __post_init__(self) -> None:
        for name in ("batch", "m", "n", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"MatmulProblem.{name} must be positive, got {getattr(self, name)}")

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def a_shape(self) -> tuple[int, int, int]:
        return (self.batch if self.a_batched else 1, self.m, self.k)

    @property
    def b_shape(self) -> tuple[int, int, int]:
        bb = self.b_groups or (self.batch if self.b_batched else 1)
        return (bb, self.n, self.k) if self.trans_b else (bb, self.k, self.n)

    @property
    def c_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.n, self.m) if self.trans_c else (self.batch, self.m, self.n)

    @property
    def flags(self) -> tuple[bool, ...]:
        """What shapes the kernel's code (not its sizes): one kernel per flags and schedule."""
        return (self.a_batched, self.b_batched, self.trans_b, self.bias, self.trans_c, self.b_groups > 0)

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        specs = [(self.a_shape, self.dtype), (self.b_shape, self.dtype)]
        specs += [((self.c_shape[-1],), self.out_dtype)] if self.bias else []
        return specs + ([((self.batch,), "int64")] if self.b_groups else [])

    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [(self.c_shape, self.out_dtype)]


def operand_views(p: MatmulProblem, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
    """The kernels' operands: a, b (3-D), bias when the problem has one, c (3-D)."""
    out = [view(inputs[0], p.a_shape), view(inputs[1], p.b_shape)]
    if p.bias:
        out.append(view(inputs[2], (p.c_shape[-1],)))
    return out + [view(outputs[0], p.c_shape)]


def new_like(x: Any, shape: Sequence[int], dtype: str) -> Any:
    """A new uninitialised array of the same kind and device as ``x`` (numpy, torch, taskmap)."""
    shape = tuple(int(s) for s in shape)
    if isinstance(x, np.ndarray):
        return np.empty(shape, np.float32 if dtype == "bfloat16" else dtype)
    if is_torch_tensor(x):
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dtype), device=x.device)
    return empty(shape, dtype, device=x.device)


class Workspace:
    """Scratch buffers for kernels, reused between calls: one growing float32 buffer per
    (thread, device, slot).  Host buffers are numpy arrays; GPU ones are allocated like the
    outputs (taskmap / torch), through ``alloc``."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, slot: str, elements: int, device: str = "cpu", alloc: Any = None) -> Any:
        """A contiguous float32 array of ``elements`` (at least 1) on ``device``; its contents are
        garbage.  Valid until the next ``get`` of the same slot in this thread grows it (which
        bumps :meth:`generation`; the old array stays valid while referenced)."""
        elements = max(1, int(elements))
        bufs = self._local.__dict__.setdefault("bufs", {})
        key = (slot, device)
        buf = bufs.get(key)
        if buf is None or _numel(buf) < elements:
            size = max(elements, int(_numel(buf) * 1.25) if buf is not None else 0)
            bufs[key] = buf = np.empty(size + 16, np.float32) if alloc is None else alloc(size)
            if isinstance(buf, np.ndarray):   # 64-byte aligned start: whole cache lines per panel
                off = (-buf.ctypes.data % 64) // 4
                bufs[key] = buf = buf[off:off + size]
            self._local.generation = getattr(self._local, "generation", 0) + 1
        return buf[:elements] if isinstance(buf, np.ndarray) else _prefix(buf, elements)

    def generation(self) -> int:
        """Changes whenever a buffer of this thread is reallocated."""
        return getattr(self._local, "generation", 0)

    def clear(self) -> None:
        self._local.__dict__.pop("bufs", None)
        self._local.generation = getattr(self._local, "generation", 0) + 1


def _numel(buf: Any) -> int:
    if isinstance(buf, np.ndarray):
        return buf.size
    return int(np.prod(buf.shape))


def _prefix(buf: Any, elements: int) -> Any:
    if is_torch_tensor(buf):
        return buf[:elements]
    return view(buf, buf.shape) if _numel(buf) == elements else Tensor(buf, buf.data_ptr(), (elements,), buf.dtype,
                                                                         buf.device, buf.writeable)


WORKSPACE = Workspace()

__all__ = ["MatmulProblem", "WORKSPACE", "Workspace", "new_like", "operand_views", "view"]
