"""Choosing a template's schedule for a problem on a target.

``choose(template, problem, target, mode)``: ``"model"`` takes the cost model's best point with no
measurement (the fast default).  (Measured modes — the model's top k, or the whole space — and
the tuning cache are added by the tuner.)
"""
from __future__ import annotations

from typing import Any

from ..backends.base import Target
from ..errors import TaskmapError
from ..templates.base import Schedule, Template


def choose(template: Template, problem: Any, target: Target, mode: str = "model", k: int = 8) -> Schedule:
    space = list(template.space(problem, target))
    if not space:
        raise TaskmapError(f"template {template.name} has no feasible schedule for {problem} on {target.name}")
    if mode != "model":
        raise TaskmapError(f"tuning mode {mode!r} is not available yet (use 'model')")
    return min(space, key=lambda s: template.cost(problem, target, s))
