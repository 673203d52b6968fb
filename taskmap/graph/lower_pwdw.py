"""A pointwise convolution feeding a depthwise one (MobileNet's inverted residual: ``1x1 conv
-> BN -> ReLU6 -> depthwise conv -> BN -> ReLU6``) lowered to ONE kernel of
:mod:`taskmap.templates.pwdw_cpu`: two fusion groups — the 1x1 convolution with at most an
activation as its epilogue, the depthwise convolution with any epilogue — become one launch in
which the expanded tensor never reaches memory (a core computes it a band of rows and a few
channels at a time, in its L2, and convolves it there).  The depthwise group's epilogue is
spliced into the kernel's output stores as usual (:func:`.lower_template.plan_problem`).

Taken when the 1x1 convolution's result is read by the depthwise convolution only, both have
constant weights (BatchNorm folded: :mod:`.passes`), f32 on the CPU, strides of 1 or 2, no
dilation.  ``TASKMAP_FUSE_PWDW=0`` keeps the two kernels (for comparisons).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..backends import Target, TargetKind
from ..templates.pwdw_cpu import PWDW_CPU, PwDwProblem, worth_fusing
from .attrs import UnaryFn
from .ir import Graph, Op, Tensor
from .kinds import OpKind
from .lower_anchor import Workspace
from .lower_template import TemplateProblem
from .partition import FusionGroup, GroupKind

#: The activations the kernel applies between the two convolutions.
ACTIVATIONS = {UnaryFn.RELU: "relu", UnaryFn.RELU6: "relu6", UnaryFn.HARDSWISH: "hardswish", UnaryFn.SILU: "silu"}


def _conv(group: FusionGroup) -> Op | None:
    """The group's conv2d anchor when it is f32 NCHW with constant weights (and bias), no
    dilation and no prologue."""
    op = group.anchor
    if group.kind is not GroupKind.ANCHORED or op is None or op.kind is not OpKind.CONV2D or group.prologues:
        return None
    x, w = op.inputs[0], op.inputs[1]
    if x.ndim != 4 or not w.is_constant or not all(t.is_constant for t in op.inputs[2:]):
        return None
    if any(t.dtype.name != "float32" for t in (*op.inputs, op.output)) or op.attrs.dilation != (1, 1):
        return None
    return op


def _activation(group: FusionGroup) -> str | None:
    """The pointwise group's epilogue as one of :data:`ACTIVATIONS` ("none": no epilogue) — also
    a half-precision model's: the activation between the cast of the f32 convolution's result to
    the half type and the cast back (the fused kernel keeps the expanded tensor in f32, unrounded:
    within one half-precision rounding of eager's)."""
    epi = list(group.epilogue)
    if len(epi) == 3 and all(op.kind is OpKind.CAST for op in (epi[0], epi[2])) and \
            epi[0].output.dtype.nbytes == 2 and epi[2].output.dtype.name == "float32":
        epi = epi[1:2]
    if not epi:
        return "none"
    op = epi[0]
    if len(epi) == 1 and op.kind is OpKind.UNARY and op.attrs.fn in ACTIVATIONS:
        return ACTIVATIONS[op.attrs.fn]
    return None


def pair_problem(graph: Graph, pw: FusionGroup, dw: FusionGroup, target: Target) -> TemplateProblem | None:
    """The fused template problem of the groups ``pw`` (1x1 conv, activation) and ``dw``
    (depthwise conv reading ``pw``'s result), or None when the pair does not qualify."""
    if target.kind is not TargetKind.CPU or os.environ.get("TASKMAP_FUSE_PWDW", "1") == "0":
        return None
    a, b = _conv(pw), _conv(dw)
    act = _activation(pw)
    if a is None or b is None or act is None:
        return None
    e = pw.last.output
    if b.inputs[0] is not e or graph.consumers(e) != [b] or e in graph.outputs:
        return None
    n, cin, h, w = a.inputs[0].shape
    cexp = a.output.shape[1]
    if a.inputs[1].shape != (cexp, cin, 1, 1) or a.attrs.stride != (1, 1) or a.attrs.padding != (0, 0) \
            or a.attrs.groups != 1:
        return None
    kh, kw = b.inputs[1].shape[2:]
    sh, sw = b.attrs.stride
    ph, pw_ = b.attrs.padding
    if b.attrs.groups != cexp or b.inputs[1].shape[:2] != (cexp, 1) or b.output.shape[1] != cexp \
            or sh > 2 or sw > 2:
        return None
    p = PwDwProblem(n, cin, h, w, cexp, kh, kw, sh, sw, ph, ph, pw_, pw_, act)
    if not PWDW_CPU.applies(p, target) or (p.oh, p.ow) != tuple(b.output.shape[2:]):
        return None
    if not worth_fusing(e.nbytes // n, cin, target):    # the two kernels pass an image through L2 anyway
        return None
    operands = {"x": (a.inputs[0], (n, cin, h * w)), "w1": (a.inputs[1], (cexp, cin)),
                "wd": (b.inputs[1], (cexp, kh * kw))}
    for name, op in (("b1", a), ("bd", b)):       # a convolution without bias: zeros
        operands[name] = (op.inputs[2] if len(op.inputs) > 2 else
                          Tensor((cexp,), op.output.dtype, op.output.device, f"{op.name}_zero_bias",
                                 np.zeros(cexp, np.float32)), (cexp,))
    size = max(PWDW_CPU.workspace_size(p, s, target) for s in PWDW_CPU.space(p, target))
    return TemplateProblem(PWDW_CPU, p, operands, {}, "y", (n, cexp, p.oh, p.ow),
                           {"ws": (Workspace("cpu_pwdw", size), (size,))})


def pointwise_depthwise_pairs(graph: Graph, groups: Sequence[FusionGroup], target: Target
                              ) -> dict[int, tuple[int, TemplateProblem]]:
    """Per index of a depthwise group fused with its producer: (the producer's index, the
    fused problem)."""
    made = {t: i for i, g in enumerate(groups) for t in g.last.outputs}
    pairs: dict[int, tuple[int, TemplateProblem]] = {}
    for i, g in enumerate(groups):
        if g.anchor is None or g.anchor.kind is not OpKind.CONV2D:
            continue
        j = made.get(g.anchor.inputs[0])
        if j is None or j in pairs:             # (no chains: a group fused as a depthwise one stays so)
            continue
        tp = pair_problem(graph, groups[j], g, target)
        if tp is not None:
            pairs[i] = (j, tp)
    return pairs


def merged(pw: FusionGroup, dw: FusionGroup) -> FusionGroup:
    """The two groups as one (the depthwise convolution its anchor, its chain the epilogue)."""
    return FusionGroup(GroupKind.ANCHORED, pw.ops + dw.ops, dw.anchor, (), dw.epilogue)


__all__ = ["ACTIVATIONS", "merged", "pair_problem", "pointwise_depthwise_pairs"]
