"""Matrix products with torch's semantics: ``matmul``, ``bmm``, ``linear``.

* ``matmul(a, b)``: 1-D operands are vectors (a row on the left, a column on the right, the
  dimension dropped from the result); N-D operands are stacks of matrices whose batch dimensions
  broadcast (``(2, 1, m, k) @ (3, k, n) -> (2, 3, m, n)``).
* ``bmm(a, b)``: ``(B, m, k) @ (B, k, n)``, no broadcasting.
* ``linear(x, weight, bias=None)``: ``x @ weight.T + bias`` over any leading dimensions of ``x``;
  the weight is read in place (``trans_b``), the bias added by the kernel.

numpy arrays, torch tensors and taskmap Tensors in, the same kind out.  On the CPU float32
runs the template :mod:`taskmap.templates.matmul_cpu`; bfloat16 with one right-hand matrix runs
on AVX-512 BF16's dot products where the CPU has them (:mod:`taskmap.templates.matmul_cpu_bf16`,
the matrix packed for the call), other float16 / bfloat16 products in float32, rounded once (as
PyTorch sums them); on a GPU — or inside
``taskmap.ops.emulate_gpu`` — float32 runs the SIMT template and float16 / bfloat16 the
tensor-core one (f32 accumulation, result in the input dtype).  A stack whose right operand is
one matrix is one tall matmul.  A kernel is chosen (``taskmap.schedule.tune.choose``) and built
once per (problem, target), cached in the process (and its binary on disk); host launches skip
argument re-checking (``CompiledKernel.bind_host``).
"""
from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import numpy as np

from ..backends import Target, TargetKind
from ..errors import OpError
from ..runtime.args import data_ptr as _ptr
from ..runtime.args import is_torch_tensor
from ..runtime.kernel import HostLaunch
from ..schedule import tune
from ..templates.matmul_cpu import MATMUL_CPU, NO_INDEX
from ..templates.matmul_cpu_bf16 import MATMUL_CPU_BF16
from ..templates.matmul_problem import WORKSPACE, MatmulProblem, view
from ..templates.matmul_simt import MATMUL_SIMT
from ..templates.matmul_tc import MATMUL_TC
from ._dispatch import (
    FLOATS,
    PlannedCall,
    _record,
    clear_plans,
    host_plan,
    new_output,
    prepare,
    remember,
    target_for,
)
from .arrays import ArrayKind
from .elementwise import cast

_NUMPY_CPU = ArrayKind("numpy", "cpu")
INT32_LIMIT = 2**31 - 1
_ZERO = np.zeros(1, np.float32)


# ----------------------------------------------------------------------------- public operators


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` like ``torch.matmul`` (vectors, matrices, broadcast stacks of matrices)."""
    planned, key = host_plan(("matmul",), a, b)
    if planned is not None:
        return planned(a, b)
    kind, (a, b), (sa, sb), dt = _operands("matmul", a, b)
    if len(sa) == 0 or len(sb) == 0:
        raise OpError(f"matmul(): both arguments need at least 1 dimension, got shapes {sa} and {sb}")
    va, vb = len(sa) == 1, len(sb) == 1
    sa2 = (1, sa[0]) if va else sa
    sb2 = (sb[0], 1) if vb else sb
    if sa2[-1] != sb2[-2]:
        raise OpError(f"matmul(): inner dimensions differ: {_shape(sa)} @ {_shape(sb)} ({sa2[-1]} != {sb2[-2]})")
    try:
        batch = tuple(np.broadcast_shapes(sa2[:-2], sb2[:-2]))
    except ValueError:
        raise OpError(f"matmul(): batch dimensions {sa2[:-2]} and {sb2[:-2]} do not broadcast") from None
    m, k, n = sa2[-2], sa2[-1], sb2[-1]
    out_shape = batch + ((m,) if not va else ()) + ((n,) if not vb else ())
    if vb and not va and len(sa2) > 2 and _elems(sb2[:-2]) == 1:   # stack @ vector: one tall matrix-vector
        out = _product("matmul", kind, dt, a, b, 1, _elems(batch) * m, 1, k, False)
        return _reshape(out, out_shape)
    if len(sa) == len(sb) == 2:
        return _reshape(_product("matmul", kind, dt, a, b, 1, m, n, k, False, plan=(key, out_shape)), out_shape)
    return _reshape(_batched("matmul", kind, dt, a, b, sa2, sb2, batch, m, n, k), out_shape)


def bmm(a: Any, b: Any) -> Any:
    """``torch.bmm``: ``(B, m, k) @ (B, k, n) -> (B, m, n)``."""
    kind, (a, b), (sa, sb), dt = _operands("bmm", a, b)
    if len(sa) != 3 or len(sb) != 3:
        raise OpError(f"bmm(): both arguments must be 3-D, got shapes {_shape(sa)} and {_shape(sb)}")
    if sa[0] != sb[0]:
        raise OpError(f"bmm(): batch sizes differ: {sa[0]} and {sb[0]}")
    if sa[2] != sb[1]:
        raise OpError(f"bmm(): inner dimensions differ: {_shape(sa)} @ {_shape(sb)} ({sa[2]} != {sb[1]})")
    return _batched("bmm", kind, dt, a, b, sa, sb, (sa[0],), sa[1], sb[2], sa[2])


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """``torch.nn.functional.linear``: ``x @ weight.T + bias``; ``x (..., in)``, ``weight (out, in)``
    (or ``(in,)``), ``bias (out,)``."""
    arrays = (x, weight) if bias is None else (x, weight, bias)
    planned, key = host_plan(("linear",), *arrays)
    if planned is not None:
        return planned(*arrays)
    kind, arrs, shapes, dt = _operands("linear", *arrays)
    sx, sw = shapes[0], shapes[1]
    if len(sx) == 0 or len(sw) not in (1, 2):
        raise OpError(f"linear(): input must have at least 1 dimension and weight 1 or 2, got shapes "
                      f"{_shape(sx)} and {_shape(sw)}")
    n = sw[0] if len(sw) == 2 else 1
    if sx[-1] != sw[-1]:
        raise OpError(f"linear(): input features {sx[-1]} do not match the weight's {sw[-1]} (shapes {_shape(sx)} "
                      f"and {_shape(sw)})")
    if bias is not None and shapes[2] not in ((n,), () if len(sw) == 1 else (n,)):
        raise OpError(f"linear(): bias must have shape ({n},), got {_shape(shapes[2])}")
    m, k = _elems(sx[:-1]), sx[-1]
    out_shape = sx[:-1] + ((n,) if len(sw) == 2 else ())
    bias_arr = None if bias is None else _reshape(arrs[2], (n,))
    plan = (key, out_shape) if len(sw) == 2 else None       # a bias (n,) goes in as it came
    return _reshape(_product("linear", kind, dt, arrs[0], arrs[1], 1, m, n, k, True, bias_arr, plan=plan), out_shape)


# ----------------------------------------------------------------------------- shapes and checks


def _operands(op: str, *arrays: Any) -> tuple[ArrayKind, list[Any], list[tuple[int, ...]], str]:
    """Kind, contiguous arrays, shapes and the common dtype (fast path for numpy arrays)."""
    if all(type(x) is np.ndarray for x in arrays):
        arrs = [x if x.flags.c_contiguous else np.ascontiguousarray(x) for x in arrays]
        kind, shapes, dtypes = _NUMPY_CPU, [x.shape for x in arrs], [x.dtype.name for x in arrs]
        for d in dtypes:
            if d not in FLOATS:
                raise OpError(f"{op}() needs floating-point arrays, got {d}")
    else:
        args = prepare(op, *arrays, allowed=FLOATS)
        kind, arrs, shapes, dtypes = args.kind, list(args.arrays), list(args.shapes), list(args.dtypes)
    if len(set(dtypes)) > 1:
        raise OpError(f"{op}(): arguments must have the same dtype, got {', '.join(dtypes)}")
    return kind, arrs, [tuple(s) for s in shapes], dtypes[0]


def _shape(s: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def _elems(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _reshape(x: Any, shape: Sequence[int]) -> Any:
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    if isinstance(x, np.ndarray):
        return x.reshape(shape)
    if is_torch_tensor(x):
        return x.reshape(shape)
    return view(x, shape)


def _broadcast(x: Any, shape: Sequence[int]) -> Any:
    """``x`` materialised with broadcast batch dimensions (a contiguous copy)."""
    shape = tuple(shape)
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(np.broadcast_to(x, shape))
    if is_torch_tensor(x):
        return x.expand(shape).contiguous()
    raise OpError(f"matmul(): broadcasting the batch dimensions of a {type(x).__name__} is not supported; "
                  "expand the operands first")


def _batched(op: str, kind: ArrayKind, dt: str, a: Any, b: Any, sa: tuple[int, ...], sb: tuple[int, ...],
             batch: tuple[int, ...], m: int, n: int, k: int) -> Any:
    nb = _elems(batch)
    a_one, b_one = _elems(sa[:-2]) == 1, _elems(sb[:-2]) == 1
    if b_one and not a_one and tuple(sa[:-2]) == batch:             # a stack times one matrix: fold
        return _reshape(_product(op, kind, dt, a, b, 1, nb * m, n, k, False), batch + (m, n))
    if not a_one and tuple(sa[:-2]) != batch:
        a = _broadcast(_reshape(a, sa), batch + sa[-2:])
    if not b_one and tuple(sb[:-2]) != batch:
        b = _broadcast(_reshape(b, sb), batch + sb[-2:])
    return _reshape(_product(op, kind, dt, a, b, nb, m, n, k, False, a_batched=not a_one,
                             b_batched=not b_one), batch + (m, n))


# ----------------------------------------------------------------------------- running


def _product(op: str, kind: ArrayKind, dt: str, a: Any, b: Any, batch: int, m: int, n: int, k: int,
             trans_b: bool, bias: Any = None, a_batched: bool = True, b_batched: bool = True,
             plan: tuple[Any, tuple[int, ...]] | None = None) -> Any:
    """``c (batch, m, n) = a @ b (+ bias)`` (``b`` is ``(n, k)`` with ``trans_b``), a new array of
    ``kind``; ``a_batched`` / ``b_batched``: whether the operand has the batch dimension.
    ``plan``: the call's :func:`host_plan` key (or None) and result shape, when ``a``, ``b`` and
    ``bias`` are its arrays as they came: host calls like it then go straight to the kernel."""
    out = new_output(kind, (batch, m, n), dt)
    if batch * m * n == 0:
        return out
    if k == 0:
        _fill(out, bias)
        return out
    target = target_for(kind)
    if batch == 1:
        a_batched = b_batched = True
    for size in (batch * (m + 16) * k, batch * k * (n + 64), batch * m * n):
        if size > INT32_LIMIT:
            raise OpError(f"{op}(): operands of {batch} x {m} x {n} x {k} are too large for 32-bit indexing")
    if target.kind is TargetKind.CPU and dt in ("float16", "bfloat16"):
        return _half_product(op, kind, dt, a, b, batch, m, n, k, trans_b, bias, a_batched, b_batched, out, target)
    swap = _swapped(target, batch, m, n, trans_b)
    if swap:        # c^T = b a^T: the transposing copy goes to the smaller operand (see _swapped)
        problem = MatmulProblem(1, n, m, k, dt, dt, True, True, True, bias is not None, trans_c=True)
        a, b = b, a
    else:
        problem = MatmulProblem(batch, m, n, k, dt, dt, a_batched, b_batched, trans_b, bias is not None)
    run = _plan(op, problem, target)
    run(kind, a, b, bias, out)
    if plan is not None and plan[0] is not None and target.kind is TargetKind.CPU:
        remember(plan[0], PlannedCall(_host_call(run, kind, swap, bias is not None), _reshape(out, plan[1])))
    return out


def _half_product(op: str, kind: ArrayKind, dt: str, a: Any, b: Any, batch: int, m: int, n: int, k: int,
                  trans_b: bool, bias: Any, a_batched: bool, b_batched: bool, out: Any, target: Target) -> Any:
    """A half-precision product on the CPU: one bf16 matrix ``b`` on AVX-512 BF16's dot products
    (:mod:`taskmap.templates.matmul_cpu_bf16`, its panels packed for the call); else computed in
    float32 and rounded once — PyTorch's CPU kernels sum half-precision products in f32 too."""
    problem = MatmulProblem(1, m, n, k, dt, dt, True, True, trans_b, bias is not None, const_b=True)
    if batch == 1 and MATMUL_CPU_BF16.applies(problem, target):
        sched = tune.choose(MATMUL_CPU_BF16, problem, target)
        inputs = [a, b] if bias is None else [a, b, bias]
        args = MATMUL_CPU_BF16.arguments(problem, inputs, [out], sched, target)
        MATMUL_CPU_BF16.instantiate(problem, target, sched)(*args)
        return out
    wide = [None if x is None else cast(x, "float32") for x in (a, b, bias)]
    c = _product(op, kind, "float32", wide[0], wide[1], batch, m, n, k, trans_b, wide[2], a_batched, b_batched)
    return cast(c, dt)


def _host_call(plan: Any, kind: ArrayKind, swap: bool, bias: bool) -> Any:
    """``run(a, b, [bias], out)`` of a planned host call (operands swapped when the plan was)."""
    if bias:
        if swap:
            return lambda a, b, c, out: plan(kind, b, a, c, out)
        return lambda a, b, c, out: plan(kind, a, b, c, out)
    if swap:
        return lambda a, b, out: plan(kind, b, a, None, out)
    return lambda a, b, out: plan(kind, a, b, None, out)


def _swapped(target: Target, batch: int, m: int, n: int, trans_b: bool) -> bool:
    """Whether to compute ``c = a b^T`` as ``c^T = b a^T`` (on the CPU): the operand on the vector
    side of the micro-kernel is copied transposed when it is stored (rows, k), and the other one
    is read in place — so the transposed copy should be of the smaller one."""
    return trans_b and batch == 1 and target.kind is TargetKind.CPU and m < n


def _fill(out: Any, bias: Any) -> None:
    """k == 0: the product is zeros (plus the bias)."""
    if isinstance(out, np.ndarray):
        out[...] = 0 if bias is None else bias
    elif is_torch_tensor(out):
        out.zero_()
        if bias is not None:
            out += bias
    else:
        host = np.zeros(out.shape, np.float32)
        out.copy_(host if bias is None else host + np.asarray(bias.numpy(), np.float32))


_PLANS: dict[tuple[MatmulProblem, Target], Any] = {}
_LOCK = threading.Lock()


def _plan(op: str, problem: MatmulProblem, target: Target) -> Any:
    key = (problem, target)
    plan = _PLANS.get(key)
    if plan is None:
        template = _template_for(op, problem, target)
        schedule = tune.choose(template, problem, target)
        kernel = template.instantiate(problem, target, schedule)
        plan = _HostPlan(template, problem, target, schedule, kernel) if target.kind is TargetKind.CPU else \
            _DevicePlan(template, problem, target, schedule, kernel)
        with _LOCK:
            plan = _PLANS.setdefault(key, plan)
    return plan


def _template_for(op: str, p: MatmulProblem, target: Target) -> Any:
    if target.kind is TargetKind.CPU:
        if p.dtype != "float32":
            raise OpError(f"{op}() on the CPU supports float32 only, got {p.dtype}")
        return MATMUL_CPU
    if p.dtype == "float32":
        return MATMUL_SIMT
    if p.dtype in ("float16", "bfloat16") and MATMUL_TC.applies(p, target):
        return MATMUL_TC
    kinds = "float32, float16 and bfloat16" if "mma_m16n8k16" in target.features else "float32"
    raise OpError(f"{op}() on {target.name} supports {kinds}, got {p.dtype}")


_ZERO_PTR = _ZERO.ctypes.data


class _HostPlan:
    """A CPU kernel launched by addresses (``CompiledKernel.bind_host``): the operator checked
    the shapes, the first call binds the launch (the plan fixes every shape)."""

    def __init__(self, template: Any, problem: MatmulProblem, target: Target, schedule: Any, kernel: Any) -> None:
        self.template, self.problem, self.schedule = template, problem, schedule
        self.kernel, self.target = kernel, target
        self.wa, self.wb = template.workspace_sizes(problem, schedule, target)
        self.launch: HostLaunch | None = None
        self.tail: tuple[int, ...] = ()
        self._workspace: dict[int, tuple[int, int, int]] = {}   # thread -> generation, workspace pointers

    def __call__(self, kind: ArrayKind, a: Any, b: Any, bias: Any, c: Any) -> None:
        if self.launch is None:
            inputs = [a, b] if bias is None else [a, b, bias]
            args = self.template.arguments(self.problem, inputs, [c], self.schedule, self.target)
            self.launch = self.kernel.build("cpu").bind_host(*args)
            self.tail = (NO_INDEX.ctypes.data,) * (self.launch.arity - 7)     # bidx, where the kernel has it
        tid = threading.get_ident()
        ws = self._workspace.get(tid)
        if ws is None or ws[0] != WORKSPACE.generation():
            wa, wb = WORKSPACE.get("cpu_a", self.wa), WORKSPACE.get("cpu_b", self.wb)
            ws = self._workspace[tid] = (WORKSPACE.generation(), _ptr(wa), _ptr(wb))
        pc = _ptr(c)          # c is also cw, the partial sums (write-once c: see matmul_cpu_kernel)
        self.launch(_ptr(a), _ptr(b), _ZERO_PTR if bias is None else _ptr(bias), pc, pc, ws[1], ws[2], *self.tail)


class _DevicePlan:
    """A GPU-style kernel (on its GPU, or emulated on the CPU): launched through its checks."""

    def __init__(self, template: Any, problem: MatmulProblem, target: Target, schedule: Any, kernel: Any) -> None:
        self.template, self.problem, self.schedule, self.kernel = template, problem, schedule, kernel

    def __call__(self, kind: ArrayKind, a: Any, b: Any, bias: Any, c: Any) -> None:
        inputs = [a, b] if bias is None else [a, b, bias]
        args = self.template.arguments(self.problem, inputs, [c], self.schedule)
        for k in getattr(self.kernel, "kernels", (self.kernel,)):
            _record(k)
        self.kernel.build(kind.target)(*args)


def clear_cache() -> None:
    """Forget the planned kernels (their binaries stay in the on-disk cache)."""
    with _LOCK:
        _PLANS.clear()
    clear_plans()
    WORKSPACE.clear()


__all__ = ["bmm", "clear_cache", "linear", "matmul"]
