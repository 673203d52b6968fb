"""Where an f32 convolution runs on the CPU, as one tuning space: the direct template's points
(pixel tiles, channel tiles, Winograd) and the implicit GEMM's (the matmul template's points
with the img2col prologue spliced into their B packing).

The cost model ranks both kinds on one scale (:func:`taskmap.templates.conv_cpu.direct_cost`,
:func:`~taskmap.templates.conv_cpu.gemm_cost`), so ``mode="model"`` answers what
:func:`taskmap.templates.conv_cpu.select` does.  Under ``TASKMAP_TUNE=topk`` / ``exhaustive``
the routing itself is measured — the direct kernels against the implicit GEMMs, built as they
run — and cached with the other tuning records: a machine the cost model was not fitted on gets
its convolutions where they run fastest there.  :func:`route` is what :mod:`taskmap.ops.conv`
and the graph compiler (:mod:`taskmap.graph.lower_anchor`) ask.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.base import Target, TargetKind, host_cpu_target
from ..fusion import fuse
from ..runtime.kernel import Kernel
from ..schedule import tune
from ..templates.base import Schedule
from ..templates.conv_cpu import CONV_CPU, direct_cost, gemm_cost, gemm_space
from ..templates.conv_problem import ConvProblem
from ..templates.matmul_cpu import MATMUL_CPU, NO_INDEX
from ..templates.matmul_problem import WORKSPACE
from .conv_defs import gemm_prologues, gemm_views

#: The tag of the implicit GEMM's points (the direct template's have no ``vec`` or another one).
GEMM = "gemm"
_ZERO = np.zeros(1, np.float32)      # the matmul template's own bias, unused


def gemm_schedule(schedule: Schedule) -> Schedule | None:
    """The matmul schedule of an implicit-GEMM point; None for a direct one."""
    if schedule.get("vec") != GEMM:
        return None
    return Schedule(tuple(kv for kv in schedule.params if kv[0] != "vec"))


def gemm_kernel(p: ConvProblem, target: Target, schedule: Schedule, epilogues: dict[str, Any] | None = None) -> Kernel:
    """The implicit GEMM of ``p`` on the CPU matmul template with the matmul ``schedule``: its
    prologues spliced into the operand packing, ``epilogues`` into the stores of C."""
    mp = p.matmul()
    sizes = {"batch": mp.batch, "m": mp.m, "n": mp.n, "k": mp.k}
    return fuse(MATMUL_CPU.instantiate(mp, target, schedule), gemm_prologues(p, True), epilogues or {}, sizes)


@functools.lru_cache(maxsize=64)
def _gemm_alone(p: ConvProblem, target: Target, schedule: Schedule) -> Kernel:
    """The implicit GEMM without an epilogue (what the tuner builds, and reads the parameters
    of to lay out the arguments), fused once per point."""
    return gemm_kernel(p, target, schedule)


class ConvRouteCpuTemplate:
    """The direct convolution template and the implicit GEMM as one space (CPU, f32)."""

    name = "conv_route_cpu"

    @property
    def version(self) -> str:
        return f"{CONV_CPU.version}.{MATMUL_CPU.version}"

    def applies(self, problem: Any, target: Target) -> bool:
        return (isinstance(problem, ConvProblem) and target.kind is TargetKind.CPU and problem.dtype == "float32"
                and MATMUL_CPU.applies(problem.matmul(), target))

    def space(self, problem: ConvProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        return list(CONV_CPU.space(problem, target)) + \
            [Schedule.of(vec=GEMM, **s.as_dict()) for s in gemm_space(problem, target)]

    def cost(self, problem: ConvProblem, target: Target, schedule: Schedule) -> float:
        gemm = gemm_schedule(schedule)
        return direct_cost(problem, target, schedule) if gemm is None else gemm_cost(problem, target, gemm)

    def instantiate(self, problem: ConvProblem, target: Target, schedule: Schedule) -> Kernel:
        gemm = gemm_schedule(schedule)
        return CONV_CPU.instantiate(problem, target, schedule) if gemm is None else _gemm_alone(problem, target, gemm)

    def arguments(self, problem: ConvProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None, target: Target | None = None) -> list[Any]:
        """The direct template's arguments, or the implicit GEMM's: the views of x, the weights
        and the output its parameters name, C again as the partial sums, and its workspaces —
        constant weights packed beforehand, as a compiled graph passes them."""
        target = target or host_cpu_target()
        gemm = None if schedule is None else gemm_schedule(schedule)
        if gemm is None:
            return CONV_CPU.arguments(problem, inputs, outputs, schedule, target)
        p, mp = problem, problem.matmul()
        names = [q.name for q in self.instantiate(p, target, schedule).func.params]
        avail = gemm_views(p, names, inputs[0], inputs[1], outputs[0])
        wa, wb = MATMUL_CPU.workspace_sizes(mp, gemm, target)
        packed_a, _ = MATMUL_CPU.pack_constants(mp, gemm, inputs[1], None, target) if mp.const_a else (None, None)
        avail.update(cw=avail["c"], bias=_ZERO, bidx=NO_INDEX, wb=WORKSPACE.get("cpu_b", wb),
                     wa=WORKSPACE.get("cpu_a", wa) if packed_a is None else packed_a)
        return [avail[name] for name in names]


CONV_ROUTE_CPU = ConvRouteCpuTemplate()


def route(p: ConvProblem, target: Target) -> tuple[Schedule | None, Schedule | None]:
    """Where ``p`` runs on the CPU: ``(direct schedule, None)`` or ``(None, matmul schedule of the
    implicit GEMM)`` — the cost model's choice, or a measured one (``TASKMAP_TUNE``, or one the
    tuning cache holds)."""
    choice = tune.choose(CONV_ROUTE_CPU, p, target)
    gemm = gemm_schedule(choice)
    return (choice, None) if gemm is None else (None, gemm)


__all__ = ["CONV_ROUTE_CPU", "ConvRouteCpuTemplate", "GEMM", "gemm_kernel", "gemm_schedule", "route"]
