"""The tuning cache: measured schedule choices on disk, in the ``"tuning"`` namespace of the
compile cache (``taskmap cache`` lists it; ``taskmap cache --clear --namespace tuning`` forgets).

One JSON file per (template, problem, target, taskmap version, mode), keyed by
:func:`tuning_key` (``runtime.cache.cache_key`` mixes in the taskmap version; a template's
optional ``version`` attribute is mixed in too, so a template whose kernels change invalidates
its own entries).  Entries are written atomically, so concurrent tuners never see half a file.

Only *measured* choices are stored (modes ``"topk"`` and ``"exhaustive"``): the model's choice is
recomputed in microseconds.  Each entry keeps every measured time, so reports (model vs
exhaustive) are answered from the cache.  A stored schedule that is no longer in the template's
space (its space changed without a version bump) is ignored.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..backends.base import Target
from ..runtime.cache import DiskCache, cache_key
from ..templates.base import Schedule
from ..version import __version__

NAMESPACE = "tuning"
SUFFIX = ".json"
#: Bumped when records change meaning (2: samples time prepared launches, without the per-call
#: argument checks that weighed on small kernels; 3: CPU candidates run on cache-line aligned
#: arrays and packed constants, as in a compiled graph — numpy's were 16 bytes off most times;
#: 4: GPU samples are device time, a CUDA graph of back-to-back launches, as a compiled graph
#: replays them — a host-timed loop measured the launches of kernels shorter than ~30 us).
FORMAT = 4

_log = logging.getLogger("taskmap.tune")
_cache = DiskCache(NAMESPACE)


def tuning_key(template: Any, problem: Any, target: Target, mode: str) -> str:
    """The cache key of ``template``'s measured choice for ``problem`` on ``target`` in ``mode``."""
    return cache_key("tuning", FORMAT, template.name, getattr(template, "version", None), problem, target, mode)


def schedule_to_json(schedule: Schedule) -> list:
    return [[k, _jsonable(v)] for k, v in schedule.params]


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def find_schedule(data: Any, space: Sequence[Schedule]) -> Schedule | None:
    """The point of ``space`` whose JSON form is ``data`` (None: no longer in the space)."""
    for s in space:
        if schedule_to_json(s) == data:
            return s
    return None


@dataclass
class TuningRecord:
    """A measured choice: the best schedule, and every candidate's median time (seconds; failed
    candidates are absent from ``times`` and listed in ``failures`` with the reason)."""

    template: str
    problem: str
    target: str
    mode: str
    k: int
    best: Schedule
    times: dict[Schedule, float]
    failures: dict[Schedule, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    device: str = ""                  # what the choice transfers across (``shipped.device_key``)
    template_version: Any = None

    def to_json(self) -> dict:
        return {"format": FORMAT, "taskmap_version": __version__, "template": self.template,
                "template_version": self.template_version, "device": self.device,
                "problem": self.problem, "target": self.target, "mode": self.mode, "k": self.k,
                "created": self.created, "best": schedule_to_json(self.best),
                "times": [[schedule_to_json(s), t] for s, t in self.times.items()],
                "failures": [[schedule_to_json(s), why] for s, why in self.failures.items()]}

    @staticmethod
    def from_json(data: dict, space: Sequence[Schedule]) -> "TuningRecord | None":
        """The record ``data`` describes, matched against the template's current ``space``
        (None when the format differs or its best schedule left the space)."""
        if data.get("format") != FORMAT:
            return None
        best = find_schedule(data["best"], space)
        if best is None:
            return None
        times = {s: float(t) for d, t in data.get("times", []) if (s := find_schedule(d, space)) is not None}
        failures = {s: str(w) for d, w in data.get("failures", []) if (s := find_schedule(d, space)) is not None}
        return TuningRecord(data["template"], data["problem"], data["target"], data["mode"], int(data["k"]),
                            best, times, failures, float(data.get("created", 0.0)), data.get("device", ""),
                            data.get("template_version"))


def load(template: Any, problem: Any, target: Target, mode: str,
         space: Sequence[Schedule] | Callable[[], Sequence[Schedule]]) -> TuningRecord | None:
    """The cached record, or None (absent, unreadable, or stale).  ``space`` (or a function
    returning it, called only when an entry exists) is the template's current space."""
    path = _cache.get(tuning_key(template, problem, target, mode), SUFFIX)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
        record = TuningRecord.from_json(data, space() if callable(space) else space)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("ignoring unreadable tuning cache entry %s: %s", path, exc)
        return None
    if record is None:
        _log.info("ignoring stale tuning cache entry %s (schedule not in %s's space)", path, template.name)
    return record


def store(template: Any, problem: Any, target: Target, record: TuningRecord) -> None:
    """Write ``record`` atomically (replacing an older entry)."""
    key = tuning_key(template, problem, target, record.mode)
    _cache.put_bytes(key, SUFFIX, json.dumps(record.to_json(), indent=1).encode())
