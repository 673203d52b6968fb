"""An on-disk cache of the kernels the graph lowering makes (fused template kernels,
rule-based kernels of composed injective ops), so that compiling a model again — in a new
process — skips instantiating templates, splicing prologues / epilogues and the lowering
passes: the lowered IR module is stored (pickled) under a key of everything it depends on,
and its binary comes from the backend's own cache.

The key holds the caller's description of the kernel (template, configuration, the fusion's
definitions as text, sizes, target) and a fingerprint of taskmap's own source files, so an
edited compiler never reads a stale module.  ``TASKMAP_GRAPH_CACHE=0`` turns the cache off.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path

from ..runtime.cache import DiskCache, cache_key
from ..runtime.kernel import Kernel

_DISK = DiskCache("graph-kernels")
_MEMORY: dict[str, Kernel] = {}
_LOCK = threading.Lock()


@functools.cache
def code_fingerprint() -> str:
    """A digest of every Python file of the taskmap package except the frontends."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "frontend" in path.parts:
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def enabled() -> bool:
    return os.environ.get("TASKMAP_GRAPH_CACHE", "1") != "0"


def cached_kernel(parts: tuple[object, ...], make: Callable[[], Kernel]) -> Kernel:
    """The kernel described by ``parts`` (everything it depends on): from this process, from
    the disk cache, or ``make()``-d and stored."""
    key = cache_key("graph-kernel", code_fingerprint(), parts)
    with _LOCK:
        hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    kernel = None
    if enabled():
        path = _DISK.get(key, ".pkl")
        if path is not None:
            try:
                kernel = Kernel.from_lowered(pickle.loads(path.read_bytes()))
            except Exception:  # noqa: BLE001 - an unreadable entry is rebuilt and overwritten
                kernel = None
    if kernel is None:
        kernel = make()
        if enabled():
            try:
                data = pickle.dumps(kernel.lower(), protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError):
                data = None
            if data is not None:
                _DISK.put_bytes(key, ".pkl", data)
    with _LOCK:
        return _MEMORY.setdefault(key, kernel)


__all__ = ["cached_kernel", "code_fingerprint", "enabled"]
