"""Every error an operator raises on bad input: OpError (a ValueError) or LaunchError, with a
message that says what is wrong."""
import numpy as np
import pytest
import torch

from taskmap import ops
from taskmap.errors import LaunchError, OpError, TaskmapError

X = np.zeros((3, 4), np.float32)
I = np.zeros((3, 4), np.int32)

CASES = [
    (lambda: ops.add(X, np.zeros((5,), np.float32)), "do not broadcast"),
    (lambda: ops.where(np.zeros((2,), bool), X, 0.0), "do not broadcast"),
    (lambda: ops.add(1, 2), "at least one operand must be an array"),
    (lambda: ops.where(True, X, X), "condition must be an array"),
    (lambda: ops.exp([1.0, 2.0]), "expected numpy arrays"),
    (lambda: ops.exp(None), "must be an array"),
    (lambda: ops.exp(np.zeros(3, np.complex64)), "does not support dtype complex64"),
    (lambda: ops.neg(np.zeros(3, bool)), "does not support dtype bool"),
    (lambda: ops.cast(X, "complex64"), "unknown dtype|unsupported target dtype"),
    (lambda: ops.cast(X, "bfloat16"), "numpy has no bfloat16"),
    (lambda: ops.gelu(X, approximate="x"), "approximate"),
    (lambda: ops.sum(X, 2), "axis 2 is out of range for a 2-d array"),
    (lambda: ops.sum(X, (0, 0)), "repeated axis"),
    (lambda: ops.sum(X, 0, dim=1), "axis or dim, not both"),
    (lambda: ops.sum(X, 1.5), "axis must be an int"),
    (lambda: ops.mean(I, 0), "does not support dtype int32"),
    (lambda: ops.var(X, 0, correction=-1), "correction"),
    (lambda: ops.softmax(X, -3), "out of range"),
    (lambda: ops.softmax(I), "does not support dtype int32"),
    (lambda: ops.layer_norm(X, (3,)), "normalized_shape"),
    (lambda: ops.layer_norm(X, (4,), np.zeros(3, np.float32)), "weight must have shape"),
    (lambda: ops.layer_norm(X, (4,), np.zeros(4, np.float64)), "weight must have the input's dtype"),
    (lambda: ops.layer_norm(X, (4,), None, np.zeros(5, np.float32)), "bias must have shape"),
    (lambda: ops.layer_norm(X, (4,), eps=-1.0), "eps"),
    (lambda: ops.rms_norm(X, (2, 4)), "normalized_shape"),
    (lambda: ops.rms_norm(np.zeros((), np.float32)), "0-d"),
    (lambda: ops.reshape(X, (5, -1)), "cannot reshape 12 elements"),
    (lambda: ops.reshape(X, (-1, -1)), "at most one -1"),
    (lambda: ops.permute(X, (0, 0)), "not a permutation"),
    (lambda: ops.transpose(X, 0, 2), "out of range"),
    (lambda: ops.flatten(X, 1, 0), "comes after"),
    (lambda: ops.slice(X, 0, 0, 2, 0), "step must be a positive int"),
    (lambda: ops.narrow(X, 1, 2, 3), "out of range"),
    (lambda: ops.concat([], 0), "non-empty list"),
    (lambda: ops.concat([X, np.zeros((3, 5), np.float32)], 0), "differ outside axis 0"),
    (lambda: ops.concat([X, np.zeros(4, np.float32)], 0), "same number of dimensions"),
    (lambda: ops.pad(X, (1,)), "even number"),
    (lambda: ops.pad(X, (1, 1, 1, 1, 1, 1)), "even number"),
    (lambda: ops.pad(X, (-3, -3)), "negative"),
    (lambda: ops.pad(X, (1, 1), mode="wrap"), "mode must be one of"),
    (lambda: ops.pad(X, (4, 0), mode="reflect"), "reflect padding"),
    (lambda: ops.pad(X, (1, 1), value="a"), "value must be a number"),
    (lambda: ops.gather(X, 1, np.zeros((3, 2), np.float32)), "index must be int32 or int64"),
    (lambda: ops.gather(X, 1, np.zeros(3, np.int64)), "as many dimensions"),
    (lambda: ops.gather(X, 1, np.zeros((4, 2), np.int64)), "exceeds x shape"),
    (lambda: ops.gather(X, 1, np.full((3, 2), 4, np.int64)), r"must be in \[0, 4\)"),
    (lambda: ops.gather(X, 1, np.full((3, 2), -1, np.int64)), r"must be in \[0, 4\)"),
    (lambda: ops.broadcast_to(X, (4, 4)), "cannot broadcast"),
    (lambda: ops.expand(X, 3), "1 sizes for a 2-d array"),
    (lambda: ops.expand(X, -1, 3, 4), "not allowed for the new leading"),
    (lambda: ops.squeeze(X, 3), "out of range"),
]


@pytest.mark.parametrize("call,message", CASES, ids=[m.split("|")[0][:40] for _, m in CASES])
def test_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises((OpError, LaunchError), match=message) as info:
        call()
    assert isinstance(info.value, ValueError) and isinstance(info.value, TaskmapError)


def test_mixed_devices_and_kinds():
    with pytest.raises(LaunchError, match="different devices"):
        ops.add(X, torch.zeros(4, device="meta"))
    y = ops.add(X, torch.zeros(4))  # numpy and torch on the CPU: torch out
    assert isinstance(y, torch.Tensor)
