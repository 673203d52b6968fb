"""Post-scheduling fusion (Hidet §4.2 / §5.2): splice injective *prologues* into an anchor
kernel's loads and bijective *epilogues* into its stores, after the anchor was scheduled alone.

Public API::

    from taskmap.fusion import fuse, can_fuse, place, FusionError
    from taskmap.compute import tensor_input, compute
    from taskmap.ir.expr import call, Intrinsic, maximum

    anchor = MATMUL_CPU.instantiate(problem, target, schedule)   # a taskmap.Kernel: params a, b, bias, c, cw, wa, wb

    # prologue: the anchor's parameter ``a`` (f32[batch, m, k]) is computed from new inputs
    xt = tensor_input("xt", "float32", [1, 7, 5])                 # a stored transposed, times 2
    a_def = compute("a", [1, 5, 7], lambda b, i, j: xt[b, j, i] * 2.0)

    # epilogue: the output reads the anchor's parameter ``c`` through a tensor_input *named "c"*
    c_in = tensor_input("c", "float32", [1, 5, 9])
    bias = tensor_input("bias_n", "float32", [9])
    y = compute("y", [1, 5, 9], lambda b, i, j: maximum(c_in[b, i, j] + bias[j], 0.0))

    fused = fuse(anchor, prologues={"a": a_def}, epilogues={"c": y})    # -> taskmap.Kernel
    [p.name for p in fused.func.params]   # ['xt', 'b', 'bias', 'bias_n', 'y', 'cw', 'wa', 'wb', 'bidx']
    fused(xt_array, b_array, ..., y_array, ...)                        # or fused.build("cuda", arch="sm_90")

Semantics:

* ``prologues[p]``: an injective compute definition (no reduction) with ``p``'s rank and dtype;
  every ``Load(p, idx)`` of the anchor (in the entry kernel and in the helper functions ``p`` is
  passed to) becomes the inlined definition evaluated at ``idx``.  ``p`` leaves the parameters;
  the definition's ``tensor_input`` leaves take its place (in the order they are first read,
  one parameter per input node, shared between prologues / epilogues that read the same node).
  Vector copies reading ``p`` (``copy16``, ``cp_async``) are expanded into element loads +
  stores (``cp_async`` becomes synchronous: its zero-fill predicate ``src_bytes`` is kept) —
  except the elements of a ``cp_async`` whose definition only reads one element of a 4-byte
  tensor where a guard holds and is zero elsewhere (img2col, a transpose, a slice): they stay
  asynchronous copies of 4 bytes, zero-filled where the guard fails, so the anchor's copy
  pipeline keeps running.
* ``epilogues[p]``: a bijective compute definition that reads the anchor's output ``p`` through
  a ``tensor_input`` named ``p`` (same rank and dtype, bijective read).  Every
  ``Store(p, idx, v)`` becomes ``Store(out, inv(idx), g(v, other inputs at inv(idx)))`` where
  ``inv`` is the inverse index map (:func:`taskmap.compute.analysis.inverse_index_map`).  ``p``'s
  place in the parameters is taken by the other inputs of the definition, then the output
  (named after the definition's node).  Valid only if the anchor writes each element of ``p``
  exactly once and never reads it: templates guarantee this (the CPU matmul template keeps
  partial sums in a separate parameter ``cw``, see :mod:`taskmap.templates.matmul_cpu_kernel`);
  a kernel that loads ``p`` or writes it through a primitive is refused.
* ``place(kernel, p, into, offset, shape)`` (:mod:`.place`): the output ``p``, viewed as
  ``shape``, written inside the larger ``into`` (a ``tensor_input``) instead — ``Store(p, idx,
  v)`` becomes ``Store(into, idx + offset, v)`` — the epilogue machinery with a shift as its
  index map, under the same conditions; the other elements of ``into`` are never touched, so
  several kernels can fill one tensor (a concatenation's inputs at batch > 1:
  :mod:`taskmap.graph.concat_place`).
* **Sizes.** A parameter dimension that is a symbolic size and whose definition gives an int
  binds that size everywhere (the fused kernel is specialised); ``sizes={"m": 64}`` binds
  more.  Every size left symbolic must still be a whole dimension of some parameter.
* **Refusals** raise :class:`FusionError` (a ``TaskmapError``) with the reason: a reduction in
  a prologue, a non-bijective epilogue, a missing ``tensor_input`` named after the output,
  mismatched shapes / dtypes, a name clash between new parameters and the anchor's, atomics,
  ``ldmatrix`` or ``mma`` on a fused tensor, a fused tensor passed to a helper function at a
  position that also receives unfused tensors, a kernel chain (split-K).  :func:`can_fuse`
  answers the same question as a ``(bool, reason)`` pair without raising, so a graph compiler
  can fall back to separate kernels.
* **Vector loops.**  After splicing, loop-invariant index arithmetic with divisions (img2col's
  tap decomposition) is hoisted out of ``vectorize()`` loops (:mod:`.hoist`), so that gcc
  turns affine spliced reads into (masked) vector loads instead of gathers.
* **Caching.** ``fuse`` memoises per (anchor, definitions, sizes) in the process, so the same
  fusion returns the same ``Kernel`` (built once); binaries are cached on disk by their
  generated source, which contains the spliced definitions.
"""
from __future__ import annotations

from ..errors import FusionError
from .place import place
from .splice import can_fuse, fuse, fusion_key

__all__ = ["FusionError", "can_fuse", "fuse", "fusion_key", "place"]
