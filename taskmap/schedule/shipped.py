"""Measured schedule choices shipped with taskmap: ``taskmap/schedule/records/<device>.json``.

Tuning (``TASKMAP_TUNE=topk|exhaustive``) stores its measured choices in the local tuning cache
(:mod:`.tuning_cache`).  ``taskmap records export DIR`` gathers them into one file per *device*
— the target's name and its number of cores / multiprocessors, e.g. ``cuda:sm_90a`` with 132 SMs
(an H100 SXM or an H200) — and a file committed under ``taskmap/schedule/records/`` answers
model-mode choices on every machine of that device when the local cache has no measured choice
of its own: a GPU tuned once, on a lent machine, makes later compiles on that kind of GPU pick
measured schedules instead of the cost model's.

A shipped choice is used only while it still means the same kernel: the template's name and
``version`` and the problem's ``repr`` must match, and the schedule must still be in the
template's space (the local cache's rules).  Order of evidence in model mode: the local cache's
measured choice, then the shipped one, then the cost model.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..backends.base import Target
from ..templates.base import Schedule
from .tuning_cache import FORMAT, NAMESPACE, find_schedule, schedule_to_json

RECORDS_DIR = Path(__file__).resolve().parent / "records"
#: Which measured modes a shipped file keeps, best evidence first.
MODES = ("exhaustive", "topk")

_log = logging.getLogger("taskmap.tune")
_lock = threading.Lock()
_loaded: dict[tuple[Path, str], dict[tuple[str, Any, str], dict]] = {}


def device_key(target: Target) -> str:
    """``"cuda:sm_90a/132"``: what a measured choice transfers across (name and core count)."""
    return f"{target.name}/{target.num_cores}"


def file_name(device: str) -> str:
    """``cuda:sm_90a/132`` -> ``cuda_sm_90a_132.json``."""
    return device.replace(":", "_").replace("/", "_") + ".json"


def _key(record: dict) -> tuple[str, Any, str]:
    """What a record answers: (template name, template version, problem repr)."""
    return record["template"], record.get("template_version"), record["problem"]


def _read(path: Path, device: str) -> dict[tuple[str, Any, str], dict]:
    """The records of ``device`` in ``path`` by :func:`_key` (none: no file, another format or
    device)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT or data.get("device") != device:
        return {}
    return {_key(r): r for r in data["records"]}


def _entries(device: str, directory: Path) -> dict[tuple[str, Any, str], dict]:
    with _lock:
        hit = _loaded.get((directory, device))
        if hit is not None:
            return hit
        path = directory / file_name(device)
        try:
            table = _read(path, device)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning("ignoring unreadable shipped tuning records %s: %s", path, exc)
            table = {}
        _loaded[(directory, device)] = table
        return table


def best(template: Any, problem: Any, target: Target, space: Sequence[Schedule] | Callable[[], Sequence[Schedule]],
         directory: Path | None = None) -> Schedule | None:
    """The shipped measured choice of ``template`` for ``problem`` on ``target``'s device (from
    ``directory``, default :data:`RECORDS_DIR`), or None (none shipped, or its schedule left the
    template's space)."""
    r = _entries(device_key(target), directory or RECORDS_DIR).get((template.name, getattr(template, "version", None),
                                                      repr(problem)))
    if r is None:
        return None
    return find_schedule(r["best"], space() if callable(space) else space)


def clear() -> None:
    """Forget the files read (after writing new ones)."""
    with _lock:
        _loaded.clear()


# ----------------------------------------------------------------------------- export


def _cached_records(root: Path) -> Iterable[dict]:
    for path in sorted(root.glob("*/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("format") == FORMAT and data.get("device") and data.get("mode") in MODES:
            yield data


def export(directory: Path, root: Path | None = None, device: str | None = None) -> dict[str, int]:
    """Merge the local tuning cache's measured choices (of ``device`` only, when given) into
    ``directory/<device>.json``, one file per device; returns the records written per file.  A
    record replaces a shipped one for the same (template, version, problem) unless that one is
    exhaustive and the new one is not."""
    from ..runtime.cache import DiskCache     # noqa: PLC0415 - the cache's root is looked up per call

    root = root or DiskCache(NAMESPACE).root
    by_device: dict[str, list[dict]] = {}
    for r in _cached_records(root):
        if device is None or r["device"] == device:
            by_device.setdefault(r["device"], []).append(r)
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for dev, records in sorted(by_device.items()):
        path = directory / file_name(dev)
        table = _read(path, dev)
        for r in records:
            old = table.get(_key(r))
            if old is None or MODES.index(r["mode"]) <= MODES.index(old["mode"]):
                table[_key(r)] = {k: r[k] for k in ("template", "template_version", "problem", "target", "mode", "k",
                                                 "best", "times", "created") if k in r}
        out = {"format": FORMAT, "device": dev, "exported": time.time(),
               "records": sorted(table.values(), key=lambda r: (r["template"], r["problem"]))}
        path.write_text(json.dumps(out, indent=1) + "\n")
        written[str(path)] = len(table)
    clear()
    return written


__all__ = ["RECORDS_DIR", "best", "clear", "device_key", "export", "file_name", "schedule_to_json"]
