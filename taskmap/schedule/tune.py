"""Choosing a template's schedule for a problem on a target.

``choose(template, problem, target, mode=None, k=8, progress=True) -> Schedule``

``"model"``       the cost model's best point, no measurement (the fast default) — unless the
                  tuning cache holds a *measured* choice for the same (template, problem,
                  target): then that one (an exhaustive one first, else a top-k one); else a
                  choice measured on the same kind of device and shipped with taskmap
                  (:mod:`.shipped`).  A measurement is better evidence than the model, so once a
                  problem has been tuned (say with ``TASKMAP_TUNE=exhaustive`` once), every later
                  default call gets the tuned schedule for free.  The model's choice itself is not
                  written to disk (it is recomputed).  Model-mode answers are memoized per process (cleared
                  when this process tunes, or by ``clear_memo``): a long-running process picks up
                  choices another process measures meanwhile only after ``clear_memo()``.
``"topk"``        measure the model's ``k`` best points, take the fastest (cached; an
                  exhaustive entry, or a top-k entry with at least ``k`` points, answers it).
``"exhaustive"``  measure every point (hardware-centric spaces are small: a matmul's is ≲ 200).

``mode=None`` reads ``$TASKMAP_TUNE`` (``model`` | ``topk`` | ``exhaustive``; default
``model``): operators that call ``choose`` without a mode are tuned by setting it.  Measuring
(``taskmap.schedule.measure``) builds candidates in parallel processes and times each in an
isolated one; candidates that crash, hang or fail are dropped.  A progress bar (tqdm, on a
terminal only) shows the best time so far.

``tune`` is ``choose`` with everything it learnt (model costs, measured times);
``compare_model_vs_exhaustive`` reports how close the model's choice comes to the best measured.
"""
from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from tqdm import tqdm

from ..backends.base import Target
from ..errors import TaskmapError
from ..templates.base import Schedule, Template
from . import shipped, tuning_cache
from .measure import Measurement, MeasureSettings, measure_candidates
from .tuning_cache import TuningRecord

MODES = ("model", "topk", "exhaustive")
ENV_MODE = "TASKMAP_TUNE"
#: Which cached measured choices answer a request in each mode, best evidence first.
_ANSWERED_BY = {"model": ("exhaustive", "topk"), "topk": ("exhaustive", "topk"), "exhaustive": ("exhaustive",)}

_log = logging.getLogger("taskmap.tune")
_model_memo: dict[Any, Schedule] = {}
_MEMO_LIMIT = 4096


def default_mode() -> str:
    """``$TASKMAP_TUNE`` if set, else ``"model"``."""
    mode = os.environ.get(ENV_MODE, "").strip().lower() or "model"
    if mode not in MODES:
        raise TaskmapError(f"{ENV_MODE}={os.environ[ENV_MODE]!r} is not a tuning mode: use one of {', '.join(MODES)}")
    return mode


def _resolve_mode(mode: str | None, k: int) -> str:
    if mode is None:
        mode = default_mode()
    if mode not in MODES:
        raise TaskmapError(f"unknown tuning mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "topk" and k < 1:
        raise TaskmapError(f"mode='topk' needs k >= 1, not {k}")
    return mode


def _space(template: Template, problem: Any, target: Target) -> list[Schedule]:
    space = list(template.space(problem, target))
    if not space:
        raise TaskmapError(f"template {template.name} has no feasible schedule for {problem} on {target.name}")
    return space


def model_costs(template: Template, problem: Any, target: Target, space: Sequence[Schedule]) -> dict[Schedule, float]:
    """The cost model's estimate of every point (NaN counts as infinitely slow)."""
    costs = {}
    for s in space:
        c = float(template.cost(problem, target, s))
        costs[s] = math.inf if math.isnan(c) else c
    return costs


def ranked(costs: dict[Schedule, float]) -> list[Schedule]:
    """Points from the cheapest estimate up (ties keep the space's order)."""
    return sorted(costs, key=costs.__getitem__)


def _memo_key(template: Template, problem: Any, target: Target) -> Any:
    key = (type(template).__module__, type(template).__qualname__, template.name,
           getattr(template, "version", None), problem, target)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _cached(template: Template, problem: Any, target: Target, mode: str, k: int,
            space: Callable[[], Sequence[Schedule]]) -> TuningRecord | None:
    for stored in _ANSWERED_BY[mode]:
        record = tuning_cache.load(template, problem, target, stored, space)
        if record is not None and (stored != "topk" or mode != "topk" or record.k >= k):
            return record
    return None


@dataclass
class TuneResult:
    """What ``tune`` found: the choice, where it came from, the model's estimates, and the
    measured times (``record``; None for a model-only choice)."""

    schedule: Schedule
    mode: str                       # the mode that made the choice ("model", "topk", "exhaustive")
    from_cache: bool
    costs: dict[Schedule, float]
    record: TuningRecord | None = None

    @property
    def model_choice(self) -> Schedule:
        return ranked(self.costs)[0]


def choose(template: Template, problem: Any, target: Target, mode: str | None = None, k: int = 8,
           progress: bool = True, settings: MeasureSettings | None = None) -> Schedule:
    """The schedule to use for ``problem`` on ``target`` (see the module docstring)."""
    mode = _resolve_mode(mode, k)
    if mode != "model":
        return tune(template, problem, target, mode, k, progress, settings).schedule
    key = _memo_key(template, problem, target)
    if key is not None and key in _model_memo:
        return _model_memo[key]
    space: list[Schedule] = []

    def get_space() -> list[Schedule]:
        if not space:
            space.extend(_space(template, problem, target))
        return space

    record = _cached(template, problem, target, "model", k, get_space)
    best = record.best if record is not None else shipped.best(template, problem, target, get_space)
    if best is None:
        best = ranked(model_costs(template, problem, target, get_space()))[0]
    if key is not None:
        if len(_model_memo) >= _MEMO_LIMIT:
            _model_memo.clear()
        _model_memo[key] = best
    return best


def tune(template: Template, problem: Any, target: Target, mode: str | None = None, k: int = 8,
         progress: bool = True, settings: MeasureSettings | None = None, use_cache: bool = True) -> TuneResult:
    """``choose`` with its evidence.  ``use_cache=False`` neither reads nor writes the cache."""
    mode = _resolve_mode(mode, k)
    space = _space(template, problem, target)
    costs = model_costs(template, problem, target, space)
    if use_cache:
        record = _cached(template, problem, target, mode, k, lambda: space)
        if record is not None:
            return TuneResult(record.best, record.mode, True, costs, record)
    order = ranked(costs)
    if mode == "model":
        return TuneResult(order[0], "model", False, costs)
    candidates = order if mode == "exhaustive" else order[:k]
    measured = _measure_with_progress(template, problem, target, candidates, settings, progress)
    ok = [m for m in measured if m.ok]
    if not ok:
        reasons = "\n".join(f"  {m.schedule}: {m.error}" for m in measured)
        raise TaskmapError(f"tuning {template.name} for {problem} on {target.name}: no candidate could be "
                           f"measured:\n{reasons}")
    best = min(ok, key=lambda m: m.time)
    record = TuningRecord(template=template.name, problem=repr(problem), target=target.name, mode=mode,
                          k=k if mode == "topk" else len(candidates), best=best.schedule,
                          times={m.schedule: m.time for m in ok},
                          failures={m.schedule: m.error or "" for m in measured if not m.ok},
                          device=shipped.device_key(target), template_version=getattr(template, "version", None))
    if use_cache:
        tuning_cache.store(template, problem, target, record)
        _model_memo.clear()         # model-mode answers may now be this measured choice
    _log.info("tuned %s for %s on %s (%s): %s, %.1f us", template.name, problem, target.name, mode,
              best.schedule, best.time * 1e6)
    return TuneResult(best.schedule, mode, False, costs, record)


def _measure_with_progress(template: Template, problem: Any, target: Target, candidates: list[Schedule],
                           settings: MeasureSettings | None, progress: bool) -> list[Measurement]:
    bar = tqdm(total=len(candidates), desc=f"building {template.name}", unit="schedule", leave=False,
               disable=not (progress and sys.stderr.isatty()))
    best: list[Measurement] = []
    building = [True]

    def on_built(schedule: Schedule, error: str | None) -> None:
        bar.update()

    def on_result(m: Measurement) -> None:
        if building[0]:
            building[0] = False
            bar.reset(total=len(candidates) * max((settings or MeasureSettings()).rounds, 1))
            bar.set_description(f"measuring {template.name}")
        if m.ok and (not best or m.time < best[0].time):
            best[:] = [m]
            bar.set_postfix_str(f"best {m.time * 1e6:.1f} us ({m.schedule})")
        if not m.ok:
            _log.warning("dropped %s of %s: %s", m.schedule, template.name, m.error)
        bar.update()

    try:
        return measure_candidates(template, problem, target, candidates, settings, on_result=on_result,
                                  on_built=on_built)
    finally:
        bar.close()


class ModelVsExhaustive(NamedTuple):
    """Measured time of the model's choice, the best measured time, and their ratio (>= 1;
    1.0 means the model picked the fastest point; inf when the model's choice failed).

    ``side_by_side``: when the two differ and a confirmation was asked for, the ratio of the
    two measured again against each other in alternating rounds (None otherwise).  The best of
    many noisy measurements is biased low (the points whose noise happened to be favourable
    win), so the exhaustive ratio overstates the model's loss where the points are close; the
    pair measured side by side does not carry that selection bias."""

    model_time: float
    best_time: float
    ratio: float
    model_choice: Schedule | None = None
    best_choice: Schedule | None = None
    side_by_side: float | None = None


#: How ``compare_model_vs_exhaustive`` re-measures the model's choice against the best: many
#: alternating rounds, so that both see the same load.
CONFIRM_SETTINGS = MeasureSettings(repeat=40, rounds=8)


def compare_model_vs_exhaustive(template: Template, problem: Any, target: Target, progress: bool = False,
                                settings: MeasureSettings | None = None,
                                confirm: MeasureSettings | None = None) -> ModelVsExhaustive:
    """How close model-only gets to exhaustive tuning (measures the whole space unless the
    tuning cache already holds an exhaustive record).  With ``confirm`` (e.g.
    :data:`CONFIRM_SETTINGS`), a model's choice that is not the best is measured again side by
    side with the best (see :class:`ModelVsExhaustive`)."""
    result = tune(template, problem, target, "exhaustive", progress=progress, settings=settings)
    assert result.record is not None
    model, best = result.model_choice, result.record.best
    model_time = result.record.times.get(model, math.inf)
    best_time = result.record.times[best]
    side = None
    if confirm is not None and model != best and math.isfinite(model_time):
        pair = measure_candidates(template, problem, target, [model, best], confirm)
        if all(m.ok for m in pair):
            side = pair[0].time / pair[1].time
    return ModelVsExhaustive(model_time, best_time, model_time / best_time, model, best, side)


def clear_memo() -> None:
    """Forget the model choices memoized in this process."""
    _model_memo.clear()


__all__ = ["MODES", "ENV_MODE", "MeasureSettings", "ModelVsExhaustive", "TuneResult", "choose", "clear_memo",
           "compare_model_vs_exhaustive", "default_mode", "model_costs", "ranked", "tune"]
