"""Structural expression nodes cache their hash (trees are hashed over and over as memo keys);
the cache must never outlive the process that computed it."""
import os
import pickle
import subprocess
import sys

from taskmap.ir import expr as E


def _tree():
    n = E.SizeVar("n")                       # a string field: its hash differs between processes
    return E.Binary(E.BinOp.ADD, E.Binary(E.BinOp.MUL, n, E.Const(3)), E.CallFunc("helper", (n,), E.i32))


def test_equal_trees_hash_alike_and_the_hash_is_kept():
    a, b = _tree(), _tree()
    assert a is not b and a == b and hash(a) == hash(b)
    assert a.__dict__["_hash"] == hash(a)
    assert {a: 1}[b] == 1


def test_a_pickled_tree_hashes_as_built_in_the_loading_process():
    a = _tree()
    hash(a)                                  # cached here, under this process's string hashes
    code = ("import pickle, sys; from test_expr_hash import _tree; t = pickle.loads(sys.stdin.buffer.read());"
            "fresh = _tree(); assert '_hash' not in t.__dict__; assert hash(t) == hash(fresh);"
            "assert {fresh: 1}[t] == 1; print('ok')")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.path.dirname(__file__)}
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(a), capture_output=True, env=env,
                         timeout=120)
    assert out.stdout.decode().strip() == "ok", out.stderr.decode()[-2000:]


def test_scalar_types_unpickle_as_the_unique_instances():
    for t in (E.i32, E.f32, E.bool_):
        assert pickle.loads(pickle.dumps(t)) is t
    c = E.Const(2.5, E.f32)
    assert pickle.loads(pickle.dumps(c)) == c
