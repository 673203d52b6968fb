"""A compiled graph's kernel steps on the CPU: bound once (``CompiledKernel.bind_host``) at the
first run, then launched by data pointers — on new inputs and fresh output arrays every run —
while the graph still checks the inputs it is given."""
import dataclasses

import numpy as np
import pytest
import torch

from taskmap.errors import LaunchError
from taskmap.graph import (
    AxisAttrs,
    BinaryAttrs,
    BinaryFn,
    GraphBuilder,
    OpKind,
    UnaryAttrs,
    UnaryFn,
    kinds,
)
from taskmap.graph.attrs import InputRef, TorchAttrs
from taskmap.ir.dtypes import f32
from taskmap.runtime.args import data_ptr
from taskmap.runtime.graph import CompiledGraph
from taskmap.runtime.kernel import CompiledKernel, HostLaunch

RNG = np.random.default_rng(17)


def mlp(layers=3, width=16):
    """``layers`` x (linear -> tanh), then ``* 2`` and ``exp``: kernels reading constants,
    planned intermediates, the graph input, and writing the graph's output."""
    b = GraphBuilder()
    x = b.input((4, width), f32)
    y, ws = x, []
    for _ in range(layers):
        w = RNG.standard_normal((width, width)).astype(np.float32) / 4
        ws.append(w)
        y = b.op(OpKind.LINEAR, [y, b.constant(w), b.constant(np.full(width, 0.1, np.float32))])
        y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.TANH))
    y = b.op(OpKind.BINARY, [y], BinaryAttrs(BinaryFn.MUL, 2.0))
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.EXP))
    return b.build([y]), ws


def reference(x, ws):
    for w in ws:
        x = np.tanh(x @ w.T + 0.1)
    return np.exp(2 * x)


class Counting:
    """Counts the calls of ``CompiledKernel.bind_host`` and ``CompiledKernel.prepare``."""

    def __init__(self, monkeypatch):
        self.bound = self.prepared = 0
        bind, prepare = CompiledKernel.bind_host, CompiledKernel.prepare

        def counted_bind(kernel, *args):
            self.bound += 1
            return bind(kernel, *args)

        def counted_prepare(kernel, *args):
            self.prepared += 1
            return prepare(kernel, *args)
        monkeypatch.setattr(CompiledKernel, "bind_host", counted_bind)
        monkeypatch.setattr(CompiledKernel, "prepare", counted_prepare)


@pytest.mark.parametrize("library", ["torch", "numpy"])
@pytest.mark.parametrize("fuse", [True, False])
def test_steps_bind_once_and_run_on_new_arrays(monkeypatch, library, fuse):
    graph, ws = mlp()
    cg = CompiledGraph(graph, "cpu", library, fuse=fuse)
    kernels = sum(s.kernel is not None for s in cg.steps)
    assert kernels >= 2
    calls = Counting(monkeypatch)
    outs = []
    for run in range(4):
        x = RNG.standard_normal((4, 16)).astype(np.float32)
        (out,) = cg(torch.from_numpy(x) if library == "torch" else x)
        np.testing.assert_allclose(np.asarray(out), reference(x, ws), rtol=1e-5, atol=1e-6)
        outs.append(out)                                 # kept alive: every run's output is new memory
        if run == 0:
            first = (calls.bound, calls.prepared)        # (unfused linears: their runners bind too)
            assert calls.bound >= kernels and calls.prepared == calls.bound     # bind_host prepares once
        assert (calls.bound, calls.prepared) == first    # later runs: addresses only
    assert len({data_ptr(o) for o in outs}) == len(outs)


def test_a_bound_graph_still_checks_its_inputs():
    graph, ws = mlp(layers=1)
    cg = CompiledGraph(graph, "cpu", "torch")
    x = torch.randn(4, 16)
    cg(x)
    with pytest.raises(LaunchError, match=r"expected float32\[4, 16\] on cpu, got float32\[5, 16\]"):
        cg(torch.randn(5, 16))
    with pytest.raises(LaunchError, match=r"got float64\[4, 16\]"):
        cg(x.double())
    with pytest.raises(LaunchError, match="takes 1 inputs, got 2"):
        cg(x, x)
    xt = torch.randn(16, 4).t()                            # not contiguous: copied, then bound by address
    np.testing.assert_allclose(cg(xt)[0].numpy(), reference(xt.numpy(), ws), rtol=1e-5, atol=1e-6)


def test_a_runner_result_of_another_dtype_is_an_error(monkeypatch):
    """Kernels read the runners' results by address: a result unlike the inferred tensor is
    reported, not read."""
    softmax = OpKind.SOFTMAX.definition
    monkeypatch.setitem(kinds._DEFS, OpKind.SOFTMAX,
                        dataclasses.replace(softmax, run=lambda args, attrs: softmax.run(args, attrs).double()))
    b = GraphBuilder()
    y = b.op(OpKind.SOFTMAX, [b.input((3, 8), f32)], AxisAttrs(1))
    cg = CompiledGraph(b.build([b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.EXP))]), "cpu", "torch", fuse=False)
    assert [s.kernel is None for s in cg.steps] == [True, False]
    with pytest.raises(LaunchError, match=r"returned float64\[3, 8\], expected float32\[3, 8\]"):
        cg(torch.randn(3, 8))


@pytest.mark.parametrize("chain", ["1", "0"])
def test_later_runs_chain_the_kernel_steps_between_the_runners(monkeypatch, chain):
    """From the second run on, each run of consecutive kernel steps is one call into C (a
    ``HostChain``), the runner steps between them run as before; the graph's inputs and outputs
    and the runners' results are new arrays each run.  ``TASKMAP_HOST_CHAIN=0``: step by step."""
    monkeypatch.setenv("TASKMAP_HOST_CHAIN", chain)
    b = GraphBuilder()
    x = b.input((4, 16), f32)
    w1, w2 = (RNG.standard_normal((16, 16)).astype(np.float32) / 4 for _ in range(2))
    y = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [x, b.constant(w1)])], UnaryAttrs(UnaryFn.TANH))
    s = b.op(OpKind.TORCH, [y], TorchAttrs(torch.softmax, (InputRef(0), 1), ()))     # a runner: PyTorch
    z = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [s, b.constant(w2)])], UnaryAttrs(UnaryFn.EXP))
    cg = CompiledGraph(b.build([y, z]), "cpu", "torch")           # y: an output a runner reads
    runner = [s.kernel is None for s in cg.steps].index(True)
    assert 0 < runner < len(cg.steps) - 1
    outs = []
    for run in range(4):
        xv = RNG.standard_normal((4, 16)).astype(np.float32)
        got = [o.numpy() for o in cg(torch.from_numpy(xv))]
        yr = np.tanh(xv @ w1.T)
        e = np.exp(yr - yr.max(1, keepdims=True))
        np.testing.assert_allclose(got[0], yr, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], np.exp((e / e.sum(1, keepdims=True)) @ w2.T), rtol=1e-5, atol=1e-6)
        outs.extend(got)
        if run == 0 and chain == "1":     # chained: the bound launches are not called from Python again
            segments = [seg if isinstance(seg, int) else len(seg[0]) for seg in cg._segments]
            assert segments[runner] == runner and len(segments) == 3
            assert sum(segments[:runner]) + sum(segments[runner + 1:]) == sum(len(s.kernels) for s in cg.steps)

            def not_called(*args):
                raise AssertionError("a chained launch ran from Python")
            monkeypatch.setattr(HostLaunch, "__call__", not_called)
    assert (cg._segments is None) == (chain == "0")
    assert len({data_ptr(o) for o in outs}) == len(outs)


def test_profile_times_every_step_and_leaves_results_intact():
    """``CompiledGraph.profile``: one row per step (name, kind, positive median seconds), slowest
    first; the graph still computes the right values afterwards; ``CompiledModule.profile``
    prints the same steps as a table."""
    graph, ws = mlp()
    cg = CompiledGraph(graph, "cpu", "numpy")
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    rows = cg.profile(x, rounds=3)
    assert sorted(r[0] for r in rows) == sorted(s.name for s in cg.steps)
    assert all(r[2] > 0 for r in rows) and [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    assert {r[1] for r in rows} <= {k.name.lower() for k in OpKind}
    np.testing.assert_allclose(cg(x)[0], reference(x, ws), rtol=1e-5, atol=1e-6)

    import taskmap
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)).eval()
    xt = torch.randn(3, 16)
    cm = taskmap.compile(model, progress=False)
    with torch.no_grad():
        table = cm.profile(xt, rounds=2)
        torch.testing.assert_close(cm(xt), model(xt), rtol=1e-4, atol=1e-5)
    steps = cm.entries[next(iter(cm.entries))].compiled.steps
    assert table.splitlines()[0].startswith(f"Sequential: {len(steps)} steps")
    assert all(s.name in table for s in steps)
    assert "matmul_cpu" in table          # the kernel column: the linears' template kernel
    # the GFLOP/s column: a number on the linears' rows (their FLOPs: test_op_flops)
    assert "GFLOP of convolutions, matmuls and attention" in table.splitlines()[0]
    rates = [line.split()[2] for line in table.splitlines()[2:] if "matmul_cpu" in line]
    assert rates and all(float(r) >= 0 for r in rates)


def test_cpu_constants_start_on_a_cache_line():
    """A compiled graph's constants (packed weight panels are read as aligned vectors) start on a
    cache line whatever the allocator of the arrays they came from."""
    import taskmap
    from taskmap.runtime.args import CACHE_LINE
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(32 * 7 * 7, 10)).eval()
    x = torch.randn(1, 8, 7, 7)
    cm = taskmap.compile(model, (x,), progress=False)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-5)
    cg = next(iter(cm.entries.values())).compiled
    assert cg.constants and all(data_ptr(v) % CACHE_LINE == 0 for v in cg.constants.values())


def test_op_flops():
    """What the profile divides by: 2 per multiply-add of convolutions (groups), matmuls, linears
    and attention; nothing for other ops, those of several outputs included (top-k)."""
    from taskmap.graph import Conv2dAttrs, GraphBuilder, TopkAttrs
    from taskmap.graph.flops import op_flops
    b = GraphBuilder()
    x = b.input((2, 8, 10, 10), f32)
    w = b.constant(np.zeros((6, 4, 3, 3), np.float32))
    conv = b.op(OpKind.CONV2D, [x, w], Conv2dAttrs(padding=(1, 1), groups=2))
    a, m = b.input((5, 7), f32), b.input((7, 3), f32)
    mm = b.op(OpKind.MATMUL, [a, m])
    lin = b.op(OpKind.LINEAR, [a, b.constant(np.zeros((9, 7), np.float32))])
    q, k, v = b.input((2, 4, 5, 8), f32), b.input((2, 4, 6, 8), f32), b.input((2, 4, 6, 3), f32)
    att = b.op(OpKind.ATTENTION, [q, k, v])
    relu = b.op(OpKind.UNARY, [mm], UnaryAttrs(UnaryFn.RELU))
    top = b.op_multi(OpKind.TOPK, [relu], TopkAttrs(2, 1, True))
    g = b.build([conv, lin, att, *top])
    flops = {op.kind: op_flops(op) for op in g.ops}
    assert flops[OpKind.CONV2D] == 2 * (2 * 6 * 10 * 10) * (4 * 3 * 3)
    assert flops[OpKind.MATMUL] == 2 * 5 * 3 * 7 and flops[OpKind.LINEAR] == 2 * 5 * 9 * 7
    assert flops[OpKind.ATTENTION] == 2 * (2 * 4 * 5) * 6 * (8 + 3)
    assert flops[OpKind.UNARY] == 0 and flops[OpKind.TOPK] == 0


@pytest.mark.cuda
@pytest.mark.parametrize("capture", ["1", "0"])
def test_cuda_graph_capture_replays_with_new_inputs(monkeypatch, capture):
    """On a GPU a compiled graph runs eagerly once, is captured as one CUDA graph at the second
    call and replayed after: every call's outputs match the model on that call's inputs and stay
    intact after later calls (fresh tensors); with TASKMAP_CUDA_GRAPHS=0 nothing is captured."""
    import taskmap

    monkeypatch.setenv("TASKMAP_CUDA_GRAPHS", capture)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 10 * 10, 16), torch.nn.GELU()).cuda().eval()
    cm = taskmap.compile(model, progress=False)
    xs, outs = [], []
    with torch.no_grad():
        for _ in range(4):
            xs.append(torch.randn(2, 3, 10, 10, device="cuda"))
            outs.append(cm(xs[-1]))
        for x, y in zip(xs, outs):
            torch.testing.assert_close(y, model(x), rtol=1e-3, atol=1e-4)
    cg = next(iter(cm.entries.values())).compiled
    assert cg.cuda_graph == (capture == "1") and (cg._captured is not None) == (capture == "1")
