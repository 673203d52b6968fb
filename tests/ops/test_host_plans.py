"""Host plans of ``taskmap.ops``: a call like one seen before goes straight to its kernel, and
every input that would fail the checks still fails them, with the same errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from taskmap import ops
from taskmap.errors import OpError
from taskmap.ops import _dispatch
from taskmap.testing import assert_close

RNG = np.random.default_rng(23)


def _data(*shape, dtype=np.float32):
    return RNG.uniform(-2, 2, shape).astype(dtype)


def _planned(head, *arrays):
    plan, key = _dispatch.host_plan(head, *arrays)
    assert key is not None
    return plan


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_softmax_and_layer_norm_plans_match_torch(lib):
    conv = (lambda a: a) if lib == "numpy" else torch.from_numpy
    for _ in range(3):                       # the first call plans, the others run the plan, on new data
        x, w, b = _data(6, 40), _data(40), _data(40)
        y = ops.softmax(conv(x), -1)
        z = ops.layer_norm(conv(x), (40,), conv(w), conv(b))
        assert type(y) is type(conv(x)) and type(z) is type(conv(x))
        tx = torch.from_numpy(x)
        assert_close(np.asarray(y), torch.softmax(tx, -1).numpy())
        assert_close(np.asarray(z), F.layer_norm(tx, (40,), torch.from_numpy(w), torch.from_numpy(b)).numpy())
    assert _planned(("softmax", -1, None), conv(x)) is not None
    assert _planned(("layer_norm", (40,), False, False, 1e-5), conv(x), conv(w), conv(b)) is not None


def test_reduction_plans_match_numpy():
    for _ in range(3):
        x = _data(5, 7, 9)
        assert_close(ops.sum(x, 1), x.sum(1))
        assert_close(ops.mean(x, (1, 2), keepdim=True), x.mean((1, 2), keepdims=True))
        assert_close(ops.var(x, -1), x.var(-1, ddof=1))
    assert _planned(("sum", 1, False, None, 0), x) is not None


def test_weight_or_bias_alone_are_different_plans():
    x, p = _data(4, 16), _data(16)
    tx, tp = torch.from_numpy(x), torch.from_numpy(p)
    for _ in range(2):
        assert_close(ops.layer_norm(x, 16, p, None), F.layer_norm(tx, (16,), tp, None).numpy())
        assert_close(ops.layer_norm(x, 16, None, p), F.layer_norm(tx, (16,), None, tp).numpy())


def test_a_plan_keeps_the_checks_of_bad_parameters():
    x = _data(3, 8)
    ops.softmax(x, 1)
    ops.softmax(x, 1)                        # planned for axis=1
    with pytest.raises(OpError, match="axis must be an int, got True"):
        ops.softmax(x, True)                 # True == 1, but not an axis
    with pytest.raises(OpError, match="axis must be an int, got 1.0"):
        ops.softmax(x, 1.0)
    ops.sum(x, (1,))
    with pytest.raises(OpError, match="axis must be an int, got True"):
        ops.sum(x, (True,))
    ops.layer_norm(x, (8,))
    with pytest.raises(OpError, match="eps must be a non-negative number"):
        ops.layer_norm(x, (8,), eps=-1.0)


def test_a_plan_keeps_the_checks_of_bad_arrays():
    x, w = _data(3, 8), _data(8)
    ops.layer_norm(x, (8,), w, w)
    ops.layer_norm(x, (8,), w, w)
    with pytest.raises(OpError, match="bias must have shape"):
        ops.layer_norm(x, (8,), w, _data(9))
    with pytest.raises(OpError, match="bias must have the input's dtype float32, got float64"):
        ops.layer_norm(x, (8,), w, w.astype(np.float64))
    with pytest.raises(OpError, match="softmax\\(\\) does not support dtype int32"):
        ops.softmax(x.astype(np.int32), 1)
    with pytest.raises(OpError, match="normalized_shape"):
        ops.layer_norm(_data(3, 9), (8,), w, w)


def test_strided_and_other_kinds_of_arrays_take_the_checked_path():
    x = _data(6, 16)
    ops.softmax(x, -1)
    strided = _data(6, 32)[:, ::2]           # not contiguous: copied, never planned
    assert _dispatch.host_plan(("softmax", -1, None), strided) == (None, None)
    assert_close(ops.softmax(strided, -1), torch.softmax(torch.from_numpy(strided.copy()), -1).numpy())
    mixed = ops.layer_norm(x, (16,), torch.from_numpy(_data(16)))   # numpy and torch: a torch result
    assert isinstance(mixed, torch.Tensor)


def test_no_plan_inside_gpu_emulation():
    x = _data(4, 32)
    ops.softmax(x, -1)
    ops.softmax(x, -1)
    with ops.emulate_gpu("sm_90") as emu:
        assert _dispatch.host_plan(("softmax", -1, None), x) == (None, None)
        y = ops.softmax(x, -1)
    assert emu.kernels, "the emulated call ran (and recorded) a GPU-style kernel"
    assert_close(y, torch.softmax(torch.from_numpy(x), -1).numpy())


def test_matmul_attention_and_conv_plans_on_torch_tensors():
    a, b = torch.from_numpy(_data(9, 12)), torch.from_numpy(_data(12, 5))
    q, k, v = (torch.from_numpy(_data(2, 7, 8)) for _ in range(3))
    x, w, bias = torch.from_numpy(_data(1, 3, 9, 9)), torch.from_numpy(_data(4, 3, 3, 3)), torch.from_numpy(_data(4))
    for _ in range(2):
        assert_close(ops.matmul(a, b).numpy(), (a @ b).numpy())
        assert_close(ops.scaled_dot_product_attention(q, k, v, is_causal=True).numpy(),
                     F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy())
        assert_close(ops.conv2d(x, w, bias, padding=1).numpy(), F.conv2d(x, w, bias, padding=1).numpy())
    assert _planned(("conv2d", 1, 1, 1, 1), x, w, bias) is not None
    with pytest.raises(OpError, match="stride must be positive"):
        ops.conv2d(x, w, bias, stride=0, padding=1)


def test_rms_norm_plans_with_default_parameters():
    for _ in range(3):
        x, w = _data(4, 16), _data(16)
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        assert_close(ops.rms_norm(x, weight=w), F.rms_norm(tx, (16,), tw).numpy())
        assert_close(ops.rms_norm(x), F.rms_norm(tx, (16,)).numpy())
        assert_close(ops.rms_norm(tx, (16,), eps=1e-3).numpy(), F.rms_norm(tx, (16,), eps=1e-3).numpy())
    assert _planned(("rms_norm", None, True, None), x) is not None
    with pytest.raises(OpError, match="a 0-d input has no dimension to normalise"):
        ops.rms_norm(np.array(1.0, np.float32))
