"""Compositions of ``ops_search``: order statistics (median, kthvalue), bucketing (bucketize,
searchsorted), norms and distances (linalg.norm of vectors and matrices, cdist), power-average
pooling and frac — against eager PyTorch on random inputs, with no op left to PyTorch."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskmap


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def check(fn, *xs, rtol=1e-5, atol=1e-6, exact=False):
    model = Fn(fn)
    fast = taskmap.compile(model, progress=False)
    got, want = fast(*xs), model(*xs)
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0 if exact else rtol, atol=0 if exact else atol)
    assert "run by PyTorch" not in fast.summary()


@pytest.mark.parametrize("dim, keepdim", [(1, False), (0, True), (-1, True)])
def test_median_and_kthvalue(dim, keepdim):
    torch.manual_seed(dim + 2)
    x = torch.randn(6, 7)
    check(lambda x: (*torch.median(x, dim, keepdim), *x.kthvalue(3, dim, keepdim), x.median()), x, exact=True)


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize_and_searchsorted(right, out_int32):
    torch.manual_seed(1)
    edges = torch.tensor([-1.0, -0.25, 0.0, 0.5, 2.0])
    rows = torch.sort(torch.randn(3, 6), 1).values
    x = torch.randn(3, 4)
    x[0, :2] = edges[1:3]                   # values equal to a boundary: right decides
    check(lambda x, e, r: (torch.bucketize(x, e, right=right, out_int32=out_int32),
                           torch.searchsorted(e, x, right=right, out_int32=out_int32),
                           torch.searchsorted(r, x, side="right" if right else "left")), x, edges, rows, exact=True)


@pytest.mark.parametrize("ord", [None, 0, 1, 2, 3, 0.5, math.inf, -math.inf])
def test_vector_norms(ord):
    torch.manual_seed(3)
    x = torch.randn(4, 5)
    x[0, 0] = 0.0
    check(lambda x: (torch.linalg.norm(x, ord, dim=1), torch.linalg.norm(x[0], ord),
                     torch.linalg.norm(x, ord, dim=-1, keepdim=True)), x)


@pytest.mark.parametrize("ord", [None, "fro", 1, -1, math.inf, -math.inf])
def test_matrix_norms(ord):
    torch.manual_seed(4)
    x = torch.randn(3, 4, 5)
    check(lambda x: (torch.linalg.norm(x, ord, dim=(1, 2)), torch.linalg.norm(x, ord, dim=(2, 0), keepdim=True),
                     torch.linalg.norm(x[0], ord)), x)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, math.inf])
def test_cdist(p):
    torch.manual_seed(5)
    check(lambda a, b: (torch.cdist(a, b, p), torch.cdist(a[0], b[0], p)), torch.randn(2, 5, 3), torch.randn(2, 4, 3))


@pytest.mark.parametrize("p, ceil_mode", [(2, False), (3, True), (1.5, False)])
def test_lp_pool_and_frac(p, ceil_mode):
    torch.manual_seed(6)
    x = torch.rand(1, 3, 7, 7) + 0.1         # positive: a fractional power of a negative sum is NaN in both
    check(lambda x: (F.lp_pool2d(x, p, 2, ceil_mode=ceil_mode), F.lp_pool1d(x[0], p, 3, stride=2),
                     nn.LPPool2d(p, (2, 3))(x), torch.frac(x * 7 - 3)), x, rtol=1e-5, atol=1e-5)
