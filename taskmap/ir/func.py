"""Functions and modules of the tensor IR."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from .dtypes import HOOKS, ScalarType
from .expr import Expr, SizeVar, Var, const
from .stmt import Stmt


class FuncKind(enum.Enum):
    GPU_KERNEL = "gpu_kernel"    # launched on a grid of thread blocks (runs on the CPU too)
    DEVICE = "device"            # helper called from kernels
    CPU_KERNEL = "cpu_kernel"    # CPU-style kernel: workers are loop iterations, cores, lanes
    HOST = "host"                # host-side function (launch wrappers)


@dataclass(frozen=True)
class LaunchConfig:
    """Grid and block dimensions (x, y, z) of a GPU kernel: expressions of symbolic sizes."""

    grid_dim: tuple[Expr, Expr, Expr] = (const(1), const(1), const(1))
    block_dim: tuple[Expr, Expr, Expr] = (const(1), const(1), const(1))
    dynamic_smem: Expr = const(0)
    #: Blocks that should fit on one multiprocessor at once (``attrs.min_blocks``; 0: no request):
    #: the compiler keeps registers per thread within that occupancy (``__launch_bounds__``).
    min_blocks: int = 0

    def block_size(self) -> int | None:
        """Threads per block when the block dimensions are constants."""
        total = 1
        for d in self.block_dim:
            v = getattr(d, "value", None)
            if not isinstance(v, int):
                return None
            total *= v
        return total


@dataclass(frozen=True, eq=False)
class Function:
    name: str
    kind: FuncKind
    params: tuple[Var, ...]
    body: Stmt
    ret: ScalarType | None = None
    launch: LaunchConfig | None = None
    size_vars: tuple[SizeVar, ...] = field(default=())  # symbolic sizes, passed after the params

    def with_body(self, body: Stmt) -> "Function":
        return self if body is self.body else replace(self, body=body)

    def __repr__(self) -> str:
        return HOOKS["func_str"](self)  # set by ir.printer


@dataclass(frozen=True, eq=False)
class Module:
    """A set of functions compiled together; ``entry`` names the kernel users launch."""

    functions: tuple[Function, ...]
    entry: str

    def __post_init__(self) -> None:
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate function names in module: {names}")
        if self.entry not in names:
            raise ValueError(f"entry {self.entry!r} is not a function of the module")

    @property
    def entry_function(self) -> Function:
        return self.lookup(self.entry)

    def lookup(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def map_functions(self, fn) -> "Module":
        new = tuple(fn(f) for f in self.functions)
        if all(a is b for a, b in zip(new, self.functions)):
            return self
        return Module(new, self.entry)

    def __repr__(self) -> str:
        return "\n\n".join(repr(f) for f in self.functions)
