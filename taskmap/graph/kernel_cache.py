"""An on-disk cache of the kernels the graph lowering makes (fused template kernels,
rule-based kernels of composed injective ops), so that compiling a model again — in a new
process — skips instantiating templates, splicing prologues / epilogues, the lowering
passes and rendering the source: the lowered IR module and its source for the target are
stored (pickled) under a key of everything they depend on, and the binary comes from the
backend's own cache (keyed by the source).

The key holds the caller's description of the kernel (template, configuration, the fusion's
definitions as text, sizes), the target and a fingerprint of taskmap's own source files (the
lowering passes and the renderers included), so an edited compiler never reads a stale module
or source.  ``TASKMAP_GRAPH_CACHE=0`` turns the cache off.  The module from before the lowering
passes is stored too, so that a kernel from the cache can still be rewritten
(:func:`derived_kernel`: a concat's input placed in its output, keyed by the kernel's own key
and the rewrite).
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from ..backends import Target
from ..ir.func import Module
from ..runtime.cache import DiskCache, cache_key
from ..runtime.kernel import Kernel

_DISK = DiskCache("graph-kernels")
_MEMORY: dict[str, Kernel] = {}
_KEYS: "weakref.WeakKeyDictionary[Kernel, str]" = weakref.WeakKeyDictionary()    # kernel -> its key
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


def cached_kernel(parts: tuple[object, ...], make: Callable[[], Kernel], target: Target) -> Kernel:
    """The kernel described by ``parts`` (everything it depends on) for ``target``: from this
    process, from the disk cache (with its source for ``target``, which is not rendered again),
    or ``make()``-d, lowered, rendered and stored."""
    key = cache_key("graph-kernel", code_fingerprint(), parts, target)
    return _cached(key, make, target)


def derived_kernel(base: Kernel, parts: tuple[object, ...], make: Callable[[], Kernel], target: Target) -> Kernel:
    """``make()`` — a rewrite of ``base`` described by ``parts`` — cached under ``base``'s key and
    ``parts`` when ``base`` came from :func:`cached_kernel` (else made each time)."""
    with _LOCK:
        base_key = _KEYS.get(base)
    if base_key is None:
        return make()
    return _cached(cache_key("graph-kernel-derived", base_key, parts), make, target)


def clear_memo() -> None:
    """Forget the kernels made in this process (the disk cache stays): a compiler patched at run
    time (a benchmark's A/B, :mod:`benchmarks.ab_steps`) makes its kernels again."""
    with _LOCK:
        _MEMORY.clear()


def _cached(key: str, make: Callable[[], Kernel], target: Target) -> Kernel:
    with _LOCK:
        hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    kernel = _load(key, target) if enabled() else None
    if kernel is None:
        kernel = make()
        if enabled():
            _store(key, kernel, target)
    with _LOCK:
        kernel = _MEMORY.setdefault(key, kernel)
        _KEYS[kernel] = key
        return kernel


def _load(key: str, target: Target) -> Kernel | None:
    path = _DISK.get(key, ".pkl")
    if path is None:
        return None
    try:
        original, module, sources = pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - an unreadable entry is rebuilt and overwritten
        return None
    if not isinstance(original, Module) or not isinstance(module, Module) or not isinstance(sources, dict):
        return None
    source = sources.get(target)
    return Kernel.from_lowered(module, {target: source} if isinstance(source, str) else None, original)


def _store(key: str, kernel: Kernel, target: Target) -> None:
    try:
        sources = {target: kernel.render(target)}
    except Exception:  # noqa: BLE001 - the build renders it again and reports the error
        sources = {}
    try:
        data = pickle.dumps((kernel.module, kernel.lower(), sources), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    _DISK.put_bytes(key, ".pkl", data)


__all__ = ["cached_kernel", "clear_memo", "code_fingerprint", "derived_kernel", "enabled"]
