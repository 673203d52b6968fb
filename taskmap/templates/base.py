"""What a template is: a hand-scheduled kernel family with a hardware-centric tuning space.

A template declares its space in hardware terms (warps, lanes, register tiles, shared-memory
stages — never the input size), prunes infeasible points with checks against the ``Target``,
estimates each point's cost analytically (Roller-style: memory traffic, footprint, alignment,
occupancy), and instantiates a point as a ``taskmap.Kernel`` that is correct for any input size
(predicated accesses).  The tuner (``taskmap.schedule.tune``) picks a point: by the cost model
alone, by measuring the model's top k, or exhaustively; results are cached.

Measuring runs a template in worker processes, so a template and its problems must pickle
(instances of module-level classes).  Its ``name`` (and optional ``version``) key the tuning
cache: give differently configured instances different names, and bump ``version`` when the
kernels change.  ``taskmap.schedule.cost_model`` helps write ``cost``.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..backends.base import Target
from ..runtime.kernel import Kernel


@dataclass(frozen=True)
class Schedule:
    """One point of a tuning space: named parameters (hashable, printable, cache-key material)."""

    params: tuple[tuple[str, Any], ...]

    @staticmethod
    def of(**params: Any) -> "Schedule":
        return Schedule(tuple(sorted(params.items())))

    def __getitem__(self, name: str) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params)


class ExampleArgs(NamedTuple):
    """Arrays to measure a kernel with: the operator's inputs (random, non-zero) and outputs."""

    inputs: Sequence[Any]
    outputs: Sequence[Any]


class Template(Protocol):
    """A template for one operator family.  ``problem`` is the operator instance: a frozen,
    hashable dataclass of shapes and dtypes (e.g. ``MatmulProblem``)."""

    name: str

    def applies(self, problem: Any, target: Target) -> bool:
        """Whether this template handles ``problem`` on ``target`` at all."""

    def space(self, problem: Any, target: Target) -> Sequence[Schedule]:
        """The feasible points (checks already applied), in a stable order."""

    def cost(self, problem: Any, target: Target, schedule: Schedule) -> float:
        """Estimated run time in seconds (only the ranking matters)."""

    def instantiate(self, problem: Any, target: Target, schedule: Schedule) -> Kernel:
        """The kernel for ``schedule``; its arguments are the operator's inputs then outputs."""

    def arguments(self, problem: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> Sequence[Any]:
        """The kernel's launch arguments (inputs, outputs, workspace) in order."""

    # Optional members (the tuner uses them when present):
    #
    # version: int | str
    #     Mixed into the tuning-cache key; bump it when the template's kernels change.
    #
    # def example_inputs(self, problem, target) -> ExampleArgs:
    #     Inputs and outputs on ``target``'s device to measure with.  Default
    #     (``taskmap.schedule.measure.default_example_inputs``): from ``problem.input_specs()`` and
    #     ``problem.output_specs()`` (specs with ``.shape`` and ``.dtype``, or (shape, dtype)
    #     pairs), inputs random in +-[0.5, 1.5), outputs zeros.


class KernelFamily:
    """Base of templates that build one kernel per configuration and keep it: ``kernel(cfg,
    build)`` builds once per ``cfg`` (thread-safe).  Pickles empty — tuning workers rebuild the
    kernels they measure."""

    def __init__(self) -> None:
        self._kernels: dict[Hashable, Kernel] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop the kernels built so far (a template patched at run time builds them again)."""
        with self._lock:
            self._kernels.clear()

    def kernel(self, cfg: Hashable, build: Callable[[], Kernel]) -> Kernel:
        with self._lock:
            kernel = self._kernels.get(cfg)
            if kernel is None:
                kernel = self._kernels[cfg] = build()
            return kernel

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


def schedule_table(space: Sequence[Schedule], costs: Mapping[Schedule, float]) -> str:
    """A small text table of schedules and their estimated costs (for progress and debugging)."""
    rows = sorted(space, key=lambda s: costs.get(s, float("inf")))
    return "\n".join(f"{costs.get(s, float('nan')) * 1e6:10.1f} us  {s}" for s in rows)
