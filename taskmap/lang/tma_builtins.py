"""DSL builtins for Hopper's copy engine (TMA) and its barriers (mbarriers), sm_90, and named barriers
(``bar_sync``: a barrier among some warps, any GPU) — the pieces of warp-specialized kernels (IR:
:mod:`taskmap.ir.primitives`).

An mbarrier is an element of a ``u64`` shared tensor.  One thread initializes it with
``mbarrier_init(bar[i], count)`` (then a ``syncthreads()``); a *phase* of it completes when
``count`` threads have called ``mbarrier_arrive`` and every byte the phase expects
(``mbarrier_arrive(bar, tx_bytes)``) has been copied in by ``tma_load``; then the next phase
begins.  ``mbarrier_wait(bar, parity)`` returns once the phase of that parity has completed:
phase 0 has parity 0, phase 1 parity 1, and so on, so a ring of barriers is waited for with
parity ``(round & 1)``.  Waiting for parity 1 on a fresh barrier returns at once (the phase before
phase 0 counts as completed), which lets a producer's first pass through a ring of "empty" barriers
go through.

``tma_load(dst, src[b, r, c], bar, rows, cols, swizzle=0)`` copies the ``rows x cols`` box of the
global tensor ``src`` whose first element is ``src[b, r, c]`` (rank 2: ``src[r, c]``) into the
shared tile at ``dst``, elements outside the tensor zero-filled, and counts its ``rows * cols``
elements' bytes on ``bar``.  ``swizzle=128``: rows of exactly 128 bytes, 16-byte chunk ``c`` of row
``r`` stored as chunk ``c ^ r % 8`` — wgmma's K-major layout (``wgmma_sw128``), the tile 1024-byte
aligned.  On CUDA each tensor ``tma_load`` reads gets a tensor map, made at launch from the tensor's
address and sizes (rows 16-byte aligned: the innermost size times the element size a multiple
of 16).  The CPU emulation copies when a thread first waits for the barrier (so reading the tile
before waiting reads stale data there too) and blocks waiting threads until their phase completes
(a block whose threads all wait on each other faults as a deadlock).  On a GPU a wait that has not
ended after about 2^34 cycles (~10 s) traps, so a deadlocked kernel fails its launch instead of
hanging the device.
"""
from __future__ import annotations

import ast
from typing import Any

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import i32
from ..ir.primitives import TMA_SWIZZLES, Prim, PrimCall
from .builtins import Builtin, const_int
from .gpu_builtins import arg_node, element_ref, finish, int_arg, take_args


def _barrier_op(prim: Prim, second: str, what: str, default: Any = None) -> Any:
    """The builtin ``name(bar[i], <second>)`` of an mbarrier primitive: an element reference and an
    integer (``what`` names it in errors); ``default``: the integer when omitted."""
    name = prim.spec.name
    required = 2 if default is None else 1

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
        bar_v, v = take_args(ctx, node, name, args, kwargs, ("bar", second), required,
                             {} if default is None else {second: default})
        ctx.mark_gpu(node, f"{name}()")
        bar = element_ref(ctx, node, 0, bar_v, name)
        value = int_arg(ctx, node, 1, v, what, second)
        return S.Evaluate(finish(ctx, node, PrimCall(prim, (bar, value)), {1: second}))
    return impl


_mbarrier_init = _barrier_op(Prim.MBAR_INIT, "count", "the arrival count of mbarrier_init()")
_mbarrier_arrive = _barrier_op(Prim.MBAR_ARRIVE, "tx_bytes", "tx_bytes of mbarrier_arrive()", default=0)
_mbarrier_wait = _barrier_op(Prim.MBAR_WAIT, "parity", "the parity of mbarrier_wait()")


def _tma_load(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    names = ("dst", "src", "bar", "rows", "cols", "swizzle")
    dst_v, src_v, bar_v, rows_v, cols_v, sw_v = take_args(ctx, node, "tma_load", args, kwargs, names, 5,
                                                          {"swizzle": 0})
    ctx.mark_gpu(node, "tma_load()")
    dst = element_ref(ctx, node, 0, dst_v, "tma_load")
    src = element_ref(ctx, node, 1, src_v, "tma_load")
    bar = element_ref(ctx, node, 2, bar_v, "tma_load")
    consts = []
    for i, (v, what) in enumerate(((rows_v, "rows"), (cols_v, "cols"), (sw_v, "swizzle")), start=3):
        c = const_int(v)
        if c is None:
            raise ctx.error(arg_node(node, i, what), f"{what} of tma_load() must be a compile-time integer, got "
                                                     f"{ctx.value_str(v)}")
        consts.append(E.const(c))
    if int(consts[2].value) not in TMA_SWIZZLES:
        raise ctx.error(arg_node(node, 5, "swizzle"), f"the swizzle of tma_load() is 0 or 128, got {consts[2].value}")
    coords = [E.cast(i, i32) for i in src.indices]
    if len(coords) == 2:
        coords.insert(0, E.const(0))
    origin = E.Load(src.tensor, tuple(E.const(0) for _ in src.indices))
    call = PrimCall(Prim.TMA_LOAD, (dst, origin, bar, *consts, *coords))
    if len(call.args) != Prim.TMA_LOAD.spec.arity:
        raise ctx.error(arg_node(node, 1), f"the source of tma_load() is an element of a tensor of rank 2 or 3, "
                                           f"'{src.tensor.name}' has rank {len(src.indices)}")
    return S.Evaluate(finish(ctx, node, call, {3: "rows", 4: "cols", 5: "swizzle"}))


def _bar_sync(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    id_v, count_v = take_args(ctx, node, "bar_sync", args, kwargs, ("id", "count"), 2, {})
    ctx.mark_gpu(node, "bar_sync()")
    bar = const_int(id_v)
    if bar is None:
        raise ctx.error(arg_node(node, 0, "id"), f"the id of bar_sync() must be a compile-time integer, got "
                                                 f"{ctx.value_str(id_v)}")
    count = int_arg(ctx, node, 1, count_v, "the thread count of bar_sync()", "count")
    return S.Evaluate(finish(ctx, node, PrimCall(Prim.BAR_SYNC, (E.const(bar), count)), {0: "id", 1: "count"}))


bar_sync = Builtin("bar_sync", _bar_sync,
                   "``bar_sync(id, count)``: a named barrier (id 1 to 15): the calling warps wait until count "
                   "threads (a multiple of the warp size) have arrived at barrier id — syncthreads() among some "
                   "warps of the block, e.g. the consumers of a warp-specialized kernel.")
mbarrier_init = Builtin("mbarrier_init", _mbarrier_init,
                        "``mbarrier_init(bar[i], count)``: one thread makes the u64 shared element bar[i] an "
                        "mbarrier whose phases complete after count arrivals (and their expected bytes); a "
                        "syncthreads() before others use it.  sm_90.")
mbarrier_arrive = Builtin("mbarrier_arrive", _mbarrier_arrive,
                          "``mbarrier_arrive(bar[i], tx_bytes=0)``: one arrival on the barrier's current phase; "
                          "with tx_bytes, the phase also waits for that many bytes of tma_load copies.  sm_90.")
mbarrier_wait = Builtin("mbarrier_wait", _mbarrier_wait,
                        "``mbarrier_wait(bar[i], parity)``: block until the barrier's phase of this parity (0 or "
                        "1; phase p has parity p % 2) has completed.  sm_90.")
tma_load = Builtin("tma_load", _tma_load,
                   "``tma_load(dst_smem[...], src[b, r, c], bar[i], rows, cols, swizzle=0)``: the copy engine "
                   "copies the rows x cols box of the global tensor src (rank 2 or 3, row-major) at that element "
                   "into shared memory, zero-filling what lies outside src; its bytes complete on bar[i].  "
                   "swizzle=128: rows of 128 bytes in wgmma's swizzled layout.  sm_90.")

__all__ = ["bar_sync", "mbarrier_arrive", "mbarrier_init", "mbarrier_wait", "tma_load"]
