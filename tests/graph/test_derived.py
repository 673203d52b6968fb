"""Constants derived once and shared between the compiled graphs of one model (one per input
shape): packed weights are not copied per shape, and values changed in place derive anew."""
import gc
import os

import numpy as np
import torch

import taskmap
from taskmap.graph import derived as D


class _Owner:
    pass


def _counting(value):
    calls = []

    def make():
        calls.append(1)
        return value * 2
    return make, calls


def test_outside_a_compile_it_derives_every_time():
    a = np.arange(D.MIN_BYTES // 4 + 16, dtype=np.float32)
    make, calls = _counting(a)
    D.derived((a,), "twice", make)
    D.derived((a,), "twice", make)
    assert len(calls) == 2


def test_shared_while_an_owner_lives_and_rederived_when_the_values_change():
    a = np.random.default_rng(0).standard_normal(D.MIN_BYTES // 4 + 16).astype(np.float32)
    make, calls = _counting(a)
    first, second = _Owner(), _Owner()
    before = D.entries()
    with D.shared_by(first):
        x = D.derived((a,), "twice", make)
    with D.shared_by(second):
        y = D.derived((a,), "twice", make)
        z = D.derived((a,), "thrice", lambda: a * 3)          # another derivation: its own entry
    assert x is y and len(calls) == 1 and D.entries() == before + 2
    np.testing.assert_array_equal(y, a * 2)
    np.testing.assert_array_equal(z, a * 3)
    a[7] += 1.0                                                # in place, same buffer
    third = _Owner()
    with D.shared_by(third):
        w = D.derived((a,), "twice", make)
    assert len(calls) == 2 and w is not x and w[7] == a[7] * 2
    del first, second, third
    gc.collect()
    assert D.entries() == before


def test_values_derived_from_derived_values_are_not_checksummed(monkeypatch):
    """Only the model's own buffers are checksummed: a value derived from one :func:`derived`
    made (folded weights, then packed), or from a view of it, is shared without reading it."""
    a = np.random.default_rng(1).standard_normal(D.MIN_BYTES // 4 + 16).astype(np.float32)
    summed = []
    crc32 = D.zlib.crc32
    monkeypatch.setattr(D.zlib, "crc32", lambda data, value=0: (summed.append(data.nbytes), crc32(data, value))[1])
    owner, other = _Owner(), _Owner()
    with D.shared_by(owner):
        folded = D.derived((a,), "twice", lambda: a * 2)
        packed = D.derived((folded[::-1],), "packed", lambda: folded[::-1] + 1)
    assert summed == [a.nbytes]
    with D.shared_by(other):
        again = D.derived((D.derived((a,), "twice", lambda: a * 2)[::-1],), "packed", lambda: folded[::-1] + 1)
    assert again is packed and summed == [a.nbytes] * 2
    np.testing.assert_array_equal(packed, (a * 2)[::-1] + 1)


def test_a_failed_compile_keeps_nothing():
    a = np.ones(D.MIN_BYTES // 4 + 16, np.float32)
    before = D.entries()
    try:
        with D.shared_by(_Owner()):
            D.derived((a,), "ones", lambda: a + 1)
            raise RuntimeError("the build failed")
    except RuntimeError:
        pass
    assert D.entries() == before


def _rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_graphs_of_one_model_share_its_packed_weights(monkeypatch):
    """Four input shapes, four compiled graphs: each weight packed once; then an in-place update
    of the weights makes the next graphs pack (and compute with) the new values."""
    from taskmap.templates.matmul_cpu import MATMUL_CPU
    packs = []
    pack = MATMUL_CPU.pack_constants

    def counted(problem, schedule, a, b, target=None):
        packs.append(problem.b_shape)
        return pack(problem, schedule, a, b, target)
    monkeypatch.setattr(MATMUL_CPU, "pack_constants", counted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).eval()
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        for rows in (32, 33, 34, 35):
            x = torch.randn(rows, 512)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
        assert len(fast.entries) == 4
        assert 0 < len(packs) <= 2 * len(set(packs))         # at most a tile change per weight
        first = len(packs)
        model[0].weight.mul_(-0.5)                             # in place: same buffer, new values
        for rows in (32, 36):
            x = torch.randn(rows, 512)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
        assert len(packs) > first


def test_conv_weights_are_packed_once_for_every_image_size(monkeypatch):
    """The batch norm folds into the same weights for every image size, so the folded weights
    are packed once too."""
    from taskmap.templates.conv_cpu import CONV_CPU
    packs = []
    weights = CONV_CPU.weights

    def counted(problem, schedule, w, target=None):
        packs.append(tuple(schedule.get(k) for k in ("vec", "m", "mr", "nr")))
        return weights(problem, schedule, w, target)
    monkeypatch.setattr(CONV_CPU, "weights", counted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.BatchNorm2d(128),
                                torch.nn.ReLU()).eval()
    bn = model[1]
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    fast = taskmap.compile(model, progress=False)
    with torch.no_grad():
        for hw in (20, 21, 22, 20):
            x = torch.randn(1, 64, hw, hw)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    assert packs and len(packs) == len(set(packs))           # once per packing, whatever the image
