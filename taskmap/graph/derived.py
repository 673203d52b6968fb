"""Arrays derived from graph constants — weights folded with a batch norm, packed into a
template's panels, aligned, moved to a device — shared by every compiled graph that derives the
same thing from the same values.

A model compiled for several input shapes (``taskmap.compile`` once per shape, dynamo's
recompiles, a decode loop whose key / value cache grows by a position per step) gets one
compiled graph per shape, and each derived its constants again: every graph held its own copy of
every packed weight (GPT-2's greedy decoding under ``torch.compile(backend="taskmap")`` grew the
process by ~475 MB per generated token).

:func:`derived` finds an entry by where its sources' data live (address, shape, strides, dtype)
and what is derived from them (a hashable description), and uses it only when the sources still
hold the values it was derived from (a CRC-32 of their bytes, taken when the entry was made): a
buffer written in place between two compiles (an optimizer step, ``load_state_dict``) derives
anew.  A source that is itself a value :func:`derived` made (or a view of one: weights folded
with a batch norm, then packed) is not checksummed: nothing writes into those, and they stay at
their address while they live (half of the checksummed bytes of a ResNet-50 compile, ~0.05 s).
Entries are shared only inside :func:`shared_by` (a compiled graph being built): each entry
counts the graphs that use it and goes with the last of them.  Elsewhere, and for sources under
:data:`MIN_BYTES` (cheaper to derive than to checksum), :func:`derived` just derives.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
import zlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Smaller sources are not worth an entry.
MIN_BYTES = 64 * 1024


@dataclass(eq=False)
class _Entry:
    crc: int
    value: Any
    users: int = 0


_LOCK = threading.Lock()
_ENTRIES: dict[tuple[Any, ...], _Entry] = {}
#: The arrays :func:`derived` made that are alive, by ``id``: never written in place.
_MADE: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
#: The entries the compiled graph being built uses (None: outside :func:`shared_by`).
_USED: contextvars.ContextVar[set[tuple[tuple[Any, ...], _Entry]] | None] = contextvars.ContextVar(
    "taskmap_derived_used", default=None)


def _where(a: np.ndarray) -> tuple[Any, ...]:
    return (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)


def _made(a: Any) -> bool:
    """Whether ``a`` is (a view of) an array :func:`derived` made."""
    while isinstance(a, np.ndarray):
        if _MADE.get(id(a)) is a:
            return True
        a = a.base
    return False


def _crc(arrays: Sequence[np.ndarray]) -> int:
    crc = 0
    for a in arrays:
        if not _made(a):
            crc = zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8), crc)   # bfloat16 too (no buffer format)
    return crc


def derived(sources: Sequence[Any], what: Hashable, make: Callable[[], Any]) -> Any:
    """``make()`` — what ``what`` derives from ``sources`` (numpy arrays; other values are part
    of the description) — or, inside :func:`shared_by`, the value made before from the same
    sources' values."""
    used = _USED.get()
    arrays = [s for s in sources if isinstance(s, np.ndarray)]
    if used is None or not arrays or sum(a.nbytes for a in arrays) < MIN_BYTES:
        return make()
    key = (tuple(_where(a) if isinstance(a, np.ndarray) else ("value", a) for a in sources), what)
    try:
        hash(key)
    except TypeError:                   # a description that cannot be a key: not shared
        return make()
    crc = _crc(arrays)
    with _LOCK:
        entry = _ENTRIES.get(key)
    if entry is None or entry.crc != crc:
        entry = _Entry(crc, make())
        if isinstance(entry.value, np.ndarray):
            _MADE[id(entry.value)] = entry.value
        with _LOCK:
            _ENTRIES[key] = entry
    used.add((key, entry))
    return entry.value


def _release(used: frozenset[tuple[tuple[Any, ...], _Entry]], owned: bool) -> None:
    with _LOCK:
        for key, entry in used:
            entry.users -= owned
            if entry.users <= 0 and _ENTRIES.get(key) is entry:
                del _ENTRIES[key]


@contextlib.contextmanager
def shared_by(owner: Any) -> Iterator[None]:
    """Share derived values with the other compiled graphs while ``owner`` is built; they stay
    shared until ``owner`` is collected (or at once, when building it fails)."""
    used: set[tuple[tuple[Any, ...], _Entry]] = set()
    token = _USED.set(used)
    try:
        yield
    except BaseException:
        _release(frozenset(used), False)
        raise
    finally:
        _USED.reset(token)
    with _LOCK:
        for _, entry in used:
            entry.users += 1
    weakref.finalize(owner, _release, frozenset(used), True)


def entries() -> int:
    """Values held for sharing (for tests)."""
    with _LOCK:
        return len(_ENTRIES)


__all__ = ["MIN_BYTES", "derived", "entries", "shared_by"]
