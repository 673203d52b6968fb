"""``nn.EmbeddingBag`` / ``F.embedding_bag`` (``ops_bag``): every mode, bags of one size (a 2-d
input) and bags by offsets (empty bags, a bag of padding only, ``include_last_offset``), with
``padding_idx`` and weights per sample, against eager PyTorch with no op left to it; the forms
not converted are named."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskmap
from taskmap.errors import UnsupportedOpsError

PAD = 3


class Bag(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 8, **kw)

    def forward(self, ids, offsets=None, w=None):
        return self.bag(ids, offsets, per_sample_weights=w)


def _inputs(form, last, psw):
    """Bags of a 2-d input (one all padding), or by offsets: [0, 3), an empty one, [3, 7),
    [7, 10) all padding, [10, 20) (and an empty last one with ``include_last_offset``)."""
    if form == "2d":
        ids = torch.randint(0, 50, (4, 6))
        ids[0, :2], ids[1] = PAD, PAD
        return ids, None, torch.rand(4, 6) if psw else None
    ids = torch.randint(0, 50, (20,))
    ids[:2], ids[7:10] = PAD, PAD
    offsets = torch.tensor([0, 3, 3, 7, 10] + ([20] if last else []))
    return ids, offsets, torch.rand(20) if psw else None


CASES = [(mode, pad, last, psw, form)
         for mode, pad, last, psw, form in itertools.product(["sum", "mean", "max"], [None, PAD], [False, True],
                                                             [False, True], ["2d", "offsets"])
         if (mode == "sum" or not psw) and not (form == "2d" and last)]


IDS = [f"{m}-{'pad' if p else 'nopad'}-{'last' if lo else 'starts'}-{'psw' if w else 'plain'}-{f}"
       for m, p, lo, w, f in CASES]


@pytest.mark.parametrize("mode, pad, last, psw, form", CASES, ids=IDS)
def test_embedding_bag_matches_eager(mode, pad, last, psw, form):
    torch.manual_seed(len(mode) + 7 * bool(pad) + 3 * last + 5 * psw)
    model = Bag(mode=mode, padding_idx=pad, include_last_offset=last).eval()
    args = _inputs(form, last, psw)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(*args), model(*args), rtol=1e-5, atol=1e-6)
        args = (torch.randint(0, 50, args[0].shape), *args[1:])          # other indices, same graph
        torch.testing.assert_close(fast(*args), model(*args), rtol=1e-5, atol=1e-6)
    assert "run by PyTorch" not in fast.summary()


class Functional(nn.Module):
    """``F.embedding_bag`` on a table passed in, under each capture."""

    def forward(self, ids, table, offsets):
        return F.embedding_bag(ids, table, offsets, mode="max") + F.embedding_bag(ids, table, offsets, mode="sum")


@pytest.mark.parametrize("capture", ["auto", "dynamo"])
def test_functional_form(capture):
    torch.manual_seed(2)
    args = (torch.randint(0, 10, (12,)), torch.randn(10, 4), torch.tensor([0, 5, 5, 9]))
    fast = taskmap.compile(Functional(), progress=False, capture=capture)
    torch.testing.assert_close(fast(*args), Functional()(*args), rtol=1e-5, atol=1e-6)


def test_forms_not_converted_are_named():
    model = nn.EmbeddingBag(10, 4, max_norm=1.0).eval()
    with pytest.raises(UnsupportedOpsError, match="embedding_bag with max_norm"):
        taskmap.compile(model, progress=False)(torch.randint(0, 10, (2, 3)))


class Recommender(nn.Module):
    """DLRM's shape: bags of sparse features (a list of index tensors: captured by torch.export,
    whose ATen ``embedding_bag`` returns more than the bags), a dense MLP, pairwise interactions."""

    def __init__(self):
        super().__init__()
        self.bags = nn.ModuleList([nn.EmbeddingBag(100, 8, mode=m) for m in ("sum", "mean", "max")])
        self.bottom, self.top = nn.Linear(5, 8), nn.Linear(8 + 6, 1)

    def forward(self, dense, ids, offsets):
        x = torch.relu(self.bottom(dense))
        t = torch.stack([x] + [b(i, o) for b, i, o in zip(self.bags, ids, offsets)], 1)
        z = torch.bmm(t, t.transpose(1, 2))
        li, lj = torch.triu_indices(4, 4, 1)
        return torch.sigmoid(self.top(torch.cat([x, z[:, li, lj]], 1)))


def test_recommender_through_torch_export():
    torch.manual_seed(9)
    model = Recommender().eval()
    ids = [torch.randint(0, 100, (24,)) for _ in range(3)]
    offsets = [torch.tensor([0, 2, 2, 9, 15, 20]) for _ in range(3)]
    args = (torch.randn(6, 5), ids, offsets)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(*args), model(*args), rtol=1e-5, atol=1e-6)
    assert "captured by torch.export" in fast.summary() and "run by PyTorch" not in fast.summary()


def test_reading_the_bags_positions_is_named():
    """ATen's other results of ``embedding_bag`` are not computed: a model that reads one (each
    index's bag) is refused, naming it."""
    class Positions(nn.Module):
        def forward(self, table, ids, offsets):
            out, bag_of, _, _ = torch.embedding_bag(table, ids, offsets, False, 1)
            return out, bag_of

    args = (torch.randn(10, 4), torch.randint(0, 10, (7,)), torch.tensor([0, 3]))
    with pytest.raises(UnsupportedOpsError, match="bag of each index"):
        taskmap.compile(Positions(), progress=False, capture="export")(*args)
