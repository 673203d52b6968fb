"""Reduction templates: sum / mean / max / min / prod / var over an axis, softmax and
log-softmax, layer norm and RMS norm — each one kernel, on the CPU and on GPUs.

A problem (:class:`RowProblem`) views the input as ``(outer, extent, inner)`` and reduces or
normalises along ``extent``.  Each operator is a :class:`~.reduce_kernels.RowProgram` (what
happens to a row); :mod:`.reduce_kernels` runs programs on the CPU (a core per row, SIMD lanes in
the row, or lanes across rows when ``inner > 1``) and on GPUs (a group of lanes, a warp or a
block per row with shuffles; a thread per row when ``inner > 1``).

Tuning spaces are small and in hardware terms: CPU — accumulator vectors per lane group
(latency hiding); GPU — threads per row and rows per block (or the block size of the
thread-per-row kernel).  ``cost`` is a roofline: DRAM traffic against bandwidth, and
per-row latency (dependent adds, shuffles, barriers) against the parallelism of the machine.
Pick a point with ``taskmap.schedule.tune.choose(template, problem, target, mode="model")``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..backends.base import Target, TargetKind
from ..compute.nodes import ReduceOp, accumulator_type
from ..ir import expr as E
from ..ir.dtypes import ScalarType, i64, scalar_type
from ..runtime.args import view
from ..runtime.kernel import Kernel
from .base import Schedule
from .reduce_kernels import (MAX_CACHED, Let, Reduce, RowProgram, Shape, cpu_columns, cpu_rows, gpu_columns,
                             gpu_rows, lanes_of)

REDUCTIONS = ("sum", "mean", "max", "min", "prod", "var")
SOFTMAX = ("softmax", "log_softmax")


@dataclass(frozen=True)
class RowProblem:
    """``op`` along the middle axis of an input viewed as ``(outer, extent, inner)``.

    ``correction`` is var's divisor offset (``extent - correction``); ``eps``, ``weight`` and
    ``bias`` are the norms'.  Dtypes are names ("float32", "bfloat16", ...)."""

    op: str
    outer: int
    extent: int
    inner: int
    dtype: str
    out_dtype: str
    correction: int = 0
    eps: float = 0.0
    weight: bool = False
    bias: bool = False

    @property
    def shape(self) -> Shape:
        return Shape(self.outer, self.extent, self.inner)

    @property
    def elementwise(self) -> bool:
        return self.op not in REDUCTIONS

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, dtype) of the kernel's inputs: x as (outer, extent, inner), then weight, bias."""
        params = [((self.extent,), self.dtype)] * (int(self.weight) + int(self.bias))
        return [((self.outer, self.extent, self.inner), self.dtype), *params]

    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        shape = (self.outer, self.extent, self.inner) if self.elementwise else (self.outer, self.inner)
        return [(shape, self.out_dtype)]

    @property
    def compute_type(self) -> ScalarType:
        return accumulate_type(self.op, self.dtype)


def accumulate_type(op: str, dtype: str) -> ScalarType:
    """What ``op`` computes in for ``dtype``: f32 for 16-bit floats, i64 for integer sums and
    products, else the type itself."""
    t = scalar_type(dtype)
    if op in ("sum", "prod") and not t.is_float:
        return i64
    return accumulator_type(t)


# ----------------------------------------------------------------------------- row programs


def program(p: RowProblem) -> RowProgram:
    """What ``p.op`` does with one row."""
    ct, K = p.compute_type, p.extent
    op = p.op
    x_only = lambda x, env, k, m: x  # noqa: E731
    if op in ("sum", "max", "min", "prod"):
        rop = ReduceOp(op)
        return RowProgram(op, (Reduce("acc", rop, x_only),), ct, per_row=lambda env: env["acc"])
    if op == "mean":
        return RowProgram(op, (Reduce("s", ReduceOp.SUM, x_only), Let("mean", lambda env: env["s"] / float(K))), ct,
                          per_row=lambda env: env["mean"])
    if op == "var":
        return RowProgram(op, (*_mean_var(K, float(K - p.correction)),), ct, per_row=lambda env: env["var"])
    if op == "softmax":
        return RowProgram(op, _max_sumexp() + (Let("inv", lambda env: 1.0 / env["sum"]),), ct,
                          elementwise=lambda x, env, k, m: _exp_or_stash(x, env, m) * env["inv"])
    if op == "log_softmax":
        lse = Let("lse", lambda env: env["max"] + E.call(E.Intrinsic.LOG, env["sum"]))
        return RowProgram(op, _max_sumexp() + (lse,), ct, elementwise=lambda x, env, k, m: x - env["lse"])
    if op == "layer_norm":
        eps = p.eps
        steps = (*_mean_var(K, float(K)), Let("rstd", lambda env: E.call(E.Intrinsic.RSQRT, env["var"] + eps)))
        params = tuple(n for n, on in (("w", p.weight), ("b", p.bias)) if on)

        def ln(x: E.Expr, env: Any, k: E.Expr, m: Any) -> E.Expr:
            y = (x - env["mean"]) * env["rstd"]
            y = y * E.cast(env["w"], ct) if p.weight else y
            return y + E.cast(env["b"], ct) if p.bias else y
        return RowProgram(op, steps, ct, elementwise=ln, params=params)
    if op == "rms_norm":
        eps = p.eps
        steps = (Reduce("ss", ReduceOp.SUM, lambda x, env, k, m: x * x),
                 Let("r", lambda env: E.call(E.Intrinsic.RSQRT, env["ss"] / float(K) + eps)))

        def rms(x: E.Expr, env: Any, k: E.Expr, m: Any) -> E.Expr:
            return x * env["r"] * E.cast(env["w"], ct) if p.weight else x * env["r"]
        return RowProgram(op, steps, ct, elementwise=rms, params=("w",) if p.weight else ())
    raise ValueError(f"no row program for {op!r}")


def _exp_or_stash(x: E.Expr, env: Any, m: Any) -> E.Expr:
    return env["stash"] if "stash" in env else m.exp_nonpositive(x - env["max"])


def _mean_var(K: int, divisor: float) -> tuple[Reduce | Let, ...]:
    """Two passes (the row is in cache or in registers): the mean, then the squared deviations."""
    return (Reduce("s", ReduceOp.SUM, lambda x, env, k, m: x), Let("mean", lambda env: env["s"] / float(K)),
            Reduce("ss", ReduceOp.SUM, lambda x, env, k, m: (x - env["mean"]) * (x - env["mean"])),
            Let("var", lambda env: env["ss"] / divisor))


def _max_sumexp() -> tuple[Reduce | Let, ...]:
    """Numerically stable: the row maximum, then the sum of ``exp(x - max)``."""
    return (Reduce("max", ReduceOp.MAX, lambda x, env, k, m: x),
            Reduce("sum", ReduceOp.SUM, lambda x, env, k, m: m.exp_nonpositive(x - env["max"]), stash=True))


# ----------------------------------------------------------------------------- the templates

_DEFAULTS = {TargetKind.CPU: (20e9, 2.5e9), TargetKind.CUDA: (2e12, 1.5e9), TargetKind.HIP: (1.6e12, 1.5e9)}
#: Cycles of a dependent vector add / max (CPU) and of a load-use round trip per element (GPU).
CPU_ADD_LATENCY = 4
GPU_ELEMENT_CYCLES = 24
GPU_SHUFFLE_CYCLES = 30
GPU_BARRIER_CYCLES = 120


class RowTemplate:
    """A template for the row operators ``ops`` (see the module docstring)."""

    version = 1  # keys the tuning cache: bump when the kernels change

    def __init__(self, name: str, ops: Sequence[str]) -> None:
        self.name = name
        self.ops = tuple(ops)

    def __repr__(self) -> str:
        return f"<RowTemplate {self.name}>"

    def applies(self, problem: RowProblem, target: Target) -> bool:
        return isinstance(problem, RowProblem) and problem.op in self.ops

    # ------------------------------------------------------------------ space
    def space(self, problem: RowProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p = problem
        if target.kind is TargetKind.CPU:
            lanes = lanes_of(target.vector_bytes, p.compute_type)
            span = p.extent if p.inner == 1 else p.inner
            out = [Schedule.of(vectors=v) for v in (1, 2, 4) if v == 1 or (v // 2) * lanes < span]
            return out
        if p.inner > 1:
            return [Schedule.of(block=bs) for bs in (64, 128, 256)]
        out = []
        for lanes in (4, 8, 16, 32):
            for block in (128, 256):
                if lanes <= 2 * max(4, p.extent):
                    out.append(Schedule.of(lanes=lanes, rows_per_block=block // lanes))
        for lanes in (64, 128, 256, 512, 1024):
            smem = (lanes // 32) * p.compute_type.nbytes
            if lanes < 2 * p.extent and lanes <= target.max_threads_per_block and smem <= target.max_shared_memory:
                out.append(Schedule.of(lanes=lanes, rows_per_block=1))
        return out

    # ------------------------------------------------------------------ cost
    def cost(self, problem: RowProblem, target: Target, schedule: Schedule) -> float:
        p = problem
        bw, clock = _DEFAULTS[target.kind]
        bw = target.mem_bandwidth or bw
        clock = target.clock_hz or clock
        prog = program(p)
        passes = sum(isinstance(s, Reduce) for s in prog.steps) + (1 if p.elementwise else 0)
        in_b = scalar_type(p.dtype).nbytes
        out_b = scalar_type(p.out_dtype).nbytes
        elems = p.outer * p.extent * p.inner
        traffic = elems * in_b + (elems if p.elementwise else p.outer * p.inner) * out_b
        rows = p.outer * p.inner
        if target.kind is TargetKind.CPU:
            lanes = lanes_of(target.vector_bytes, p.compute_type)
            vectors = schedule["vectors"]
            width = lanes * vectors
            span = p.extent if p.inner == 1 else p.inner
            row_bytes = p.extent * in_b * (1 if p.inner == 1 else min(p.inner, width))
            if row_bytes > (target.l2_bytes or 1 << 20) / max(1, target.num_cores):
                traffic += (passes - 1) * elems * in_b  # the row does not stay in cache
            steps = -(-span // width) * (p.extent if p.inner > 1 else 1)
            per_group = passes * steps * max(1.0, CPU_ADD_LATENCY / vectors) + passes * width
            groups = p.outer if p.inner == 1 else p.outer * -(-p.inner // width)
            waste = (-(-span // width) * width) / span  # lanes idle in the tail
            cores = min(target.num_cores, groups)
            compute = groups * per_group * waste / (clock * max(1, cores))
            return _overlap(traffic / bw, compute) + 2e-6
        occupancy_threads = target.max_threads_per_core or 2048
        sms = max(1, target.num_cores)
        if p.inner > 1:
            block = schedule["block"]
            waves = -(-rows // (sms * (occupancy_threads // block) * block))
            coalesce = 1.0 if p.inner * in_b >= 32 else 32 / (p.inner * in_b)
            latency = waves * p.extent * passes * GPU_ELEMENT_CYCLES / clock
            tail = (-(-rows // block) * block) / rows
            return _overlap(traffic * coalesce / bw, latency * tail) + 3e-6
        lanes, rpb = schedule["lanes"], schedule["rows_per_block"]
        block = lanes * rpb
        per_lane = -(-p.extent // lanes)
        if per_lane > MAX_CACHED:
            traffic += (passes - 1) * elems * in_b * 0.5  # re-read, mostly from L2
        sector = min(1.0, lanes * in_b / 32)
        concurrent_rows = sms * max(1, occupancy_threads // block) * rpb
        waves = -(-rows // concurrent_rows)
        steps = math.log2(lanes)
        row_cycles = passes * (per_lane * GPU_ELEMENT_CYCLES + steps * GPU_SHUFFLE_CYCLES)
        if lanes > 32:
            row_cycles += passes * (2 * GPU_BARRIER_CYCLES + 5 * GPU_SHUFFLE_CYCLES)
        idle = (per_lane * lanes) / p.extent
        return _overlap(traffic / (bw * sector), waves * row_cycles * idle / clock) + 3e-6

    # ------------------------------------------------------------------ kernels
    def instantiate(self, problem: RowProblem, target: Target, schedule: Schedule) -> Kernel:
        p = problem
        prog = program(p)
        x_t, y_t = scalar_type(p.dtype), scalar_type(p.out_dtype)
        if target.kind is TargetKind.CPU:
            lanes = lanes_of(target.vector_bytes, p.compute_type)
            work = p.outer * p.extent * p.inner
            parallel = target.num_cores > 1 and work >= (1 << 15) and p.shape.rows > 1
            build = cpu_rows if p.inner == 1 else cpu_columns
            module = build(prog, p.shape, x_t, y_t, x_t, lanes, schedule["vectors"], parallel)
        elif p.inner > 1:
            module = gpu_columns(prog, p.shape, x_t, y_t, x_t, schedule["block"])
        else:
            module = gpu_rows(prog, p.shape, x_t, y_t, x_t, schedule["lanes"], schedule["rows_per_block"])
        return Kernel(module)

    def arguments(self, problem: RowProblem, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
        """The input (viewed as ``(outer, extent, inner)``), the weight and bias, the output."""
        p = problem
        shape = (p.outer, p.extent, p.inner)
        out_shape = shape if p.elementwise else (p.outer, p.inner)
        return [view(inputs[0], shape), *inputs[1:], view(outputs[0], out_shape)]


def _overlap(a: float, b: float) -> float:
    """Memory and compute overlap, imperfectly: the larger plus a quarter of the smaller."""
    return max(a, b) + 0.25 * min(a, b)


REDUCE = RowTemplate("reduce", REDUCTIONS)
SOFTMAX_TEMPLATE = RowTemplate("softmax", SOFTMAX)
LAYER_NORM = RowTemplate("layer_norm", ("layer_norm",))
RMS_NORM = RowTemplate("rms_norm", ("rms_norm",))
TEMPLATES = (REDUCE, SOFTMAX_TEMPLATE, LAYER_NORM, RMS_NORM)


def template_for(op: str) -> RowTemplate:
    for t in TEMPLATES:
        if op in t.ops:
            return t
    raise ValueError(f"no reduction template for {op!r}")


__all__ = ["LAYER_NORM", "accumulate_type", "REDUCE", "REDUCTIONS", "RMS_NORM", "RowProblem", "RowTemplate", "SOFTMAX",
           "SOFTMAX_TEMPLATE", "TEMPLATES", "program", "template_for", "view"]
