"""The on-disk cache of lowered graph kernels (taskmap.graph.kernel_cache): a new process (here:
an emptied in-memory table) loads the lowered module and its source instead of fusing, lowering
and rendering again."""
import numpy as np
import pytest

from taskmap.backends import TargetKind, get_backend
from taskmap.backends.base import host_cpu_target
from taskmap.graph import (
    BinaryAttrs,
    BinaryFn,
    GraphBuilder,
    OpKind,
    UnaryAttrs,
    UnaryFn,
    kernel_cache,
)
from taskmap.graph.lower import lower_graph
from taskmap.ir.dtypes import f32
from taskmap.runtime.graph import CompiledGraph

RNG = np.random.default_rng(3)


def graph():
    b = GraphBuilder()
    x = b.input((6, 12), f32)
    w, bias = b.constant(RNG.standard_normal((10, 12)).astype(np.float32)), b.constant(np.ones(10, np.float32))
    y = b.op(OpKind.LINEAR, [x, w, bias])
    y = b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.TANH))
    z = b.op(OpKind.BINARY, [y], BinaryAttrs(BinaryFn.MUL, 3.0))
    z = b.op(OpKind.UNARY, [z], UnaryAttrs(UnaryFn.EXP))
    return b.build([z]), w.data


def test_lowered_kernels_come_back_from_disk(monkeypatch):
    g, w = graph()
    first = lower_graph(g, host_cpu_target())
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    calls = []
    real = kernel_cache.Kernel.from_lowered
    monkeypatch.setattr(kernel_cache.Kernel, "from_lowered",
                        lambda m, sources=None, original=None: calls.append(m) or real(m, sources, original))
    again = lower_graph(g, host_cpu_target())
    assert len(calls) == len(again) == len(first) == 1
    lowered = [p.name for p in first[0].kernel.lower().entry_function.params]
    assert [p.name for p in again[0].kernel.lower().entry_function.params] == lowered
    # the module from before the lowering passes comes back too (what a placement rewrites)
    assert [p.name for p in again[0].kernel.func.params] == [p.name for p in first[0].kernel.func.params]
    assert again[0].kernel.module is not again[0].kernel.lower()
    xa = RNG.standard_normal((6, 12)).astype(np.float32)
    out = CompiledGraph(g, "cpu", "numpy")(xa)[0]
    np.testing.assert_allclose(out, np.exp(3 * np.tanh(xa @ w.T + 1)), rtol=1e-5)


def test_unreadable_entries_are_rebuilt(monkeypatch):
    g, _ = graph()
    lower_graph(g, host_cpu_target())
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    monkeypatch.setattr(kernel_cache.pickle, "loads", lambda data: (_ for _ in ()).throw(EOFError("corrupt")))
    (kg,) = lower_graph(g, host_cpu_target())
    assert kg.kernel.lower() is not kg.kernel.module        # made (and lowered) again, not loaded


def test_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TASKMAP_GRAPH_CACHE", "0")
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    g, _ = graph()
    (kg,) = lower_graph(g, host_cpu_target())
    assert kg.kernel.lower() is not kg.kernel.module
    assert len(kernel_cache.code_fingerprint()) == 32


def _no_rendering(monkeypatch):
    def render(self, module, target):
        raise AssertionError("rendered the source of a cached kernel")
    monkeypatch.setattr(type(get_backend(TargetKind.CPU)), "render", render)


def test_a_hit_builds_from_the_stored_source(monkeypatch):
    g, w = graph()
    (made,) = lower_graph(g, host_cpu_target())
    source = made.kernel.build("cpu").source
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    _no_rendering(monkeypatch)
    (kg,) = lower_graph(g, host_cpu_target())
    assert kg.kernel is not made.kernel and kg.kernel.build("cpu").source == source
    xa = RNG.standard_normal((6, 12)).astype(np.float32)
    out = CompiledGraph(g, "cpu", "numpy")(xa)[0]
    np.testing.assert_allclose(out, np.exp(3 * np.tanh(xa @ w.T + 1)), rtol=1e-5)


def test_an_edited_compiler_reads_no_stored_module_or_source(monkeypatch, tmp_path):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))         # no entries of earlier runs
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    g, w = graph()
    lower_graph(g, host_cpu_target())
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    monkeypatch.setattr(kernel_cache, "code_fingerprint", lambda: "edited" * 5)

    def loaded(module, sources=None):
        raise AssertionError("loaded a kernel stored by another compiler")
    monkeypatch.setattr(kernel_cache.Kernel, "from_lowered", loaded)
    lower_graph(g, host_cpu_target())               # another key: made, lowered and rendered again
    xa = RNG.standard_normal((6, 12)).astype(np.float32)
    out = CompiledGraph(g, "cpu", "numpy")(xa)[0]
    np.testing.assert_allclose(out, np.exp(3 * np.tanh(xa @ w.T + 1)), rtol=1e-5)


@pytest.mark.parametrize("entry", [lambda m: m, lambda m: (m, {}), lambda m: (m, m, ["not", "a", "dict"]),
                                   lambda m: ("x", m, {})])
def test_entries_of_another_layout_are_rebuilt(monkeypatch, entry):
    g, _ = graph()
    lower_graph(g, host_cpu_target())
    monkeypatch.setattr(kernel_cache, "_MEMORY", {})
    real = kernel_cache.pickle.loads
    monkeypatch.setattr(kernel_cache.pickle, "loads", lambda data: entry(real(data)[0]))
    (kg,) = lower_graph(g, host_cpu_target())
    assert kg.kernel.lower() is not kg.kernel.module        # made (and lowered) again, not loaded


def test_repeated_layers_share_their_views(monkeypatch):
    """Two identical linear + tanh layers: the second layer's epilogue view is the first's (the
    lowering memoizes views by the definitions' text), and the model still computes each layer
    on its own operands."""
    from taskmap.graph import lower_anchor
    monkeypatch.setattr(lower_anchor, "_VIEWS", {})
    b = GraphBuilder()
    x = b.input((6, 12), f32)
    ws = [b.constant(RNG.standard_normal((12, 12)).astype(np.float32)) for _ in range(2)]
    y = x
    for w in ws:
        y = b.op(OpKind.UNARY, [b.op(OpKind.LINEAR, [y, w])], UnaryAttrs(UnaryFn.TANH))
    g = b.build([y])
    calls = []
    real = lower_anchor.bounded_view
    monkeypatch.setattr(lower_anchor, "bounded_view", lambda node: calls.append(node.name) or real(node))
    groups = lower_graph(g, host_cpu_target())
    assert len(groups) == 2 and len(calls) == 1 and len(lower_anchor._VIEWS) == 1
    xv = RNG.standard_normal((6, 12)).astype(np.float32)
    want = np.tanh(np.tanh(xv @ ws[0].data.T) @ ws[1].data.T)
    np.testing.assert_allclose(CompiledGraph(g, "cpu", "numpy")(xv)[0], want, rtol=1e-5, atol=1e-5)


def test_in_process_memos_can_be_forgotten(monkeypatch):
    """``kernel_cache.clear_memo``, ``_dispatch.clear_kernels`` and ``KernelFamily.forget`` drop
    what this process made (a compiler patched at run time — ``benchmarks/ab_steps.py`` — makes
    it again); without them the same kernel object comes back."""
    from taskmap.ops import _dispatch
    from taskmap.templates.base import KernelFamily
    from taskmap.templates.window import WINDOW, WindowProblem

    monkeypatch.setenv("TASKMAP_GRAPH_CACHE", "0")
    target = host_cpu_target()
    made = []

    def make():
        made.append(1)
        return _dispatch.template_kernel(WINDOW, WindowProblem("max", 1, 3, 9, 9, 4, 4, 2, 2, 2, 2), target)

    parts = ("test-memo", 1)
    first = kernel_cache.cached_kernel(parts, make, target)
    assert kernel_cache.cached_kernel(parts, make, target) is first and len(made) == 1
    kernel_cache.clear_memo()
    kernel_cache.cached_kernel(parts, make, target)
    assert len(made) == 2
    p = WindowProblem("avg", 1, 2, 8, 8, 4, 4, 2, 2, 2, 2)
    k1 = _dispatch.template_kernel(WINDOW, p, target)
    assert _dispatch.template_kernel(WINDOW, p, target) is k1
    _dispatch.clear_kernels()
    assert _dispatch.template_kernel(WINDOW, p, target) is not k1

    class Family(KernelFamily):
        pass

    fam, builds = Family(), []
    build = lambda: builds.append(1) or object()      # noqa: E731
    fam.kernel("cfg", build), fam.kernel("cfg", build)
    assert len(builds) == 1
    fam.forget()
    fam.kernel("cfg", build)
    assert len(builds) == 2
