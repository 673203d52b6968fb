"""Facts about compute DAGs: injective, bijective, reductions, and the index maps fusion uses."""
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.compute import (bounded_view, compute, has_reduction, index_map, inline, inverse_index_map, is_bijective,
                             is_injective, reduce, tensor_input)
from taskmap.ir import f32, i64
from taskmap.ir import expr as E
from taskmap.ops.elementwise import binary_compute, unary_compute
from taskmap.ops.transform import (broadcast_compute, concat_compute, gather_compute, pad_compute, permute_compute,
                                   reshape_compute, slice_compute)

FEW = settings(max_examples=15, deadline=None)


def _check_inverse(node, x, points=40):
    """forward(inverse(j)) == j on sample input indices, and inverse(forward(i)) == i."""
    fwd, inv = index_map(node, x), inverse_index_map(node, x)
    assert fwd is not None and inv is not None
    rng = random.Random(0)
    for _ in range(points):
        j = tuple(rng.randrange(s) for s in x.shape)
        i = inv.evaluate(*j)
        assert all(0 <= a < s for a, s in zip(i, node.shape)), (i, node.shape)
        assert fwd.evaluate(*i) == j
    if math.prod(node.shape) <= 512:  # exhaustively: the forward map hits every input index once
        seen = {fwd.evaluate(*i) for i in itertools.product(*(range(s) for s in node.shape))}
        assert len(seen) == math.prod(x.shape)


def test_elementwise_is_bijective_broadcast_is_not():
    x = tensor_input("x", f32, [4, 6])
    b = tensor_input("b", f32, [6])
    y = binary_compute("add", x, b, (4, 6))
    assert is_injective(y) and not has_reduction(y)
    assert not is_bijective(y)  # b[j] feeds 4 outputs
    assert index_map(y, b).evaluate(3, 5) == (5,)
    assert inverse_index_map(y, b) is None
    assert inverse_index_map(y, x).evaluate(2, 3) == (2, 3)
    z = binary_compute("mul", x, tensor_input("w", f32, [4, 6]), (4, 6))
    assert is_bijective(z)
    assert is_bijective(unary_compute("exp", x))


def test_reductions_are_not_injective():
    x = tensor_input("x", f32, [4, 6])
    s = reduce("s", [4], lambda i, k: x[i, k], [6])
    m = compute("m", [4], lambda i: s[i] / 6.0)
    assert has_reduction(m) and not is_injective(m) and not is_bijective(m)
    with pytest.raises(ValueError, match="injective"):
        index_map(m, x)


def test_transpose_and_permute():
    x = tensor_input("x", f32, [3, 5, 7])
    p = permute_compute(x, [2, 0, 1])
    assert p.shape == (7, 3, 5) and is_bijective(p)
    inv = inverse_index_map(p, x)
    assert inv.evaluate(1, 2, 3) == (3, 1, 2)
    _check_inverse(p, x)


def test_reshape_of_transpose_of_reshape():
    x = tensor_input("x", f32, [6, 10])
    r = reshape_compute(x, (2, 3, 10))
    t = permute_compute(r, [0, 2, 1])
    f = reshape_compute(t, (20, 3))
    assert is_bijective(f)
    _check_inverse(f, x)


@pytest.mark.parametrize("make", [
    lambda x: slice_compute(x, 1, 1, 1, 4),
    lambda x: slice_compute(x, 0, 0, 2, 2),
    lambda x: pad_compute(x, [(0, 0), (1, 1)], "constant", 0.0),
    lambda x: broadcast_compute(x, (2, 4, 6)),
    lambda x: concat_compute([x, x], 0),
    lambda x: compute("flip", x.shape, lambda i, j: x[3 - i, j]),  # bijective, not recognised: conservative
    lambda x: compute("twice", x.shape, lambda i, j: x[i, j] + x[i, (j + 1) % 6]),
])
def test_injective_but_not_bijective(make):
    x = tensor_input("x", f32, [4, 6])
    y = make(x)
    assert is_injective(y) and not is_bijective(y)
    assert inverse_index_map(y, x) is None


def test_slice_has_a_forward_map():
    x = tensor_input("x", f32, [4, 10])
    s = slice_compute(x, 1, 2, 3, 3)
    assert index_map(s, x).evaluate(1, 2) == (1, 8)


def test_gather_reads_its_index_at_the_output_index():
    x = tensor_input("x", f32, [4, 6])
    idx = tensor_input("idx", i64, [4, 3])
    g = gather_compute(x, 1, idx)
    assert index_map(g, idx).evaluate(2, 1) == (2, 1)
    assert inverse_index_map(g, idx) is not None  # idx itself is read one to one
    assert not is_bijective(g)  # x is not


def test_inline_substitutes_compute_nodes_only():
    x = tensor_input("x", f32, [4, 6])
    y = compute("y", [4, 6], lambda i, j: x[i, j] * 2.0)
    s = reduce("s", [4], lambda i, k: y[i, k], [6])
    z = compute("z", [4], lambda i: s[i] + y[i, 0])
    inl = inline(z)
    tensors = {ld.tensor.name for ld in inl.reads()}
    assert tensors == {"s", "x"}
    assert {ld.tensor.name for ld in inline(s).reads()} == {"x"}
    assert inline(z, keep=[y]).reads()[1].tensor is y.var


def test_symbolic_permutation_is_recognised():
    x = tensor_input("x", f32, ["n", "m"])
    t = compute("t", [E.SizeVar("m"), E.SizeVar("n")], lambda i, j: x[j, i])
    assert is_bijective(t)
    inv = inverse_index_map(t, x)
    assert [repr(e) for e in inv(E.var("a"), E.var("b"))] == ["b", "a"]
    r = compute("r", [E.SizeVar("n"), E.SizeVar("m")], lambda i, j: x[i, E.SizeVar("m") - 1 - j])
    assert not is_bijective(r)  # conservative with symbolic sizes


def test_index_map_arguments():
    x = tensor_input("x", f32, [4])
    y = compute("y", [4], lambda i: x[i])
    with pytest.raises(ValueError, match="not part of"):
        index_map(y, tensor_input("other", f32, [4]))
    with pytest.raises(ValueError, match="takes 1 indices"):
        index_map(y, x)(1, 2)


@st.composite
def reshape_permute_chains(draw):
    """A random input shape and a chain of reshapes and permutes applied to it."""
    sides = draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, 6]), min_size=1, max_size=4))
    steps = []
    shape = list(sides)
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            perm = draw(st.permutations(range(len(shape))))
            steps.append(("permute", list(perm)))
            shape = [shape[d] for d in perm]
        else:
            flat = list(sides)
            cut = sorted(draw(st.lists(st.integers(0, len(flat)), max_size=2)))
            groups = [flat[a:b] for a, b in zip([0, *cut], [*cut, len(flat)])]
            shape = [math.prod(g) for g in groups if g] or [1]
            steps.append(("reshape", shape))
            # the next reshape regroups the original sides (so that sizes always match)
    return sides, steps


@given(reshape_permute_chains())
@settings(max_examples=25, deadline=None)
def test_random_reshape_permute_chains(chain):
    """Sound always: when a chain is called bijective its inverse is right.  Complete for chains
    of reshapes only or permutes only; a reshape that regroups a transposed tensor across its
    dimension boundaries (``(3, 2) -> (2, 3)`` after a transpose) is not recognised."""
    sides, steps = chain
    x = tensor_input("x", f32, sides)
    node = x
    for kind, arg in steps:
        node = permute_compute(node, arg) if kind == "permute" else reshape_compute(node, tuple(arg))
    kinds = {kind for kind, _ in steps}
    if len(kinds) == 1:
        assert is_bijective(node)
    if is_bijective(node):
        _check_inverse(node, x, points=20)


def test_regrouping_after_a_transpose_is_not_recognised():
    x = tensor_input("x", f32, [2, 3])
    t = permute_compute(x, [1, 0])
    r = reshape_compute(t, (2, 3))
    assert is_injective(r) and not is_bijective(r)  # bijective in fact: a conservative answer


def test_bounded_view_collapses_a_head_split_to_a_strided_read():
    """GPT-2's attention operand: a slice of the fused qkv projection, split into heads and
    permuted, viewed as (heads, seq, dim).  Without the axes' ranges its index keeps a reshape's
    ``//`` and ``%`` per element; with them it is ``qkv[0, i, 64 h + d + 768]`` — and the same map."""
    qkv = tensor_input("qkv", f32, [1, 16, 3 * 4 * 8])
    k = slice_compute(qkv, 2, 32, 1, 32)
    heads = permute_compute(reshape_compute(k, [1, 16, 4, 8]), [0, 2, 1, 3])
    view = compute("k", [4, 16, 8], lambda h, i, d: reshape_compute(heads, [4, 16, 8])[h, i, d])
    loose = index_map(view, qkv)
    assert any(op in str(e) for e in loose.indices for op in ("//", "%"))
    tight = bounded_view(view)
    fwd = index_map(tight, qkv)
    assert not any(op in str(e) for e in fwd.indices for op in ("//", "%")), fwd.indices
    for idx in itertools.product(range(4), range(16), range(8)):
        assert fwd.evaluate(*idx) == loose.evaluate(*idx) == (0, idx[1], 32 + 8 * idx[0] + idx[2])
    assert bounded_view(qkv) is qkv      # an input (and a reduction) comes back as it is
