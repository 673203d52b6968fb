"""Compiling a graph lowers its fusion groups and builds their kernels on a few threads while
the next groups are lowered: the progress bar counts the groups, groups of the same shapes share
one kernel, and a build's error reaches the caller."""
import gc

import numpy as np
import pytest
from tqdm import tqdm

from taskmap.errors import BuildError
from taskmap.graph import Conv2dAttrs, GraphBuilder, OpKind, UnaryAttrs, UnaryFn
from taskmap.ir.dtypes import f32
from taskmap.runtime import graph as runtime_graph
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(11)


def two_convs():
    """conv -> relu -> conv -> relu on 16 channels: two fusion groups with the same kernel."""
    b = GraphBuilder()
    y = b.input((1, 16, 8, 8), f32)
    ws = [RNG.standard_normal((16, 16, 3, 3)).astype(np.float32) / 10 for _ in range(2)]
    for w in ws:
        y = b.op(OpKind.CONV2D, [y, b.constant(w)], Conv2dAttrs((1, 1), (1, 1), (1, 1), 1))
        y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))
    return b.build([y]), ws


class Recording(tqdm):
    """The progress bar, keeping (description, count, total) of each bar when it closes."""

    closed: dict = {}

    def close(self):
        Recording.closed[id(self)] = (self.desc, self.n, self.total)
        super().close()


def test_progress_bar_counts_the_groups(capsys, monkeypatch):
    graph, ws = two_convs()
    monkeypatch.setattr(runtime_graph, "tqdm", Recording)
    Recording.closed.clear()
    cg = CompiledGraph(graph, "cpu", "numpy", progress=True)
    assert "taskmap: compiling" in capsys.readouterr().err
    assert list(Recording.closed.values()) == [("taskmap: compiling graph", 2, 2)]
    assert len(cg.steps) == 2 and cg.steps[0].kernel is cg.steps[1].kernel     # same shapes: one kernel
    x = RNG.standard_normal((1, 16, 8, 8)).astype(np.float32)
    want = x
    for w in ws:
        want = np.maximum(_conv3x3(want, w), 0)
    np.testing.assert_allclose(cg(x)[0], want, rtol=1e-4, atol=1e-4)


def test_a_build_error_reaches_the_caller(monkeypatch):
    graph, _ = two_convs()

    def fail(self, *args):
        raise BuildError("gcc failed (injected)")
    monkeypatch.setattr(runtime_graph.Kernel, "build", fail)
    with pytest.raises(BuildError, match="injected"):
        CompiledGraph(graph, "cpu", "numpy", progress=False)


def test_the_garbage_collector_pauses_while_compiling_and_comes_back(monkeypatch):
    graph, _ = two_convs()
    seen = []
    build = runtime_graph.build_steps

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return build(*args, **kwargs)
    monkeypatch.setattr(runtime_graph, "build_steps", spy)
    assert gc.isenabled()
    CompiledGraph(graph, "cpu", "numpy", progress=False)
    assert seen == [False] and gc.isenabled()
    with monkeypatch.context() as m, pytest.raises(BuildError):      # a failed compile gives it back too
        m.setattr(runtime_graph.Kernel, "build", lambda self, *a: (_ for _ in ()).throw(BuildError("x")))
        CompiledGraph(two_convs()[0], "cpu", "numpy", progress=False)
    assert gc.isenabled()
    gc.disable()                              # ... and leaves it off when the caller had turned it off
    try:
        CompiledGraph(graph, "cpu", "numpy", progress=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def _conv3x3(x, w):
    """Stride 1, padding 1, NCHW (numpy reference)."""
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out.astype(np.float32)
