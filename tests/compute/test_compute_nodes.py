"""Compute definitions: building nodes, what they record, printing, and the errors of misuse."""
import dataclasses

import pytest

from taskmap.compute import (ComputeNode, ReduceNode, ReduceOp, TensorInput, compute, dag_str, graph_inputs, reduce,
                             tensor_input, walk)
from taskmap.errors import ComputeError
from taskmap.ir import f16, f32, i32, i64
from taskmap.ir import expr as E
from taskmap.ir.expr import SizeVar


def test_nodes_record_their_inputs_and_types():
    x = tensor_input("x", "float32", [4, 6])
    b = tensor_input("b", f32, [6])
    y = compute("y", [4, 6], lambda i, j: x[i, j] + b[j])
    s = reduce("s", [4], lambda i, k: y[i, k] * y[i, k], [6], "sum")
    assert isinstance(x, TensorInput) and isinstance(y, ComputeNode) and isinstance(s, ReduceNode)
    assert y.inputs == (x, b) and s.inputs == (y,)
    assert y.dtype is f32 and y.shape == (4, 6) and s.shape == (4,) and s.reduce_shape == (6,)
    assert s.op is ReduceOp.SUM and s.acc_dtype is f32
    assert walk(s) == [x, b, y, s] and graph_inputs(s) == [x, b]
    assert [a.name for a in y.axes] == ["i", "j"]  # named after fcompute's parameters


def test_nodes_are_immutable_and_compare_by_identity():
    x = tensor_input("x", f32, [3])
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.name = "y"  # type: ignore[misc]
    assert tensor_input("x", f32, [3]) != x and x == x


def test_printing_lists_the_dag():
    x = tensor_input("x", f32, [4, 6])
    y = compute("y", [4, 6], lambda i, j: x[i, j] * 2.0)
    m = reduce("m", [4], lambda i, k: y[i, k], [6], "max")
    text = dag_str(m)
    assert text.splitlines() == ["x = tensor_input('x', f32, [4, 6])", "y[i, j] = x[i, j] * 2.0",
                                 "m[i_1] = max(y[i_1, k] for k < 6)"]
    assert repr(m) == text


def test_symbolic_shapes():
    x = tensor_input("x", f32, ["n", 8])
    y = compute("y", [SizeVar("n"), 8], lambda i, j: x[i, j])
    assert x.shape == (SizeVar("n"), 8) and not x.is_static and not y.is_static
    assert "tensor_input('x', f32, [n, 8])" in repr(y)


def test_dtype_and_accumulator():
    x = tensor_input("x", f16, [5])
    s = reduce("s", [1], lambda i, k: x[k], [5], "sum")
    assert s.dtype is f16 and s.acc_dtype is f32
    c = compute("c", [5], lambda i: x[i], dtype="float32")
    assert c.dtype is f32
    n = reduce("n", [1], lambda i, k: x[k], [5], "max", dtype=f32)
    assert n.dtype is f32


@pytest.mark.parametrize("op,dtype,value", [("sum", f32, 0.0), ("prod", i32, 1), ("max", f32, float("-inf")),
                                            ("min", i64, 2**63 - 1), ("max", i32, -(2**31))])
def test_reduce_identities(op, dtype, value):
    assert ReduceOp(op).identity(dtype).value == value


def test_float_max_propagates_nan_as_a_select():
    a, b = E.var("a", f32), E.var("b", f32)
    m = ReduceOp.MAX.combine(a, b)
    assert isinstance(m, E.Select)  # not fmaxf: CPU vector loops stay vectorized
    assert isinstance(ReduceOp.MAX.combine(E.var("p", i32), E.var("q", i32)), E.Binary)


def test_index_casts_to_i32():
    x = tensor_input("x", f32, [4])
    idx = tensor_input("idx", i64, [4])
    g = compute("g", [4], lambda i: x[idx[i]])
    load = g.value
    assert isinstance(load, E.Load) and load.indices[0].dtype is i32


@pytest.mark.parametrize("make,message", [
    (lambda x: compute("y", [4], lambda i: x[i]), "indexed with 1"),
    (lambda x: compute("y", [4], lambda i, j: x[i, j]), "must take 1 index argument"),
    (lambda x: compute("y", [4, 0], lambda i, j: x[i, j]), "dimensions must be positive"),
    (lambda x: compute("y", [4, 4], lambda i, j: x), "index it"),
    (lambda x: compute("y", [4, 4], lambda i, j: "text"), "must return an IR expression"),
    (lambda x: compute("y", [4, 4], lambda i, j: x[i, j * 1.5]), "indices must be integers"),
    (lambda x: reduce("y", [4], lambda i, k: x[i, k], [4], "mean"), "unknown reduction"),
    (lambda x: reduce("y", [4], lambda i: x[i, 0], [], "sum"), "at least one dimension"),
    (lambda x: compute("y", [4, 4], lambda i, j: E.Load(E.var("t", f32[4, 4]), (i, j))), "not a node"),
    (lambda x: tensor_input("z", f32, [2.5]), "ints or symbolic sizes"),
])
def test_malformed_definitions(make, message):
    x = tensor_input("x", f32, [4, 4])
    with pytest.raises(ComputeError, match=message):
        make(x)
    assert issubclass(ComputeError, ValueError)
