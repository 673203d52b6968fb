"""Every DSL error points at the user's file, absolute line, original column, with a caret.

Kernels that must fail carry a marker comment ``# E:<tag>`` on the line the error points at.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

from taskmap.errors import DSLError
from taskmap.ir.func import FuncKind
from taskmap.lang import (attrs, bitcast, f32, func, i32, i64, shared_tensor, spatial, threadIdx, transpile, u8,
                          unroll)

THIS = pathlib.Path(__file__)
LINES = THIS.read_text(encoding="utf-8").splitlines()


def marked(tag: str) -> tuple[int, str]:
    hits = [n for n, line in enumerate(LINES, 1) if line.rstrip().endswith(f"# E:{tag}")]
    assert len(hits) == 1, f"marker E:{tag} found {len(hits)} times"
    return hits[0], LINES[hits[0] - 1]


def check_location(err: DSLError, filename: str, lineno: int, line: str, col: int) -> None:
    assert os.path.samefile(err.filename, filename)
    assert err.lineno == lineno, (err.lineno, lineno, str(err))
    assert err.source_line == line
    assert err.col == col, (err.col, col, str(err))
    text = str(err).splitlines()
    assert text[0].startswith(f"{err.filename}:{lineno}:{col + 1}: error: ")
    assert text[1] == "    " + line.strip()
    indent = len(line) - len(line.lstrip())
    assert text[2] == "    " + " " * (col - indent) + "^"


def expect_error(fn, tag: str, at: str | int, message: str, kind: FuncKind | None = None) -> DSLError:
    lineno, line = marked(tag)
    with pytest.raises(DSLError) as info:
        transpile(fn, kind)
    err = info.value
    assert message in err.msg, err.msg
    check_location(err, str(THIS), lineno, line, at if isinstance(at, int) else line.index(at))
    return err


# ----------------------------------------------------------------------------- names and indexing


def undefined(a: f32[4]):
    for i in range(4):
        a[i] = undefined_name + 1.0  # noqa: F821  # E:undef


def test_undefined_name():
    err = expect_error(undefined, "undef", "undefined_name", "name 'undefined_name' is not defined")
    assert "error: name 'undefined_name' is not defined" in str(err)


def test_undefined_name_in_indented_kernel_with_unicode():
    def k(a: f32[4]):
        s = "héllo, wörld"; a[0] = missing  # noqa: E702,F821  # E:unicode

    expect_error(k, "unicode", "missing", "name 'missing' is not defined")


def indexing(a: f32[4, 4], c: f32[4, 4]):
    for i in range(4):
        c[i, 0, 1] = 1.0  # E:too_many


def too_few(a: f32[4, 4], c: f32[4]):
    for i in range(4):
        c[i] = a[i] * 2.0  # E:too_few


def chained_too_many(a: f32[4, 4], c: f32[4]):
    c[0] = a[0][1][2]  # E:chained


def test_index_counts():
    expect_error(indexing, "too_many", "c[i", "tensor 'c' has 2 dimensions but is indexed with 3 indices")
    expect_error(too_few, "too_few", "a[i]", "tensor 'a' has 2 dimensions but is indexed with 1 index")
    expect_error(chained_too_many, "chained", "a[0]", "tensor 'a' has 2 dimensions but is indexed with 3 indices")


def float_index(a: f32[4]):
    a[0] = a[0.5]  # E:float_index


def test_float_index():
    expect_error(float_index, "float_index", "0.5", "tensor indices must be integers")


def before_assignment(a: f32[4]):
    a[0] = y  # E:before
    y = a[1]


def loop_var_after_loop(a: f32[4]):
    for i in range(4):
        a[i] = 0.0
    a[i] = 1.0  # E:after_loop


def loop_carried(a: f32[8]):
    for i in range(8):
        if i > 0:
            a[i] = prev  # noqa: F821  # E:carried
        prev = a[i]


def test_local_scoping_errors():
    expect_error(before_assignment, "before", "y", "local variable 'y' is referenced before assignment")
    expect_error(loop_carried, "carried", "prev", "to carry a value across loop iterations, assign it before")
    expect_error(loop_var_after_loop, "after_loop", 6, "loop variable 'i' cannot be used after its loop")


# ----------------------------------------------------------------------------- tensors


def reassign_tensor(a: f32[4]):
    a = 1.0  # noqa: F841  # E:reassign


def tensor_as_scalar(a: f32[4], b: f32[4]):
    b[0] = a + 1.0  # E:as_scalar


def shared_dynamic(a: f32[4], n: i32):
    attrs.block_dim = 4
    buf = shared_tensor(f32, [n, 4])  # noqa: F841  # E:dyn_shape


def shared_in_cpu(a: f32[4]):
    buf = shared_tensor(f32, [4])  # noqa: F841  # E:shared_cpu


def test_tensor_errors():
    expect_error(reassign_tensor, "reassign", "a =", "cannot assign to tensor 'a'")
    expect_error(tensor_as_scalar, "as_scalar", "a + 1", "tensor 'a' cannot be used as a scalar value")
    expect_error(shared_dynamic, "dyn_shape", "[n, 4]", "shape of shared_tensor() must be a list of compile-time")
    expect_error(shared_in_cpu, "shared_cpu", "shared_tensor(", "shared_tensor() can only be used in GPU kernels",
                 kind=FuncKind.CPU_KERNEL)


# ----------------------------------------------------------------------------- loops


def wrong_targets(a: f32[4, 4]):
    for i in spatial(4, 4).on(0):  # E:targets
        a[i, 0] = 0.0


def step_zero(a: f32[8]):
    for i in range(0, 8, 0):  # E:step0
        a[i] = 0.0


def step_dynamic(a: f32[8], n: i32):
    for i in range(0, 8, n):  # E:step_dyn
        a[i] = 0.0


def unroll_dynamic(a: f32[8], n: i32):
    for i in unroll(n):  # E:unroll_dyn
        a[i] = 0.0


def not_iterable(a: f32[8]):
    for i in 5:  # E:not_iterable
        a[i] = 0.0


def break_in_mapping(a: f32[8]):
    for i in spatial(8).on(0):
        break  # E:break_mapping


def test_loop_errors():
    expect_error(wrong_targets, "targets", "i in", "has 2-D tasks but the loop has 1 loop variable(s)")
    step = LINES[marked("step0")[0] - 1].index("range(0, 8, 0)") + len("range(0, 8, ")
    expect_error(step_zero, "step0", step, "the step of range() must not be zero")
    expect_error(step_dynamic, "step_dyn", step, "the step of range() must be a compile-time int")
    expect_error(unroll_dynamic, "unroll_dyn", "unroll(", "unroll() needs compile-time bounds")
    expect_error(not_iterable, "not_iterable", "5", "cannot iterate over 5 (a Python int)")
    expect_error(break_in_mapping, "break_mapping", "break", "not supported directly inside a task-mapping loop")


# ----------------------------------------------------------------------------- calls


def py_helper(x):
    return x * 2


def calls_python_with_ir(a: f32[4]):
    a[0] = py_helper(a[1])  # E:py_call


def bad_compile_time(a: f32[4]):
    for i in spatial(0).on(0):  # E:ct_eval
        a[i] = 0.0


@func
def add_to(t: f32[4], v: f32):
    t[0] += v


def device_arg_count(a: f32[4]):
    add_to(a)  # E:dev_count


def device_arg_kind(a: f32[4]):
    add_to(a[0], 1.0)  # E:dev_kind


def test_call_errors():
    expect_error(calls_python_with_ir, "py_call", "py_helper(", "cannot call py_helper() with run-time values")
    expect_error(bad_compile_time, "ct_eval", "spatial(0)",
                 "error while evaluating `spatial(0)` at compile time: ValueError")
    expect_error(device_arg_count, "dev_count", "add_to(", "device function 'add_to' takes 2 argument(s) but 1")
    expect_error(device_arg_kind, "dev_kind", "a[0]", "argument 't' of 'add_to' must be a tensor f32[4]")


# ----------------------------------------------------------------------------- kernels and signatures


def no_block_dim(a: f32[32]):  # E:no_block
    a[threadIdx.x] = 0.0


def nested_attrs(a: f32[32]):
    for i in range(2):
        attrs.block_dim = 32  # E:nested_attrs


def unknown_attr(a: f32[32]):
    attrs.shared_mem = 32  # E:unknown_attr


def dynamic_launch(a: f32[32], n: i32):
    attrs.block_dim = n  # E:dyn_launch


def negative_min_blocks(a: f32[32]):
    attrs.block_dim = 32
    attrs.min_blocks = -1  # E:min_blocks


def dynamic_min_blocks(a: f32[32], n: i32):
    attrs.block_dim = 32
    attrs.min_blocks = n  # E:dyn_min_blocks


def missing_annotation(a, b: f32[4]):  # E:no_ann
    pass


def bad_annotation(a: int):  # E:bad_ann
    pass


def kernel_returns(a: f32[4]) -> f32:  # E:ret_ann
    pass


def kernel_return_value(a: f32[4]):
    return a[0]  # E:ret_value


def compile_time_assert(a: f32[4]):
    assert len(a.shape) == 2, "expected a matrix"  # E:assert


def test_kernel_errors():
    expect_error(no_block_dim, "no_block", "def", "GPU kernel 'no_block_dim' must set attrs.block_dim "
                                                  "(it uses threadIdx.x)")
    expect_error(nested_attrs, "nested_attrs", "attrs", "can only be set at the top level of the kernel body")
    expect_error(unknown_attr, "unknown_attr", "attrs", "unknown kernel attribute attrs.shared_mem")
    expect_error(dynamic_launch, "dyn_launch", "n  #", "can only use compile-time values and symbolic sizes")
    expect_error(negative_min_blocks, "min_blocks", "-1", "attrs.min_blocks must be a compile-time int >= 0")
    expect_error(dynamic_min_blocks, "dyn_min_blocks", "n  #", "attrs.min_blocks must be a compile-time int >= 0")
    expect_error(missing_annotation, "no_ann", "a, b", "parameter 'a' needs a type annotation")
    expect_error(bad_annotation, "bad_ann", "int", "invalid annotation for parameter 'a'")
    expect_error(kernel_returns, "ret_ann", "f32:", "a kernel cannot return a value")
    expect_error(kernel_return_value, "ret_value", "a[0]", "a kernel cannot return a value")
    expect_error(compile_time_assert, "assert", "assert", "assertion failed: expected a matrix")


def test_unsupported_syntax_in_this_file():
    def outer():
        x = 0

        def k(a: f32[4]):
            nonlocal x  # E:nonlocal
            a[0] = 1.0
        return k

    expect_error(outer(), "nonlocal", "nonlocal", "unsupported syntax: nonlocal statement")


def test_source_not_available():
    ns: dict = {}
    exec("from taskmap.lang import f32\ndef k(a: f32[4]):\n    a[0] = 1.0\n", ns)  # noqa: S102
    with pytest.raises(DSLError, match="cannot read the source code of 'k'"):
        transpile(ns["k"])
    lam = lambda a: None  # noqa: E731
    with pytest.raises(DSLError, match="must be defined with `def`"):
        transpile(lam)
    with pytest.raises(TypeError, match="expected a Python function"):
        transpile(print)


# ----------------------------------------------------------------------------- unsupported syntax


HEADER = "from taskmap.lang import *\nG = 1\n\n\ndef k(a: f32[8], n: i32):\n"
SYNTAX_CASES = [
    ("with", "    with open('x') as fh:\n        pass\n", "with open", "with statement"),
    ("lambda", "    f = lambda x: x\n", "lambda", "lambda"),
    ("listcomp", "    xs = [i for i in range(3)]\n", "[i for", "list comprehension"),
    ("setcomp", "    xs = {i for i in range(3)}\n", "{i for", "set comprehension"),
    ("dictcomp", "    xs = {i: i for i in range(3)}\n", "{i:", "dict comprehension"),
    ("genexp", "    g = (i for i in range(3))\n", "(i for", "generator expression"),
    ("try", "    try:\n        pass\n    except Exception:\n        pass\n", "try", "try statement"),
    ("global", "    global G\n", "global", "global statement"),
    ("yield", "    yield 1\n", "yield", "yield"),
    ("class", "    class C:\n        pass\n", "class", "class definition"),
    ("import", "    import math\n", "import", "import statement"),
    ("importfrom", "    from math import exp\n", "from", "import statement"),
    ("fstring", "    s = f'{n}'\n", "f'", "f-string"),
    ("dict", "    d = {1: 2}\n", "{1", "dict literal"),
    ("set", "    s = {1, 2}\n", "{1", "set literal"),
    ("starred", "    a[0] = max(*a)\n", "*a", "starred expression"),
    ("walrus", "    a[0] = (y := 3)\n", "y :=", "assignment expression (:=)"),
    ("del", "    del n\n", "del", "del statement"),
    ("raise", "    raise ValueError('x')\n", "raise", "raise statement"),
    ("def", "    def g():\n        pass\n", "def g", "nested function definition"),
    ("slice", "    a[0] = a[1:3]\n", "1:3", "slice"),
    ("matmul", "    a[0] = n @ n\n", "n @ n", "@ operator"),
    ("for_else", "    for i in range(3):\n        pass\n    else:\n        pass\n", "for i", "for ... else"),
    ("while_else", "    while n > 0:\n        n -= 1\n    else:\n        pass\n", "while", "while ... else"),
    ("match", "    match n:\n        case 1:\n            pass\n", "match", "match statement"),
    ("kwargs", "    a[0] = max(n, **G)\n", "G)", "**kwargs in a call"),
    ("is", "    a[0] = n is None\n", "n is", "'is' comparison of run-time values"),
    ("attr_store", "    a.x = 1\n", "a.x", "assignment to an attribute"),
    ("string_index", "    a[0] = a['x']\n", "'x'", "cannot use 'x' (a Python str) as a value"),
]


def load_module(tmp_path: pathlib.Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path


@pytest.mark.parametrize("name,body,at,what", SYNTAX_CASES, ids=[c[0] for c in SYNTAX_CASES])
def test_unsupported_syntax(tmp_path, name, body, at, what):
    source = HEADER + body
    mod, path = load_module(tmp_path, f"dsl_syntax_{name}", source)
    lines = source.splitlines()
    first_body_line = HEADER.count("\n")
    lineno = next(n for n, line in enumerate(lines, 1) if n > first_body_line and at in line)
    with pytest.raises(DSLError) as info:
        transpile(mod.k)
    err = info.value
    assert what in err.msg, err.msg
    check_location(err, str(path), lineno, lines[lineno - 1], lines[lineno - 1].index(at))


def test_async_kernel(tmp_path):
    mod, path = load_module(tmp_path, "dsl_async", "from taskmap.lang import f32\n\n\nasync def k(a: f32[4]):\n"
                                                   "    pass\n")
    with pytest.raises(DSLError, match="unsupported syntax: async function definition") as info:
        transpile(mod.k)
    assert info.value.lineno == 4 and info.value.col == 0


# ----------------------------------------------------------------------------- locals and helpers


def rebind_in_loop(a: f32[8]):
    m = spatial(8)
    for i in range(2):
        m = spatial(4)  # E:rebind
    for j in m.on(0):
        a[j] = 0.0


def const_from_branch(a: f32[8], n: i32):
    if n > 0:
        m = spatial(8)
    else:
        m = spatial(4)
    for j in m.on(0):  # E:const_branch
        a[j] = 0.0


def tensor_from_branch(a: f32[8], n: i32):
    attrs.block_dim = 8
    if n > 0:
        buf = shared_tensor(f32, [8])
        buf[0] = 1.0
    a[0] = buf[0]  # E:tensor_branch


def unpack_count(a: f32[8]):
    x, y = 1, 2, 3  # E:unpack


def scalar_local_annotated_as_tensor(a: f32[8]):
    t: f32[8] = 0.0  # E:ann_tensor


def runtime_after_compile_time(a: f32[8]):
    m = (1, 2)
    m = a[0]  # E:ct_then_rt


@func
def no_return(x: f32) -> f32:  # E:no_return
    x = x + 1.0


@func
def empty_return(x: f32) -> f32:
    if x > 0.0:
        return  # E:empty_return
    return x


def test_local_and_helper_errors():
    expect_error(rebind_in_loop, "rebind", "m =", "cannot rebind the compile-time name 'm' inside a run-time loop")
    expect_error(const_from_branch, "const_branch", "m.on", "'m' was bound to a compile-time value inside a run-time")
    expect_error(tensor_from_branch, "tensor_branch", "buf[0]", "tensor 'buf' is declared inside a loop or branch")
    expect_error(unpack_count, "unpack", "x, y", "cannot unpack 3 values into 2 targets")
    expect_error(scalar_local_annotated_as_tensor, "ann_tensor", "f32[8]", "can only be annotated with a scalar type")
    expect_error(runtime_after_compile_time, "ct_then_rt", "m =", "'m' holds the compile-time value (1, 2)")
    expect_error(no_return, "no_return", "def", "'no_return' declares a return type (f32) but never returns")
    expect_error(empty_return, "empty_return", "return", "'empty_return' must return a f32 value")


def test_multiline_string_less_indented_than_the_kernel():
    def k(a: f32[4]):
        s = """first line
second line at column 0"""
        a[0] = nowhere  # noqa: F821  # E:dedent_fallback

    expect_error(k, "dedent_fallback", "nowhere", "name 'nowhere' is not defined")


# ----------------------------------------------------------------------------- bitcast


def bitcast_size(a: f32[4], b: i64[4]):
    for i in range(4):
        b[i] = bitcast(a[i], i64)  # E:bitcast_size


def bitcast_not_a_type(a: f32[4], b: i32[4]):
    for i in range(4):
        b[i] = bitcast(a[i], 32)  # E:bitcast_type


def bitcast_bool(a: f32[4], b: i32[4]):
    for i in range(4):
        b[i] = bitcast(a[i] > 0.0, u8)  # E:bitcast_bool


def test_bitcast_errors():
    expect_error(bitcast_size, "bitcast_size", "bitcast(",
                 "cannot bit-cast f32 (32 bits) to i64 (64 bits): the types must have the same size")
    expect_error(bitcast_not_a_type, "bitcast_type", "32", "bitcast() needs a scalar type such as i32, got 32")
    expect_error(bitcast_bool, "bitcast_bool", "bitcast(", "cannot bit-cast bool to u8")
