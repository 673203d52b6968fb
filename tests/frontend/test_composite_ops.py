"""PyTorch operators the frontend composes from taskmap's own ops (``ops_composite.py``,
``ops_einsum.py``, argmax in ``ops_nn.py``): statistics, NaN tests, group / instance / RMS / local
response norm, prelu, shrinks, index transforms, einsum, argmax — each against eager PyTorch on
random inputs, special values included, and fused like native ops.  (Upsampling: ``test_upsample_ops.py``.)"""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import taskmap
from taskmap.errors import UnsupportedOpsError

torch.manual_seed(3)


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def check(model, *inputs, rtol=1e-5, atol=1e-6):
    model = model.eval()
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        want = model(*inputs)
    got = fast(*inputs)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    return fast


def kernels(fast, *inputs):
    entry = fast._entry(fast._bind(inputs, {}))
    return len(entry.ready(False).steps)


x4 = torch.randn(2, 6, 9, 11)


@pytest.mark.parametrize("fn", [
    lambda x: x.std(1), lambda x: torch.std(x, (2, 3), keepdim=True, correction=0), lambda x: x.std(),
    lambda x: torch.logsumexp(x, 1), lambda x: x.logsumexp((2, 3), keepdim=True),
    lambda x: torch.linalg.vector_norm(x, dim=-1), lambda x: torch.linalg.vector_norm(x, 1, (1, 2)),
    lambda x: torch.linalg.vector_norm(x, math.inf, -1, keepdim=True), lambda x: x.norm(dim=1), lambda x: x.norm(),
    lambda x: F.normalize(x, dim=1), lambda x: F.normalize(x, p=1, dim=-1),
    lambda x: torch.linalg.vector_norm(x, 3, (1, 3)), lambda x: torch.linalg.vector_norm(x, 0.5, -1),
    lambda x: torch.linalg.vector_norm(x, -math.inf, 1), lambda x: x.norm(p=4, dim=2, keepdim=True),
    lambda x: F.normalize(x, p=3, dim=1), lambda x: torch.linalg.vector_norm(x.round(), 0, (0, 2)),
    lambda x: (x > 1).any(1), lambda x: (x > -2).all(), lambda x: x.any(-1), lambda x: torch.all(x > -1.5, 2, True),
], ids=lambda f: "stat")
def test_statistics(fn):
    check(Fn(fn), x4)


def test_logsumexp_of_infinite_rows_and_nan_tests():
    x = torch.randn(5, 4)
    x[0] = -math.inf
    x[1, 2] = math.inf
    x[2, 1] = math.nan
    x[3, 0] = -math.inf
    check(Fn(lambda x: torch.logsumexp(x, 1)), x)
    check(Fn(lambda x: torch.stack([x.isnan(), torch.isinf(x), x.isfinite()])), x)
    check(Fn(lambda x: torch.nan_to_num(x)), x)
    check(Fn(lambda x: x.nan_to_num(1.5, posinf=7.0, neginf=-9.0)), x)
    ints = torch.randint(-3, 3, (4, 5))
    check(Fn(lambda i: torch.stack([i.isnan(), i.isinf(), i.isfinite()]).int() + i.nan_to_num()), ints)


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
def test_group_norm(groups):
    m = nn.GroupNorm(groups, 6)
    with torch.no_grad():
        m.weight.copy_(torch.randn(6))
        m.bias.copy_(torch.randn(6))
    check(m, x4, rtol=1e-4, atol=1e-5)
    check(Fn(lambda x: F.group_norm(x, groups, eps=1e-3)), x4, rtol=1e-4, atol=1e-5)


def test_instance_norm_and_prelu():
    check(nn.InstanceNorm2d(6), x4, rtol=1e-4, atol=1e-5)
    affine = nn.InstanceNorm2d(6, affine=True)
    with torch.no_grad():
        affine.weight.copy_(torch.randn(6))
    check(affine, x4, rtol=1e-4, atol=1e-5)
    tracked = nn.InstanceNorm2d(6, track_running_stats=True)
    with torch.no_grad():
        tracked.running_mean.copy_(torch.randn(6))
        tracked.running_var.copy_(torch.rand(6) + 0.5)
    check(tracked, x4, rtol=1e-4, atol=1e-5)            # eval: the running statistics
    check(nn.InstanceNorm1d(6), torch.randn(3, 6, 20), rtol=1e-4, atol=1e-5)
    p = nn.PReLU(6)
    with torch.no_grad():
        p.weight.copy_(torch.rand(6))
    check(p, x4)
    check(nn.PReLU(), torch.randn(7, 5))
    check(Fn(lambda x: F.prelu(x, torch.full((1,), 0.3))), x4)


@pytest.mark.parametrize("fn", [
    lambda x: x.flip(1), lambda x: torch.flip(x, (0, 3)), lambda x: x.flip(-1, -2) + 1, lambda x: torch.fliplr(x),
    lambda x: torch.roll(x, 3, 2), lambda x: x.roll((1, -4), (1, 3)), lambda x: torch.roll(x, 5),
    lambda x: x.tril(), lambda x: torch.triu(x, 2), lambda x: x.tril(-1), lambda x: (x > 0).triu(),
    lambda x: F.pixel_unshuffle(x[..., :8, :10], 2), lambda x: x.repeat_interleave(3, 2),
    lambda x: torch.repeat_interleave(x, 2), lambda x: x[:, [0, 3, -1]], lambda x: x[:, :, [4, 1]],
], ids=lambda f: "index")
def test_index_transforms(fn):
    check(Fn(fn), x4)


def test_pixel_shuffle_roundtrip_and_modules():
    y = torch.randn(2, 12, 5, 7)
    check(nn.PixelShuffle(2), y)
    check(Fn(lambda t: F.pixel_unshuffle(F.pixel_shuffle(t, 2), 2) * 2), y)
    check(nn.PixelUnshuffle(3), torch.randn(1, 2, 6, 9))


def test_flip_and_friends_fuse_into_one_kernel():
    # flip, roll and tril are index maps: with the activation around them, one kernel
    fast = check(Fn(lambda x: torch.relu(x.flip(2).tril() * 2 + 1)), x4)
    assert kernels(fast, x4) == 1


def test_unsupported_variants_are_named():
    with pytest.raises(UnsupportedOpsError, match="vector norm of order 'nuc'"):
        taskmap.compile(Fn(lambda t: torch.norm(t[0, 0], "nuc")), x4, progress=False)
    np.testing.assert_array_equal(taskmap.compile(Fn(lambda t: t.repeat_interleave(2, 0)), x4,
                                                  progress=False)(x4).numpy(), x4.repeat_interleave(2, 0).numpy())


@pytest.mark.parametrize("eq, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]), ("ij,jk", [(3, 4), (4, 5)]), ("ij->ji", [(3, 4)]),
    ("bchw,bchw->bc", [(2, 3, 4, 5)] * 2), ("i,j->ij", [(3,), (4,)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 6)]), ("ijk->", [(2, 3, 4)]), ("ij,ij->i", [(3, 4)] * 2),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]), ("bij,jk->bki", [(2, 3, 4), (4, 5)]), ("ijk->kj", [(2, 3, 4)]),
])
def test_einsum(eq, shapes):
    xs = [torch.randn(*s) for s in shapes]
    if len(xs) == 1:
        check(Fn(lambda a: torch.einsum(eq, a)), xs[0], rtol=1e-4, atol=1e-5)
    else:
        check(Fn(lambda t: torch.einsum(eq, t, *xs[1:])), xs[0], rtol=1e-4, atol=1e-5)


def test_einsum_attention_is_two_matmuls():
    q, k = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    fast = check(Fn(lambda t: torch.einsum("bhqd,bhkd->bhqk", t, k).softmax(-1) @ k), q, rtol=1e-4, atol=1e-5)
    graph = fast._entry(fast._bind((q,), {})).imported.graph
    assert sum(op.kind.name == "MATMUL" for op in graph.ops) == 2


def test_einsum_refusals_are_named():
    with pytest.raises(UnsupportedOpsError, match="repeated labels"):
        taskmap.compile(Fn(lambda t: torch.einsum("ii->i", t)), torch.randn(3, 3), progress=False)


def test_argmax_argmin_and_max_with_indices():
    x = torch.randn(3, 5, 7)
    x[0, 2, 3] = math.nan                    # torch: the first NaN is the maximum (and the minimum)
    x[1, :, 0] = 2.0                         # ties: the first index
    check(Fn(lambda t: t.argmax(1)), x)
    check(Fn(lambda t: torch.argmin(t, 2)), x)
    check(Fn(lambda t: t.argmax()), x)
    check(Fn(lambda t: t.argmin(0, keepdim=True)), x)
    check(Fn(lambda t: t.max(1)), x)
    check(Fn(lambda t: torch.min(t, -1, keepdim=True).indices * 2 + t.max(0).values.int()), x)
    check(Fn(lambda t: (t * 10).int().argmax(1)), x.nan_to_num())


x3 = torch.randn(2, 8, 17)


@pytest.mark.parametrize("layer", [
    nn.Conv1d(8, 4, 3, padding=1), nn.Conv1d(8, 4, 5, stride=2, groups=4, bias=False), nn.Conv1d(8, 6, 3, dilation=2),
    nn.Conv1d(8, 4, 4, padding="same"), nn.MaxPool1d(2), nn.MaxPool1d(3, 2, 1, ceil_mode=True), nn.AvgPool1d(3, 2),
    nn.AvgPool1d(4, 3, 2, count_include_pad=False), nn.AdaptiveAvgPool1d(5), nn.BatchNorm1d(8),
    nn.AdaptiveMaxPool1d(6), nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1),
    nn.ConvTranspose1d(8, 6, 3, stride=3, padding=2, output_padding=1, groups=2, dilation=2),
], ids=lambda m: type(m).__name__)
def test_one_d_layers(layer):
    if isinstance(layer, nn.BatchNorm1d):
        with torch.no_grad():
            layer.running_mean.copy_(torch.randn(8))
    check(layer, x3, rtol=1e-4, atol=1e-5)
    if isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d, nn.AdaptiveMaxPool1d)):
        check(layer, x3[0], rtol=1e-4, atol=1e-5)       # unbatched (C, L)


@pytest.mark.parametrize("fn", [
    torch.exp2, lambda t: torch.log2(t.abs() + 0.1), lambda t: torch.log10(t.abs() + 0.1), F.softsign, F.tanhshrink,
    lambda t: F.celu(t, 0.7), nn.CELU(), lambda t: F.threshold(t, 0.1, 20.0), nn.Threshold(-0.5, -3.0),
    lambda t: F.rrelu(t, training=False), lambda t: F.softmin(t, -1), nn.Softmin(1), lambda t: F.glu(t, 1),
    lambda t: nn.GLU()(t[..., 1:]),
    lambda t: torch.addcmul(t, t, t.flip(-1), value=0.5), lambda t: t.addcdiv(t, t.abs() + 1),
    lambda t: torch.lerp(t, t * 2, 0.3), lambda t: torch.where(t > 0, 1.0, -1.0),
    lambda t: torch.where(t > 0, 1, 0), lambda t: torch.where(t > 0, 2, 0.5), lambda t: torch.where(t > 0, True, False),
    lambda t: t.unfold(1, 2, 1), lambda t: t.unfold(-1, 3, 3) + 1, lambda t: t.unfold(0, 1, 2),   # (PatchTST)
    lambda t: torch.outer(t[0, 0], t[1, 1]),
    lambda t: torch.var_mean(t, -1)[0] + torch.var_mean(t, -1)[1], lambda t: torch.std_mean(t, (1, 2), correction=0)[0],
    lambda t: F.cosine_similarity(t[0], t[1], dim=0), lambda t: F.cosine_similarity(t, t.flip(0), dim=-1),
    lambda t: t.movedim(1, -1), lambda t: torch.moveaxis(t, (0, 2), (2, 0)), lambda t: t.unflatten(1, (2, -1)),
    lambda t: torch.tensor_split(t, 3, 2)[2], lambda t: t.tensor_split([2, 5], 1)[1], lambda t: t.tile(2, 1, 1),
    lambda t: torch.tile(t[0], (3,)), lambda t: F.one_hot((t[0] > 0).long() * 3, 5),
], ids=lambda f: "fn")
def test_more_element_wise_and_shape_ops(fn):
    check(fn if isinstance(fn, nn.Module) else Fn(fn), x3, rtol=1e-5, atol=1e-5)


def test_glu_of_an_odd_dimension_is_refused_like_torch():
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        taskmap.compile(Fn(lambda t: F.glu(t, -1)), progress=False)(torch.randn(2, 5))


@pytest.mark.parametrize("fn", [
    lambda t: _assign(t, (slice(None), slice(1, None)), t[:, :-1] * 2),           # BART's shift_tokens_right
    lambda t: _assign(t, (0,), 5.0), lambda t: _assign(t, (Ellipsis, 3), t[..., 0]),
    lambda t: _assign(t, (slice(None), 2, slice(4, 9)), 0.5), lambda t: _assign(t, (1, Ellipsis), t[0, :1] - 1),
    lambda t: _assign(t.int(), (slice(None), -1), 7),
    lambda t: _assign(t, (slice(None, None, 2),), 1.0), lambda t: _assign(t, (Ellipsis, slice(1, None, 3)), t[..., :6]),
    lambda t: _assign(t, (slice(1, 3), slice(0, 4, 2), slice(5, 9, 2)), t[0, :2, :2] * 5),
], ids=lambda f: "setitem")
def test_slice_assignment_is_functional_and_later_reads_see_it(fn):
    check(Fn(fn), x3)


def _assign(t, idx, value):
    y = t.clone()
    y[idx] = value
    return y * 3                 # a later use of y must read the assigned values


@pytest.mark.parametrize("fn", [
    lambda t: torch.diagonal(t, 0, 1, 2), lambda t: t.diagonal(1, -1, -2), lambda t: torch.diagonal(t, -2, 1, 2),
    lambda t: torch.diag(t[0]), lambda t: torch.diag(t[0], 2), lambda t: torch.diag(t[0, 0]) * 2,
    lambda t: torch.diag(t[0, 0], -2), lambda t: torch.diag((t[0, 0] > 0).int(), 3),
    lambda t: torch.heaviside(t.round(), torch.tensor(0.5)), lambda t: torch.heaviside(t.round(), t),
    lambda t: torch.atan2(t, t.flip(0)), lambda t: torch.lgamma(t.abs() + 0.1),
], ids=lambda f: "fn")
def test_diagonals_heaviside_atan2_lgamma(fn):
    check(Fn(fn), torch.randn(3, 5, 6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(kernel_size=3), dict(kernel_size=(2, 3), stride=2, padding=1),
                                    dict(kernel_size=3, dilation=2, padding=2, stride=(1, 2)), dict(kernel_size=1)],
                         ids=lambda k: "unfold")
def test_unfold_is_im2col(kwargs):
    x = torch.randn(2, 3, 9, 11)
    check(Fn(lambda t: F.unfold(t, **kwargs) * 2), x)
    check(nn.Unfold(**kwargs), x)


_RMS = nn.RMSNorm(11, eps=1e-5)
with torch.no_grad():
    _RMS.weight.uniform_(0.5, 1.5)


@pytest.mark.parametrize("fn", [
    lambda x: F.rms_norm(x, (11,)), lambda x: F.rms_norm(x, (9, 11), torch.linspace(0.5, 1.5, 99).reshape(9, 11), 1e-3),
    _RMS, lambda x: F.local_response_norm(x, 3), nn.LocalResponseNorm(4, 2e-3, 0.6, 2.0),
    lambda x: F.hardshrink(x, 0.7), lambda x: F.softshrink(x), lambda x: torch.channel_shuffle(x, 3),
    nn.ChannelShuffle(2), lambda x: torch.hypot(x, x.flip(1)), lambda x: torch.dot(x[0, 0, 0], x[1, 0, 0]),
    lambda x: torch.inner(x[0, :2], x[1, 0]),
], ids=["rms", "rms-2d-weight", "RMSNorm", "lrn", "LocalResponseNorm", "hardshrink", "softshrink", "channel_shuffle",
        "ChannelShuffle", "hypot", "dot", "inner"])
def test_more_norms_shrinks_and_shuffles(fn):
    check(Fn(fn), x4, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x: x.flatten(2).view_as(x), lambda x: x.reshape_as(x.transpose(1, 2)),
    lambda x: x.select(1, 2) * 2, lambda x: torch.select(x, -1, -3), lambda x: x[:, :1].broadcast_to((2, 6, 9, 11)) + x,
    lambda x: torch.broadcast_to(x[0, 0], (3, 9, 11)), lambda x: torch.swapaxes(x, 1, 3), lambda x: torch.swapdims(x, 0, 2),
    lambda x: torch.hstack([x, x * 2]), lambda x: torch.vstack([x[0, 0, 0], x[1, 0, 0]]),
    lambda x: torch.split_with_sizes(x, [2, 4], 1)[1], lambda x: x.split_with_sizes([5, 6], -1)[0],
], ids=["view_as", "reshape_as", "select", "torch.select", "broadcast_to", "torch.broadcast_to", "swapaxes", "swapdims",
        "hstack", "vstack", "split_with_sizes", "split_with_sizes-method"])
def test_view_and_join_aliases(fn):
    check(Fn(fn), x4)


@pytest.mark.parametrize("kwargs", [
    dict(output_size=(8, 12), kernel_size=(2, 3), stride=(2, 3)),                 # patches tiling the output
    dict(output_size=(9, 11), kernel_size=3),                                       # overlaps summed
    dict(output_size=(9, 11), kernel_size=(3, 2), stride=2, padding=1, dilation=(1, 2)),
], ids=["tiles", "overlaps", "strided"])
def test_fold_is_col2im(kwargs):
    """``F.fold`` against torch, and ``fold(unfold(x))`` (each pixel times the windows covering it)."""
    k, s = nn.modules.utils._pair(kwargs["kernel_size"]), nn.modules.utils._pair(kwargs.get("stride", 1))
    p, d = nn.modules.utils._pair(kwargs.get("padding", 0)), nn.modules.utils._pair(kwargs.get("dilation", 1))
    (h, w) = kwargs["output_size"]
    blocks = [(n + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for n, kk, ss, pp, dd in zip((h, w), k, s, p, d)]
    cols = torch.randn(2, 3 * k[0] * k[1], blocks[0] * blocks[1])
    check(Fn(lambda c: F.fold(c, **kwargs)), cols)
    check(nn.Fold(**kwargs), cols[0])
    x = torch.randn(2, 3, h, w)
    unfold_kw = {key: v for key, v in kwargs.items() if key != "output_size"}
    check(Fn(lambda x: F.fold(F.unfold(x, **unfold_kw), **kwargs)), x)


def test_negative_padding_crops():
    # RWKV's time shift: nn.ZeroPad2d((0, 0, 1, -1)) moves the sequence down by one
    check(nn.ZeroPad2d((0, 0, 1, -1)), torch.randn(2, 7, 5))
    check(Fn(lambda x: F.pad(x, (-2, 1, 0, -3), value=0.5)), x4)
    with pytest.raises(UnsupportedOpsError, match="negative padding in mode 'reflect'"):
        taskmap.compile(Fn(lambda x: F.pad(x, (-1, 1), mode="reflect")), progress=False)(torch.randn(2, 6, 9))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=(2, 4, 4), stride=(2, 4, 4)),                                  # a tubelet embedding
    dict(kernel_size=3, padding=1, bias=False),
    dict(kernel_size=(3, 1, 3), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(2, 1, 1)),
    dict(kernel_size=3, padding="same", groups=2),
], ids=["tubelets", "3x3x3", "strided-dilated", "same-groups"])
def test_conv3d_is_a_sum_of_2d_convolutions(kwargs):
    conv = nn.Conv3d(4, 6, **kwargs)
    check(conv, torch.randn(2, 4, 6, 8, 12), rtol=1e-4, atol=1e-5)
    check(conv, torch.randn(4, 5, 8, 8), rtol=1e-4, atol=1e-5)                     # unbatched
