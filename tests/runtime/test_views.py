"""Slices without a copy (taskmap.graph.views, taskmap.runtime.views): a group that only slices
one contiguous, 64-byte aligned range of a tensor is a view of that tensor's buffer — carved once
by the memory plan when a kernel writes the tensor, made per run when a runner returns it — and
the numbers match PyTorch either way, on the second run too."""
import pytest
import torch
from torch import nn

import taskmap

T = 6


class Steps(nn.Module):
    """A recurrence over a time-major projection: each step adds its slice ``g[t]`` in the epilogue
    of its linear (a group of its own); ``source="runner"`` permutes the projection's rows by a
    scatter first (its runner returns its own array)."""

    def __init__(self, feat, source="kernel"):
        super().__init__()
        self.proj, self.step, self.source = nn.Linear(8, feat), nn.Linear(feat, feat), source
        self.register_buffer("rows", torch.arange(T - 1, -1, -1).view(T, 1, 1).expand(T, 1, feat).contiguous())

    def forward(self, x):
        g = self.proj(x)
        if self.source == "runner":
            g = g.scatter(0, self.rows, g * 2)
        h = torch.tanh(g[0])
        for t in range(1, T):
            h = torch.tanh(self.step(h) + g[t])
        return h


def _compiled(model, x):
    fast = taskmap.compile(model, x, progress=False)
    with torch.no_grad():
        want = model(x)
    for _ in range(2):
        torch.testing.assert_close(fast(x), want, rtol=1e-5, atol=1e-5)
    (entry,) = fast.entries.values()
    return entry.compiled


@pytest.mark.parametrize("feat", [32, 8])
def test_aligned_slices_of_a_kernel_result_are_carved_by_the_plan(feat):
    """``g[t]`` starts ``t * feat * 4`` bytes into ``g``: at 32 features every step's slice is a view
    (no step makes it); at 8 only those starting 64-byte aligned are, the others copied by kernels
    of their own.  The steps after the first run one kernel either way."""
    torch.manual_seed(0)
    cg = _compiled(Steps(feat).eval(), torch.randn(T, 1, 8))
    assert not [st for st in cg.steps if st.view is not None]
    aligned = [t * feat * 4 for t in range(1, T) if t * feat * 4 % 64 == 0]
    assert sorted(off for _, off in cg.aliases.values()) == aligned
    copies = [st.name for st in cg.steps if st.name.startswith("slice") and "linear" not in st.name]
    assert len(copies) == T - 1 - len(aligned)
    assert len({id(st.kernel) for st in cg.steps[2:] if st.name.startswith("linear")}) == 1


def test_views_on_gpu_kernels():
    """The GPU lowering (in GPU emulation: alignment rules checked) reads the views as well."""
    from taskmap.ops import emulate_gpu

    torch.manual_seed(2)
    with emulate_gpu("sm_90"):
        cg = _compiled(Steps(32).eval(), torch.randn(T, 1, 8))
    assert not [st for st in cg.steps if st.view is not None] and len(cg.aliases) == T - 1


def test_slices_of_a_runner_result_are_views_made_per_run():
    torch.manual_seed(1)
    cg = _compiled(Steps(32, source="runner").eval(), torch.randn(T, 1, 8))
    views = [st for st in cg.steps if st.view is not None]
    assert len(views) == T - 1 and not cg.aliases
    assert sorted(off for _, off in (st.view for st in views)) == [t * 32 * 4 for t in range(1, T)]


def test_slices_of_a_graph_input_are_read_in_place_by_their_kernels():
    """The input's array is the caller's: no view of it is planned (the slices fuse into the
    kernels that read them)."""
    class Pick(nn.Module):
        def forward(self, x):
            return torch.tanh(x[1]) + x[3] * 2

    cg = _compiled(Pick(), torch.randn(T, 1, 32))
    assert not cg.aliases and not [st for st in cg.steps if st.view is not None]
