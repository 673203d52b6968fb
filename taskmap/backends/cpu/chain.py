"""Run a chain of bound CPU launches by one call into C.

A compiled graph's CPU steps are launches of bound kernels (``HostLaunch``) on arrays that are,
for most of them, the same every run (the memory plan's buffers, the constants).  Calling each
through ctypes costs about a microsecond of Python and argument conversion per kernel, which is
5% of a small model's run (MobileNetV2: 48 kernels in ~2 ms).  A :class:`HostChain` holds the
packed arguments of consecutive launches (one 64-bit word per argument, see ``codegen``'s packed
entry) and runs them in order by a single call of ``tm_run_chain``; before each run only the
words of the *volatile* arrays (the graph's inputs and outputs, the results of PyTorch runners)
are written again.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..base import Target
from .build import build_c, load_library

CHAIN_C = r"""#include <stdint.h>
typedef int (*tm_packed_fn)(const uint64_t *);
/* Run the packed entries fns[i] on the words at args[i] in order; stop at the first failure
   (its index in *at, its status returned). */
int tm_run_chain(int64_t n, const uint64_t *fns, const uint64_t *args, int64_t *at) {
  for (int64_t i = 0; i < n; ++i) {
    int status = ((tm_packed_fn)(uintptr_t)fns[i])((const uint64_t *)(uintptr_t)args[i]);
    if (status) { *at = i; return status; }
  }
  return 0;
}
"""

_runners: dict[Target, Any] = {}
_lock = threading.Lock()


def chain_runner(target: Target) -> Any:
    """``tm_run_chain`` built for ``target`` (once per process; the binary is in the disk cache)."""
    with _lock:
        fn = _runners.get(target)
        if fn is None:
            fn = getattr(load_library(build_c(CHAIN_C, target, "run_chain").binary), "tm_run_chain")
            fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int32
            _runners[target] = fn
        return fn


class HostChain:
    """Launches run in order by one call.  ``launches``: per launch, its packed entry's address,
    its name, and its words with the tensor arguments given as ``(word, slot)`` pairs: the word
    of a slot's array is written from ``values`` — once here for the ``stable`` slots, before
    every run for the others."""

    def __init__(self, target: Target, launches: Sequence[tuple[int, str, list[int], list[tuple[int, int]]]],
                 values: Sequence[Any], stable: set[int], pointer: Callable[[Any], int]) -> None:
        self._run = chain_runner(target)
        self._pointer = pointer
        self.names = [name for _, name, _, _ in launches]
        offsets, words, volatile = [], [], {}
        for _, _, w, tensors in launches:
            base = len(words)
            offsets.append(base)
            words.extend(w)
            for pos, slot in tensors:
                if slot in stable:
                    words[base + pos] = pointer(values[slot])
                else:
                    volatile.setdefault(slot, []).append(base + pos)
        self._words = np.array(words, dtype=np.uint64)
        self._fns = np.array([fn for fn, _, _, _ in launches], dtype=np.uint64)
        self._args = self._words.ctypes.data + 8 * np.array(offsets, dtype=np.uint64)
        self._at = np.zeros(1, dtype=np.int64)
        self._volatile = list(volatile.items())
        self._call = (len(launches), self._fns.ctypes.data, self._args.ctypes.data, self._at.ctypes.data)

    def __len__(self) -> int:
        return len(self.names)

    def __call__(self, values: Sequence[Any]) -> tuple[str, int] | None:
        """Run every launch; None, or the name and status of the first that failed."""
        words = self._words
        for slot, at in self._volatile:
            ptr = self._pointer(values[slot])
            for i in at:
                words[i] = ptr
        status = self._run(*self._call)
        return None if status == 0 else (self.names[int(self._at[0])], status)


__all__ = ["CHAIN_C", "HostChain", "chain_runner"]
