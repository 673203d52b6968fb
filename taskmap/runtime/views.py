"""Views without a step: a slice of a contiguous range (:mod:`taskmap.graph.views`) carved out of
its source's buffer once, by the memory plan.

Each such group is a view step (``Step.view``: the source's slot and the byte offset) that makes
its result a view of the source's array when it runs.  Where the source lives in the memory plan
— a kernel step's output, or an input a concat's output hosts (:mod:`.concat_inplace`) —
:func:`elide_views` drops the step and records the view as an alias of the buffer's owner: the
plan keeps the owner's buffer until the last step that reads any view of it, and carves the view
with the others, once.  The kernels that read it then see the same address every run (one chain
of CPU steps, one captured CUDA graph), with no copy and no step of its own.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .concat_inplace import Aliases


def elide_views(steps: Sequence[Any], aliases: Aliases, keep: set[int]) -> tuple[list[Any], Aliases]:
    """``steps`` without the view steps whose source lives in the memory plan (a planned step's
    output or a concat's, not one of ``keep``: the graph's inputs, outputs and constants), and
    ``aliases`` with those views added (slot -> the buffer owner's slot and byte offset)."""
    aliases = dict(aliases)
    owners = {k for st in steps if st.planned for k in st.outputs} | {host for host, _ in aliases.values()}
    kept = []
    for st in steps:
        if st.view is None:
            kept.append(st)
            continue
        src, offset = st.view
        owner, base = aliases.get(src, (src, 0))
        if owner in owners and owner not in keep and src not in keep:
            aliases[st.outputs[0]] = (owner, base + offset)
        else:
            kept.append(st)
    return kept, aliases


__all__ = ["elide_views"]
