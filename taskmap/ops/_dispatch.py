"""How an operator of ``taskmap.ops`` runs: arrays in, a cached kernel, the same kind of array out.

* :func:`prepare` checks the arguments (numpy arrays, torch tensors, taskmap Tensors, on one
  device), makes them contiguous and reads their shapes and dtypes;
* :func:`target_for` picks the target: the host CPU for host arrays, the GPU of GPU arrays — or,
  inside :func:`emulate_gpu`, a GPU target for host arrays: the operators then schedule
  GPU-style kernels (blocks, warps, shuffles) and run them on the CPU with GPU semantics;
* :func:`run_compute` runs a compute definition through the rule-based scheduler,
  :func:`run_template` a template problem; kernels are cached per (operator, shapes, dtypes,
  parameters, target).

Shapes with no element are answered without a kernel; 0-d arrays run as 1-element ones.
"""
from __future__ import annotations

import contextvars
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..backends import Target, TargetKind
from ..backends.base import host_cpu_target
from ..backends.cuda.target import cuda_target, current_cuda_target
from ..backends.hip.target import current_hip_target, hip_target
from ..compute.nodes import TensorInput, TensorNode, graph_inputs, tensor_input
from ..errors import LaunchError, OpError
from ..ir.dtypes import ScalarType, scalar_type
from ..runtime.kernel import Kernel
from ..schedule import tune
from ..schedule.rule_based import schedule
from ..templates.reduce import view
from ..runtime.args import array_info
from .arrays import ArrayKind, contiguous, describe, empty_like_kind

#: dtypes the operators accept (by name), as arrays of numpy or torch.
SUPPORTED = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16", "float32", "float64")
FLOATS = ("float16", "bfloat16", "float32", "float64")


@dataclass
class Emulation:
    """Inside ``emulate_gpu``: the GPU target scheduled for, and the kernels the operators ran."""

    target: Target
    kernels: list[Kernel] = field(default_factory=list)


_EMULATION: contextvars.ContextVar[Emulation | None] = contextvars.ContextVar("taskmap_ops_emulation", default=None)


@contextmanager
def emulate_gpu(arch: str = "sm_90") -> Iterator[Emulation]:
    """Schedule operators on host arrays for the GPU ``arch`` ("sm_90", "gfx90a", ...) and run
    those GPU-style kernels on the CPU, with GPU semantics (tests; no GPU needed).  The
    returned object lists the kernels used (``.kernels``): build them with
    ``k.build("cuda", arch=...)`` to check that they compile for the real device."""
    target = hip_target(arch) if arch.startswith("gfx") else cuda_target(arch)
    emu = Emulation(target)
    token = _EMULATION.set(emu)
    try:
        yield emu
    finally:
        _EMULATION.reset(token)


def target_for(kind: ArrayKind) -> Target:
    emu = _EMULATION.get()
    if kind.target == "cpu":
        return emu.target if emu is not None else _host()
    index = int(kind.device.partition(":")[2] or 0)
    return current_cuda_target(index) if kind.target == "cuda" else current_hip_target(index)


_HOST: list[Target] = []


def _host() -> Target:
    if not _HOST:
        _HOST.append(host_cpu_target())
    return _HOST[0]


# ----------------------------------------------------------------------------- arguments


@dataclass(frozen=True)
class Args:
    kind: ArrayKind
    arrays: tuple[Any, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


def prepare(op: str, *arrays: Any, allowed: Sequence[str] = SUPPORTED) -> Args:
    """Check and normalise the array arguments of ``op``."""
    for k, a in enumerate(arrays):
        if isinstance(a, (bool, int, float)) or a is None:
            raise OpError(f"{op}(): argument {k + 1} must be an array (numpy, torch or taskmap), got "
                          f"{type(a).__name__}")
    try:
        kind = describe(*arrays)
    except LaunchError as e:
        raise LaunchError(f"{op}(): {e}") from None
    infos = [array_info(a) for a in arrays]
    arrs = tuple(a if info.contiguous else contiguous(a) for a, info in zip(arrays, infos))  # type: ignore[union-attr]
    dtypes = tuple(info.dtype for info in infos)  # type: ignore[union-attr]
    for d in dtypes:
        check_dtype(op, d, allowed)
    if kind.library == "numpy" and "bfloat16" in dtypes:
        raise OpError(f"{op}(): numpy has no bfloat16; pass torch tensors")
    return Args(kind, arrs, tuple(info.shape for info in infos), dtypes)  # type: ignore[union-attr]


def check_dtype(op: str, dtype: str, allowed: Sequence[str]) -> None:
    if dtype not in allowed:
        raise OpError(f"{op}() does not support dtype {dtype}; supported: {', '.join(allowed)}")


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise OpError(f"{op}(): axis must be an int, got {axis!r}")
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= axis <= hi:
        raise OpError(f"{op}(): axis {axis} is out of range for a {ndim}-d array (expected {lo}..{hi})")
    return axis % max(ndim, 1)


def dtype_name(dtype: Any) -> str:
    """A dtype given as a name, a numpy or torch dtype, or a ScalarType -> its name."""
    if isinstance(dtype, ScalarType):
        return dtype.name
    try:
        return scalar_type(str(dtype).replace("torch.", "")).name
    except TypeError:
        pass
    try:
        return scalar_type(np.dtype(dtype).name).name
    except TypeError:
        raise OpError(f"unknown dtype {dtype!r}") from None


# ----------------------------------------------------------------------------- kernels

_KERNELS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


def _cached(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    with _LOCK:
        hit = _KERNELS.get(key)
    if hit is None:
        hit = make()
        with _LOCK:
            hit = _KERNELS.setdefault(key, hit)
    return hit


def _record(kernel: Kernel) -> None:
    emu = _EMULATION.get()
    if emu is not None and kernel not in emu.kernels:
        emu.kernels.append(kernel)


def _launch(kernel: Kernel, kind: ArrayKind, args: Sequence[Any]) -> None:
    """Run ``kernel`` on the device of ``kind`` (its build for that device is cached)."""
    _record(kernel)
    kernel.build(kind.target)(*args)


def kernel_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape a kernel sees: 0-d arrays are 1-element 1-d ones."""
    return tuple(shape) or (1,)


def new_output(kind: ArrayKind, shape: Sequence[int], dtype: str) -> Any:
    return empty_like_kind(kind, tuple(shape), dtype)


def filled(kind: ArrayKind, shape: Sequence[int], dtype: str, value: Any) -> Any:
    """A new array of ``kind`` holding ``value`` everywhere (no kernel: for the corner cases of
    empty inputs, which have nothing to compute)."""
    out = new_output(kind, shape, dtype)
    if math.prod(shape) == 0:
        return out
    if isinstance(out, np.ndarray):
        out.fill(value)
    elif hasattr(out, "fill_"):
        out.fill_(value)
    else:
        out.copy_(np.full(tuple(shape), value, dtype=dtype))
    return out


def run_compute(op: str, key: tuple[Any, ...], args: Args, out_shape: Sequence[int], out_dtype: str,
                define: Callable[[list[TensorInput]], TensorNode]) -> Any:
    """Run the compute definition ``define(inputs)`` (built from the kernel shapes of ``args``)
    with the rule-based scheduler; the result has ``out_shape`` and ``out_dtype``."""
    out = new_output(args.kind, out_shape, out_dtype)
    if math.prod(out_shape) == 0:
        return out
    target = target_for(args.kind)
    shapes = tuple(kernel_shape(s) for s in args.shapes)

    def make() -> tuple[Kernel, tuple[int, ...]]:
        inputs = [tensor_input(f"x{k}", d, s) for k, (d, s) in enumerate(zip(args.dtypes, shapes))]
        node = define(inputs)
        if tuple(node.shape) != kernel_shape(out_shape) or node.dtype.name != out_dtype:
            raise AssertionError(f"{op}: definition gives {node.dtype!r}{list(node.shape)}, expected "
                                 f"{out_dtype}{list(out_shape)}")
        read = {id(n) for n in graph_inputs(node)}
        used = tuple(k for k, x in enumerate(inputs) if id(x) in read)  # inputs the definition reads
        return schedule(node, target, inputs=[inputs[k] for k in used], name=op), used

    kernel, used = _cached(("compute", op, key, shapes, args.dtypes, target), make)
    _launch(kernel, args.kind, [*(view(args.arrays[k], shapes[k]) for k in used), view(out, kernel_shape(out_shape))])
    return out


def run_template(template: Any, problem: Any, args: Args, inputs: Sequence[Any], out: Any) -> Any:
    """Run ``problem`` with ``template`` (schedule chosen by the cost model) into ``out``."""
    kernel = template_kernel(template, problem, target_for(args.kind))
    _launch(kernel, args.kind, template.arguments(problem, inputs, [out]))
    return out


def template_kernel(template: Any, problem: Any, target: Target) -> Kernel:
    """The kernel of ``problem`` with ``template`` on ``target``: the schedule chosen by
    :func:`taskmap.schedule.tune.choose` (``TASKMAP_TUNE`` picks the mode), cached per
    (template, problem, target) — what the operators run, and what the graph lowering fuses."""

    def make() -> Kernel:
        choice = tune.choose(template, problem, target)
        return template.instantiate(problem, target, choice)

    return _cached(("template", template.name, problem, target), make)


__all__ = ["Args", "Emulation", "FLOATS", "SUPPORTED", "check_dtype", "dtype_name", "emulate_gpu", "kernel_shape",
           "filled", "new_output", "normalize_axis", "prepare", "run_compute", "run_template", "target_for",
           "template_kernel"]
