"""How an operator of ``taskmap.ops`` runs: arrays in, a cached kernel, the same kind of array out.

* :func:`prepare` checks the arguments (numpy arrays, torch tensors, taskmap Tensors, on one
  device), makes them contiguous and reads their shapes and dtypes;
* :func:`target_for` picks the target: the host CPU for host arrays, the GPU of GPU arrays — or,
  inside :func:`emulate_gpu`, a GPU target for host arrays: the operators then schedule
  GPU-style kernels (blocks, warps, shuffles) and run them on the CPU with GPU semantics;
* :func:`run_compute` runs a compute definition through the rule-based scheduler,
  :func:`run_template` a template problem; kernels are cached per (operator, shapes, dtypes,
  parameters, target);
* :func:`host_plan` is the fast path of host calls seen before: C-contiguous numpy arrays (or
  torch CPU tensors) whose operator, parameters, types, shapes and dtypes match a call that
  passed every check and launched one kernel on its arrays as they came go straight to that
  kernel (a :class:`HostPlan`: the output allocated, the kernel called by addresses).

Shapes with no element are answered without a kernel; 0-d arrays run as 1-element ones.
"""
from __future__ import annotations

import contextvars
import math
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..backends import Target
from ..backends.base import host_cpu_target
from ..backends.cuda.target import cuda_target, current_cuda_target
from ..backends.hip.target import current_hip_target, hip_target
from ..compute.nodes import TensorInput, TensorNode, graph_inputs, tensor_input
from ..errors import LaunchError, OpError
from ..ir.dtypes import ScalarType, scalar_type
from ..runtime.args import array_info, data_ptr, is_torch_tensor, numpy_ptr
from ..runtime.kernel import Kernel
from ..schedule import tune
from ..schedule.rule_based import schedule
from ..templates.reduce import view
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


def run_template(template: Any, problem: Any, args: Args, inputs: Sequence[Any], out: Any,
                 plan: tuple[Any, ...] | None = None) -> Any:
    """Run ``problem`` with ``template`` (schedule chosen by the cost model) into ``out``.

    ``plan``: the :func:`host_plan` key of the call, when ``out`` is its result and this its only
    launch; the launch is remembered under it if the kernel's arguments are the call's arrays as
    they came, then ``out`` (the template's arguments are all arrays)."""
    kernel = template_kernel(template, problem, target_for(args.kind))
    kargs = template.arguments(problem, inputs, [out])
    if plan is not None and len(kargs) == len(args.arrays) + 1:
        ptrs = [data_ptr(a) for a in kargs]
        if ptrs == [data_ptr(a) for a in (*args.arrays, out)]:
            launch = kernel.build("cpu").bind_host(*kargs)
            launch(*ptrs)
            remember(plan, HostPlan(launch, out))   # run: the launch, by addresses
            return out
    _launch(kernel, args.kind, kargs)
    return out


def template_kernel(template: Any, problem: Any, target: Target) -> Kernel:
    """The kernel of ``problem`` with ``template`` on ``target``: the schedule chosen by
    :func:`taskmap.schedule.tune.choose` (``TASKMAP_TUNE`` picks the mode), cached per
    (template, problem, target) — what the operators run, and what the graph lowering fuses."""

    def make() -> Kernel:
        choice = tune.choose(template, problem, target)
        return template.instantiate(problem, target, choice)

    return _cached(("template", template.name, problem, target), make)


# ----------------------------------------------------------------------------- host plans


class PlannedCall:
    """A host call seen before (:func:`host_plan`): ``run(*arrays, out)`` into a new output
    allocated like the first call's."""

    __slots__ = ("run", "shape", "dtype", "device", "numpy")

    def __init__(self, run: Callable[..., None], out: Any) -> None:
        self.run, self.shape, self.dtype = run, tuple(out.shape), out.dtype
        self.numpy = type(out) is np.ndarray
        self.device = None if self.numpy else out.device

    def new(self) -> Any:
        if self.numpy:
            return np.empty(self.shape, self.dtype)
        return sys.modules["torch"].empty(self.shape, dtype=self.dtype, device=self.device)

    def __call__(self, *arrays: Any) -> Any:
        out = self.new()
        self.run(*arrays, out)
        return out


class HostPlan(PlannedCall):
    """A planned call of one kernel whose arguments are the arrays, then the output: ``run`` is
    its :class:`~taskmap.runtime.kernel.HostLaunch`, given their addresses."""

    def __call__(self, *arrays: Any) -> Any:
        out = self.new()
        if self.numpy:
            self.run(*[numpy_ptr(a) for a in arrays], numpy_ptr(out))
        else:
            self.run(*[a.data_ptr() for a in arrays], out.data_ptr())
        return out


_PLANS: dict[tuple[Any, ...], Callable[..., Any]] = {}
_PLAN_LIMIT = 4096
_TENSOR_TYPES: set[type] = set()   # torch tensor types seen (is_torch_tensor is slower)


def host_plan(head: tuple[Any, ...], *arrays: Any) -> tuple[Callable[..., Any] | None, tuple[Any, ...] | None]:
    """The plan of a call of the operator ``head[0]`` with parameters ``head[1:]`` on ``arrays``
    (``plan(*arrays)`` gives the result), and its key: (None, key) when none is made yet — pass
    the key to :func:`run_template`, or :func:`remember` a plan —, (None, None) when the call
    cannot have one (not all C-contiguous numpy arrays or torch CPU tensors of one type,
    unhashable parameters, inside :func:`emulate_gpu`)."""
    if _EMULATION.get() is not None:
        return None, None
    t = type(arrays[0])
    if t is np.ndarray:
        for a in arrays:
            if type(a) is not t or not a.flags.c_contiguous:
                return None, None
    elif t in _TENSOR_TYPES or is_torch_tensor(arrays[0]):
        _TENSOR_TYPES.add(t)
        for a in arrays:
            if type(a) is not t or not a.is_cpu or not a.is_contiguous():
                return None, None
    else:
        return None, None
    key = (head, tuple(map(_typed, head)), t, *[(a.shape, a.dtype) for a in arrays])
    try:
        return _PLANS.get(key), key
    except TypeError:   # an unhashable parameter (a list)
        return None, None


def remember(key: tuple[Any, ...], plan: Callable[..., Any]) -> None:
    """Serve later calls of ``key`` (from :func:`host_plan`) with ``plan``: only for a call that
    passed every check, whose result ``plan`` computes from arrays like its own."""
    if len(_PLANS) >= _PLAN_LIMIT:
        _PLANS.clear()
    _PLANS[key] = plan


def _typed(p: Any) -> Any:
    """A parameter's type, and its items' (``True == 1 == 1.0``, but ``axis=True`` or ``1.0``
    must fail as it did): equal keys are calls the checks treat alike."""
    t = type(p)
    return (t, *map(type, p)) if t is tuple else t


def clear_plans() -> None:
    """Forget the host plans (the kernels stay cached)."""
    _PLANS.clear()


def clear_kernels() -> None:
    """Forget the templates' kernels made in this process, and the host plans: a compiler patched
    at run time (a benchmark's A/B, ``benchmarks/ab_steps.py``) makes them again."""
    with _LOCK:
        _KERNELS.clear()
    clear_plans()


__all__ = ["Args", "Emulation", "FLOATS", "HostPlan", "PlannedCall", "SUPPORTED", "check_dtype", "clear_kernels",
           "clear_plans", "dtype_name", "emulate_gpu", "filled", "host_plan", "kernel_shape", "new_output",
           "normalize_axis", "prepare",
           "remember", "run_compute", "run_template", "target_for", "template_kernel"]
