"""The compute definitions an implicit-GEMM convolution splices into the matmul templates (see
:mod:`taskmap.ops.conv`): the img2col prologue of the B operand, the per-group weights of the A
operand, the bias epilogues (implicit GEMM and direct template), and the views of a
convolution's arrays the fused kernels take."""
from __future__ import annotations

from typing import Any

from ..compute.nodes import compute, tensor_input
from ..ir import expr as E
from ..ir.dtypes import i32, u32
from ..templates.conv_problem import ConvProblem
from ..templates.matmul_problem import view


def img2col(p: ConvProblem, linear: bool = False) -> Any:
    """``Col[b*G + g, kd, pix]`` (the B operand) as a compute definition reading ``x`` — or with
    ``linear`` (stride 1 and OW == W, where the input offset is the pixel's plus a per-tap
    constant), ``xf``, the input seen flat."""
    G, cg, KH, KW, OW = p.groups, p.cin // p.groups, p.kh, p.kw, p.ow
    mp = p.matmul()
    assert not linear or (p.sh == p.sw == 1 and OW == p.w)
    x = tensor_input("x", p.dtype, [p.n, p.cin, p.h, p.w])
    xf = tensor_input("xf", p.dtype, [p.n * p.cin * p.h * p.w])
    top = p.pt > 0
    bottom = (p.oh - 1) * p.sh - p.pt + (KH - 1) * p.dh >= p.h
    left = p.pl > 0
    right = (OW - 1) * p.sw - p.pl + (KW - 1) * p.dw >= p.w

    def col(b: Any, kd: Any, pix: Any) -> Any:
        # Written for gcc's vectorizer (the B packing loop of the CPU template runs this per lane,
        # as masked gathers): unsigned division by constants, one unsigned compare per bound
        # pair, no short-circuit (``&&`` is control flow, which stops vectorization).
        bu, kdu, pu = (E.cast(v, u32) for v in (b, kd, pix))
        img, ci = (bu // G, bu % G * cg + kdu // (KH * KW)) if G > 1 else (bu, kdu // (KH * KW))
        r, s = kdu // KW % KH, kdu % KW
        ih = E.cast(pu // OW * p.sh + r * p.dh, i32) - p.pt
        iw = E.cast(pu % OW * p.sw + s * p.dw, i32) - p.pl
        conds = []
        if top or bottom:
            conds.append(E.cast(ih, u32) < p.h)
        if left or right:
            conds.append(E.cast(iw, u32) < p.w)
        if linear:      # the address is affine in the pixel: masked vector loads, not gathers
            plane = E.cast(img * p.cin + ci, i32) * (p.h * p.w)
            value = xf[plane + E.cast(r * (p.dh * p.w) + s * p.dw, i32) + pix - (p.pt * p.w + p.pl)]
        else:
            value = x[E.cast(img, i32), E.cast(ci, i32), ih, iw]
        if not conds:
            return value
        ok = conds[0] if len(conds) == 1 else E.binary(E.BinOp.BITAND, conds[0], conds[1])
        return E.select(ok, value, 0.0)

    return compute("b", [mp.batch, mp.k, mp.n], col)


def grouped_weights(p: ConvProblem) -> Any:
    """``A[b*G + g] = W[g]``: the weights of each image's group (several images and groups)."""
    mp = p.matmul()
    wv = tensor_input("wg", p.dtype, [p.groups, mp.m, mp.k])
    return compute("a", [mp.batch, mp.m, mp.k], lambda b, i, kd: wv[b % p.groups, i, kd])


def bias_epilogue(p: ConvProblem) -> Any:
    """``y = C + bias`` along the output channels, in C's own (N*G, C_out/G, OH*OW) shape."""
    mp = p.matmul()
    c = tensor_input("c", p.dtype, [mp.batch, mp.m, mp.n])
    bias = tensor_input("conv_bias", p.dtype, [p.cout])
    G, m = p.groups, mp.m
    return compute("y", [mp.batch, mp.m, mp.n], lambda b, i, pix: c[b, i, pix] + bias[b % G * m + i if G > 1 else i])


def direct_bias_epilogue(p: ConvProblem) -> Any:
    """``y = c + bias`` along the output channels, in the direct template's NCHW ``c``."""
    c = tensor_input("c", p.dtype, [p.n, p.cout, p.oh, p.ow])
    bias = tensor_input("conv_bias", p.dtype, [p.cout])
    return compute("y", [p.n, p.cout, p.oh, p.ow], lambda b, co, i, j: c[b, co, i, j] + bias[co])


def direct_sizes(p: ConvProblem) -> dict[str, int]:
    """The direct template's symbolic sizes bound to ``p`` (the fused kernel is specialised)."""
    return {"n": p.n, "cin": p.cin, "cig": p.cin // p.groups, "h": p.h, "w": p.w, "cout": p.cout, "oh": p.oh,
            "ow": p.ow}


def gemm_prologues(p: ConvProblem, cpu: bool) -> dict[str, Any]:
    """The implicit GEMM's prologues: img2col into B (none for a 1x1 stride-1 layer, whose input
    is B; on the CPU the flat form where it applies), and into A the weights of each image's
    group when there are several images and groups."""
    prologues: dict[str, Any] = {}
    if not p.pointwise:
        prologues["b"] = img2col(p, cpu and p.sh == p.sw == 1 and p.ow == p.w)
    if p.groups > 1 and p.n > 1:
        prologues["a"] = grouped_weights(p)
    return prologues


def gemm_views(p: ConvProblem, names: Any, x: Any, weight: Any, c: Any) -> dict[str, Any]:
    """The implicit-GEMM kernel's operands among ``names`` (its parameters) that are views of the
    convolution's NCHW input ``x``, its weights and its output ``c`` (seen as C)."""
    mp = p.matmul()
    c3 = (mp.batch, mp.m, mp.n)
    views = {"x": lambda: view(x, (p.n, p.cin, p.h, p.w)), "xf": lambda: view(x, (p.n * p.cin * p.h * p.w,)),
             "b": lambda: view(x, (mp.batch, mp.k, mp.n)),
             "a": lambda: view(weight, (mp.batch if mp.a_batched else 1, mp.m, mp.k)),
             "wg": lambda: view(weight, (p.groups, mp.m, mp.k)), "c": lambda: view(c, c3), "y": lambda: view(c, c3)}
    return {name: views[name]() for name in names if name in views}
