"""Lowering an anchored fusion group (matmul / linear / conv2d anchor) to ONE fused kernel.

The anchor is scheduled alone, exactly as :mod:`taskmap.ops` does (the CPU matmul template;
:func:`taskmap.schedule.tune.choose`, ``mode="model"`` unless ``TASKMAP_TUNE`` says
otherwise), then :func:`taskmap.fusion.fuse` splices

* each prologue (the group's injective ops computing an operand, composed into one compute
  definition and reshaped to the template's 3-D operand) into the operand's loads — the
  operand is then packed (the prologue runs once per element);
* the epilogue (the anchor's result reshaped from the template's ``c`` to the graph shape, a
  conv's bias, then every op of the chain, composed) into the stores of ``c``.

Conv2d runs where :func:`taskmap.ops.conv_route.route` puts it (the one decision shared with
:mod:`taskmap.ops.conv`; measured under ``TASKMAP_TUNE``): the direct-convolution template (the
epilogue spliced into its NCHW stores), or the implicit GEMM on the matmul schedule the route
chose (the model's, when the group's own prologues need operands it does not pack), with the
img2col prologue and per-group weights of :mod:`taskmap.ops.conv_defs`.  A 1x1 convolution whose
input is squeeze-and-excitation's ``x * scale`` moves from the direct template to the implicit
GEMM when the cost model prices the GEMM, the multiply in its B packing, below the direct kernel
plus the multiply as a kernel of its own (:func:`gemm_takes_prologue`).  :func:`plan_anchor`
returns an :class:`AnchorPlan`; it raises :class:`~taskmap.errors.FusionError` when the group
cannot be one kernel (the caller splits it).

On a GPU target the anchor runs the GPU matmul template (:func:`gpu_template`: SIMT for f32,
tensor cores for f16 / bf16) reading its operands in place (nothing packed), a convolution always
as the implicit GEMM.  A schedule that splits K is two launches in one step: the template with the
prologues, writing partial sums to a workspace, then the split-K reduction with the epilogue
(:attr:`AnchorPlan.then`).
"""
from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends import Target, TargetKind
from ..compute.analysis import bounded_view
from ..compute.nodes import TensorNode, compute, dag_str, graph_inputs, tensor_input
from ..errors import FusionError
from ..fusion import fuse, fusion_key
from ..ops.conv_defs import direct_sizes, grouped_weights, img2col
from ..ops.conv_route import CONV_ROUTE_CPU, route
from ..ops._dispatch import kernel_shape
from ..ops.transform import reshape_compute
from ..runtime.kernel import Kernel
from ..schedule import tune
from ..templates.base import Schedule
from ..templates.conv_cpu import CONV_CPU, best_gemm, gemm_cost
from ..templates.conv_problem import ConvProblem
from ..templates.matmul_cpu import CALL_COST, COPY_BANDWIDTH, FORK_COST, MATMUL_CPU
from ..templates.matmul_cpu_bf16 import MATMUL_CPU_BF16
from ..templates.matmul_problem import MatmulProblem
from ..templates.matmul_simt import MATMUL_SIMT
from ..templates.matmul_tc import MATMUL_TC
from ..templates.matmul_wgmma import MATMUL_WGMMA, WG_M, enabled as wgmma_enabled
from .derived import derived
from .ir import Op, Tensor
from .kernel_cache import cached_kernel
from .kinds import OpCategory, OpKind
from .lower_reduce import reduction_compute
from .passes.widen_half import native_bf16


@dataclass(frozen=True)
class Workspace:
    """Scratch memory a kernel needs: ``elements`` float32 in the shared slot ``slot`` (or of
    ``dtype``, 2-byte types: the slot's float32 buffer seen as them)."""

    slot: str
    elements: int
    dtype: str = "float32"

    @property
    def words(self) -> int:
        """float32 elements of the slot this needs."""
        return self.elements if self.dtype == "float32" else -(-self.elements // 2)


@dataclass(frozen=True)
class Zeros:
    """A small zero-filled array (an operand the kernel declares but this problem does not use)."""

    elements: int = 1
    dtype: str = "float32"


Arg = Tensor | Workspace | Zeros


@dataclass
class AnchorPlan:
    """A fused kernel and, per parameter, what to pass (a graph tensor, viewed as ``shape``);
    ``then``: launches that follow it in the same step (split-K's reduction, which carries the
    epilogue)."""

    kernel: Kernel
    args: tuple[Arg, ...]
    shapes: tuple[tuple[int, ...] | None, ...]
    then: tuple["AnchorPlan", ...] = ()


# ----------------------------------------------------------------------------- anchor problems


@dataclass
class _Anchor:
    """The template problem of an anchor and where its operands come from."""

    problem: MatmulProblem
    operands: dict[str, Tensor]              # template parameter -> graph tensor (a, b, bias, x, wg)
    views: dict[str, tuple[int, ...]]       # the shape each operand is viewed as
    graph_input: dict[int, str]             # anchor input index -> template parameter (for prologues)
    conv: ConvProblem | None = None
    direct: Schedule | None = None          # conv2d on the direct template (else implicit GEMM)
    gemm: Schedule | None = None            # conv2d's implicit GEMM: the matmul schedule routed to
    packed: dict[Any, tuple[Tensor | None, Tensor | None]] = field(default_factory=dict)  # schedule -> (wa, wb)


def _constant(t: Tensor) -> bool:
    return t.data is not None


def _packed_tensor(t: Tensor, data: Any, shape: tuple[int, ...]) -> Tensor:
    """A new constant: the constant ``t`` packed into a kernel's layout (``data``, seen as ``shape``)."""
    return Tensor(shape, t.dtype, t.device, f"{t.name}_packed", data)


def _swapped(target: Target, m: int, n: int, const_weights: bool) -> bool:
    """``c = a b^T`` computed as ``c^T = b a^T`` on the CPU when m < n (see ops.linalg._swapped):
    for weights given per call.  Constant weights are packed once either way, and ``c``'s rows
    then take the fused epilogue as whole vectors (BERT's linear + GELU: 1.2x faster, measured on
    Zen 4, the other BERT / GPT-2 linears 1.0-1.1x)."""
    return target.kind is TargetKind.CPU and m < n and not const_weights


def anchor_dtypes(target: Target) -> tuple[str, ...]:
    """The anchors' dtypes: f32 on the CPU; on a GPU also f16 / bf16 (the tensor-core template)."""
    return ("float32",) if target.kind is TargetKind.CPU else ("float32", "float16", "bfloat16")


def gpu_template(p: MatmulProblem, target: Target) -> Any:
    """The GPU matmul template of ``p``: tensor cores for f16 / bf16 and for f32 that allows TF32,
    else SIMT for f32 (None: none).  An f32 problem that asks for 3xTF32 takes whichever of the
    3xTF32 tensor cores and the SIMT FMAs (as accurate) the cost models find faster at their best
    schedules: the tensor cores' tiles are at least 32 x 32, and three mma per product.  On sm_90a
    the wgmma template (unless ``TASKMAP_WGMMA=0``) takes the problems it applies to (TF32, 3xTF32,
    f16 / bf16 linears) of at least a warpgroup's 64 rows: on an H200 it ran every measured TF32 and
    f16 linear faster than the mma.sync template, 3xTF32 ones 0.8-1.4x as fast as mma.sync and the
    transformers faster (session 27); with fewer rows most of each wgmma would multiply padding."""
    return _gpu_template(p, target, wgmma_enabled())


@functools.lru_cache(maxsize=512)
def _gpu_template(p: MatmulProblem, target: Target, wgmma: bool) -> Any:
    fits = [t for t in (MATMUL_WGMMA, MATMUL_TC, MATMUL_SIMT)
            if t.applies(p, target) and (t is not MATMUL_WGMMA or (wgmma and p.m >= WG_M))]
    if len(fits) == 2 and p.dtype == "float32" and p.tf32x3 and not p.tf32:
        return min(fits, key=lambda t: min((t.cost(p, target, s) for s in t.space(p, target)), default=float("inf")))
    return fits[0] if fits else None


def _allows_tf32(op: Op, target: Target) -> bool:
    """Whether the anchor's f32 products may run on TF32 tensor cores (the op's ``tf32`` attribute,
    PyTorch's setting at capture; NVIDIA GPUs only)."""
    return target.kind is TargetKind.CUDA and bool(getattr(op.attrs, "tf32", False))


def _wants_tf32x3(op: Op, target: Target) -> bool:
    """Whether the anchor's f32 products run as 3xTF32 on tensor cores (the op's ``tf32x3``
    attribute: compiled with ``fp32_precision="3xtf32"``; NVIDIA GPUs only)."""
    return target.kind is TargetKind.CUDA and bool(getattr(op.attrs, "tf32x3", False))


def matmul_anchor(op: Op, target: Target) -> _Anchor | None:
    """The problem of a MATMUL / LINEAR op, or None for shapes the fused path does not take
    (vectors, broadcast batches: those run through ``taskmap.ops``)."""
    dt = op.output.dtype.name
    if (dt not in anchor_dtypes(target) and not (target.kind is TargetKind.CPU and native_bf16(op, target))) or \
            any(t.dtype.name != dt for t in op.inputs) or op.output.numel == 0:
        return None
    if op.kind is OpKind.LINEAR:
        x, w = op.inputs[0], op.inputs[1]
        bias = op.inputs[2] if len(op.inputs) > 2 else None
        if w.ndim != 2 or x.ndim < 1 or (bias is not None and bias.shape != (w.shape[0],)):
            return None
        m, k, n = math.prod(x.shape[:-1]), x.shape[-1], w.shape[0]
        if k == 0:
            return None
        ops = {"bias": bias} if bias is not None else {}
        if _swapped(target, m, n, _constant(w)):
            p = MatmulProblem(1, n, m, k, dt, dt, True, True, True, bias is not None, trans_c=True)
            ops.update(a=w, b=x)
            return _Anchor(p, ops, {"a": (1, n, k), "b": (1, m, k)}, {0: "b"})
        p = MatmulProblem(1, m, n, k, dt, dt, True, True, True, bias is not None, const_b=_constant(w))
        ops.update(a=x, b=w)
        return _Anchor(p, ops, {"a": (1, m, k), "b": (1, n, k)}, {0: "a"})
    if op.kind is OpKind.MATMUL:
        a, b = op.inputs
        if a.ndim < 2 or b.ndim < 2:
            return None
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        if k == 0:
            return None
        if b.ndim == 2:                      # a stack times one matrix: one tall product
            mm = math.prod(a.shape[:-1])
            p = MatmulProblem(1, mm, n, k, dt, dt, const_b=_constant(b))
            return _Anchor(p, {"a": a, "b": b}, {"a": (1, mm, k), "b": (1, k, n)}, {0: "a", 1: "b"})
        ba, bb = math.prod(a.shape[:-2]), math.prod(b.shape[:-2])
        batch = math.prod(op.output.shape[:-2])
        if (ba != batch and ba != 1) or (bb != batch and bb != 1) or \
                (ba == batch and a.shape[:-2] != op.output.shape[:-2] and ba != 1) or \
                (bb == batch and b.shape[:-2] != op.output.shape[:-2] and bb != 1):
            return None
        p = MatmulProblem(batch, m, n, k, dt, dt, ba == batch, bb == batch)
        return _Anchor(p, {"a": a, "b": b}, {"a": p.a_shape, "b": p.b_shape}, {0: "a", 1: "b"})
    return None


def conv_anchor(op: Op, target: Target) -> _Anchor | None:
    """The implicit-GEMM problem of a CONV2D op (None: depthwise, non-f32, batch-less input)."""
    x, w = op.inputs[0], op.inputs[1]
    a = op.attrs
    dt = op.output.dtype.name
    dots = target.kind is TargetKind.CPU and native_bf16(op, target)      # bf16 on the CPU's dot products
    if x.ndim != 4 or (dt not in anchor_dtypes(target) and not dots) or any(t.dtype.name != dt for t in op.inputs):
        return None
    n, cin, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    if n == 0 or (a.groups == cin and a.groups > 1 and cg == 1):      # depthwise: its own kernel
        return None
    p = ConvProblem(n, cin, h, wd, cout, kh, kw, a.stride[0], a.stride[1], a.padding[0], a.padding[0],
                    a.padding[1], a.padding[1], a.dilation[0], a.dilation[1], a.groups, dt, False,
                    w.data is not None)
    mp = p.matmul()
    # on a GPU, and for bf16 on the CPU's dot products: always the implicit GEMM (its template's
    # loads take the img2col prologue)
    direct, gemm = route(p, target) if target.kind is TargetKind.CPU and not dots else (None, None)
    if direct is not None:      # the weights as the kernel takes them: packed once, here, when constant
        wshape = CONV_CPU.weight_shape(p, direct, target)
        packing = (CONV_CPU.name, CONV_CPU.version, *(direct.get(k) for k in ("vec", "m", "mr", "nr")))
        wt = w if not direct.get("packed") else _packed_tensor(      # shared by every image size
            w, derived((w.data,), packing, lambda: CONV_CPU.weights(p, direct, w.data, target)), wshape)
        return _Anchor(mp, {"x": x, "wt": wt}, {"x": (n, cin, h, wd), "wt": wshape}, {}, p, direct)
    return _gemm_anchor(op, p, gemm)


def _gemm_anchor(op: Op, p: ConvProblem, gemm: Schedule | None) -> _Anchor:
    """The CONV2D op ``op`` (problem ``p``) as the implicit GEMM, on the matmul schedule ``gemm``."""
    x, w = op.inputs[0], op.inputs[1]
    mp = p.matmul()
    ops: dict[str, Tensor] = {}
    views: dict[str, tuple[int, ...]] = {}
    graph_input: dict[int, str] = {}
    if p.pointwise:                   # else the img2col prologue's input (see plan_anchor)
        ops["b"], views["b"] = x, (mp.batch, mp.k, mp.n)
        graph_input[0] = "b"          # a prologue (SE's x * scale) in B's packing
    if not (p.groups > 1 and p.n > 1):  # else the per-group weights prologue's input
        ops["a"], views["a"] = w, mp.a_shape
    return _Anchor(mp, ops, views, graph_input, p, gemm=gemm)


def _alone_seconds(elements: int, target: Target) -> float:
    """An f32 element-wise kernel of its own over ``elements``: its operand read and its result
    written once (at the matmul cost model's copy bandwidth a core), a parallel region and a call."""
    return 8 * elements / (COPY_BANDWIDTH * max(1, target.num_cores)) + FORK_COST + CALL_COST


def gemm_takes_prologue(op: Op, elements: int, target: Target) -> bool:
    """Re-anchor ``op``, a CPU 1x1 convolution routed to the direct template (which reads its input
    in place and takes no prologue), on the implicit GEMM, whose B packing takes the producer of
    its input (``elements`` of it) as a prologue — when the cost model prices the GEMM below the
    direct kernel plus that producer run as a kernel of its own.  Squeeze-and-excitation's
    ``x * scale`` before a projection is such a producer: no kernel before it can take it (its
    scale is reduced from ``x``).  Returns whether it re-anchored ``op``."""
    anc = anchor_problem(op, target)
    if target.kind is not TargetKind.CPU or anc is None or anc.direct is None or anc.conv is None or \
            not anc.conv.pointwise:
        return False
    p = anc.conv
    gemm = best_gemm(p, target, packs_b=True)      # the prologue runs in B's packing
    if gemm is None:
        return False
    if gemm_cost(p, target, gemm) >= CONV_ROUTE_CPU.cost(p, target, anc.direct) + _alone_seconds(elements, target):
        return False
    with _ANCHORS_LOCK:
        _ANCHORS[op][target] = _gemm_anchor(op, p, gemm)
    return True


_ANCHORS: "weakref.WeakKeyDictionary[Op, dict[Target, _Anchor | None]]" = weakref.WeakKeyDictionary()
_ANCHORS_LOCK = threading.Lock()


def anchor_problem(op: Op, target: Target) -> _Anchor | None:
    """The anchor's problem on ``target``, made once per op (the partition asks, then the plan:
    a conv's schedule is selected and its constant weights packed only once)."""
    with _ANCHORS_LOCK:
        per_op = _ANCHORS.setdefault(op, {})
        if target in per_op:
            return per_op[target]
    anc = conv_anchor(op, target) if op.kind is OpKind.CONV2D else matmul_anchor(op, target)
    if anc is not None and anc.problem.dtype == "float32" and _allows_tf32(op, target):
        anc.problem = replace(anc.problem, tf32=True)
    elif anc is not None and anc.problem.dtype == "float32" and _wants_tf32x3(op, target):
        anc.problem = replace(anc.problem, tf32x3=True)
    if anc is not None and target.kind is not TargetKind.CPU:
        anc = _k_major_weights(anc, target) if gpu_template(anc.problem, target) is not None else None
    with _ANCHORS_LOCK:
        return per_op.setdefault(target, anc)


def _k_major_weights(anc: _Anchor, target: Target) -> _Anchor:
    """A constant K x N weight (GPT-2's Conv1D layers) transposed once to N x K where that lets
    the wgmma template read it in its K-major tiles: it copies a K x N B element by element (TF32)
    or leaves it to mma.sync (f16 / bf16), and BERT's N x K linears ran 1.3-1.7x faster on it than
    on mma.sync at batch 8 (H200, session 27)."""
    p, b = anc.problem, anc.operands.get("b")
    if anc.conv is not None or p.trans_b or not p.const_b or p.batch != 1 or b is None or b.ndim != 2:
        return anc
    pt = replace(p, trans_b=True)
    if gpu_template(pt, target) is not MATMUL_WGMMA:
        return anc
    data = derived((b.data,), ("k-major",), lambda: b.data.T.copy())
    return replace(anc, problem=pt, operands={**anc.operands, "b": _packed_tensor(b, data, (p.n, p.k))},
                   views={**anc.views, "b": (1, p.n, p.k)},
                   graph_input={i: name for i, name in anc.graph_input.items() if name != "b"})


def fusable(op: Op, target: Target) -> bool:
    """Whether the fused lowering takes this anchor on ``target``."""
    return op.kind in (OpKind.MATMUL, OpKind.LINEAR, OpKind.CONV2D) and anchor_problem(op, target) is not None


# ----------------------------------------------------------------------------- definitions


def compose(ops: Sequence[Op], nodes: dict[Tensor, TensorNode], leaves: dict[str, Tensor],
            prefix: str) -> dict[Tensor, TensorNode]:
    """Every op's compute definition reading the nodes of its inputs; inputs without a node
    become ``tensor_input`` nodes named ``prefix<k>`` (recorded in ``nodes`` and ``leaves``)."""
    for op in ops:
        ins = []
        for t in op.inputs:
            if t not in nodes:
                nodes[t] = leaf(t, leaves, prefix)
            ins.append(nodes[t])
        define = op.definition.compute
        if define is None:               # a reduction anchor (rule-based)
            nodes[op.output] = reduction_compute(op, ins, kernel_shape(op.output.shape))
        else:
            nodes[op.output] = define(ins, op.attrs, kernel_shape(op.output.shape))
    return nodes


def leaf(t: Tensor, leaves: dict[str, Tensor], prefix: str) -> TensorNode:
    """A new ``tensor_input`` for the graph tensor ``t`` (its name recorded in ``leaves``)."""
    name = f"{prefix}{sum(1 for n in leaves if n.startswith(prefix))}"
    leaves[name] = t
    return tensor_input(name, t.dtype, kernel_shape(t.shape))


#: Views made, by the definition's text (:func:`dag_str`: names, dtypes, shapes, expressions —
#: what the fused kernel's key holds too), its name and shape: a model's repeated layers (BERT's
#: 12: 87 views, 7 distinct) and a decode loop's graphs (one per sequence length) view the same
#: definitions over again.  The IR is immutable, so a view is shared as it is.
_VIEWS: dict[tuple[str, str, tuple[int, ...]], TensorNode] = {}
_VIEWS_LIMIT = 1024
_VIEWS_LOCK = threading.Lock()


def view_as(node: TensorNode, name: str, shape: Sequence[int]) -> TensorNode:
    """``node`` seen as ``shape`` (same size, row-major) under the name ``name``: a prologue or
    epilogue definition, its reads' indices simplified within the view's ranges (a chain of
    slices, reshapes and permutes becomes one strided read: :func:`.bounded_view`)."""
    key = (dag_str(node), name, tuple(shape))
    with _VIEWS_LOCK:
        hit = _VIEWS.get(key)
    if hit is not None:
        return hit
    src = node if tuple(node.shape) == tuple(shape) else reshape_compute(node, shape)
    view = bounded_view(compute(name, shape, lambda *i: src[i]))
    with _VIEWS_LOCK:
        if len(_VIEWS) >= _VIEWS_LIMIT:
            _VIEWS.clear()
        _VIEWS[key] = view
    return view


def _anchor_value(anc: _Anchor, op: Op, leaves: dict[str, Tensor]) -> tuple[TensorNode, dict[Tensor, TensorNode]]:
    """The anchor's graph output as a node reading the template's ``c`` (plus a conv's bias)."""
    p = anc.problem
    c = tensor_input("c", p.out_dtype, p.c_shape)
    extra: dict[Tensor, TensorNode] = {}
    out_shape = kernel_shape(op.output.shape)
    if anc.conv is not None:
        cp = anc.conv
        G, m, OW = cp.groups, p.m, cp.ow
        bias = None
        if len(op.inputs) > 2:
            bias = extra[op.inputs[2]] = leaf(op.inputs[2], leaves, "e")
        if anc.direct is not None:    # the direct template's c is the NCHW output itself
            c = tensor_input("c", p.out_dtype, [cp.n, cp.cout, cp.oh, cp.ow])

        def conv(n: Any, co: Any, oh: Any, ow: Any) -> Any:
            if anc.direct is not None:
                return c[n, co, oh, ow] + bias[co] if bias is not None else c[n, co, oh, ow]
            v = c[n * G + co // m, co % m, oh * OW + ow] if G > 1 else c[n, co, oh * OW + ow]
            return v + bias[co] if bias is not None else v
        return compute("conv", out_shape, conv), extra
    return (reshape_compute(c, out_shape) if tuple(p.c_shape) != out_shape else c), extra


# ----------------------------------------------------------------------------- schedules


def _suits(s: dict[str, Any], packed_a: bool, packed_b: bool) -> bool:
    return (not packed_a or s.get("pack_a", True)) and (not packed_b or s.get("pack_b", True))


def _schedule(p: MatmulProblem, target: Target, packed_a: bool, packed_b: bool) -> Any:
    if not packed_a and not packed_b:
        return tune.choose(MATMUL_CPU, p, target)
    space = [s for s in MATMUL_CPU.space(p, target) if _suits(s.as_dict(), packed_a, packed_b)]
    if not space:
        raise FusionError(f"no schedule of {MATMUL_CPU.name} packs the operands a prologue needs for {p}")
    return tune.ranked(tune.model_costs(MATMUL_CPU, p, target, space))[0]


# ----------------------------------------------------------------------------- the plan


def reads_channels_last(epilogue: Sequence[Op]) -> bool:
    """Whether ``epilogue`` reads its NCHW anchor channels-last: element-wise ops, then a permute
    to NHWC (ConvNeXt's depthwise conv before its LayerNorm), or one that moves the channels last
    once the image's rows are flattened (Swin's patch embedding: ``flatten(2).transpose(1, 2)``)."""
    for i, op in enumerate(epilogue):
        if op.kind is OpKind.PERMUTE:
            return tuple(op.attrs.dims) == (0, 2, 3, 1)
        if op.kind is OpKind.RESHAPE and i + 1 < len(epilogue) and epilogue[i + 1].kind is OpKind.PERMUTE:
            x, y = op.inputs[0].shape, op.output.shape
            return (len(x) == 4 and tuple(y) == (x[0], x[1], x[2] * x[3])
                    and tuple(epilogue[i + 1].attrs.dims) == (0, 2, 1))
        if op.definition.category > OpCategory.BROADCAST:
            return False
    return False


def plan_anchor(anchor: Op, prologues: Sequence[tuple[int, Sequence[Op]]], epilogue: Sequence[Op],
                target: Target) -> AnchorPlan:
    """One kernel for the anchor with its prologues and epilogue (FusionError: cannot)."""
    anc = anchor_problem(anchor, target)
    if anc is None:
        raise FusionError(f"{anchor.name}: no fused lowering for {anchor.kind.name} with these shapes on "
                          f"{target.name}")
    anc = replace(anc, operands=dict(anc.operands), views=dict(anc.views))   # the memoised one stays as it is
    if anc.direct is not None and anc.direct.get("vec") == "channels" and reads_channels_last(epilogue):
        anc.conv = replace(anc.conv, channels_last=True)      # the channel kernel's stores, pixel by pixel
    p = anc.problem
    pro_defs: dict[str, TensorNode] = {}
    sources: dict[str, Tensor] = {}
    nodes: dict[Tensor, TensorNode] = {}
    for k, ops in prologues:
        param = anc.graph_input.get(k)
        if param is None:
            raise FusionError(f"{anchor.name}: input {k} takes no prologue")
        if anc.conv is not None and any(op.kind is OpKind.CONCAT for op in ops):
            raise FusionError(f"{anchor.name}: a concatenation's inputs are written in place instead (.concat_place)")
        source = _reshaped(ops, anchor.inputs[k])
        if source is not None:       # only reshapes (views of row-major data): read the source itself
            anc.operands[param] = source
            continue
        indexed = _indexed_b(ops, anchor.inputs[k], p) if param == "b" and target.kind is TargetKind.CPU else None
        if indexed is not None:      # each batch's matrix picked from a constant stack: packed once, indexed
            table, idx, idx_ops = indexed
            anc.problem = p = replace(p, const_b=True, b_groups=table.shape[0])
            anc.packed = {}
            anc.operands["b"], anc.views["b"] = table, p.b_shape
            if idx_ops:
                compose(idx_ops, nodes, sources, "p")
                pro_defs["bidx"] = view_as(nodes[idx], "bidx", (p.batch,))
            else:
                anc.operands["bidx"], anc.views["bidx"] = idx, (p.batch,)
            continue
        compose(ops, nodes, sources, "p")
        pro_defs[param] = view_as(nodes[anchor.inputs[k]], param, anc.views[param])
    if anc.conv is not None and anc.direct is None:   # implicit GEMM: img2col / weights definitions
        conv_defs = {}
        if not anc.conv.pointwise:
            conv_defs["b"] = (img2col(anc.conv), anchor.inputs[0])
        if anc.conv.groups > 1 and anc.conv.n > 1:
            conv_defs["a"] = (grouped_weights(anc.conv), anchor.inputs[1])
        for param, (node, t) in conv_defs.items():
            pro_defs[param] = node
            for leaf_node in graph_inputs(node):
                if math.prod(leaf_node.shape) != t.numel:
                    raise FusionError(f"{anchor.name}: conv2d's {param} definition reads {leaf_node.name} "
                                      f"{list(leaf_node.shape)}, not a view of {t.name}")
                anc.operands[leaf_node.name] = t
                anc.views[leaf_node.name] = tuple(leaf_node.shape)
    epi_defs: dict[str, TensorNode] = {}
    outputs: dict[str, Tensor] = {}
    value, extra = _anchor_value(anc, anchor, sources)
    if epilogue or extra:
        enodes: dict[Tensor, TensorNode] = {anchor.output: value, **extra}
        compose(epilogue, enodes, sources, "e")
        last = epilogue[-1].output if epilogue else anchor.output
        epi_defs["c"] = view_as(enodes[last], "out", kernel_shape(last.shape))
        outputs["out"] = last
    if anc.direct is not None:
        return _direct_plan(anc, anchor, pro_defs, epi_defs, outputs, sources, target)
    if target.kind is not TargetKind.CPU:
        return _gpu_plan(anc, anchor, pro_defs, epi_defs, outputs, sources, target)
    if p.dtype == "bfloat16":
        return _bf16_plan(anc, anchor, pro_defs, epi_defs, outputs, sources, target)
    sched = anc.gemm if anc.gemm is not None and _suits(anc.gemm.as_dict(), "a" in pro_defs, "b" in pro_defs) \
        else _schedule(p, target, "a" in pro_defs, "b" in pro_defs)
    sizes = {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k}
    kernel = cached_kernel((MATMUL_CPU.name, MATMUL_CPU.version, MATMUL_CPU.config(p, target, sched),
                            fusion_key(pro_defs, epi_defs, sizes), target),
                           lambda: fuse(MATMUL_CPU.instantiate(p, target, sched), pro_defs, epi_defs, sizes),
                           target)
    wa, wb = MATMUL_CPU.workspace_sizes(p, sched, target)
    packed = _packed_constants(anc, sched, target)
    c = (Workspace("cpu_c", p.batch * p.m * p.n) if epi_defs else anchor.output, p.c_shape)
    fixed = {"c": c, "cw": c}
    for name, data, size in (("wa", packed[0], wa), ("wb", packed[1], wb)):
        fixed[name] = (data if data is not None else Workspace(f"cpu_{name[1]}", size), None)
    return AnchorPlan(kernel, *_plan_args(kernel, anc, anchor, pro_defs, outputs, sources, fixed))


def _bf16_plan(anc: _Anchor, anchor: Op, pro_defs: dict[str, TensorNode], epi_defs: dict[str, TensorNode],
               outputs: dict[str, Tensor], sources: dict[str, Tensor], target: Target) -> AnchorPlan:
    """A bf16 product on the CPU's dot products (:mod:`taskmap.templates.matmul_cpu_bf16`): its
    constant ``b`` packed once (pairs of K side by side), the epilogue in its stores.  It reads
    ``a`` in place inside its dot products: no prologue (a reshape is read as it is).  Where the
    epilogue moves the rows in pieces (the heads of a q / k / v projection: ``run`` elements
    contiguous), a panel holds whole pieces, so that its stores stay vector stores (ViT's q / k /
    v at batch 8: 12.1 ms on 8 x 48 tiles, 6.2 on 6 x 64)."""
    p, t = anc.problem, MATMUL_CPU_BF16
    if anc.conv is not None:
        return _bf16_gemm_plan(anc, anchor, pro_defs, epi_defs, outputs, sources, target)
    if pro_defs:
        raise FusionError(f"{anchor.name}: {t.name} reads its input in place, inside its dot products: no prologue")
    sched = tune.choose(t, p, target)
    run = outputs["out"].shape[-1] if "out" in outputs and outputs["out"].ndim else p.n
    if run < p.n and run % sched["nr"]:      # an epilogue that moves rows of ``run`` (heads): whole ones a panel
        fits = [s for s in t.space(p, target) if run % s["nr"] == 0]     # the widest: one piece a panel
        fits = [s for s in fits if s["nr"] == max(f["nr"] for f in fits)]
        sched = tune.ranked(tune.model_costs(t, p, target, fits))[0] if fits else sched
    sizes = {"m": p.m, "n": p.n, "k": p.k}
    kernel = cached_kernel((t.name, t.version, t.config(p, target, sched), fusion_key({}, epi_defs, sizes), target),
                           lambda: fuse(t.instantiate(p, target, sched), {}, epi_defs, sizes), target)
    b = anc.operands["b"]
    data = derived((b.data,), (t.name, t.version, p.trans_b, sched["nr"]), lambda: t.weights(p, sched, b.data))
    fixed = {"wb": (_packed_tensor(b, data, (data.size,)), None), "c": (anchor.output, p.c_shape)}
    return AnchorPlan(kernel, *_plan_args(kernel, anc, anchor, {}, outputs, sources, fixed))


def _bf16_gemm_plan(anc: _Anchor, anchor: Op, pro_defs: dict[str, TensorNode], epi_defs: dict[str, TensorNode],
                    outputs: dict[str, Tensor], sources: dict[str, Tensor], target: Target) -> AnchorPlan:
    """A bf16 convolution on the CPU's dot products: the implicit GEMM of ``matmul_cpu_bf16``
    (``gemm``) — the weights read in place as ``a``, each core packing the panels of ``b`` it
    uses, the img2col prologue (and the group's own) in those loads, the epilogue in its stores."""
    p, t = anc.problem, MATMUL_CPU_BF16
    if "a" in pro_defs:
        raise FusionError(f"{anchor.name}: {t.name} reads the weights in place, inside its dot products")
    sched = tune.choose(t, p, target)
    sizes = {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k}
    kernel = cached_kernel((t.name, t.version, t.config(p, target, sched), fusion_key(pro_defs, epi_defs, sizes),
                            target), lambda: fuse(t.instantiate(p, target, sched), pro_defs, epi_defs, sizes), target)
    panels = t.config(p, target, sched).workspace(p.k)
    fixed = {"c": (anchor.output, p.c_shape), "ws": (Workspace("cpu_bf16_panels", panels, "bfloat16"), None)}
    return AnchorPlan(kernel, *_plan_args(kernel, anc, anchor, pro_defs, outputs, sources, fixed))


def _gpu_plan(anc: _Anchor, anchor: Op, pro_defs: dict[str, TensorNode], epi_defs: dict[str, TensorNode],
              outputs: dict[str, Tensor], sources: dict[str, Tensor], target: Target) -> AnchorPlan:
    """The GPU matmul template (operands read in place: nothing packed) with the prologues in its
    tile loads; the epilogue in its stores of ``c`` — or, when the schedule splits K, in the
    stores of the split-K reduction that follows it (the partial results go through a
    workspace)."""
    p = anc.problem
    template = gpu_template(p, target)
    sched = tune.choose(template, p, target)
    if template is MATMUL_WGMMA and ("a" in pro_defs or "b" in pro_defs):
        sched = MATMUL_WGMMA.without_tma(sched)      # the copy engine cannot run a prologue
    sizes = {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k}
    key = (template.name, template.version, template.config(p, target, sched))
    out = {"c": (anchor.output, p.c_shape)}
    if sched["split"] == 1:
        kernel = cached_kernel((*key, fusion_key(pro_defs, epi_defs, sizes), target),
                               lambda: fuse(template.instantiate(p, target, sched), pro_defs, epi_defs, sizes), target)
        return AnchorPlan(kernel, *_plan_args(kernel, anc, anchor, pro_defs, outputs, sources, out))
    main = cached_kernel((*key, "main", fusion_key(pro_defs, {}, sizes), target),
                         lambda: fuse(template.instantiate(p, target, sched).kernels[0], pro_defs, {}, sizes), target)
    reduce = cached_kernel((*key, "reduce", fusion_key({}, epi_defs, sizes), target),
                           lambda: fuse(template.instantiate(p, target, sched).kernels[1], {}, epi_defs, sizes), target)
    part = (Workspace("gpu_splitk", p.batch * sched["split"] * p.m * p.n), (p.batch * sched["split"], p.m, p.n))
    then = AnchorPlan(reduce, *_plan_args(reduce, anc, anchor, {}, outputs, sources, {**out, "part": part}))
    return AnchorPlan(main, *_plan_args(main, anc, anchor, pro_defs, outputs, sources, {"c": part}), then=(then,))


def _plan_args(kernel: Kernel, anc: _Anchor, anchor: Op, pro_defs: dict[str, TensorNode], outputs: dict[str, Tensor],
               sources: dict[str, Tensor], fixed: dict[str, tuple[Arg, tuple[int, ...] | None]]
               ) -> tuple[tuple[Arg, ...], tuple[tuple[int, ...] | None, ...]]:
    """Per parameter of a matmul-template kernel, what to pass and the shape to view it as: the
    anchor's operands (unless a prologue computes them), a zero bias where the problem has
    none, the ``fixed`` parameters (outputs, workspaces, packed weights), and the graph tensors
    fusion added."""
    args: list[Arg] = []
    shapes: list[tuple[int, ...] | None] = []
    for param in kernel.func.params:
        name = param.name
        if name in anc.operands and name not in pro_defs:
            t = anc.operands[name]
            arg, shape = t, anc.views.get(name, kernel_shape(t.shape))
        elif name in ("bias", "bidx"):
            arg, shape = Zeros(dtype=param.type.dtype.name), None
        elif name in fixed:
            arg, shape = fixed[name]
        else:
            t = _graph_tensor(anchor, name, outputs, sources)
            arg, shape = t, kernel_shape(t.shape)
        args.append(arg)
        shapes.append(shape)
    return tuple(args), tuple(shapes)


def _reshaped(ops: Sequence[Op], operand: Tensor) -> Tensor | None:
    """The tensor a prologue of reshapes only reshapes into ``operand`` (same elements, same
    order: the kernel can view it as the operand), or None."""
    chain = {op.output: op for op in ops}
    t = operand
    while t in chain and chain[t].kind is OpKind.RESHAPE and len(chain[t].inputs) == 1:
        t = chain.pop(t).inputs[0]
    return t if not chain and t is not operand and t.numel == operand.numel else None


def _indexed_b(ops: Sequence[Op], operand: Tensor, p: MatmulProblem) -> tuple[Tensor, Tensor, list[Op]] | None:
    """Where a batched f32 product's ``b`` prologue picks each batch's matrix out of a constant
    stack — an embedding of a constant ``(G, k, n)`` by ``batch`` indices, then reshapes (a
    mixture of experts' blocks of rows: :mod:`taskmap.frontend.torch.ops_moe`) — the stack, the
    indices and the prologue ops that compute them (the CPU template then reads the stack packed
    once, by batch: ``MatmulProblem.b_groups``); else None."""
    if p.dtype != "float32" or p.trans_b or not p.b_batched or p.batch < 1:
        return None
    made = {op.output: op for op in ops}
    t = operand
    while t in made and made[t].kind is OpKind.RESHAPE:
        t = made[t].inputs[0]
    emb = made.get(t)
    if emb is None or emb.kind is not OpKind.EMBEDDING:
        return None
    table, idx = emb.inputs
    if not _constant(table) or table.ndim != 3 or tuple(table.shape[1:]) != (p.k, p.n) or idx.numel != p.batch \
            or idx.dtype.name != "int64":          # (the kernel's bidx is int64)
        return None
    needed, todo = set(), [idx]           # the prologue ops the indices come from
    while todo:
        u = todo.pop()
        if u in made and made[u] not in needed:
            needed.add(made[u])
            todo.extend(made[u].inputs)
    return table, idx, [op for op in ops if op in needed]


def _packed_constants(anc: _Anchor, sched: Schedule, target: Target) -> tuple[Tensor | None, Tensor | None]:
    """The constant operands of ``anc`` packed once for ``sched`` (new constant tensors passed as
    the kernel's ``wa`` / ``wb``; None: packed by the kernel, or not packed)."""
    p = anc.problem
    if not (p.const_a or p.const_b):
        return None, None
    with _ANCHORS_LOCK:
        hit = anc.packed.get(sched)
    if hit is not None:
        return hit
    a, b = anc.operands.get("a"), anc.operands.get("b")
    cfg = MATMUL_CPU.config(p, target, sched)          # the panels depend on the operand and the tile only
    layout = (MATMUL_CPU.name, MATMUL_CPU.version, type(cfg).__name__, getattr(cfg, "pre_a", False),
              getattr(cfg, "pre_b", False), cfg.mr, cfg.nr)
    wa = derived((a.data,), ("a", p.a_shape, *layout),
                 lambda: MATMUL_CPU.pack_constants(p, sched, a.data, None, target)[0]) \
        if p.const_a and a is not None else None
    wb = derived((b.data,), ("b", p.b_shape, p.trans_b, *layout),
                 lambda: MATMUL_CPU.pack_constants(p, sched, None, b.data, target)[1]) \
        if p.const_b and b is not None else None
    out = tuple(None if d is None else _packed_tensor(t, d, (d.size,)) for d, t in ((wa, a), (wb, b)))
    with _ANCHORS_LOCK:
        return anc.packed.setdefault(sched, out)      # type: ignore[arg-type]


def _graph_tensor(anchor: Op, name: str, outputs: dict[str, Tensor], sources: dict[str, Tensor]) -> Tensor:
    """The graph tensor behind a parameter that fusion added (an epilogue's output or an input
    of a prologue / the epilogue)."""
    t = outputs.get(name, sources.get(name))
    if t is None:
        raise FusionError(f"{anchor.name}: the fused kernel has a parameter {name!r} with no source")
    return t


def _direct_plan(anc: _Anchor, anchor: Op, pro_defs: dict[str, TensorNode], epi_defs: dict[str, TensorNode],
                 outputs: dict[str, Tensor], sources: dict[str, Tensor], target: Target) -> AnchorPlan:
    """The direct-convolution template with the group's epilogue spliced into its stores."""
    cp, sched = anc.conv, anc.direct
    assert cp is not None and sched is not None
    sizes = direct_sizes(cp)
    kernel = cached_kernel((CONV_CPU.name, CONV_CPU.version, CONV_CPU.config(cp, target, sched),
                            fusion_key(pro_defs, epi_defs, sizes), target),
                           lambda: fuse(CONV_CPU.instantiate(cp, target, sched), pro_defs, epi_defs, sizes),
                           target)
    args: list[Arg] = []
    shapes: list[tuple[int, ...] | None] = []
    for param in kernel.func.params:
        name = param.name
        if name in anc.operands:
            args.append(anc.operands[name])
            shapes.append(anc.views[name])
        elif name == "c":
            args.append(anchor.output)
            shapes.append((cp.n, cp.cout, cp.oh, cp.ow))
        elif name == "xp":
            args.append(Workspace("cpu_conv_x", CONV_CPU.workspace_size(cp, sched, target)))
            shapes.append(None)
        else:
            t = _graph_tensor(anchor, name, outputs, sources)
            args.append(t)
            shapes.append(kernel_shape(t.shape))
    return AnchorPlan(kernel, tuple(args), tuple(shapes))


__all__ = ["AnchorPlan", "Arg", "Workspace", "Zeros", "anchor_dtypes", "anchor_problem", "compose", "fusable",
           "gemm_takes_prologue", "kernel_shape", "leaf", "plan_anchor"]
