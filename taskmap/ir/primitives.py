"""GPU primitives of the tensor IR: warp shuffles and votes, atomics, vector and asynchronous
copies, tensor-core ``mma.sync``, ``ldmatrix`` and ``wgmma``, Hopper's copy engine (``tma_load``)
with its mbarriers, and named barriers — one node class, :class:`PrimCall`, with an operator enum
:class:`Prim` (as ``Call`` has ``Intrinsic``).

Conventions every pass relies on:

* **Element references.** Some arguments designate memory rather than values: the first
  argument of ``atomic_add``, both of ``copy16`` and ``transpose_block``, the fragments of
  ``mma_sync_m16n8k16``...  Such an argument is a ``Load`` node (``t[i, j]``), listed in
  ``Prim.spec.refs``; backends render it as ``&t[offset]``.  Being an ordinary ``Load`` child,
  it is lowered like any load (mapping variables substituted, indices flattened through the
  layout, simplified); passes that rewrite loads *as values* (fusion) must skip the positions in
  ``refs``: use :func:`ref_args`.
* **Immediates** (``transpose_block``'s block size, ``prefetch``'s cache level, ``cp_async``'s byte count,
  ``cp_async_wait``'s group count, ``ldmatrix``'s matrix count and transpose flag) are integer
  ``Const`` arguments, listed in ``spec.consts``.
* **Effects.** Every primitive has an effect or takes part in a warp-wide exchange, so none may
  be removed, duplicated or merged by a rewrite (the simplifier treats them as impure).
  Primitives without a result (``spec.value`` False) appear as ``Evaluate(PrimCall(...))``.
* **Warp semantics** (``PrimKind.WARP`` and ``PrimKind.MMA``) need the target's warp size, which
  the IR does not know: backends resolve it (as they resolve ``lane_id()``, a ``Special``).
  A lane's result only depends on lanes that execute the same primitive and are in its mask;
  a source lane that is out of range, inactive or not in the mask gives the caller its own value.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from .dtypes import ScalarType, bf16, bool_, f16, f32, f64, i16, i32, i64, u16, u32, u64
from .expr import Const, Expr, Load, Var, cached_hash
from .types import MemScope, row_major


class PrimKind(enum.Enum):
    WARP = "warp"        # warp-synchronous exchange among the lanes named by a mask
    ATOMIC = "atomic"    # read-modify-write of one element of global or shared memory
    MEMORY = "memory"    # 16-byte vector copies, block transposes, asynchronous global -> shared copies
    MMA = "mma"          # warp-cooperative tensor-core operations (all 32 lanes take part)


@dataclass(frozen=True)
class PrimSpec:
    name: str                      # the DSL name, also used by the printer
    kind: PrimKind
    arity: int
    refs: tuple[int, ...] = ()     # arguments that are element references (Load nodes)
    writes: tuple[int, ...] = ()   # the references written to
    consts: tuple[int, ...] = ()   # arguments that must be integer constants
    value: bool = True             # whether the primitive has a result


class Prim(enum.Enum):
    """The GPU primitives; ``prim.spec`` describes the arguments."""

    SHFL_IDX = PrimSpec("shfl_sync", PrimKind.WARP, 3)            # (mask, value, src_lane)
    SHFL_XOR = PrimSpec("shfl_xor_sync", PrimKind.WARP, 3)        # (mask, value, lane_mask)
    SHFL_DOWN = PrimSpec("shfl_down_sync", PrimKind.WARP, 3)      # (mask, value, delta)
    SHFL_UP = PrimSpec("shfl_up_sync", PrimKind.WARP, 3)          # (mask, value, delta)
    SYNCWARP = PrimSpec("syncwarp", PrimKind.WARP, 1, value=False)  # (mask,)
    VOTE_ALL = PrimSpec("all_sync", PrimKind.WARP, 2)             # (mask, pred) -> bool
    VOTE_ANY = PrimSpec("any_sync", PrimKind.WARP, 2)             # (mask, pred) -> bool
    VOTE_BALLOT = PrimSpec("ballot_sync", PrimKind.WARP, 2)       # (mask, pred) -> u32 / u64
    ATOMIC_ADD = PrimSpec("atomic_add", PrimKind.ATOMIC, 2, refs=(0,), writes=(0,))  # (ref, v) -> old
    ATOMIC_MAX = PrimSpec("atomic_max", PrimKind.ATOMIC, 2, refs=(0,), writes=(0,))
    ATOMIC_MIN = PrimSpec("atomic_min", PrimKind.ATOMIC, 2, refs=(0,), writes=(0,))
    ATOMIC_EXCH = PrimSpec("atomic_exch", PrimKind.ATOMIC, 2, refs=(0,), writes=(0,))
    ATOMIC_CAS = PrimSpec("atomic_cas", PrimKind.ATOMIC, 3, refs=(0,), writes=(0,))  # (ref, compare, v)
    COPY16 = PrimSpec("copy16", PrimKind.MEMORY, 2, refs=(0, 1), writes=(0,), value=False)  # (dst, src)
    #: (dst, src, n, ld_dst, ld_src): for a, b < n, dst[b * ld_dst + a] = src[a * ld_src + b] (flat
    #: element offsets from the references; strides in elements; the blocks must not overlap)
    TRANSPOSE = PrimSpec("transpose_block", PrimKind.MEMORY, 5, refs=(0, 1), writes=(0,), consts=(2,), value=False)
    CP_ASYNC = PrimSpec("cp_async", PrimKind.MEMORY, 4, refs=(0, 1), writes=(0,), consts=(2,),
                        value=False)                              # (dst, src, nbytes, src_bytes)
    CP_ASYNC_COMMIT = PrimSpec("cp_async_commit", PrimKind.MEMORY, 0, value=False)
    CP_ASYNC_WAIT = PrimSpec("cp_async_wait", PrimKind.MEMORY, 1, consts=(0,), value=False)  # (n,)
    MMA_M16N8K16 = PrimSpec("mma_sync_m16n8k16", PrimKind.MMA, 3, refs=(0, 1, 2), writes=(0,),
                            value=False)                          # (c, a, b): c += a @ b
    MMA_M16N8K8_TF32 = PrimSpec("mma_sync_m16n8k8_tf32", PrimKind.MMA, 4, refs=(0, 1, 2), writes=(0,), consts=(3,),
                                value=False)  # (c, a, b, rounded): c += tf32(a) @ tf32(b); rounded: a, b are tf32
    LDMATRIX = PrimSpec("ldmatrix", PrimKind.MMA, 4, refs=(0, 1), writes=(0,), consts=(2, 3),
                        value=False)                              # (dst, src_row, num, trans)
    #: (c, a, b, n, accumulate): one warpgroup's (4 warps, from a warp index divisible by 4)
    #: ``wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32``: c (f32[n / 2] a thread, as in
    #: ``wgmma_c_layout``) = a (64 x 8) @ b (n x 8)^T (+ c when ``accumulate``), both operands in
    #: shared memory in the 128-byte-swizzled K-major layout (rows of 128 bytes, 8-row atoms of 1024,
    #: a row's 16-byte chunk c stored as chunk c ^ row % 8: ``lang.wgmma_sw128``), read as tf32
    #: (their low 13 bits ignored); asynchronous: complete after ``wgmma_commit`` + ``wgmma_wait``
    WGMMA_TF32 = PrimSpec("wgmma_tf32", PrimKind.MMA, 5, refs=(0, 1, 2), writes=(0,), consts=(3, 4), value=False)
    #: the same with f16 or bf16 operands: ``m64n{n}k16.f32.{f16,bf16}``, a 64 x 16 and an n x 16
    #: slice of 128-byte swizzled K-major tiles of 64 elements a row (``wgmma_sw128_b16``)
    WGMMA_F16 = PrimSpec("wgmma_f16", PrimKind.MMA, 5, refs=(0, 1, 2), writes=(0,), consts=(3, 4), value=False)
    WGMMA_FENCE = PrimSpec("wgmma_fence", PrimKind.MEMORY, 0, value=False)    # before a warpgroup's first wgmma
    WGMMA_COMMIT = PrimSpec("wgmma_commit", PrimKind.MEMORY, 0, value=False)  # closes a group of wgmma
    WGMMA_WAIT = PrimSpec("wgmma_wait", PrimKind.MEMORY, 1, consts=(0,), value=False)  # (n,): all but n groups done
    #: (c, count): c[0..count) (accumulators wgmma wrote) are read only after this point — an empty
    #: asm that "writes" them, after the wait that retires those wgmma (CUTLASS's fence_operand)
    WGMMA_KEEP = PrimSpec("wgmma_keep", PrimKind.MEMORY, 2, refs=(0,), writes=(0,), consts=(1,), value=False)
    #: orders this thread's ordinary shared-memory writes before later reads by the tensor cores
    #: (wgmma) or the copy engine (with a barrier after it)
    FENCE_PROXY_ASYNC = PrimSpec("fence_proxy_async", PrimKind.MEMORY, 0, value=False)
    #: (bar, count): initialize the shared ``u64`` mbarrier ``bar`` to expect ``count`` arrivals per
    #: phase, phase 0 pending (one thread; a ``syncthreads()`` before anyone else uses it)
    MBAR_INIT = PrimSpec("mbarrier_init", PrimKind.MEMORY, 2, refs=(0,), writes=(0,), value=False)
    #: (bar, tx_bytes): arrive once on ``bar``; with tx_bytes > 0 first expect that many bytes of
    #: asynchronous copies (``tma_load``) more for the current phase, which completes when its arrivals
    #: and its bytes are all in
    MBAR_ARRIVE = PrimSpec("mbarrier_arrive", PrimKind.MEMORY, 2, refs=(0,), writes=(0,), value=False)
    #: (bar, parity): wait until the phase of ``bar`` with this parity (0 or 1) has completed
    MBAR_WAIT = PrimSpec("mbarrier_wait", PrimKind.MEMORY, 2, refs=(0,), value=False)
    #: (dst, src, bar, rows, cols, swizzle, c0, c1, c2): a TMA copy of the ``rows x cols`` box of the
    #: global tensor ``src`` (rank 2 or 3, row-major; ``src`` references its element 0) at
    #: coordinates (c0: batch, 0 for rank 2; c1: row; c2: column) into the shared tile at ``dst``
    #: (rows of ``cols`` elements; with ``swizzle`` 128 rows of 128 bytes whose 16-byte chunk c is
    #: stored as c ^ row % 8: the wgmma layout), elements outside the tensor zero-filled; its bytes
    #: (all ``rows * cols`` of them) complete on ``bar``
    TMA_LOAD = PrimSpec("tma_load", PrimKind.MEMORY, 9, refs=(0, 1, 2), writes=(0, 2), consts=(3, 4, 5), value=False)
    #: (id, count): a named barrier (1..15): wait until ``count`` threads (whole warps) have arrived at
    #: barrier ``id`` — a ``syncthreads()`` among some warps of the block (warp specialization)
    BAR_SYNC = PrimSpec("bar_sync", PrimKind.MEMORY, 2, consts=(0,), value=False)
    #: (c, a, b, n): for i < n, c[i] += f32(a[0]) * f32(b[2i]) + f32(a[1]) * f32(b[2i + 1]) — a pair of
    #: bf16 along K (``a``) times n such pairs (``b``, interleaved), summed into f32 ``c`` (products
    #: exact; AVX-512 BF16's ``vdpbf16ps`` for n = 16 on the CPU, which flushes subnormals)
    DOT2_BF16 = PrimSpec("dot2_bf16", PrimKind.MEMORY, 4, refs=(0, 1, 2), writes=(0,), consts=(3,), value=False)
    #: (ref, level, write, beside): a hint to bring the cache line of ``ref`` into the cache of
    #: ``level`` (1 or 2), owned for writing when ``write`` is 1; no effect on results, and ``ref``
    #: may lie past the tensor's end (a prefetch never faults).  ``beside`` 1: not the line of
    #: ``ref`` but those a fused epilogue reads beside a store to ``ref`` (a residual) — nothing
    #: where no epilogue is spliced (for stores that bypass the caches)
    PREFETCH = PrimSpec("prefetch", PrimKind.MEMORY, 4, refs=(0,), consts=(1, 2, 3), value=False)
    #: (i,) -> i: an integer whose value the C compiler may not see (no constant propagated
    #: through it): the same result, another program — see ``taskmap.lang.opaque``; GPUs: ``i``
    OPAQUE = PrimSpec("opaque", PrimKind.MEMORY, 1)

    @property
    def spec(self) -> PrimSpec:
        return self.value


#: Element types each atomic supports on every backend.
ATOMIC_TYPES: dict[Prim, tuple[ScalarType, ...]] = {
    Prim.ATOMIC_ADD: (f32, f64, i32, u32, i64, u64),
    Prim.ATOMIC_MAX: (i32, u32, i64, u64),
    Prim.ATOMIC_MIN: (i32, u32, i64, u64),
    Prim.ATOMIC_EXCH: (f32, i32, u32, i64, u64),
    Prim.ATOMIC_CAS: (i32, u32, i64, u64),
}
CP_ASYNC_BYTES = (4, 8, 16)
#: Block sizes of ``transpose_block`` (16 and 8: in-register AVX-512 / AVX transposes in C).
TRANSPOSE_SIZES = (1, 2, 4, 8, 16, 32)
TRANSPOSE_TYPES = (f32,)
LDMATRIX_NUMS = (1, 2, 4)
#: The mbarrier and TMA primitives (sm_90: the copy engine's asynchronous loads and their barriers).
MBAR_OPS = (Prim.MBAR_INIT, Prim.MBAR_ARRIVE, Prim.MBAR_WAIT)
TMA_SWIZZLES = (0, 128)
#: A TMA box: at most 256 elements a dimension; its rows 16-byte multiples.
TMA_BOX_MAX = 256
#: Cache levels ``prefetch`` fetches into.
PREFETCH_LEVELS = (1, 2)
#: Elements each mma_sync_m16n8k16 operand reference covers (C f32, A and B f16/bf16), per lane.
MMA_FRAGMENT = {0: 4, 1: 8, 2: 4}
#: The same for mma_sync_m16n8k8_tf32 (C f32, A and B f32 rounded to tf32).
MMA_TF32_FRAGMENT = {0: 4, 1: 4, 2: 2}
#: The warpgroup products (they read 128-byte swizzled shared tiles).
WGMMA_OPS = (Prim.WGMMA_TF32, Prim.WGMMA_F16)
#: ``wgmma_tf32``'s and ``wgmma_f16``'s n: multiples of 8 up to 256.
WGMMA_N = tuple(range(8, 257, 8))
B16_TYPES = (f16, bf16, i16, u16)
#: 32-bit elements ``ldmatrix`` moves untransposed (one per lane and matrix: the tf32 fragments).
B32_TYPES = (f32, i32, u32)


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class PrimCall(Expr):
    """A GPU primitive.  ``type`` is the result type, None for primitives without a result."""

    op: Prim
    args: tuple[Expr, ...]
    type: ScalarType | None = None

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        if self.type is None:
            raise TypeError(f"{self.op.spec.name}() has no value")
        return self.type


def ref_args(call: PrimCall) -> tuple[Load, ...]:
    """The element references of ``call`` (its memory operands)."""
    return tuple(call.args[i] for i in call.op.spec.refs)  # type: ignore[misc]


def is_warp_synchronous(op: Prim) -> bool:
    """Whether all lanes of a warp (those in the mask) must execute the primitive together."""
    return op.spec.kind in (PrimKind.WARP, PrimKind.MMA)


def needs_gpu(op: Prim) -> bool:
    """Whether the primitive only exists in GPU kernels and device functions (atomics and
    ``copy16`` and ``transpose_block`` are also valid in CPU kernels)."""
    return op.spec.kind in (PrimKind.WARP, PrimKind.MMA) or op in (
        Prim.CP_ASYNC, Prim.CP_ASYNC_COMMIT, Prim.CP_ASYNC_WAIT, Prim.WGMMA_FENCE, Prim.WGMMA_COMMIT, Prim.WGMMA_WAIT,
        Prim.WGMMA_KEEP, Prim.FENCE_PROXY_ASYNC, Prim.TMA_LOAD, Prim.BAR_SYNC) or op in MBAR_OPS


# ----------------------------------------------------------------------------- checks


#: A problem found in a primitive: the argument position (None: the call) and a message; or None.
Problem = tuple[int | None, str] | None


def _scope(ref: Load) -> MemScope:
    return ref.tensor.type.scope


def _int_const(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) and (e.dtype.is_integer or e.dtype.is_bool) else None


def problem(call: PrimCall) -> Problem:
    """What is wrong with ``call`` (the argument position, or None, and a message), or None.

    The rules every backend relies on: reference positions hold ``Load`` nodes of tensors in
    the right memory (atomics: global or shared; ``cp_async``: shared <- global; fragments of
    ``mma``/``ldmatrix``: registers, ``ldmatrix`` reads shared memory), element types fit, and
    immediates are constants in range.
    """
    op, spec, args = call.op, call.op.spec, call.args
    name = spec.name
    if len(args) != spec.arity:
        return None, f"{name}() takes {spec.arity} argument(s), got {len(args)}"
    for i in spec.refs:
        if not isinstance(args[i], Load) or not isinstance(args[i].tensor, Var):
            return i, f"argument {i + 1} of {name}() must be a tensor element such as t[i, j]"
    for i in spec.consts:
        if _int_const(args[i]) is None:
            return i, f"argument {i + 1} of {name}() must be a compile-time integer"
    if spec.value != (call.type is not None):
        return None, f"{name}() {'has' if spec.value else 'has no'} result, but the node's type is {call.type!r}"
    check = {PrimKind.WARP: _warp_problem, PrimKind.ATOMIC: _atomic_problem, PrimKind.MEMORY: _memory_problem,
             PrimKind.MMA: _mma_problem}[spec.kind]
    return check(call, op, name, args)


def _warp_problem(call: PrimCall, op: Prim, name: str, args: tuple[Expr, ...]) -> Problem:
    if not args[0].dtype.is_integer:
        return 0, f"the mask of {name}() must be an integer, got {args[0].dtype!r}"
    if op in (Prim.SHFL_IDX, Prim.SHFL_XOR, Prim.SHFL_DOWN, Prim.SHFL_UP):
        if not args[2].dtype.is_integer:
            return 2, f"the lane argument of {name}() must be an integer, got {args[2].dtype!r}"
        if call.type is not args[1].dtype:
            return 1, f"{name}() returns the type of its value ({args[1].dtype!r}), node says {call.type!r}"
    if op in (Prim.VOTE_ALL, Prim.VOTE_ANY, Prim.VOTE_BALLOT) and not args[1].dtype.is_bool:
        return 1, f"the predicate of {name}() must be a bool, got {args[1].dtype!r}"
    if op in (Prim.VOTE_ALL, Prim.VOTE_ANY) and call.type is not bool_:
        return None, f"{name}() returns a bool"
    if op is Prim.VOTE_BALLOT and call.type not in (u32, u64):
        return None, f"{name}() returns u32 or u64, not {call.type!r}"
    return None


def _atomic_problem(call: PrimCall, op: Prim, name: str, args: tuple[Expr, ...]) -> Problem:
    ref = args[0]
    if _scope(ref) is MemScope.REGISTER:
        return 0, (f"{name}() needs an element of a global or shared tensor; '{ref.tensor.name}' is a "
                   "register tensor")
    t = ref.dtype
    if t not in ATOMIC_TYPES[op]:
        ok = ", ".join(x.short for x in ATOMIC_TYPES[op])
        return 0, f"{name}() on {t!r} elements is not supported (supported: {ok})"
    for i in range(1, len(args)):
        if args[i].dtype is not t:
            return i, f"argument {i + 1} of {name}() must have the element type {t!r}, got {args[i].dtype!r}"
    if call.type is not t:
        return None, f"{name}() returns the old element ({t!r}), node says {call.type!r}"
    return None


def _memory_problem(call: PrimCall, op: Prim, name: str, args: tuple[Expr, ...]) -> Problem:
    if op is Prim.COPY16:
        dst, src = args
        if dst.dtype is not src.dtype:
            return 1, f"copy16() copies between tensors of one element type, got {dst.dtype!r} and {src.dtype!r}"
        if 16 % dst.dtype.nbytes or dst.dtype.is_bool:
            return 0, f"copy16() cannot copy {dst.dtype!r} elements"
        return None
    if op is Prim.TRANSPOSE:
        dst, src, n = args[:3]
        for i, ref in ((0, dst), (1, src)):
            if ref.dtype not in TRANSPOSE_TYPES:
                ok = ", ".join(repr(t) for t in TRANSPOSE_TYPES)
                return i, f"transpose_block() moves {ok} elements, got {ref.dtype!r} ('{ref.tensor.name}')"
        if _int_const(n) not in TRANSPOSE_SIZES:
            sizes = ", ".join(map(str, TRANSPOSE_SIZES))
            return 2, f"transpose_block() transposes n x n blocks with n one of {sizes}, got {_int_const(n)}"
        for i in (3, 4):
            if not args[i].dtype.is_integer:
                what = ("ld_dst", "ld_src")[i - 3]
                return i, f"the {what} stride of transpose_block() must be an integer, got {args[i].dtype!r}"
        return None
    if op is Prim.DOT2_BF16:
        for i, want in ((0, f32), (1, bf16), (2, bf16)):
            if args[i].dtype is not want:
                return i, f"argument {i + 1} of dot2_bf16() must be a {want!r} element, got {args[i].dtype!r}"
        if (_int_const(args[3]) or 0) < 1:
            return 3, f"dot2_bf16() needs n >= 1 pairs, got {_int_const(args[3])}"
        return None
    if op is Prim.CP_ASYNC:
        dst, src, nbytes, src_bytes = args
        if _scope(dst) is not MemScope.SHARED:
            return 0, f"the destination of cp_async() must be a shared tensor element, '{dst.tensor.name}' is " \
                      f"{_scope(dst).value}"
        if _scope(src) is not MemScope.GLOBAL:
            return 1, f"the source of cp_async() must be a global tensor element, '{src.tensor.name}' is " \
                      f"{_scope(src).value}"
        if _int_const(nbytes) not in CP_ASYNC_BYTES:
            return 2, f"cp_async() copies 4, 8 or 16 bytes, got {_int_const(nbytes)}"
        if nbytes.value % dst.dtype.nbytes or dst.dtype is not src.dtype:  # type: ignore[attr-defined]
            return 1, f"cp_async() copies whole {dst.dtype!r} elements between tensors of one type"
        if not src_bytes.dtype.is_integer:
            return 3, f"src_bytes of cp_async() must be an integer, got {src_bytes.dtype!r}"
        return None
    if op in (Prim.CP_ASYNC_WAIT, Prim.WGMMA_WAIT):
        n = _int_const(args[0])
        if n is None or n < 0:
            return 0, f"{name}() needs a group count >= 0, got {n}"
        return None
    if op is Prim.WGMMA_KEEP:
        if _scope(args[0]) is not MemScope.REGISTER or args[0].dtype is not f32 or (_int_const(args[1]) or 0) < 1:
            return 0, f"{name}() takes wgmma accumulators: an f32 register tensor element and a count >= 1"
        return None
    if op in MBAR_OPS or op is Prim.TMA_LOAD:
        return _tma_problem(op, name, args)
    if op is Prim.BAR_SYNC:
        if not 1 <= int(args[0].value) <= 15:  # type: ignore[attr-defined]
            return 0, f"bar_sync() names barrier 1 to 15 (0 is syncthreads()), got {args[0].value}"  # type: ignore
        if not args[1].dtype.is_integer:
            return 1, f"the thread count of bar_sync() must be an integer, got {args[1].dtype!r}"
        return None
    if op is Prim.PREFETCH:
        if _scope(args[0]) is MemScope.REGISTER:
            return 0, f"prefetch() needs an element of a global or shared tensor; '{args[0].tensor.name}' is a " \
                      "register tensor"
        if _int_const(args[1]) not in PREFETCH_LEVELS:
            return 1, f"prefetch() fetches into the cache level 1 or 2, got {_int_const(args[1])}"
        if _int_const(args[2]) not in (0, 1):
            return 2, f"prefetch()'s write is a compile-time bool, got {args[2]}"
        if _int_const(args[3]) not in (0, 1):
            return 3, f"prefetch()'s beside is a compile-time bool, got {args[3]}"
    return None


def _tma_problem(op: Prim, name: str, args: tuple[Expr, ...]) -> Problem:
    bar_at = 2 if op is Prim.TMA_LOAD else 0
    bar = args[bar_at]
    if _scope(bar) is not MemScope.SHARED or bar.dtype is not u64:
        return bar_at, f"the barrier of {name}() is a u64 shared tensor element; '{bar.tensor.name}' is " \
                       f"{_scope(bar).value} {bar.dtype!r}"
    if op is not Prim.TMA_LOAD:
        if op is not Prim.MBAR_WAIT and not args[1].dtype.is_integer:
            return 1, f"argument 2 of {name}() must be an integer, got {args[1].dtype!r}"
        if op is Prim.MBAR_WAIT and not (args[1].dtype.is_integer or args[1].dtype.is_bool):
            return 1, f"the parity of {name}() must be an integer (0 or 1), got {args[1].dtype!r}"
        return None
    dst, src = args[0], args[1]
    rows, cols, swizzle = (int(a.value) for a in args[3:6])  # type: ignore[attr-defined]
    if _scope(dst) is not MemScope.SHARED:
        return 0, f"the destination of tma_load() must be a shared tensor element, '{dst.tensor.name}' is " \
                  f"{_scope(dst).value}"
    st = src.tensor.type
    if _scope(src) is not MemScope.GLOBAL or st.ndim not in (2, 3):
        return 1, f"the source of tma_load() is an element of a global tensor of rank 2 or 3; '{src.tensor.name}' " \
                  f"is {_scope(src).value} of rank {st.ndim}"
    if st.layout != row_major(st.shape):
        return 1, f"tma_load() reads row-major tensors; '{src.tensor.name}' has layout {st.layout!r}"
    if dst.dtype is not src.dtype or dst.dtype.nbytes not in (2, 4):
        return 0, f"tma_load() copies 16- or 32-bit elements between tensors of one type, got {dst.dtype!r} and " \
                  f"{src.dtype!r}"
    row_bytes = cols * dst.dtype.nbytes
    if not (1 <= rows <= TMA_BOX_MAX and 1 <= cols <= TMA_BOX_MAX) or row_bytes % 16:
        return 4, f"a tma_load() box is rows x cols with both at most {TMA_BOX_MAX} and rows of a multiple of 16 " \
                  f"bytes, got {rows} x {cols} of {dst.dtype!r}"
    if swizzle not in TMA_SWIZZLES or (swizzle and row_bytes != swizzle):
        return 5, f"the swizzle of tma_load() is 0 or 128 (rows of exactly 128 bytes), got {swizzle} with rows of " \
                  f"{row_bytes} bytes"
    for i in (6, 7, 8):
        if not args[i].dtype.is_integer:
            return i, f"the coordinates of tma_load() must be integers, got {args[i].dtype!r}"
    return None


def _mma_problem(call: PrimCall, op: Prim, name: str, args: tuple[Expr, ...]) -> Problem:
    if op in (Prim.MMA_M16N8K16, Prim.MMA_M16N8K8_TF32):
        c, a, b = args[:3]
        for i, ref in enumerate(args[:3]):
            if _scope(ref) is not MemScope.REGISTER:
                return i, f"the operands of {name}() are register tensors; '{ref.tensor.name}' is " \
                          f"{_scope(ref).value}"
        if c.dtype is not f32:
            return 0, f"the accumulator of {name}() must be f32, got {c.dtype!r}"
        if op is Prim.MMA_M16N8K8_TF32:
            for i, ref in ((1, a), (2, b)):
                if ref.dtype is not f32:
                    return i, f"the {'AB'[i - 1]} operand of {name}() must be f32 (rounded to tf32), got {ref.dtype!r}"
            if _int_const(args[3]) not in (0, 1):
                return 3, f"rounded of {name}() must be a compile-time bool"
            return None
        if a.dtype not in (f16, bf16):
            return 1, f"the A operand of {name}() must be f16 or bf16, got {a.dtype!r}"
        if b.dtype is not a.dtype:
            return 2, f"the B operand of {name}() must have A's type {a.dtype!r}, got {b.dtype!r}"
        return None
    if op in WGMMA_OPS:
        c, a, b, n, acc = args
        if _scope(c) is not MemScope.REGISTER:
            return 0, f"the accumulator of {name}() is a register tensor; '{c.tensor.name}' is {_scope(c).value}"
        if c.dtype is not f32:
            return 0, f"the accumulator of {name}() must be f32, got {c.dtype!r}"
        kinds = (f32,) if op is Prim.WGMMA_TF32 else (f16, bf16)
        what = "an f32" if op is Prim.WGMMA_TF32 else "an f16 or bf16"
        for i, ref in ((1, a), (2, b)):
            if _scope(ref) is not MemScope.SHARED or ref.dtype not in kinds:
                return i, f"the {'AB'[i - 1]} operand of {name}() is {what} shared tensor element; " \
                          f"'{ref.tensor.name}' is {_scope(ref).value} {ref.dtype!r}"
        if b.dtype is not a.dtype:
            return 2, f"the B operand of {name}() must have A's type {a.dtype!r}, got {b.dtype!r}"
        if _int_const(n) not in WGMMA_N:
            return 3, f"{name}() computes 64 x n tiles with n a multiple of 8 up to 256, got {_int_const(n)}"
        if _int_const(acc) not in (0, 1):
            return 4, f"accumulate of {name}() must be a compile-time bool"
        return None
    if op is Prim.LDMATRIX:
        dst, src, num, trans = args
        if _scope(dst) is not MemScope.REGISTER:
            return 0, f"ldmatrix() loads into a register tensor; '{dst.tensor.name}' is {_scope(dst).value}"
        if _scope(src) is not MemScope.SHARED:
            return 1, f"ldmatrix() reads a shared tensor; '{src.tensor.name}' is {_scope(src).value}"
        if dst.dtype not in B16_TYPES + B32_TYPES or src.dtype is not dst.dtype:
            return 0, f"ldmatrix() moves 16-bit (or, untransposed, 32-bit) elements between tensors of one type, " \
                      f"got {dst.dtype!r} and {src.dtype!r}"
        if _int_const(num) not in LDMATRIX_NUMS or _int_const(trans) not in (0, 1):
            return 2, "ldmatrix() loads 1, 2 or 4 matrices, transposed or not"
        if dst.dtype in B32_TYPES and _int_const(trans):
            return 3, f"ldmatrix(trans=True) transposes 16-bit elements; {dst.dtype!r} ones would be split"
        return None
    return None


def fragment_elements(op: Prim, index: int, args: tuple[Expr, ...]) -> int:
    """How many consecutive elements from reference ``index`` the primitive reads or writes."""
    if op is Prim.MMA_M16N8K16:
        return MMA_FRAGMENT[index]
    if op is Prim.MMA_M16N8K8_TF32:
        return MMA_TF32_FRAGMENT[index]
    if op in WGMMA_OPS:        # c: n / 2 a thread; a, b: 64 or n rows of 128 bytes, one k-step's 32 bytes
        rows = 64 if index == 1 else int(args[3].value)  # type: ignore[attr-defined]
        per = 128 // args[index].dtype.nbytes
        return int(args[3].value) // 2 if index == 0 else (rows - 1) * per + per // 4  # type: ignore[attr-defined]
    if op is Prim.WGMMA_KEEP:
        return int(args[1].value)  # type: ignore[attr-defined]
    if op is Prim.TMA_LOAD and index == 0:
        return int(args[3].value) * int(args[4].value)  # type: ignore[attr-defined]
    if op is Prim.LDMATRIX:    # per matrix: a 32-bit register of each lane; a 16-byte row
        width = args[index].dtype.nbytes
        return 4 * int(args[2].value) // width if index == 0 else 16 // width  # type: ignore[attr-defined]
    if op is Prim.COPY16:
        return 16 // args[index].dtype.nbytes
    if op is Prim.CP_ASYNC:
        return int(args[2].value) // args[index].dtype.nbytes  # type: ignore[attr-defined]
    if op is Prim.DOT2_BF16:   # c: n f32, a: one pair, b: n pairs
        return (int(args[3].value), 2, 2 * int(args[3].value))[index]  # type: ignore[attr-defined]
    if op is Prim.TRANSPOSE:   # n rows of n elements, ld apart (at least n when ld is not a constant)
        n, ld = _int_const(args[2]) or 1, _int_const(args[3 + index])
        return (n - 1) * ld + n if ld is not None and ld >= 0 else n
    return 1


def alignment(op: Prim, index: int, args: tuple[Expr, ...]) -> int:
    """The byte alignment reference ``index`` must have (the GPU faults on misaligned ones)."""
    if (op in (Prim.COPY16, Prim.LDMATRIX) or op in WGMMA_OPS) and (op is Prim.COPY16 or index > 0):
        return 16
    if op is Prim.CP_ASYNC:
        return int(args[2].value)  # type: ignore[attr-defined]
    if op is Prim.TMA_LOAD and index == 0:     # the swizzle repeats every 1024 bytes
        return 1024 if int(args[5].value) else 128  # type: ignore[attr-defined]
    if op in MBAR_OPS or (op is Prim.TMA_LOAD and index == 2):
        return 8
    if op in (Prim.MMA_M16N8K16, Prim.MMA_M16N8K8_TF32, Prim.LDMATRIX) or op in WGMMA_OPS:
        return 4
    return args[index].dtype.nbytes
