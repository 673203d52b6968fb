"""Template anchors: softmax, log_softmax, layer_norm, pooling, depthwise conv2d and attention
lowered to ONE kernel of their ``taskmap.ops`` template, with the group's prologues and
epilogue spliced in by post-scheduling fusion.

Each op's problem comes from the planning function its ``taskmap.ops`` function uses
(:func:`taskmap.ops.reduction.softmax_problem` / ``norm_problem``,
:func:`taskmap.ops.pool.plan_pool` / ``plan_adaptive``,
:func:`taskmap.ops.depthwise.plan_depthwise`, :func:`taskmap.ops.attention.attention_problem`)
and its kernel from :func:`taskmap.ops._dispatch.template_kernel` (the same schedule and the
same ``Kernel`` object the operator runs).  Then :func:`taskmap.fusion.fuse` splices

* each prologue (the injective ops computing an anchor input, composed, viewed as the
  template's operand) into the operand's loads: ``add -> layer_norm``, ``x * scale -> softmax``,
  reshapes / permutes / mask arithmetic feeding attention;
* the epilogue (the anchor's result viewed as the graph output, then the chain, composed) into
  the stores of the template's output: ``depthwise -> bn -> relu6``.  A depthwise conv whose
  epilogue permutes it to NHWC (ConvNeXt) is planned ``channels_last``: the channel-lane kernel
  then stores a pixel's channels as one vector.

:func:`plan_template` raises :class:`~taskmap.errors.FusionError` when fusion is refused (the
CPU softmax kernel reads its output back: no epilogue) — the caller then runs the anchor alone
(``plan_template(op, (), (), target)``, still one prepared launch) and the rest as injective
kernels.  On a GPU the same templates' GPU kernels (attention: the SIMT kernel for f32, the
tensor-core one for f16 / bf16), except global pooling, which is a reduction there.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..backends import Target, TargetKind
from ..compute.nodes import TensorNode, tensor_input
from ..errors import FusionError, OpError
from ..fusion import fuse, fusion_key
from ..ir.printer import func_str
from ..ops._dispatch import template_kernel
from ..ops.attention import attention_problem, attention_template
from ..ops.depthwise import plan_depthwise
from ..ops.pool import plan_adaptive, plan_pool
from ..ops.reduction import norm_problem, softmax_problem
from ..ops.transform import reshape_compute
from ..templates.attention_cpu import ATTENTION_CPU
from ..templates.reduce import RowTemplate, template_for
from ..templates.window import WINDOW
from .ir import Op, Tensor
from .kernel_cache import cached_kernel
from .kinds import OpKind
from .lower_anchor import AnchorPlan, Workspace, anchor_dtypes, compose, kernel_shape, reads_channels_last, view_as


@dataclass(frozen=True)
class Scalar:
    """A scalar kernel argument fixed at compile time (attention's scale and index maps)."""

    value: int | float


#: The op kinds lowered here.
TEMPLATE_KINDS = frozenset({OpKind.SOFTMAX, OpKind.LOG_SOFTMAX, OpKind.LAYER_NORM, OpKind.MAX_POOL2D,
                            OpKind.AVG_POOL2D, OpKind.ADAPTIVE_AVG_POOL2D, OpKind.ADAPTIVE_MAX_POOL2D,
                            OpKind.CONV2D, OpKind.ATTENTION})


@dataclass
class TemplateProblem:
    """A template problem and where the kernel's parameters come from."""

    template: Any
    problem: Any
    operands: dict[str, tuple[Tensor, tuple[int, ...]]]     # parameter -> graph tensor, viewed as
    graph_input: dict[int, str]                             # anchor input index -> parameter (prologues)
    output: str                                             # the output parameter
    out_view: tuple[int, ...]
    fixed: dict[str, tuple[Any, tuple[int, ...] | None]]    # parameter -> Workspace / Zeros / Scalar, view


def _float_ok(op: Op, target: Target) -> bool:
    """Data and output of one dtype the anchors take on ``target`` (:func:`.lower_anchor.anchor_dtypes`;
    attention's mask may be bool: its problem checks it)."""
    data = op.inputs[:3] if op.kind is OpKind.ATTENTION else op.inputs
    dts = {t.dtype.name for t in (*data, op.output)}
    return len(dts) == 1 and dts <= set(anchor_dtypes(target)) and op.output.numel > 0


def _row(op: Op) -> TemplateProblem | None:
    x = op.inputs[0]
    name = {OpKind.SOFTMAX: "softmax", OpKind.LOG_SOFTMAX: "log_softmax", OpKind.LAYER_NORM: "layer_norm"}[op.kind]
    a = op.attrs
    if op.kind is OpKind.LAYER_NORM:
        p = norm_problem(name, x.shape, x.dtype.name, a.normalized_shape, a.has_weight, a.has_bias, a.eps)
    else:
        p = softmax_problem(name, x.shape, x.dtype.name, a.axis % max(x.ndim, 1))
    if p is None:
        return None
    rows = (p.outer, p.extent, p.inner)
    operands = {"x": (x, rows)}
    for param, t in zip(("w", "b") if p.weight else ("b",), op.inputs[1:]):
        operands[param] = (t, (p.extent,))
    return TemplateProblem(template_for(name), p, operands, {0: "x"}, "y", rows, {})


def _window(op: Op, target: Target) -> TemplateProblem | None:
    x, a = op.inputs[0], op.attrs
    shape, dt = tuple(x.shape), x.dtype.name
    if op.kind is OpKind.MAX_POOL2D:
        p, _ = plan_pool("max_pool2d", "max", shape, dt, a.kernel, a.stride, a.padding, a.dilation, a.ceil_mode)
    elif op.kind is OpKind.AVG_POOL2D:
        p, _ = plan_pool("avg_pool2d", "avg", shape, dt, a.kernel, a.stride, a.padding, 1, a.ceil_mode,
                         a.count_include_pad, a.divisor_override)
    elif op.kind in (OpKind.ADAPTIVE_AVG_POOL2D, OpKind.ADAPTIVE_MAX_POOL2D):
        kind = "avg" if op.kind is OpKind.ADAPTIVE_AVG_POOL2D else "max"
        p, _ = plan_adaptive(f"adaptive_{kind}_pool2d", kind, shape, dt, a.output_size)
    else:
        w = op.inputs[1]
        if x.ndim != 4 or not (a.groups == x.shape[1] and a.groups > 1 and w.shape[0] == x.shape[1]):
            return None                               # not depthwise: lower_anchor's conv
        p, _ = plan_depthwise(tuple(tuple(t.shape) for t in op.inputs), tuple(t.dtype.name for t in op.inputs),
                              a.stride, a.padding, a.dilation)
    if p is None or p.n == 0 or (p.is_global and target.kind is not TargetKind.CPU):
        return None              # a GPU's global pooling: a reduction (rule-based, or its runner)
    out = (p.n, p.c_out, p.oh, p.ow)
    if p.is_global:
        return TemplateProblem(WINDOW, p, {"x": (x, (p.n * p.c_in, p.h * p.w))}, {0: "x"}, "y", (p.n * p.c_out,), {})
    operands = {"x": (x, (p.n, p.c_in, p.h, p.w))}
    if p.op == "conv":
        operands["w"] = (op.inputs[1], (p.c_out, p.kh * p.kw))
        if p.bias:
            operands["bias"] = (op.inputs[2], (p.c_out,))
    return TemplateProblem(WINDOW, p, operands, {0: "x"}, "y", out, {})


def _attention(op: Op, target: Target) -> TemplateProblem | None:
    q, k, v = op.inputs[:3]
    a = op.attrs
    mask = op.inputs[3] if a.has_mask else None
    p = attention_problem(q.shape, k.shape, v.shape, mask.shape if mask is not None else None,
                          mask.dtype.name if mask is not None else None, q.dtype.name, a.is_causal, a.scale)
    template = attention_template(target, q.dtype.name)
    if p is None or not template.applies(p, target):
        return None
    operands = {"q": (q, (p.bh, p.L, p.e)), "k": (k, (p.bk, p.S, p.e)), "v": (v, (p.bk, p.S, p.ev))}
    fixed: dict[str, tuple[Any, tuple[int, ...] | None]] = {}
    if mask is not None:
        operands["mask"] = (mask, (p.mb, p.ml, p.S))
    else:
        fixed["mask"] = (Workspace("attn_no_mask", 1), (1, 1, 1))
    if template is ATTENTION_CPU:   # packed K^T: as large as any schedule needs (template_kernel picks one)
        ws = max(ATTENTION_CPU.workspace_size(p, s, target) for s in ATTENTION_CPU.space(p, target))
        fixed["kt"] = (Workspace("cpu_attn_kt", ws), (ws,))
    for name, value in zip(("scale", "kd", "km", "md", "mm"), (float(p.scale), p.kd, p.km, p.md, p.mm)):
        fixed[name] = (Scalar(value), None)
    return TemplateProblem(template, p, operands, {0: "q", 1: "k", 2: "v", 3: "mask"}, "o", (p.bh, p.L, p.ev),
                           fixed)


def template_problem(op: Op, target: Target) -> TemplateProblem | None:
    """The template problem of a template-anchor op, or None (another lowering, or its runner)."""
    if op.kind not in TEMPLATE_KINDS or len(op.outputs) != 1 or not _float_ok(op, target):
        return None
    try:
        if op.kind is OpKind.ATTENTION:
            return _attention(op, target)
        if op.kind in (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX, OpKind.LAYER_NORM):
            return _row(op)
        return _window(op, target)
    except OpError:
        return None


def template_fusable(op: Op, target: Target) -> bool:
    """Whether ``op`` is a template anchor on ``target``."""
    return op.kind in TEMPLATE_KINDS and template_problem(op, target) is not None


def template_prologue_inputs(op: Op) -> tuple[int, ...]:
    """The inputs of a template anchor that take a prologue: the data input (attention: q, k, v
    and the mask)."""
    if op.kind is OpKind.ATTENTION:
        return tuple(range(min(len(op.inputs), 4)))
    return (0,) if op.kind in TEMPLATE_KINDS else ()


def _ir_text(kernel: Any) -> str:
    """The kernel's IR as text (its schedule included), for the kernel cache's key."""
    return "\n".join(func_str(f) for f in kernel.module.functions)


def plan_template(anchor: Op, prologues: Sequence[tuple[int, Sequence[Op]]], epilogue: Sequence[Op],
                  target: Target) -> AnchorPlan:
    """One kernel: the anchor's template with its prologues and epilogue (FusionError: cannot)."""
    tp = template_problem(anchor, target)
    if tp is None:
        raise FusionError(f"{anchor.name}: no template lowering for {anchor.kind.name} with these shapes on "
                          f"{target.name}")
    if tp.template is WINDOW and tp.problem.op == "conv" and reads_channels_last(epilogue):
        tp = replace(tp, problem=replace(tp.problem, channels_last=True))
    return plan_problem(tp, anchor, prologues, epilogue, target)


def plan_problem(tp: TemplateProblem, anchor: Op, prologues: Sequence[tuple[int, Sequence[Op]]],
                 epilogue: Sequence[Op], target: Target) -> AnchorPlan:
    """One kernel: ``tp``'s template (the kernel its schedule choice gives) with the prologues
    of ``anchor``'s inputs and its epilogue spliced in (FusionError: cannot)."""
    base = template_kernel(tp.template, tp.problem, target)
    pro_defs: dict[str, TensorNode] = {}
    sources: dict[str, Tensor] = {}
    nodes: dict[Tensor, TensorNode] = {}
    for k, ops in prologues:
        param = tp.graph_input.get(k)
        if param is None or param not in tp.operands:
            raise FusionError(f"{anchor.name}: input {k} takes no prologue")
        if any(op.kind is OpKind.CONCAT for op in ops) and (
                tp.template is WINDOW or (isinstance(tp.template, RowTemplate) and target.kind is TargetKind.CPU)):
            # the staging would load every part for each element (DenseNet's transitions: 7 parts
            # 0.53 ms; as a piecewise injective kernel, then the pool alone, ~0.15 ms); a CPU
            # row's vector loop would select among the parts element by element (Swin's patch
            # merging, four strided parts before a LayerNorm of 784 x 384: 0.66 ms, apart ~0.1)
            raise FusionError(f"{anchor.name}: a concatenation is written in place, or by its own kernel piece "
                              "by piece, instead")
        compose(ops, nodes, sources, "p")
        pro_defs[param] = view_as(nodes[anchor.inputs[k]], param, tp.operands[param][1])
    epi_defs: dict[str, TensorNode] = {}
    out_tensor = anchor.output
    if epilogue:
        value = tensor_input(tp.output, anchor.output.dtype, tp.out_view)
        shape = kernel_shape(anchor.output.shape)
        enodes: dict[Tensor, TensorNode] = {anchor.output: value if tp.out_view == shape
                                            else reshape_compute(value, shape)}
        compose(epilogue, enodes, sources, "e")
        out_tensor = epilogue[-1].output
        epi_defs[tp.output] = view_as(enodes[out_tensor], "out", kernel_shape(out_tensor.shape))
    kernel = base
    if pro_defs or epi_defs:
        kernel = cached_kernel((tp.template.name, tp.template.version, tp.problem, _ir_text(base),
                                fusion_key(pro_defs, epi_defs), target),
                               lambda: fuse(base, pro_defs, epi_defs), target)
    args: list[Any] = []
    shapes: list[tuple[int, ...] | None] = []
    for param in kernel.func.params:
        name = param.name
        if name in tp.operands and name not in pro_defs:
            t, shape = tp.operands[name]
            args.append(t)
            shapes.append(shape)
        elif name == tp.output:
            args.append(anchor.output)
            shapes.append(tp.out_view)
        elif name in tp.fixed:
            arg, shape = tp.fixed[name]
            args.append(arg)
            shapes.append(shape)
        elif name == "out" and epi_defs:
            args.append(out_tensor)
            shapes.append(kernel_shape(out_tensor.shape))
        elif name in sources:
            args.append(sources[name])
            shapes.append(kernel_shape(sources[name].shape))
        else:
            raise FusionError(f"{anchor.name}: the template kernel has a parameter {name!r} with no source")
    return AnchorPlan(kernel, tuple(args), tuple(shapes))


__all__ = [
    "TEMPLATE_KINDS",
    "Scalar",
    "TemplateProblem",
    "plan_problem",
    "plan_template",
    "template_fusable",
    "template_problem",
    "template_prologue_inputs",
]
