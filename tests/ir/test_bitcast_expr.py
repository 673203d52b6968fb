"""The bit-cast expression: same-size types only, printed as ``bitcast(x, t)``, checked by the
verifier, kept by the simplifier (never folded as a numeric cast), constants folded as numpy's
``view``."""
import numpy as np
import pytest

from taskmap.errors import IRError
from taskmap.ir import (
    BitCast,
    Cast,
    FuncKind,
    Function,
    Module,
    Return,
    bf16,
    bitcast,
    bool_,
    const,
    f16,
    f32,
    f64,
    i16,
    i32,
    i64,
    u16,
    u32,
    u64,
    var,
)
from taskmap.ir import stmt as S
from taskmap.ir.expr_simplifier import simplify_expr
from taskmap.ir.functor import IRRewriter, collect, substitute
from taskmap.ir.simplify import simplify_function
from taskmap.ir.verify import verify

SAME_SIZE = [(f32, i32), (f32, u32), (i32, f32), (u32, f32), (f64, i64), (i64, f64), (f64, u64), (f16, i16),
             (u16, f16), (bf16, i16), (u16, bf16), (f16, bf16), (i32, u32)]


@pytest.mark.parametrize("src,dst", SAME_SIZE)
def test_same_size_types_build_a_bitcast_node(src, dst):
    x = var("x", src)
    e = bitcast(x, dst)
    assert isinstance(e, BitCast) and e.dtype is dst and e.a is x
    assert not isinstance(e, Cast)
    assert bitcast(x, src) is x  # to its own type: nothing


@pytest.mark.parametrize("src,dst", [(f32, i64), (f64, i32), (f16, f32), (u16, u32),
                                     (f32, bool_), (bool_, u16)])
def test_other_sizes_and_bool_are_refused(src, dst):
    with pytest.raises(TypeError, match="cannot bit-cast"):
        bitcast(var("x", src), dst)


def test_printer():
    x = var("x", f32)
    assert repr(bitcast(x, i32)) == "bitcast(x, i32)"
    assert repr(bitcast(bitcast(x, u32) + 1, f32)) == "bitcast(bitcast(x, u32) + u32(1), f32)"


def test_verifier_checks_sizes():
    x = var("x", f32)
    good = Function("f", FuncKind.DEVICE, (x,), Return(bitcast(x, f32) * 2.0), ret=f32)
    verify(Module((good,), "f"))
    bad_node = BitCast(x, i64)  # built around the checked constructor
    bad = Function("f", FuncKind.DEVICE, (x,), S.Evaluate(bad_node))
    with pytest.raises(IRError, match="cannot bit-cast f32 \\(32 bits\\) to i64 \\(64 bits\\)"):
        verify(Module((bad,), "f"))


def test_simplifier_never_folds_it_as_a_numeric_cast():
    x = var("x", f32)
    e = bitcast(x, i32)
    assert simplify_expr(e) is e
    i = var("i", i32)
    # a numeric cast of a bounded int would be a no-op; a bit-cast of it is not
    e2 = bitcast(i, f32)
    assert simplify_expr(e2, {i: (0, 10)}) is e2


@pytest.mark.parametrize("value,src,dst", [(1.0, f32, i32), (-2.5, f32, u32), (1065353216, i32, f32),
                                           (-1082130432, i32, f32), (3.0, f64, i64), (-4616189618054758400, i64, f64), (1.5, f16, u16),
                                           (15360, i16, f16), (float("inf"), f32, i32), (-0.0, f32, u32)])
def test_constants_fold_like_numpy_view(value, src, dst):
    out = simplify_expr(bitcast(const(value, src), dst))
    want = np.array(value, dtype=src.numpy_dtype).view(dst.numpy_dtype)
    assert out.dtype is dst
    assert out.value == want.item(), (out, want)
    assert np.array(out.value, dtype=dst.numpy_dtype).view(src.numpy_dtype) == np.array(value, src.numpy_dtype)


def test_nan_and_bf16_constants_are_not_folded():
    for e in (bitcast(const(0x7FC00001, i32), f32), bitcast(const(float("nan"), f32), i32),
              bitcast(const(1.0, bf16), i16), bitcast(const(16256, i16), bf16)):
        assert simplify_expr(e) == e


def test_bits_of_bits_collapse():
    x = var("x", f32)
    assert simplify_expr(bitcast(bitcast(x, i32), f32)) is x
    assert simplify_expr(bitcast(bitcast(x, i32), u32)) == bitcast(x, u32)


def test_rewriters_rebuild_it():
    x, y = var("x", f32), var("y", f32)
    e = bitcast(x + 1.0, i32)
    assert IRRewriter().visit(e) is e
    out = substitute(e, {x: y})
    assert isinstance(out, BitCast) and out.type is i32 and collect(out, type(y)) == [y]


def test_simplify_function_keeps_bitcasts():
    x = var("x", f32)
    f = Function("f", FuncKind.DEVICE, (x,), Return(bitcast((bitcast(x, u32) + 1) << 23, f32)), ret=f32)
    out = simplify_function(f)
    assert collect(out.body, BitCast) == collect(f.body, BitCast)
