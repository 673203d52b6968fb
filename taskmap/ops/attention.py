"""``scaled_dot_product_attention`` with the semantics of ``torch.nn.functional``, as one fused
kernel (the templates :mod:`taskmap.templates.attention_cpu` and :mod:`.attention_gpu`).

``query (..., L, E)``, ``key (..., S, E)``, ``value (..., S, Ev)`` -> ``(..., L, Ev)``:
``softmax(query @ key^T * scale + mask) @ value``, where

* the batch dimensions ``...`` broadcast (key and value among themselves, then with query);
  with ``enable_gqa=True`` the head dimension (``-3``) of key / value may divide the query's:
  query head ``h`` reads key / value head ``h // (Hq / Hkv)`` (torch's ``repeat_interleave``);
* ``attn_mask`` broadcasts to ``(..., L, S)``: boolean (True: take part) or float (added to
  the scores; the query's dtype); ``is_causal=True`` keeps keys ``j <= i`` (top-left aligned)
  and may not be combined with a mask (as torch);
* ``scale`` defaults to ``1 / sqrt(E)``; rows whose keys are all masked give zeros (what torch
  2.5+ gives); ``dropout_p`` must be 0 (inference only).

Batch and head dimensions are folded into one flat batch of the kernel; operands broadcast
along a contiguous run of batch dimensions (and grouped heads) are read in place through the
index map ``(b // d) % m``, others are expanded first.  On the CPU the operands must be float32;
on a GPU (or inside ``emulate_gpu``) float32 runs on CUDA cores, float16 and bfloat16 on
tensor cores (``mma.sync``, sm_80 and later; f32 accumulation, the result in the input dtype).
"""
from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends import Target, TargetKind
from ..errors import OpError
from ..runtime.args import data_ptr as _ptr
from ..runtime.kernel import HostLaunch
from ..schedule import tune
from ..templates.attention_cpu import ATTENTION_CPU
from ..templates.attention_gpu import ATTENTION_GPU
from ..templates.attention_kernels import MaskKind
from ..templates.attention_problem import AttentionProblem
from ..templates.attention_tc import ATTENTION_TC
from ..templates.matmul_problem import WORKSPACE, view
from ._dispatch import (FLOATS, SUPPORTED, PlannedCall, filled, host_plan, new_output, prepare, remember, run_template,
                        target_for)
from .transform import broadcast_to

OP = "scaled_dot_product_attention"
INT32_LIMIT = 2**31 - 1


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` (inference: ``dropout_p`` must be 0)."""
    arrays = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    planned, plan_key = host_plan((OP, dropout_p, is_causal, scale, enable_gqa), *arrays)
    if planned is not None:                           # seen before: straight to the kernel
        return planned(*arrays)
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or dropout_p != 0.0:
        raise OpError(f"{OP}(): dropout_p must be 0 (taskmap runs inference only), got {dropout_p!r}")
    if is_causal and attn_mask is not None:
        raise OpError(f"{OP}(): an explicit attn_mask cannot be combined with is_causal=True (as in torch)")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise OpError(f"{OP}(): scale must be a number or None, got {scale!r}")
    args = prepare(OP, *arrays, allowed=SUPPORTED)
    (sq, sk, sv), dts = args.shapes[:3], args.dtypes
    for name, s in (("query", sq), ("key", sk), ("value", sv)):
        if len(s) < 2:
            raise OpError(f"{OP}(): {name} needs at least 2 dimensions (..., length, features), got shape {_fmt(s)}")
    for name, d in (("query", dts[0]), ("key", dts[1]), ("value", dts[2])):
        if d not in FLOATS:
            raise OpError(f"{OP}(): {name} must be floating point, got {d}")
    if len(set(dts[:3])) > 1:
        raise OpError(f"{OP}(): query, key and value must have the same dtype, got {', '.join(dts[:3])}")
    dt = dts[0]
    L, E, S, Ev = sq[-2], sq[-1], sk[-2], sv[-1]
    if sk[-1] != E:
        raise OpError(f"{OP}(): query and key must have the same number of features, got shapes {_fmt(sq)} and "
                      f"{_fmt(sk)} ({E} != {sk[-1]})")
    if sv[-2] != S:
        raise OpError(f"{OP}(): key and value must have the same length, got shapes {_fmt(sk)} and {_fmt(sv)} "
                      f"({S} != {sv[-2]})")
    q, k, v = args.arrays[:3]
    kv_batch, k, v = _kv_batch(k, v, sk, sv)
    full, group = _batch_shape(sq[:-2], kv_batch, enable_gqa)
    out_shape = full + (L, Ev)
    mask_kind, mask, mask_shape = MaskKind.NONE, None, None
    if attn_mask is not None:
        mask, mask_shape, mask_kind = _mask(args.arrays[3], args.shapes[3], dts[3], dt, full, L, S)
    target = target_for(args.kind)
    template = attention_template(target, dt)
    kinds = ("float32",) if target.kind is TargetKind.CPU or "mma_m16n8k16" not in target.features else \
        ("float32", "float16", "bfloat16")
    if dt not in kinds:
        raise OpError(f"{OP}() on {target.name} supports {', '.join(kinds)}; got {dt}")
    bh = math.prod(full)
    if bh * L * Ev == 0:
        return new_output(args.kind, out_shape, dt)
    if S == 0:
        return filled(args.kind, out_shape, dt, 0)
    if E == 0:
        raise OpError(f"{OP}(): query and key have no features (E = 0)")
    for size in (bh * L * max(E, Ev), math.prod(kv_batch) * S * max(E, Ev),
                 math.prod(mask_shape) if mask is not None else 0):
        if size > INT32_LIMIT:
            raise OpError(f"{OP}(): operands of {bh} x {L} x {S} x {max(E, Ev)} are too large for 32-bit indexing")
    if tuple(sq[:-2]) != full:                        # query broadcast along batch dimensions: expand it
        q = broadcast_to(view(q, sq), full + (L, E))
    kd, km = _index_map(full, kv_batch, group)
    if kd is None:                                    # key / value broadcast in a way the kernel cannot read
        heads = full[:-1] + (kv_batch[-1],) if group > 1 else full
        k, v = broadcast_to(view(k, kv_batch + (S, E)), heads + (S, E)), broadcast_to(view(v, kv_batch + (S, Ev)),
                                                                                      heads + (S, Ev))
        kv_batch = heads
        kd, km = _index_map(full, kv_batch, group)
    md = mm = 1
    if mask is not None:
        md, mm = _index_map(full, mask_shape[:-2], 1)
        if md is None:
            mask = broadcast_to(view(mask, mask_shape), full + mask_shape[-2:])
            mask_shape = full + mask_shape[-2:]
            md, mm = _index_map(full, mask_shape[:-2], 1)
    problem = attention_problem(full + (L, E), kv_batch + (S, E), kv_batch + (S, Ev), mask_shape,
                                dts[3] if mask is not None else None, dt, bool(is_causal), scale, enable_gqa)
    assert problem is not None and (problem.kd, problem.km, problem.md, problem.mm) == (kd, km, md, mm), problem
    if not template.applies(problem, target):
        raise OpError(f"{OP}() on {target.name} supports {', '.join(kinds)}; got {dt}")
    out = new_output(args.kind, out_shape, dt)
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    if target.kind is TargetKind.CPU:
        plan = _host_plan(problem, target)
        plan(*inputs, out)
        if plan_key is not None and all(x is y for x, y in zip(inputs, args.arrays)):
            remember(plan_key, PlannedCall(plan, out))      # the operands went in as they came
        return out
    return run_template(template, problem, args, inputs, out)


def attention_template(target: Target, dtype: str) -> Any:
    """The attention template for ``target``: the CPU's; on a GPU the SIMT kernel for f32 and the
    tensor-core one for f16 / bf16 (each checks ``applies`` itself)."""
    if target.kind is TargetKind.CPU:
        return ATTENTION_CPU
    return ATTENTION_GPU if dtype == "float32" else ATTENTION_TC


def attention_problem(sq: Sequence[int], sk: Sequence[int], sv: Sequence[int], mask_shape: Sequence[int] | None,
                      mask_dtype: str | None, dtype: str, is_causal: bool, scale: float | None,
                      enable_gqa: bool = False) -> AttentionProblem | None:
    """The problem of an attention whose operands go to the kernel as they are — contiguous
    ``(..., L, E)`` views, key and value of one batch shape read through the index map, the
    query not broadcast, the mask (``mask_shape`` / ``mask_dtype``, or None) read in place:
    what :func:`scaled_dot_product_attention` runs once it has expanded the operands that need
    it, and what the graph lowering fuses; None for the other cases (operands to expand first,
    empty or too large operands).  The caller checks the dtypes its template takes."""
    if len(sq) < 2 or len(sk) < 2 or len(sv) < 2 or (is_causal and mask_shape is not None):
        return None
    L, E, S, Ev = sq[-2], sq[-1], sk[-2], sv[-1]
    if sk[-1] != E or sv[-2] != S or tuple(sk[:-2]) != tuple(sv[:-2]) or min(L, E, S, Ev) == 0:
        return None
    kv_batch = tuple(sk[:-2])
    try:
        full, group = _batch_shape(sq[:-2], kv_batch, enable_gqa)
    except OpError:
        return None
    if tuple(sq[:-2]) != full:
        return None
    kd, km = _index_map(full, kv_batch, group)
    if kd is None:
        return None
    kind, mb, mask_rows, md, mm = MaskKind.NONE, 1, True, 1, 1
    if mask_shape is not None:
        kind = MaskKind.BOOL if mask_dtype == "bool" else MaskKind.ADD if mask_dtype == dtype else None
        target = full + (L, S)
        padded = (1,) * (len(target) - len(mask_shape)) + tuple(mask_shape)
        if kind is None or len(mask_shape) > len(target) or padded[-1] != S or \
                any(a not in (1, b) for a, b in zip(padded, target)):
            return None
        md, mm = _index_map(full, padded[:-2], 1)
        if md is None:
            return None
        mb, mask_rows = math.prod(padded[:-2]), padded[-2] == L
    bh = math.prod(full)
    if max(bh * L * max(E, Ev), math.prod(kv_batch) * S * max(E, Ev), mb * L * S) > INT32_LIMIT:
        return None
    return AttentionProblem(bh, math.prod(kv_batch), L, S, E, Ev, dtype, kind, mb, mask_rows, bool(is_causal),
                            float(1.0 / math.sqrt(E) if scale is None else scale), kd, km, md, mm)


# ----------------------------------------------------------------------------- host launches


class _HostPlan:
    """A CPU kernel launched by addresses (``CompiledKernel.bind_host``; the operator checked
    the shapes, the first call binds the launch)."""

    def __init__(self, problem: AttentionProblem, target: Target) -> None:
        self.problem, self.target = problem, target
        self.schedule = tune.choose(ATTENTION_CPU, problem, target)     # TASKMAP_TUNE picks the mode
        self.compiled = ATTENTION_CPU.instantiate(problem, target, self.schedule).build("cpu")
        self.ws = ATTENTION_CPU.workspace_size(problem, self.schedule, target)
        self.launch: HostLaunch | None = None

    def __call__(self, q: Any, k: Any, v: Any, *rest: Any) -> None:
        """On ``q, k, v, [mask], out``."""
        mask, out = rest if len(rest) == 2 else (None, rest[0])
        if self.launch is None:
            args = ATTENTION_CPU.arguments(self.problem, [q, k, v, *rest[:-1]], [out], self.schedule, self.target)
            self.launch = self.compiled.bind_host(*args)
        kt = WORKSPACE.get("attn_kt", self.ws)
        self.launch(_ptr(q), _ptr(k), _ptr(v), _DUMMY_PTR if mask is None else _ptr(mask), _ptr(out), _ptr(kt))


_PLANS: dict[tuple[AttentionProblem, Target], _HostPlan] = {}
_LOCK = threading.Lock()
_DUMMY = np.zeros(1, np.float32)
_DUMMY_PTR = _DUMMY.ctypes.data


def _host_plan(problem: AttentionProblem, target: Target) -> _HostPlan:
    plan = _PLANS.get((problem, target))
    if plan is None:
        plan = _HostPlan(problem, target)
        with _LOCK:
            plan = _PLANS.setdefault((problem, target), plan)
    return plan


# ----------------------------------------------------------------------------- shapes


def _fmt(s: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def _broadcast(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        raise OpError(f"{OP}(): the batch dimensions of {op} do not broadcast: "
                      f"{' and '.join(_fmt(s) for s in shapes)}") from None


def _kv_batch(k: Any, v: Any, sk: Sequence[int], sv: Sequence[int]) -> tuple[tuple[int, ...], Any, Any]:
    """The common batch shape of key and value (each expanded to it when they differ)."""
    kb = _broadcast("key and value", sk[:-2], sv[:-2])
    if tuple(sk[:-2]) != kb:
        k = broadcast_to(view(k, sk), kb + tuple(sk[-2:]))
    if tuple(sv[:-2]) != kb:
        v = broadcast_to(view(v, sv), kb + tuple(sv[-2:]))
    return kb, k, v


def _batch_shape(qb: Sequence[int], kb: Sequence[int], gqa: bool) -> tuple[tuple[int, ...], int]:
    """The output's batch shape and the query heads per key / value head (grouped-query)."""
    qb, kb = tuple(qb), tuple(kb)
    if gqa and len(qb) >= 1 and len(kb) >= 1 and kb[-1] not in (1, qb[-1]):
        hq, hk = qb[-1], kb[-1]
        if hk == 0 or hq % hk:
            raise OpError(f"{OP}(): with enable_gqa the query heads ({hq}) must be a multiple of the key / value "
                          f"heads ({hk})")
        full = _broadcast("query and key/value", qb[:-1], kb[:-1]) + (hq,)
        return full, hq // hk
    return _broadcast("query and key/value", qb, kb), 1


def _index_map(full: Sequence[int], shape: Sequence[int], group: int) -> tuple[int | None, int | None]:
    """(d, m) such that flat batch ``b`` of ``full`` reads flat batch ``(b // d) % m`` of an
    operand of batch ``shape`` (left-padded with 1s; its dimensions are 1 or full, its last one
    ``full[-1] // group`` under grouped-query heads), or (None, None) when no such map exists
    (the dimensions it keeps are not contiguous)."""
    full = tuple(full)
    shape = (1,) * (len(full) - len(shape)) + tuple(shape)
    kept = [i for i in range(len(full)) if shape[i] != 1]
    if not kept:
        return 1, 1
    lo, hi = kept[0], kept[-1] + 1
    if any(shape[i] == 1 and full[i] != 1 for i in range(lo, hi)):
        return None, None
    m = math.prod(shape[lo:hi])
    d = math.prod(full[hi:])
    if group > 1:
        if hi != len(full):
            return None, None
        d = group
    return d, m


def _mask(mask: Any, shape: Sequence[int], dtype: str, qdtype: str, full: tuple[int, ...], L: int,
          S: int) -> tuple[Any, tuple[int, ...], str]:
    """The mask, its shape (batch dimensions, then L or 1, then S) and kind."""
    if dtype == "bool":
        kind = MaskKind.BOOL
    elif dtype == qdtype:
        kind = MaskKind.ADD
    else:
        raise OpError(f"{OP}(): attn_mask must be bool or have the query's dtype ({qdtype}), got {dtype}")
    shape = tuple(shape)
    target = full + (L, S)
    padded = (1,) * (len(target) - len(shape)) + shape
    if len(shape) > len(target) or any(s not in (1, t) for s, t in zip(padded, target)):
        raise OpError(f"{OP}(): attn_mask of shape {_fmt(shape)} cannot be broadcast to {_fmt(target)}")
    if padded[-1] != S:                               # one column for all keys: expand it
        new = padded[:-1] + (S,)
        mask = broadcast_to(view(mask, padded), new)
        padded = new
    return mask, padded, kind


__all__ = ["attention_problem", "attention_template", "scaled_dot_product_attention"]
