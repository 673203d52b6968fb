"""Half-precision products and reductions on the CPU computed in float32.

The CPU templates of matmul, linear, convolution and attention, and those of the reductions, are
float32 (as PyTorch's CPU kernels accumulate half-precision products and sums in float32 too).
A float16 / bfloat16 op of those kinds (:data:`WIDENED`) on the CPU becomes: casts of its half
inputs to float32 (one per tensor, shared by the ops that read it), the op in float32, and a cast
of its result back — the original output tensor, so its readers are unchanged.  Not widened: bf16
linears (and matmuls by a constant matrix) with constant weights where the CPU has AVX-512 BF16
(:func:`native_bf16`: they run on its dot products, which sum in float32 too).  Run before
constant folding: the casts of constant weights fold into float32 weights, and the casts on
either side of a result are epilogues / prologues of the neighbouring kernels like any other."""
from __future__ import annotations

from collections.abc import Callable

from ...backends.base import Target, host_cpu_target
from ...ir.dtypes import bf16, f16, f32
from ...templates.matmul_cpu_bf16 import supported as bf16_dots
from ...templates.pwdw_cpu import worth_fusing
from ..attrs import CastAttrs
from ..ir import Graph, Op, Tensor
from ..kinds import OpKind

#: Op kinds whose CPU kernels are float32 only: the products, and the reductions (their
#: templates, softmax / layer norm / pooling / sums, are float32 on the CPU; PyTorch's CPU kernels
#: accumulate half-precision reductions in float32 as well).
WIDENED = frozenset({OpKind.MATMUL, OpKind.LINEAR, OpKind.CONV2D, OpKind.ATTENTION, OpKind.MAX_POOL2D,
                     OpKind.AVG_POOL2D, OpKind.ADAPTIVE_AVG_POOL2D, OpKind.ADAPTIVE_MAX_POOL2D, OpKind.REDUCE,
                     OpKind.SOFTMAX, OpKind.LOG_SOFTMAX, OpKind.LAYER_NORM})
HALF = (f16, bf16)


def native_bf16(op: Op, target: Target, constant: Callable[[Tensor], bool] = lambda t: t.is_constant) -> bool:
    """A bf16 product the CPU computes as it is, on AVX-512 BF16's dot products
    (:mod:`taskmap.templates.matmul_cpu_bf16`): a linear with a constant 2-D weight (and a constant
    bias), a matmul of a stack by a constant 2-D matrix, or a 1x1 convolution (not grouped, no
    padding) with constant weights (``constant``: what will be one once the constants are
    folded).  Larger windows stay float32: Winograd's and the direct kernels ran ResNet-50's and
    Inception-V3's 3x3 and 7x7 layers faster than the bf16 implicit GEMM with its img2col
    (ResNet-50 at batch 8: 228 ms with them on it, 130 with only the 1x1 layers; Zen 5)."""
    if op.kind not in (OpKind.LINEAR, OpKind.MATMUL, OpKind.CONV2D) or not bf16_dots(target) or \
            any(t.dtype is not bf16 for t in (*op.inputs, op.output)) or op.output.numel == 0:
        return False
    x, w = op.inputs[0], op.inputs[1]
    if op.kind is OpKind.CONV2D:             # the implicit GEMM without img2col: 1x1, not grouped
        a = op.attrs
        return x.ndim == 4 and x.shape[0] > 0 and a.groups == 1 and constant(w) and \
            all(constant(t) for t in op.inputs[2:]) and w.shape[2:] == (1, 1) and \
            a.padding == (0, 0)
    if op.kind is OpKind.MATMUL:
        return x.ndim >= 2 and w.ndim == 2 and constant(w) and len(op.inputs) == 2
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    return x.ndim >= 1 and x.shape[-1] > 0 and w.ndim == 2 and constant(w) and \
        (bias is None or (constant(bias) and bias.shape == (w.shape[0],)))


def _into_depthwise(graph: Graph, target: Target) -> set[Op]:
    """1x1 convolutions whose result (through a batch norm and an activation) only a depthwise
    convolution reads, large enough that the lowering fuses the pair into one kernel
    (:mod:`..lower_pwdw`: the expanded tensor never reaches memory).  Kept in float32 for it: at
    batch 8 MobileNetV2 in bf16 ran 36.3 ms with these on the dot products, the expanded tensors
    through memory (its f32 run, fused: 16.5)."""
    out: set[Op] = set()
    for op in graph.ops:
        if op.kind is not OpKind.CONV2D or op.inputs[1].shape[2:] != (1, 1) or not op.output.shape:
            continue
        t = op.output
        while len(graph.consumers(t)) == 1:
            c = graph.consumers(t)[0]
            if c.kind in (OpKind.BATCH_NORM, OpKind.UNARY, OpKind.CAST) and c.inputs[0] is t:
                t = c.output
                continue
            if c.kind is OpKind.CONV2D and c.inputs[0] is t and c.attrs.groups == t.shape[1] > 1 and \
                    worth_fusing(4 * op.output.numel // op.output.shape[0], op.inputs[0].shape[1], target):
                out.add(op)
            break
    return out


def widen_half(graph: Graph) -> Graph:
    """Widen the half-precision products on the CPU (see the module docstring)."""
    target = host_cpu_target()
    paired = _into_depthwise(graph, target)
    cast = {op.output for op in graph.ops if op.kind is OpKind.CAST and op.inputs[0].is_constant}   # autocast's

    def constant(t: Tensor) -> bool:
        return t.is_constant or t in cast
    ops: list[Op] = []
    widened: dict[Tensor, Tensor] = {}    # one cast per half tensor, whatever number of ops read it
    changed = False
    for op in graph.ops:
        if op.kind not in WIDENED or not any(t.dtype in HALF for t in op.inputs) or \
                any(not t.device.startswith("cpu") for t in op.outputs) or \
                (native_bf16(op, target, constant) and op not in paired):
            ops.append(op)
            continue
        changed = True
        inputs = []
        for t in op.inputs:
            if t.dtype in HALF:
                if t not in widened:
                    widened[t] = Tensor(t.shape, f32, t.device, f"{t.name}_f32" if t.name else "")
                    ops.append(Op(OpKind.CAST, (t,), (widened[t],), CastAttrs(f32), f"{op.name}_widen", op.source))
                t = widened[t]
            inputs.append(t)
        outputs = tuple(Tensor(o.shape, f32, o.device) if o.dtype in HALF else o for o in op.outputs)
        ops.append(Op(op.kind, tuple(inputs), outputs, op.attrs, op.name, op.source))
        for o, wide in zip(op.outputs, outputs):
            if wide is not o:
                ops.append(Op(OpKind.CAST, (wide,), (o,), CastAttrs(o.dtype), f"{op.name}_narrow", op.source))
    return Graph(graph.inputs, graph.outputs, ops, graph.name) if changed else graph


__all__ = ["HALF", "WIDENED", "native_bf16", "widen_half"]
