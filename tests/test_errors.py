"""taskmap.errors: the formatting users see, and that errors survive pickling."""

import pickle

import pytest

from taskmap.errors import (
    BuildError,
    CacheError,
    DSLError,
    IRError,
    LaunchError,
    TaskmapError,
    UnsupportedError,
)

LINE = "        c[i] = a[i] + undefined_name\n"


def test_dsl_error_points_at_user_code():
    err = DSLError("name 'undefined_name' is not defined", "path/to/file.py", 12, 22, LINE)
    assert str(err) == (
        "path/to/file.py:12:23: error: name 'undefined_name' is not defined\n"
        "    c[i] = a[i] + undefined_name\n"
        "                  ^"
    )
    assert (err.filename, err.lineno, err.col, err.msg) == (
        "path/to/file.py", 12, 22, "name 'undefined_name' is not defined",
    )


def test_dsl_error_keeps_tabs_aligned():
    err = DSLError("bad", "k.py", 3, 5, "\tx =\ty")
    assert str(err).splitlines()[1:] == ["    x =\ty", "    " + "   \t" + "^"]


def test_dsl_error_without_location():
    assert str(DSLError("unsupported statement")) == "<unknown>: error: unsupported statement"
    assert str(DSLError("oops", "k.py", 7)) == "k.py:7: error: oops"
    assert str(DSLError("oops", "k.py", 7, 0, "   ")) == "k.py:7:1: error: oops"


def test_build_error_carries_source_command_and_log_tail():
    log = "\n".join(f"line {i}" for i in range(100))
    err = BuildError("gcc failed", log, "/tmp/build/kernel.c", ["gcc", "-O3", "-shared", "my file.c"])
    text = str(err)
    assert text.startswith("gcc failed\n")
    assert "generated source: /tmp/build/kernel.c" in text
    assert "reproduce with: gcc -O3 -shared 'my file.c'" in text
    assert "compiler log (last 60 of 100 lines):" in text
    assert "line 99" in text and "line 40" in text and "line 39" not in text
    assert err.log == log


def test_build_error_short():
    err = BuildError("nvrtc failed", "error: x", command="nvrtc --gpu-architecture=sm_90 k.cu")
    assert str(err) == (
        "nvrtc failed\n  reproduce with: nvrtc --gpu-architecture=sm_90 k.cu\n"
        "  compiler log:\n    error: x"
    )
    assert str(BuildError("failed")) == "failed"


def test_hierarchy():
    for cls in (DSLError, IRError, LaunchError, BuildError, UnsupportedError, CacheError):
        assert issubclass(cls, TaskmapError)
    assert issubclass(LaunchError, ValueError)
    with pytest.raises(ValueError):
        raise LaunchError("expected float32[1024], got float64[1024] for argument 'a'")


@pytest.mark.parametrize(
    "err",
    [
        DSLError("m", "f.py", 1, 2, "x = y"),
        BuildError("m", "log", "/tmp/k.c", ["gcc"]),
        LaunchError("m"),
        IRError("m"),
    ],
)
def test_errors_pickle(err):
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and str(again) == str(err)
