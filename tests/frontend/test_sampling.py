"""``F.affine_grid`` and ``F.grid_sample`` (``ops_sample``): both modes, every padding mode, with
and without ``align_corners``, on grids that reach past the input's edges, against eager PyTorch
with no op left to it; bicubic sampling is named."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskmap
from taskmap.errors import UnsupportedOpsError


class Warp(nn.Module):
    """A spatial transformer's sampling (an affine grid of another size) and a flow-style warp
    (a grid passed in)."""

    def __init__(self, mode, padding, align):
        super().__init__()
        self.mode, self.padding, self.align = mode, padding, align

    def forward(self, x, theta, grid):
        kw = dict(mode=self.mode, padding_mode=self.padding, align_corners=self.align)
        g = F.affine_grid(theta, (x.shape[0], x.shape[1], 7, 9), align_corners=self.align)
        return F.grid_sample(x, g, **kw), F.grid_sample(torch.relu(x), grid, **kw) * 2


CASES = list(itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True]))


@pytest.mark.parametrize("mode, padding, align", CASES, ids=[f"{m}-{p}-{'align' if a else 'noalign'}"
                                                             for m, p, a in CASES])
def test_grid_sample_matches_eager(mode, padding, align):
    torch.manual_seed(len(mode) + len(padding) + align)
    model = Warp(mode, padding, align)
    fast = taskmap.compile(model, progress=False)
    for _ in range(2):
        x, theta, grid = torch.randn(2, 3, 6, 5), torch.randn(2, 2, 3), torch.rand(2, 4, 8, 2) * 3.2 - 1.6
        for got, want in zip(fast(x, theta, grid), model(x, theta, grid)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "run by PyTorch" not in fast.summary()


def test_under_dynamo_and_bicubic_named():
    torch.manual_seed(3)
    args = (torch.randn(1, 2, 5, 5), torch.randn(1, 2, 3), torch.rand(1, 3, 3, 2) * 2 - 1)
    model = Warp("bilinear", "zeros", False)
    fast = taskmap.compile(model, progress=False, capture="dynamo")
    for got, want in zip(fast(*args), model(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(UnsupportedOpsError, match="grid_sample with mode='bicubic'"):
        taskmap.compile(Warp("bicubic", "zeros", False), progress=False)(*args)
