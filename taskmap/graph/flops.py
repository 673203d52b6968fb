"""Floating-point operations of the compute-heavy ops (a multiply-add counts 2): what a profile
divides a step's time by to show how close its kernel runs to the machine's peak."""
from __future__ import annotations

import math

from .ir import Op
from .kinds import OpKind


_COUNTED = frozenset((OpKind.CONV2D, OpKind.MATMUL, OpKind.LINEAR, OpKind.ATTENTION))


def op_flops(op: Op) -> float:
    """The FLOPs of a convolution, matmul, linear or attention (0 for any other op)."""
    if not op.inputs or op.kind not in _COUNTED:    # (only these have one output for certain)
        return 0.0
    out = math.prod(op.output.shape)
    if op.kind is OpKind.CONV2D:          # weight (cout, cin / groups, kh, kw)
        return 2.0 * out * math.prod(op.inputs[1].shape[1:])
    if op.kind is OpKind.MATMUL:          # torch.matmul: a's last dimension is the reduction
        return 2.0 * out * op.inputs[0].shape[-1]
    if op.kind is OpKind.LINEAR:          # weight (out_features, in_features)
        return 2.0 * out * op.inputs[1].shape[-1]
    if op.kind is OpKind.ATTENTION:       # q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev)
        q, k = op.inputs[0].shape, op.inputs[1].shape
        return 2.0 * (out // op.output.shape[-1]) * k[-2] * (q[-1] + op.output.shape[-1])
    return 0.0


__all__ = ["op_flops"]
