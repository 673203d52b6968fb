"""2-D convolution like ``torch.nn.functional.conv2d``: a direct convolution or an implicit GEMM.

``conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)``: ``x`` NCHW (or
CHW), ``weight`` ``(C_out, C_in / groups, kh, kw)``, ``bias`` ``(C_out,)``; ``padding`` an int, a
pair, ``"valid"`` or ``"same"`` (stride 1; the odd extra pad goes bottom / right, as in torch).
float32 on the CPU; float32, float16 and bfloat16 on GPUs (and inside ``emulate_gpu``).

Per image ``b`` and group ``g`` (the matmul's batch is ``N * groups``)::

    C[b*G + g, co, p] = sum_kd  W[g, co, kd] * Col[b*G + g, kd, p]
    kd = (ci, r, s) of the group's C_in/G x kh x kw taps,  p = (oh, ow) of the output pixels

``C`` *is* the NCHW output (``(N*G, C_out/G, OH*OW)`` is a view of ``(N, C_out, OH, OW)``).
``Col`` is never materialised: it is an img2col **prologue** spliced by post-scheduling fusion
(:mod:`taskmap.fusion`) into the B-operand loads of the matmul template — the CPU template's B
packing (which then reads the image, zero for padding), the SIMT template's shared-memory tile
loads, the tensor-core template's ``cp_async`` tile copies (made synchronous element loads).
1x1 convolutions with stride 1 and no padding need no prologue (``x`` is already ``Col``).  The
weights are ``A`` as stored (a prologue picks the group when there are several images and
groups).  The bias is an **epilogue** spliced into the stores of ``C``.

On the CPU, :func:`taskmap.ops.conv_route.route` (the direct template's points and the
implicit GEMM's in one space: the cost model's choice, or a measured one under
``TASKMAP_TUNE``; the graph compiler asks the same function) may route an f32 convolution to
the **direct-convolution template** instead (no img2col: the input packed once into its padded
stride phases, register tiles of output channels x pixels; see
:mod:`taskmap.templates.conv_cpu_kernel`), the bias an epilogue spliced into its NCHW stores.
Everything below describes the implicit GEMM.

Schedules come from the matmul templates' cost models (on the CPU, from the route), restricted
to those a prologue suits: on the CPU, operands with a prologue are packed (the prologue runs
once per element, not in the micro-kernel); on GPUs no split-K (one kernel).  ``groups == C_in`` with one input channel
per group (depthwise) goes to :func:`taskmap.ops.depthwise_conv2d`.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..backends import Target, TargetKind
from ..errors import OpError
from ..fusion import fuse
from ..runtime.args import aligned, data_ptr
from ..runtime.kernel import HostLaunch, Kernel
from ..schedule import tune
from ..templates.base import Schedule
from ..templates.conv_cpu import CONV_CPU
from ..templates.conv_problem import ConvProblem, output_size
from ..templates.matmul_cpu import MATMUL_CPU, NO_INDEX
from ..templates.matmul_problem import WORKSPACE, MatmulProblem, new_like, view
from ..templates.matmul_simt import MATMUL_SIMT
from ..templates.matmul_tc import MATMUL_TC
from ._dispatch import (
    FLOATS,
    PlannedCall,
    _launch,
    host_plan,
    new_output,
    prepare,
    remember,
    target_for,
)
from .arrays import ArrayKind
from .conv_defs import (bias_epilogue, direct_bias_epilogue, direct_sizes, gemm_prologues, gemm_views, grouped_weights,
                        img2col)
from .conv_route import gemm_kernel, route
from .depthwise import depthwise_conv2d

OP = "conv2d"


# ----------------------------------------------------------------------------- arguments


def pair(op: str, name: str, value: Any, *, minimum: int) -> tuple[int, int]:
    """An int or a sequence of one or two ints -> (h, w), each at least ``minimum``."""
    items = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if items is None or not 1 <= len(items) <= 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise OpError(f"{op}(): {name} must be an int or a tuple of one or two ints, got {value!r}")
    h, w = items if len(items) == 2 else items * 2
    if h < minimum or w < minimum:
        raise OpError(f"{op}(): {name} must be {'positive' if minimum == 1 else 'non-negative'}, got {value!r}")
    return h, w


def _planes(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(N, C, H, W) of an NCHW or CHW input (N = 1 for CHW), with non-empty C, H, W."""
    if len(shape) not in (3, 4):
        raise OpError(f"{OP}(): expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape {shape}")
    n, c, h, w = (1, *shape) if len(shape) == 3 else shape
    if c == 0 or h == 0 or w == 0:
        raise OpError(f"{OP}(): the input's channel and spatial dimensions must be non-empty, got shape {shape}")
    return n, c, h, w


def _padding(padding: Any, k: tuple[int, int], d: tuple[int, int], s: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding == "same":
            if s != (1, 1):
                raise OpError(f"{OP}(): padding='same' is not supported for strided convolutions (stride {s})")
            th, tw = (dd * (kk - 1) for kk, dd in zip(k, d))
            return th // 2, th - th // 2, tw // 2, tw - tw // 2
        raise OpError(f"{OP}(): padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")
    ph, pw = pair(OP, "padding", padding, minimum=0)
    return ph, ph, pw, pw


def conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Any:
    """``torch.nn.functional.conv2d``: implicit GEMM (img2col prologue + matmul template + bias
    epilogue, spliced into one kernel)."""
    arrays = [x, weight] + ([bias] if bias is not None else [])
    planned, key = host_plan((OP, stride, padding, dilation, groups), *arrays)
    if planned is not None:
        return planned(*arrays)
    args = prepare(OP, *arrays, allowed=FLOATS)
    n, cin, h, w = _planes(tuple(args.shapes[0]))
    wshape = tuple(args.shapes[1])
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise OpError(f"{OP}(): groups must be a positive int, got {groups!r}")
    if len(wshape) != 4:
        raise OpError(f"{OP}(): weight must be 4-d (C_out, C_in / groups, kh, kw), got shape {wshape}")
    cout, cg, kh, kw = wshape
    if cin % groups:
        raise OpError(f"{OP}(): the input's {cin} channels are not divisible by groups={groups}")
    if cout == 0 or cout % groups:
        raise OpError(f"{OP}(): the weight's {cout} output channels must be a positive multiple of groups={groups}")
    if cg != cin // groups:
        raise OpError(f"{OP}(): weight {wshape} expects {cg * groups} input channels (C_in / groups = {cg}), "
                      f"the input has {cin} (shape {tuple(args.shapes[0])}, groups={groups})")
    if kh == 0 or kw == 0:
        raise OpError(f"{OP}(): the kernel must be non-empty, got weight shape {wshape}")
    if bias is not None and tuple(args.shapes[2]) != (cout,):
        raise OpError(f"{OP}(): bias must have shape ({cout},), got {tuple(args.shapes[2])}")
    if len(set(args.dtypes)) != 1:
        raise OpError(f"{OP}(): input, weight and bias must have one dtype, got {', '.join(args.dtypes)}")
    s = pair(OP, "stride", stride, minimum=1)
    d = pair(OP, "dilation", dilation, minimum=1)
    pt, pb, pl, pr = _padding(padding, (kh, kw), d, s)
    problem = ConvProblem(n, cin, h, w, cout, kh, kw, s[0], s[1], pt, pb, pl, pr, d[0], d[1], groups,
                          args.dtypes[0], bias is not None)
    oh, ow = problem.oh, problem.ow
    if oh < 1 or ow < 1:
        raise OpError(f"{OP}(): the padded input ({h + pt + pb}, {w + pl + pr}) is smaller than the dilated kernel "
                      f"({d[0] * (kh - 1) + 1}, {d[1] * (kw - 1) + 1})")
    if groups == cin and groups > 1 and cg == 1:
        if key is not None:       # later calls go straight to depthwise_conv2d's own plan
            remember(key, lambda *a: depthwise_conv2d(a[0], a[1], a[2] if len(a) > 2 else None, stride, padding,
                                                      dilation))
        return depthwise_conv2d(x, weight, bias, stride, padding, dilation)
    target = target_for(args.kind)
    if target.kind is TargetKind.CPU and args.dtypes[0] != "float32":
        raise OpError(f"{OP}() on the CPU supports float32 only, got {args.dtypes[0]}")
    out = new_output(args.kind, (*args.shapes[0][:-3], cout, oh, ow), args.dtypes[0])
    if n == 0:
        return out
    plan = _plan(problem, target)
    plan(args.kind, args.arrays, out)
    if key is not None:       # contiguous host arrays: args.arrays are the arrays as they came
        kind = args.kind
        remember(key, PlannedCall(lambda *a: plan(kind, a[:-1], a[-1]), out))
    return out


# ----------------------------------------------------------------------------- plans


def _schedule(template: Any, mp: MatmulProblem, target: Target, packed_a: bool, packed_b: bool) -> Any:
    """The cost model's best schedule among those a prologue suits."""
    space = [s for s in template.space(mp, target) if _suits(s.as_dict(), packed_a, packed_b)]
    if not space and template is MATMUL_SIMT:     # the space prunes tiles twice larger than tiny problems
        return Schedule.of(wm=1, wn=1, rm=1, rn=1, tm=4, tn=4, bk=8, split=1)
    if not space:
        raise OpError(f"{OP}(): no schedule of {template.name} for {mp} on {target.name}")
    return tune.ranked(tune.model_costs(template, mp, target, space))[0]


def _suits(s: dict[str, Any], packed_a: bool, packed_b: bool) -> bool:
    if s.get("split", 1) not in (1, "m", "n"):          # GPU split-K: two kernels
        return False
    return (not packed_a or s.get("pack_a", True)) and (not packed_b or s.get("pack_b", True))


def _launch_host(plan: Any, args: list[Any]) -> None:
    """``plan.kernel`` on the CPU by addresses (``CompiledKernel.bind_host``): the arguments are
    checked on the plan's first call, later calls pass the pointers (the plan fixes every shape)."""
    if plan.launch is None:
        plan.launch = plan.kernel.build("cpu").bind_host(*args)
    plan.launch(*[data_ptr(a) for a in args])


class _DirectPlan:
    """The direct-convolution template (:mod:`taskmap.templates.conv_cpu`), with the bias as an
    epilogue spliced into its stores."""

    def __init__(self, p: ConvProblem, target: Target, schedule: Schedule) -> None:
        self.p, self.schedule = p, schedule
        anchor = CONV_CPU.instantiate(p, target, schedule)
        epilogues = {"c": direct_bias_epilogue(p)} if p.bias else {}
        self.kernel = fuse(anchor, {}, epilogues, direct_sizes(p))
        self.names = [q.name for q in self.kernel.func.params]
        self.xp = CONV_CPU.workspace_size(p, schedule, target)
        self.wshape = CONV_CPU.weight_shape(p, schedule, target)     # the weights as the kernel sees them
        self.launch: HostLaunch | None = None

    def __call__(self, kind: ArrayKind, arrays: tuple[Any, ...], out: Any) -> None:
        p = self.p
        c = view(out, (p.n, p.cout, p.oh, p.ow))
        avail = {"x": view(arrays[0], (p.n, p.cin, p.h, p.w)), "wt": view(arrays[1], self.wshape), "c": c, "y": c,
                 "xp": WORKSPACE.get("cpu_conv_x", self.xp)}
        if p.bias:
            avail["conv_bias"] = arrays[2]
        _launch_host(self, [avail[name] for name in self.names])


class _Plan:
    """A fused kernel and how to lay out its arguments (on the CPU, with the matmul ``schedule``
    :func:`.conv_route.route` chose)."""

    def __init__(self, p: ConvProblem, target: Target, schedule: Schedule | None = None) -> None:
        self.p, self.target = p, target
        mp = self.mp = p.matmul()
        cpu = target.kind is TargetKind.CPU
        template = MATMUL_CPU if cpu else MATMUL_TC if p.dtype in ("float16", "bfloat16") else MATMUL_SIMT
        if not template.applies(mp, target):
            raise OpError(f"{OP}() on {target.name} does not support {p.dtype}")
        epilogues = {"c": bias_epilogue(p)} if p.bias else {}
        if cpu:
            assert schedule is not None
            self.schedule = schedule
            self.kernel: Kernel = gemm_kernel(p, target, schedule, epilogues)
        else:
            prologues = gemm_prologues(p, cpu)
            self.schedule = _schedule(template, mp, target, "a" in prologues, "b" in prologues)
            sizes = {"batch": mp.batch, "m": mp.m, "n": mp.n, "k": mp.k, "cz": mp.batch}
            self.kernel = fuse(template.instantiate(mp, target, self.schedule), prologues, epilogues, sizes)
        self.names = [q.name for q in self.kernel.func.params]
        self.cpu = cpu
        self.launch: HostLaunch | None = None
        if cpu:
            self.wa, self.wb = MATMUL_CPU.workspace_sizes(mp, self.schedule, target)

    def __call__(self, kind: ArrayKind, arrays: tuple[Any, ...], out: Any) -> None:
        p, mp = self.p, self.mp
        if not self.cpu:                  # the GPU templates read 16-byte chunks
            arrays = tuple(aligned(x, 16) for x in arrays)
        avail = gemm_views(p, self.names, arrays[0], arrays[1], out)
        c = view(out, (mp.batch, mp.m, mp.n))
        if p.bias:
            avail["conv_bias"] = arrays[2]
        if "bias" in self.names:          # the template's own bias (unused): a 1-element dummy
            avail["bias"] = _ZERO if self.cpu and kind.target == "cpu" else new_like(out, (1,), p.dtype)
        if self.cpu:                      # partial sums: in C itself unless an epilogue writes it
            avail["cw"] = c if not p.bias else view(WORKSPACE.get("conv_cw", mp.batch * mp.m * mp.n),
                                                    (mp.batch, mp.m, mp.n))
            avail["wa"] = WORKSPACE.get("cpu_a", self.wa)
            avail["wb"] = WORKSPACE.get("cpu_b", self.wb)
            avail["bidx"] = NO_INDEX         # the matmul template's index of B's matrices (unused)
        args = [avail[name] for name in self.names]
        if self.cpu and kind.target == "cpu":
            _launch_host(self, args)
        else:
            _launch(self.kernel, kind, args)


_ZERO = np.zeros(1, np.float32)
_PLANS: dict[tuple[ConvProblem, Target], _Plan | _DirectPlan] = {}
_LOCK = threading.Lock()


def _plan(p: ConvProblem, target: Target) -> _Plan | _DirectPlan:
    key = (p, target)
    plan = _PLANS.get(key)
    if plan is None:
        direct, gemm = route(p, target) if target.kind is TargetKind.CPU else (None, None)
        plan = _DirectPlan(p, target, direct) if direct is not None else _Plan(p, target, gemm)
        with _LOCK:
            plan = _PLANS.setdefault(key, plan)
    return plan


__all__ = ["ConvProblem", "bias_epilogue", "conv2d", "direct_bias_epilogue", "direct_sizes", "grouped_weights", "img2col",
           "output_size"]
