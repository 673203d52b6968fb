"""DSL builtins for GPU primitives: warp shuffles and votes, ``lane_id()``, atomics, 16-byte and
asynchronous copies, block transposes, cache prefetches, tensor-core ``mma`` and ``ldmatrix`` (IR:
:mod:`taskmap.ir.primitives`).

Memory operands are *element references*: ``atomic_add(hist[b], 1)`` names the element
``hist[b]``; fragment operands may also be a whole register tensor (its first element).  Warp
primitives, ``cp_async*``, ``mma`` and ``ldmatrix`` make the kernel a GPU kernel (and are errors
in CPU kernels); atomics, ``copy16``, ``transpose_block``, ``dot2_bf16`` and ``prefetch`` also work in CPU kernels.

Alignment (checked at compile time when the offset is a constant, at run time by the CPU
emulation, and by the GPU's hardware): ``copy16`` needs 16-byte aligned addresses, ``cp_async``
addresses aligned to its size, ``ldmatrix`` 16-byte aligned rows; shared and register tensors
start 16-byte aligned.
"""
from __future__ import annotations

import ast
from typing import Any

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, bool_, i32, u32, u64
from ..ir.expr import Expr, Load, Special, SpecialReg
from ..ir.primitives import PREFETCH_LEVELS, TRANSPOSE_SIZES, Prim, PrimCall, alignment, fragment_elements, problem
from ..ir.simplify import simplify_expr
from ..ir.types import MemScope
from .builtins import Builtin, check_args, const_int, is_ir, is_number, is_tensor, py_number

#: The mask naming all 32 lanes of a CUDA warp.
FULL_MASK = 0xFFFFFFFF


# ----------------------------------------------------------------------------- argument helpers


def arg_node(node: ast.Call, i: int, keyword: str | None = None) -> ast.AST:
    """The AST node of positional argument ``i`` (or of ``keyword``), else the call itself."""
    if i < len(node.args):
        return node.args[i]
    for k in node.keywords:
        if k.arg == keyword:
            return k.value
    return node


def take_args(ctx: Any, node: ast.Call, name: str, args: list, kwargs: dict, names: tuple[str, ...],
              required: int, defaults: dict[str, Any]) -> list[Any]:
    """Positional and keyword arguments matched to ``names`` (like a Python signature)."""
    if len(args) > len(names):
        raise ctx.error(node, f"{name}() takes at most {len(names)} argument(s), got {len(args)}")
    out = list(args)
    for key in kwargs:
        if key not in names or names.index(key) < len(args):
            what = "an unexpected" if key not in names else "a repeated"
            raise ctx.error(arg_node(node, len(names), key), f"{name}() got {what} keyword argument '{key}'")
    for k in range(len(args), len(names)):
        key = names[k]
        if key in kwargs:
            out.append(kwargs[key])
        elif k < required:
            raise ctx.error(node, f"{name}() missing argument '{key}'")
        else:
            out.append(defaults[key])
    return out


def element_ref(ctx: Any, node: ast.Call, i: int, v: Any, name: str, whole: bool = False) -> Load:
    """Argument ``i`` as an element reference; ``whole`` also accepts a tensor (its first element)."""
    if isinstance(v, Load):
        return v
    if whole and is_tensor(v):
        return Load(v, tuple(E.const(0) for _ in v.type.shape))
    what = "a tensor element such as t[i, j]" + (" or a register tensor" if whole else "")
    raise ctx.error(arg_node(node, i), f"argument {i + 1} of {name}() must be {what}, got {ctx.value_str(v)}")


def mask_arg(ctx: Any, node: ast.Call, i: int, v: Any, name: str) -> Expr:
    if is_number(v) and not isinstance(v, (bool, float)) and int(v) >= 0:
        v = int(v)
        if v >= 1 << 64:
            raise ctx.error(arg_node(node, i), f"the mask of {name}() has more than 64 bits: {v:#x}")
        return E.const(v, u32 if v < 1 << 32 else u64)
    e = ctx.to_scalar(v, arg_node(node, i))
    if not e.dtype.is_integer:
        raise ctx.error(arg_node(node, i), f"the mask of {name}() must be an integer, got {e.dtype!r}")
    return e if e.dtype in (u32, u64) else E.cast(e, u64 if e.dtype.nbytes == 8 else u32)


def int_arg(ctx: Any, node: ast.Call, i: int, v: Any, what: str, keyword: str | None = None) -> Expr:
    e = ctx.to_scalar(v, arg_node(node, i, keyword))
    if not e.dtype.is_integer:
        raise ctx.error(arg_node(node, i, keyword), f"{what} must be an integer, got {e.dtype!r}")
    return E.cast(e, i32)


def const_arg(ctx: Any, node: ast.Call, i: int, v: Any, what: str, allowed: tuple[int, ...],
              keyword: str | None = None) -> int:
    c = py_number(v) if isinstance(v, bool) or is_number(v) else const_int(v)
    if isinstance(c, bool):
        c = int(c)
    if not isinstance(c, int) or c not in allowed:
        got = ctx.value_str(v)
        raise ctx.error(arg_node(node, i, keyword), f"{what} must be a compile-time {' or '.join(map(str, allowed))}, "
                                                     f"got {got}")
    return c


def finish(ctx: Any, node: ast.Call, call: PrimCall, keywords: dict[int, str] | None = None) -> PrimCall:
    """Check ``call`` (the IR's rules, then constant offsets), raising at the faulty argument."""
    bad = problem(call)
    if bad is not None:
        i, msg = bad
        raise ctx.error(node if i is None else arg_node(node, i, (keywords or {}).get(i)), msg)
    for i in call.op.spec.refs:
        if call.op is not Prim.PREFETCH:           # a prefetch may point past the end: it never faults
            check_static_extent(ctx, node, call, i)
    return call


def check_static_extent(ctx: Any, node: ast.Call, call: PrimCall, i: int) -> None:
    """Elements a reference covers must lie in its tensor and, in shared or register memory (whose
    base is 16-byte aligned), be aligned: checked here when offset and shape are constants."""
    ref: Load = call.args[i]  # type: ignore[assignment]
    t = ref.tensor.type
    offset = simplify_expr(t.layout.offset(ref.indices))
    if not isinstance(offset, E.Const) or not all(isinstance(s, E.Const) for s in t.shape):
        return
    count, numel = fragment_elements(call.op, i, call.args), 1
    for s in t.shape:
        numel *= int(s.value)  # type: ignore[attr-defined]
    name = call.op.spec.name
    if offset.value + count > numel:
        raise ctx.error(arg_node(node, i), f"{name}() accesses {count} elements from element {offset.value} of "
                                           f"'{ref.tensor.name}', which has {numel}")
    align = alignment(call.op, i, call.args)
    if t.scope is not MemScope.GLOBAL and (offset.value * ref.dtype.nbytes) % align:
        raise ctx.error(arg_node(node, i), f"{name}() needs a {align}-byte aligned address, but element "
                                           f"{offset.value} of '{ref.tensor.name}' is at byte "
                                           f"{offset.value * ref.dtype.nbytes}")


# ----------------------------------------------------------------------------- warp primitives


def _shfl(op: Prim, lane_what: str) -> Builtin:
    name = op.spec.name

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
        check_args(ctx, node, name, args, kwargs, 3, 3)
        ctx.mark_gpu(node, f"{name}()")
        mask = mask_arg(ctx, node, 0, args[0], name)
        value = ctx.to_scalar(args[1], node.args[1])
        lane = int_arg(ctx, node, 2, args[2], f"the {lane_what} of {name}()")
        return finish(ctx, node, PrimCall(op, (mask, value, lane), value.dtype))

    return Builtin(name, impl, f"``{name}(mask, value, {lane_what.replace(' ', '_')})``: a warp shuffle; lanes "
                               "whose source is out of range or not taking part get their own value.")


def _vote(op: Prim) -> Builtin:
    name = op.spec.name

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
        if op is Prim.VOTE_BALLOT:
            mask_v, pred_v, dtype = take_args(ctx, node, name, args, kwargs, ("mask", "pred", "dtype"), 2,
                                              {"dtype": u32})
            if dtype not in (u32, u64):
                raise ctx.error(arg_node(node, 2, "dtype"), f"ballot_sync() returns u32 or u64, got "
                                                              f"{ctx.value_str(dtype)}")
        else:
            check_args(ctx, node, name, args, kwargs, 2, 2)
            (mask_v, pred_v), dtype = args, bool_
        ctx.mark_gpu(node, f"{name}()")
        mask = mask_arg(ctx, node, 0, mask_v, name)
        pred = ctx.to_bool(pred_v, arg_node(node, 1, "pred"))
        return finish(ctx, node, PrimCall(op, (mask, E.as_expr(pred)), dtype))

    return Builtin(name, impl, f"``{name}(mask, pred)``: a warp vote.")


def _syncwarp(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Any:
    (mask_v,) = take_args(ctx, node, "syncwarp", args, kwargs, ("mask",), 0, {"mask": FULL_MASK})
    ctx.mark_gpu(node, "syncwarp()")
    return S.Evaluate(finish(ctx, node, PrimCall(Prim.SYNCWARP, (mask_arg(ctx, node, 0, mask_v, "syncwarp"),))))


def _warp_special(reg: SpecialReg) -> Builtin:
    name = reg.value

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
        check_args(ctx, node, name, args, kwargs, 0, 0)
        ctx.mark_gpu(node, f"{name}()")
        return Special(reg, 0)

    return Builtin(name, impl, f"``{name}()``: from the thread's linear index in its block and the target's "
                               "warp size (32 on CUDA and the CPU, 64 on CDNA).")


shfl_sync = _shfl(Prim.SHFL_IDX, "source lane")
shfl_xor_sync = _shfl(Prim.SHFL_XOR, "lane mask")
shfl_down_sync = _shfl(Prim.SHFL_DOWN, "delta")
shfl_up_sync = _shfl(Prim.SHFL_UP, "delta")
all_sync = _vote(Prim.VOTE_ALL)
any_sync = _vote(Prim.VOTE_ANY)
ballot_sync = _vote(Prim.VOTE_BALLOT)
syncwarp = Builtin("syncwarp", _syncwarp, "``syncwarp(mask=FULL_MASK)``: a barrier over the lanes of a warp.")
lane_id = _warp_special(SpecialReg.LANE_ID)
warp_id = _warp_special(SpecialReg.WARP_ID)
warp_size = _warp_special(SpecialReg.WARP_SIZE)


# ----------------------------------------------------------------------------- atomics


def _atomic(op: Prim) -> Builtin:
    name = op.spec.name
    arity = op.spec.arity

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
        check_args(ctx, node, name, args, kwargs, arity, arity)
        ref = element_ref(ctx, node, 0, args[0], name)
        t: ScalarType = ref.dtype
        values = [E.cast(ctx.to_scalar(a, node.args[k + 1], like=ref), t) for k, a in enumerate(args[1:])]
        return finish(ctx, node, PrimCall(op, (ref, *values), t))

    params = "t[i], compare, value" if arity == 3 else "t[i], value"
    return Builtin(name, impl, f"``{name}({params})``: atomic on one element of global or shared memory; "
                               "returns the old value.")


atomic_add = _atomic(Prim.ATOMIC_ADD)
atomic_max = _atomic(Prim.ATOMIC_MAX)
atomic_min = _atomic(Prim.ATOMIC_MIN)
atomic_exch = _atomic(Prim.ATOMIC_EXCH)
atomic_cas = _atomic(Prim.ATOMIC_CAS)


# ----------------------------------------------------------------------------- copies


def _copy16(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    check_args(ctx, node, "copy16", args, kwargs, 2, 2)
    dst = element_ref(ctx, node, 0, args[0], "copy16", whole=True)
    src = element_ref(ctx, node, 1, args[1], "copy16", whole=True)
    return S.Evaluate(finish(ctx, node, PrimCall(Prim.COPY16, (dst, src))))


def _transpose_block(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    name = "transpose_block"
    dst_v, src_v, n_v, ld_dst_v, ld_src_v = take_args(ctx, node, name, args, kwargs,
                                                      ("dst", "src", "n", "ld_dst", "ld_src"), 5, {})
    dst = element_ref(ctx, node, 0, dst_v, name)
    src = element_ref(ctx, node, 1, src_v, name)
    n = const_arg(ctx, node, 2, n_v, "the block size n of transpose_block()", TRANSPOSE_SIZES, "n")
    ld_dst = int_arg(ctx, node, 3, ld_dst_v, "ld_dst of transpose_block()", "ld_dst")
    ld_src = int_arg(ctx, node, 4, ld_src_v, "ld_src of transpose_block()", "ld_src")
    call = PrimCall(Prim.TRANSPOSE, (dst, src, E.const(n), ld_dst, ld_src))
    return S.Evaluate(finish(ctx, node, call, {2: "n", 3: "ld_dst", 4: "ld_src"}))


def _dot2_bf16(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    name = "dot2_bf16"
    c_v, a_v, b_v, n_v = take_args(ctx, node, name, args, kwargs, ("c", "a", "b", "n"), 4, {})
    refs = [element_ref(ctx, node, i, v, name) for i, v in enumerate((c_v, a_v, b_v))]
    n = const_int(n_v)
    if n is None or n < 1:
        raise ctx.error(arg_node(node, 3, "n"), f"the pair count n of dot2_bf16() must be a compile-time integer "
                                                f">= 1, got {ctx.value_str(n_v)}")
    return S.Evaluate(finish(ctx, node, PrimCall(Prim.DOT2_BF16, (*refs, E.const(n))), {3: "n"}))


def _prefetch(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    ref_v, level_v, write_v, beside_v = take_args(ctx, node, "prefetch", args, kwargs,
                                                  ("ref", "level", "write", "beside"), 1,
                                                  {"level": 1, "write": False, "beside": False})
    ref = element_ref(ctx, node, 0, ref_v, "prefetch")
    level = const_arg(ctx, node, 1, level_v, "the cache level of prefetch()", PREFETCH_LEVELS, "level")
    write = const_arg(ctx, node, 2, write_v, "prefetch()'s write", (0, 1), "write")
    beside = const_arg(ctx, node, 3, beside_v, "prefetch()'s beside", (0, 1), "beside")
    call = PrimCall(Prim.PREFETCH, (ref, E.const(level), E.const(write), E.const(beside)))
    return S.Evaluate(finish(ctx, node, call, {1: "level", 2: "write", 3: "beside"}))


def _cp_async(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    dst_v, src_v, nbytes_v, src_bytes_v = take_args(ctx, node, "cp_async", args, kwargs,
                                                    ("dst", "src", "nbytes", "src_bytes"), 3, {"src_bytes": None})
    ctx.mark_gpu(node, "cp_async()")
    dst = element_ref(ctx, node, 0, dst_v, "cp_async")
    src = element_ref(ctx, node, 1, src_v, "cp_async")
    nbytes = const_arg(ctx, node, 2, nbytes_v, "the size of cp_async() in bytes", (4, 8, 16), "nbytes")
    src_bytes = E.const(nbytes) if src_bytes_v is None else \
        int_arg(ctx, node, 3, src_bytes_v, "src_bytes of cp_async()", "src_bytes")
    call = PrimCall(Prim.CP_ASYNC, (dst, src, E.const(nbytes), src_bytes))
    return S.Evaluate(finish(ctx, node, call, {2: "nbytes", 3: "src_bytes"}))


def _cp_async_commit(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    check_args(ctx, node, "cp_async_commit", args, kwargs, 0, 0)
    ctx.mark_gpu(node, "cp_async_commit()")
    return S.Evaluate(PrimCall(Prim.CP_ASYNC_COMMIT, ()))


def _cp_async_wait(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    check_args(ctx, node, "cp_async_wait", args, kwargs, 1, 1)
    ctx.mark_gpu(node, "cp_async_wait()")
    n = const_int(args[0])
    if n is None or n < 0:
        raise ctx.error(node.args[0], f"cp_async_wait() needs a compile-time number of groups >= 0, got "
                                      f"{ctx.value_str(args[0])}")
    return S.Evaluate(PrimCall(Prim.CP_ASYNC_WAIT, (E.const(n),)))


copy16 = Builtin("copy16", _copy16, "``copy16(dst[i], src[j])``: copy 16 bytes (4 f32, 8 f16) as one vector; "
                                    "both addresses 16-byte aligned.")
transpose_block = Builtin("transpose_block", _transpose_block,
                          "``transpose_block(dst[i, j], src[k, l], n, ld_dst, ld_src)``: transpose an n x n "
                          "block of f32: for a, b < n, the element b * ld_dst + a after dst[i, j] (flat, in "
                          "elements) gets the element a * ld_src + b after src[k, l]; the blocks must not "
                          "overlap.  In-register (AVX-512 for n = 16, AVX for n = 8) on the CPU.")
dot2_bf16 = Builtin("dot2_bf16", _dot2_bf16,
                    "``dot2_bf16(c[i], a[j], b[k], n)``: for l < n, ``c[i + l] += a[j] * b[k + 2l] + a[j + 1] * "
                    "b[k + 2l + 1]`` — a pair of bf16 along K times n interleaved pairs, summed into f32 (the "
                    "products are exact).  On a CPU with AVX-512 BF16 and n = 16 one ``vdpbf16ps`` (subnormals "
                    "flushed to zero); elsewhere a loop.")
prefetch = Builtin("prefetch", _prefetch, "``prefetch(t[i], level=1, write=False, beside=False)``: a hint to "
                                          "bring the cache line holding t[i] (global or shared memory) into the "
                                          "L1 (``level=1``) or L2 cache (``level=2``) ahead of its use — owned for "
                                          "writing with ``write=True`` (a line the kernel is about to store); "
                                          "results do not change, and t[i] may lie past the end of t (a prefetch "
                                          "never faults).  ``beside=True``: instead of t[i]'s line, the lines "
                                          "that an epilogue fused into the stores to t reads beside t[i] (a "
                                          "residual), and nothing where none is fused — for a kernel whose stores "
                                          "to t bypass the caches.  The CPU's prefetch instructions (``prefetchw`` "
                                          "for writes, where the CPU has it); on CUDA ``prefetch.L1`` / ``.L2``; "
                                          "nothing on HIP.")
cp_async = Builtin("cp_async", _cp_async, "``cp_async(smem[i], gmem[j], nbytes, src_bytes=nbytes)``: an "
                                          "asynchronous global -> shared copy of 4, 8 or 16 bytes; bytes past "
                                          "src_bytes are zero-filled (predication).")
cp_async_commit = Builtin("cp_async_commit", _cp_async_commit, "``cp_async_commit()``: close the current group "
                                                               "of cp_async copies.")
cp_async_wait = Builtin("cp_async_wait", _cp_async_wait, "``cp_async_wait(n)``: wait until at most n committed "
                                                         "groups are pending.")


# ----------------------------------------------------------------------------- tensor cores


def _mma_of(prim: Prim) -> Any:
    name = prim.spec.name

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
        check_args(ctx, node, name, args, kwargs, 3, 3)
        ctx.mark_gpu(node, f"{name}()")
        refs = tuple(element_ref(ctx, node, k, a, name, whole=True) for k, a in enumerate(args))
        return S.Evaluate(finish(ctx, node, PrimCall(prim, refs)))
    return impl


def _mma_tf32(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    name = "mma_sync_m16n8k8_tf32"
    c_v, a_v, b_v, rounded = take_args(ctx, node, name, args, kwargs, ("c", "a", "b", "rounded"), 3,
                                       {"rounded": False})
    ctx.mark_gpu(node, f"{name}()")
    if is_ir(rounded) or not isinstance(rounded, (bool, int)):
        raise ctx.error(arg_node(node, 3, "rounded"), f"rounded of {name}() must be a compile-time bool, got "
                                                      f"{ctx.value_str(rounded)}")
    refs = tuple(element_ref(ctx, node, k, v, name, whole=True) for k, v in enumerate((c_v, a_v, b_v)))
    return S.Evaluate(finish(ctx, node, PrimCall(Prim.MMA_M16N8K8_TF32, (*refs, E.const(int(bool(rounded)))))))


def _ldmatrix(num: int) -> Builtin:
    name = f"ldmatrix_x{num}"

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
        dst_v, src_v, trans_v = take_args(ctx, node, name, args, kwargs, ("dst", "src", "trans"), 2,
                                          {"trans": False})
        ctx.mark_gpu(node, f"{name}()")
        if is_ir(trans_v) or not isinstance(trans_v, (bool, int)):
            raise ctx.error(arg_node(node, 2, "trans"), f"trans of {name}() must be a compile-time bool, got "
                                                          f"{ctx.value_str(trans_v)}")
        dst = element_ref(ctx, node, 0, dst_v, name, whole=True)
        src = element_ref(ctx, node, 1, src_v, name)
        call = PrimCall(Prim.LDMATRIX, (dst, src, E.const(num), E.const(int(bool(trans_v)))))
        return S.Evaluate(finish(ctx, node, call))

    regs = {1: "2", 2: "4", 4: "8"}[num]
    return Builtin(name, impl, f"``{name}(regs, smem[row, col], trans=False)``: {num} 8x8 matrices of 16-bit "
                               f"elements from shared memory into {regs} register elements per lane; or, "
                               f"untransposed, {num} 8x4 matrices of 32-bit elements (f32, i32, u32: a tf32 "
                               f"fragment) into {num} per lane (lane l: row l // 4, column l % 4 of each).")


mma_sync_m16n8k16 = Builtin("mma_sync_m16n8k16", _mma_of(Prim.MMA_M16N8K16),
                            "``mma_sync_m16n8k16(c, a, b)``: c (f32[4]) += a (f16 or bf16 [8]) @ b ([4]), fragments "
                            "as in mma_a/b/c_layout.")
mma_sync_m16n8k8_tf32 = Builtin("mma_sync_m16n8k8_tf32", _mma_tf32,
                                "``mma_sync_m16n8k8_tf32(c, a, b, rounded=False)``: c (f32[4]) += tf32(a) (f32[4]) @ "
                                "tf32(b) (f32[2]) on tensor cores, fragments as in mma_tf32_a/b_layout and "
                                "mma_c_layout; the operands are rounded to tf32 (10-bit mantissas, to nearest) on "
                                "every call.  ``rounded=True``: they already hold tf32 values (``round_tf32()`` when "
                                "the fragment was loaded, once for all the calls that read it) and pass as they are "
                                "(the tensor cores read their top 19 bits).")


def _nullary(prim: Prim) -> Any:
    name = prim.spec.name

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
        check_args(ctx, node, name, args, kwargs, 0, 0)
        ctx.mark_gpu(node, f"{name}()")
        return S.Evaluate(PrimCall(prim, ()))
    return impl


def _wgmma_wait(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
    check_args(ctx, node, "wgmma_wait", args, kwargs, 1, 3)
    ctx.mark_gpu(node, "wgmma_wait()")
    if len(args) == 2:
        raise ctx.error(node, "wgmma_wait(n, acc, count): the accumulators come with their count")
    n = const_int(args[0])
    if n is None or n < 0:
        raise ctx.error(node.args[0], f"wgmma_wait() needs a compile-time number of groups >= 0, got "
                                      f"{ctx.value_str(args[0])}")
    wait = S.Evaluate(PrimCall(Prim.WGMMA_WAIT, (E.const(n),)))
    if len(args) == 1:
        return wait
    count = const_int(args[2])
    if count is None or count < 1:
        raise ctx.error(node.args[2], f"wgmma_wait() needs a compile-time count of accumulators >= 1, got "
                                      f"{ctx.value_str(args[2])}")
    c = element_ref(ctx, node, 1, args[1], "wgmma_wait", whole=True)
    keep = PrimCall(Prim.WGMMA_KEEP, (c, E.const(count)))
    bad = problem(keep)
    if bad is not None:
        raise ctx.error(node.args[1], bad[1])
    return S.seq(wait, S.Evaluate(keep))


def _wgmma(prim: Prim) -> Any:
    name = prim.spec.name

    def impl(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> S.Stmt:
        c_v, a_v, b_v, n_v, acc_v = take_args(ctx, node, name, args, kwargs, ("c", "a", "b", "n", "accumulate"), 4,
                                              {"accumulate": True})
        ctx.mark_gpu(node, f"{name}()")
        n = const_int(n_v)
        if is_ir(acc_v) or not isinstance(acc_v, (bool, int)):
            raise ctx.error(arg_node(node, 4, "accumulate"), f"accumulate of {name}() must be a compile-time bool, "
                                                             f"got {ctx.value_str(acc_v)}")
        c = element_ref(ctx, node, 0, c_v, name, whole=True)
        a = element_ref(ctx, node, 1, a_v, name)
        b = element_ref(ctx, node, 2, b_v, name)
        call = PrimCall(prim, (c, a, b, E.const(-1 if n is None else n), E.const(int(bool(acc_v)))))
        return S.Evaluate(finish(ctx, node, call, {4: "accumulate"}))
    return impl


ldmatrix_x1 = _ldmatrix(1)
ldmatrix_x2 = _ldmatrix(2)
ldmatrix_x4 = _ldmatrix(4)
wgmma_tf32 = Builtin("wgmma_tf32", _wgmma(Prim.WGMMA_TF32),
                     "``wgmma_tf32(c, a_smem[r, k], b_smem[r, k], n, accumulate=True)``: a warpgroup's (4 warps "
                     "from a warp index divisible by 4, all 128 threads) tensor-core product c = a @ b^T (+ c): "
                     "a 64 x 8 and b n x 8 (n a multiple of 8 up to 256) from shared memory, K-major with "
                     "128-byte rows swizzled (``wgmma_sw128``; each tile 1024-byte aligned, the references at a "
                     "tile's row 0 and k 0, 8, 16 or 24), read as tf32; c (f32[n / 2]) as in "
                     "``wgmma_c_layout``.  Asynchronous: ``wgmma_fence()`` before, ``wgmma_commit()`` and "
                     "``wgmma_wait(0)`` before c is read or the tiles are overwritten.  sm_90a.")
wgmma_f16 = Builtin("wgmma_f16", _wgmma(Prim.WGMMA_F16),
                    "``wgmma_f16(c, a_smem[r, k], b_smem[r, k], n, accumulate=True)``: ``wgmma_tf32`` on f16 or "
                    "bf16 operands (both one type): a 64 x 16 and b n x 16 slice of K-major tiles of 64 elements a "
                    "row, swizzled as ``wgmma_sw128_b16`` places them (references at k 0, 16, 32 or 48); f32 "
                    "accumulators as in ``wgmma_c_layout``.  sm_90a.")
wgmma_fence = Builtin("wgmma_fence", _nullary(Prim.WGMMA_FENCE),
                      "``wgmma_fence()``: orders the warpgroup's register writes (its accumulators) before the "
                      "wgmma that follow.")
wgmma_commit = Builtin("wgmma_commit", _nullary(Prim.WGMMA_COMMIT),
                       "``wgmma_commit()``: closes the group of the warpgroup's pending wgmma.")
wgmma_wait = Builtin("wgmma_wait", _wgmma_wait, "``wgmma_wait(n, c=None, count=0)``: waits until at most n "
                                                "committed wgmma groups are pending; with c (a register tensor "
                                                "element) and count, c and the count - 1 after it are accumulators "
                                                "the retired groups wrote, kept from being read before the wait.  "
                                                "Name them only when no group writing them is left running (n = 0 "
                                                "for one accumulator set): ptxas serializes wgmma otherwise.")


def _opaque(ctx: Any, node: ast.Call, args: list, kwargs: dict) -> Expr:
    check_args(ctx, node, "opaque", args, kwargs, 1, 1)
    value = int_arg(ctx, node, 0, args[0], "the value of opaque()")
    return finish(ctx, node, PrimCall(Prim.OPAQUE, (value,), value.dtype))


opaque = Builtin("opaque", _opaque,
                 "``opaque(i)``: the integer ``i``, whose value the C compiler may not see — a bound or "
                 "index it would otherwise propagate as a constant, specializing the code it governs "
                 "(gcc made a single-core depthwise kernel 3x slower that way: its core index 0 "
                 "propagated, the staged planes were forwarded into the taps' loads as scalar shifts).  "
                 "The identity on GPUs.")
fence_proxy_async = Builtin("fence_proxy_async", _nullary(Prim.FENCE_PROXY_ASYNC),
                            "``fence_proxy_async()``: this thread's ordinary shared-memory writes become visible "
                            "to the tensor cores' wgmma reads (put it before the barrier that precedes them).")

__all__ = ["FULL_MASK", "all_sync", "any_sync", "atomic_add", "atomic_cas", "atomic_exch", "atomic_max",
           "atomic_min", "ballot_sync", "copy16", "cp_async", "cp_async_commit", "cp_async_wait", "dot2_bf16", "lane_id",
           "ldmatrix_x1", "ldmatrix_x2", "ldmatrix_x4", "mma_sync_m16n8k16", "mma_sync_m16n8k8_tf32", "opaque",
           "prefetch",
           "shfl_down_sync", "shfl_sync", "shfl_up_sync", "shfl_xor_sync", "syncwarp", "transpose_block", "warp_id",
           "warp_size", "fence_proxy_async", "wgmma_commit", "wgmma_f16", "wgmma_fence", "wgmma_tf32",
           "wgmma_wait"]
