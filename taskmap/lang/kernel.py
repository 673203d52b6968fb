"""The ``@taskmap.kernel`` decorator: a Python function becomes a :class:`~taskmap.runtime.kernel.Kernel`."""
from __future__ import annotations

from typing import Any, Callable

from ..ir.func import FuncKind
from ..runtime.kernel import Kernel
from .transpiler import transpile


def kernel(fn: Callable[..., Any] | None = None, *, kind: FuncKind | None = None) -> Any:
    """Parse ``fn`` (a kernel written with task mappings) into IR; the result is callable on arrays.

    A kernel is GPU-style when it sets ``attrs.grid_dim``/``attrs.block_dim`` or uses
    ``threadIdx``/``blockIdx``/``syncthreads``/``shared_tensor``; otherwise it is CPU-style.
    Errors in the kernel are reported at once, as :class:`~taskmap.errors.DSLError` pointing at
    the offending line and column.
    """
    def wrap(f: Callable[..., Any]) -> Kernel:
        return Kernel(transpile(f, kind=kind), f)

    return wrap(fn) if fn is not None else wrap
