"""Concatenations written in place: at batch 1 the kernels of a channel concat's inputs write into
their ranges of its output (taskmap.runtime.concat_inplace), at batch > 1 their kernels are
rewritten to write with the output's image stride (taskmap.graph.concat_place), and the copy
step disappears; where that cannot be done (an input read elsewhere at batch > 1, a misaligned
range at batch 1, a graph output) the copy stays — and the numbers match PyTorch either way."""
import pytest
import torch

import taskmap


class Branches(torch.nn.Module):
    """Inception-style: three branches concatenated on channels (one of them itself a concat),
    then a convolution over the result."""

    def __init__(self, c=16, reuse=False):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(4, c, 1), torch.nn.Conv2d(4, c, 3, padding=1)
        self.c1, self.c2 = torch.nn.Conv2d(4, c, (1, 3), padding=(0, 1)), torch.nn.Conv2d(4, c, (3, 1), padding=(1, 0))
        self.head = torch.nn.Conv2d(4 * c, 8, 1)
        self.reuse = reuse

    def forward(self, x):
        a = torch.relu(self.a(x))
        inner = torch.cat([self.c1(x), self.c2(x)], 1)
        y = self.head(torch.cat([a, torch.relu(self.b(x)), inner], 1))
        return y + a.mean() if self.reuse else y            # reuse: branch a is read again


def _compiled(model, x):
    fast = taskmap.compile(model, x, progress=False)
    got = fast(x)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-5)          # the second run too
    (entry,) = fast.entries.values()
    return entry.compiled


def _concat_steps(cg):
    return [st.name for st in cg.steps if st.kind.name == "CONCAT"]


def test_batch_one_concats_are_written_in_place_nested_too():
    torch.manual_seed(0)
    cg = _compiled(Branches().eval(), torch.randn(1, 4, 8, 8))
    assert _concat_steps(cg) == []
    outs = {out for out, _ in cg.aliases.values()}
    assert len(cg.aliases) == 4 and len(outs) == 1          # a, b and the inner concat's two parts
    assert sorted(off for _, off in cg.aliases.values()) == [0, 16 * 64 * 4, 32 * 64 * 4, 48 * 64 * 4]


def _placed(cg):
    """The steps whose kernels write inside a concat's output (batch > 1)."""
    return [st.name for st in cg.steps if any(p.name.startswith("placed") for k in st.kernels for p in k.func.params)]


@pytest.mark.parametrize("c, hw", [(16, 8), (1, 3)])        # odd channel counts and sizes too: no alignment rule
def test_batch_concats_are_written_in_place_by_their_kernels_nested_too(c, hw):
    torch.manual_seed(4)
    cg = _compiled(Branches(c=c).eval(), torch.randn(3, 4, hw, 8))
    assert _concat_steps(cg) == [] and not cg.aliases
    assert len(_placed(cg)) == 4                            # a, b and the inner concat's two parts


def test_placed_kernels_come_back_from_the_disk_cache():
    """A second compile whose kernels are loaded, lowered, from the graph-kernel cache places them
    again (from the modules stored beside the lowered ones, or the placed kernels' own entries)."""
    from taskmap.graph import kernel_cache

    torch.manual_seed(5)
    model, x = Branches().eval(), torch.randn(2, 4, 8, 8)
    _compiled(model, x)
    kernel_cache._MEMORY.clear()
    cg = _compiled(model, x)
    assert _concat_steps(cg) == [] and len(_placed(cg)) == 4


class ReadAgain(torch.nn.Module):
    """Branch ``a`` is read by the concat and again by the last kernel, after the concat's last
    reader (``head``): ``tail``'s result would fit in the concat's buffer, over ``a``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(4, 16, 1), torch.nn.Conv2d(4, 16, 1)
        self.head, self.tail = torch.nn.Conv2d(32, 32, 1), torch.nn.Conv2d(32, 16, 1)

    def forward(self, x):
        a = torch.relu(self.a(x))
        y = self.head(torch.cat([a, torch.relu(self.b(x))], 1))
        return torch.softmax(self.tail(torch.relu(y)), 1) * a


@pytest.mark.parametrize("model", [Branches(reuse=True), ReadAgain()], ids=["branches", "read-again"])
def test_a_part_read_again_after_the_concat_is_read_in_place(model):
    """A part read by other steps as well lives in the concat's output too; the memory plan keeps
    that buffer until the last of them (the second run too)."""
    torch.manual_seed(1)
    cg = _compiled(model.eval(), torch.randn(1, 4, 8, 8))
    assert _concat_steps(cg) == [] and cg.aliases


@pytest.mark.parametrize("why", ["reuse at batch 2", "misaligned"])
def test_concats_that_cannot_be_in_place_still_copy(why):
    torch.manual_seed(1)
    model = Branches(c=1 if why == "misaligned" else 16, reuse=why.startswith("reuse")).eval()
    cg = _compiled(model, torch.randn(2 if why.endswith("2") else 1, 4, 3 if why == "misaligned" else 8, 8))
    assert _concat_steps(cg) and not cg.aliases and not _placed(cg), why      # all parts in place, or the copy


def test_a_concat_returned_by_the_graph_is_copied():
    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(4, 16, 1), torch.nn.Conv2d(4, 16, 1)

        def forward(self, x):
            return torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], 1)

    torch.manual_seed(2)
    for batch in (1, 2):
        cg = _compiled(Out().eval(), torch.randn(batch, 4, 8, 8))
        assert _concat_steps(cg) and not cg.aliases and not _placed(cg)


def test_in_place_parts_on_gpu_kernels():
    """The GPU templates (in GPU emulation: their alignment rules are checked) write their parts
    into the concat's output as well."""
    from taskmap.ops import emulate_gpu

    torch.manual_seed(3)
    with emulate_gpu("sm_90"):
        cg = _compiled(Branches().eval(), torch.randn(1, 4, 8, 8))
        assert _concat_steps(cg) == [] and len(cg.aliases) == 4
        cg = _compiled(Branches().eval(), torch.randn(2, 4, 8, 8))
        assert _concat_steps(cg) == [] and len(_placed(cg)) == 4
