"""Lowering passes, run in the order of :data:`PASSES`.

Each pass is a ``Module -> Module`` function in a file of its own.  ``lower(module)`` runs them
all, verifying the result; with ``dump_dir`` (or the environment variable ``TASKMAP_DUMP_IR``)
the IR after each named pass is written to ``<dump_dir>/<NN>_<pass>.txt``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..ir.func import Module
from ..ir.verify import verify
from .flatten_indexing import flatten_indexing
from .hoist_invariants import hoist_invariants
from .lower_mappings import lower_mappings
from .simplify import simplify

Pass = Callable[[Module], Module]

#: The lowering pipeline: name and pass, in order.
PASSES: tuple[tuple[str, Pass], ...] = (
    ("lower_mappings", lower_mappings),
    ("simplify", simplify),
    ("flatten_indexing", flatten_indexing),
    ("simplify_flat", simplify),
    ("hoist_invariants", hoist_invariants),
)


def lower(module: Module, dump_dir: str | os.PathLike[str] | None = None) -> Module:
    """Run every pass of :data:`PASSES` and verify the lowered module."""
    verify(module)
    dump_dir = dump_dir or os.environ.get("TASKMAP_DUMP_IR") or None
    if dump_dir is not None:
        out = Path(dump_dir) / module.entry
        out.mkdir(parents=True, exist_ok=True)
        (out / "00_input.txt").write_text(repr(module) + "\n")
    for n, (name, fn) in enumerate(PASSES, start=1):
        module = fn(module)
        if dump_dir is not None:
            (out / f"{n:02d}_{name}.txt").write_text(repr(module) + "\n")
    verify(module, lowered=True)
    return module


__all__ = ["PASSES", "lower", "lower_mappings", "flatten_indexing", "hoist_invariants", "simplify"]
