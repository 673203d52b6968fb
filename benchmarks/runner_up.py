"""Hooks for ``ab_steps.py`` that survey the cost model's choices in a model's flow: graph B runs
every layer a template places on its runner-up kind of kernel (``hooks/runner_up_*.py``).

    python benchmarks/ab_steps.py resnext50 --batch 8 --hook benchmarks/hooks/runner_up_conv.py

:func:`runner_up` wraps a template's ``cost`` so that, for every problem whose space holds more
than one kind of point, the points of the kind the unwrapped cost model ranks first cost one second
more: the best point of another kind wins.  A step whose B time is below its A time ran faster
on the runner-up, where it counts — after the kernels before it, with their data in the caches as
the flow leaves it — which isolated timings (the tuner's) do not show.  Session 46 of
``benchmarks/RESULTS.md`` is such a survey.
"""
from __future__ import annotations

from typing import Any, Callable

PENALTY = 1.0      # seconds: more than any layer's cost


def runner_up(template: type, kind: Callable[[Any], Any], applies: Callable[[Any], bool] = lambda p: True) -> None:
    """Make ``template``'s cost model pick, for the problems ``applies`` accepts, the best point of
    a kind (``kind(schedule)``) other than the one it picks unwrapped (``ab_steps.py`` clears the
    memos of earlier choices before compiling B)."""
    cost = template.cost
    chosen: dict[Any, Any] = {}

    def penalized(self: Any, problem: Any, target: Any, schedule: Any) -> float:
        c = cost(self, problem, target, schedule)
        if not applies(problem):
            return c
        if problem not in chosen:
            space = self.space(problem, target)
            kinds = {kind(s) for s in space}
            chosen[problem] = kind(min(space, key=lambda s: cost(self, problem, target, s))) if len(kinds) > 1 else None
        return c + (PENALTY if chosen[problem] is not None and kind(schedule) == chosen[problem] else 0.0)

    template.cost = penalized
