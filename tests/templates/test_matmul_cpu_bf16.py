"""The CPU bf16 linear template (``matmul_cpu_bf16``): its packed weights, every register tile
against an f64 reference of the bf16 operands (odd K, edge rows and columns, with and without a
bias), where it applies, and its cost model's picks."""
import dataclasses

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends.base import host_cpu_target
from taskmap.templates.matmul_cpu_bf16 import (MATMUL_CPU_BF16, TILES, Bf16Config, build_kernel, pack_weights,
                                               supported)
from taskmap.templates.matmul_problem import MatmulProblem

CPU = host_cpu_target()
WITH = dataclasses.replace(CPU, features=tuple({*CPU.features, "avx512_bf16"}))
WITHOUT = dataclasses.replace(CPU, features=tuple(f for f in CPU.features if f != "avx512_bf16"))


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def _run(m, n, k, mr, nr, cores, bias, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(1, m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    packed = torch.from_numpy(pack_weights(_bits(w), nr).view(np.int16)).view(torch.bfloat16)
    c = torch.full((1, m, n), float("nan")).bfloat16()
    build_kernel(Bf16Config(mr, nr, cores, bias))(a, packed, b if bias else torch.zeros(1).bfloat16(), c)
    want = a[0].double() @ w.double().T + (b.double() if bias else 0)
    return c[0], want


def test_packed_panels_hold_pairs_of_k_side_by_side():
    w = np.arange(3 * 5, dtype=np.float32).reshape(3, 5) + 1      # n = 3, k = 5 (odd)
    p = pack_weights(w, 2).reshape(2, 3, 2, 2)                      # [panel][k / 2][nr][2]
    assert p[0, 0].tolist() == [[1, 2], [6, 7]] and p[0, 2].tolist() == [[5, 0], [10, 0]]
    assert p[1, 1].tolist() == [[13, 14], [0, 0]]                  # row 2 in panel 1; a zero row past n


@pytest.mark.parametrize("mr,nr", TILES)
def test_every_tile_matches_the_f64_product(mr, nr):
    got, want = _run(2 * mr + 3, 2 * nr + 5, 67, mr, nr, 2, True, mr * nr)
    err = ((got.double() - want).abs() / want.abs().max()).max().item()
    assert err <= 2 ** -8, err                                      # one rounding to bf16 (2^-9) and f32 sums


@given(m=st.integers(1, 40), n=st.integers(1, 100), k=st.integers(1, 80), tile=st.sampled_from(TILES),
       cores=st.sampled_from([1, 2]), bias=st.booleans(), seed=st.integers(0, 2 ** 16))
@settings(max_examples=25, deadline=None)
def test_any_shape(m, n, k, tile, cores, bias, seed):
    got, want = _run(m, n, k, *tile, cores, bias, seed)
    assert bool(torch.isfinite(got).all())                          # every element written, none past m or n read
    err = ((got.double() - want).abs() / want.abs().max()).max().item()
    assert err <= 2 ** -8, err


def test_same_bits_as_pytorchs_bf16_linear():
    """PyTorch's CPU bf16 linear (f32 sums, one rounding) gives the same bits on most elements."""
    got, _ = _run(64, 96, 256, 8, 48, 2, True, 9)
    g = torch.Generator().manual_seed(9)
    a, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((1, 64, 256), (96, 256), (96,)))
    ref = torch.nn.functional.linear(a[0], w, b)
    same = (got == ref).float().mean().item()
    ulps = ((got.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-3)).max().item()
    assert same > 0.95 and ulps <= 2 ** -7, (same, ulps)


def test_where_it_applies():
    p = MatmulProblem(1, 128, 768, 768, "bfloat16", "bfloat16", True, True, True, True, const_b=True)
    assert MATMUL_CPU_BF16.applies(p, WITH) and not MATMUL_CPU_BF16.applies(p, WITHOUT)
    assert supported(WITH) and not supported(WITHOUT)
    for other in (dataclasses.replace(p, const_b=False), dataclasses.replace(p, dtype="float32", out_dtype="float32"),
                  dataclasses.replace(p, batch=2)):
        assert not MATMUL_CPU_BF16.applies(other, WITH) and MATMUL_CPU_BF16.space(other, WITH) == []


def test_cost_model_picks_the_tile_measured_fastest():
    """BERT's linears at batch 1 (128 rows): the model picks 8 x 48 — the fastest measured on Zen 5
    (two cores) on both shapes — and ranks the 4-row tiles, which stream twice the weight panel
    per dot product from L2, last (measured 2x slower)."""
    for n, k in ((3072, 768), (768, 3072)):
        p = MatmulProblem(1, 128, n, k, "bfloat16", "bfloat16", True, True, True, True, const_b=True)
        costs = {(s["mr"], s["nr"]): MATMUL_CPU_BF16.cost(p, WITH, s) for s in MATMUL_CPU_BF16.space(p, WITH)
                 if s["cores"] == WITH.num_cores}
        assert min(costs, key=costs.get) == (8, 48)
        assert min(costs[(4, 96)], costs[(4, 48)]) > max(v for t, v in costs.items() if t[0] > 4)


@pytest.mark.skipif(not supported(CPU), reason="this CPU has no AVX-512 BF16: the template's space is empty")
def test_the_tuner_measures_every_schedule():
    """``TASKMAP_TUNE=exhaustive``: each schedule runs on its own packed panels in the workers."""
    from taskmap.schedule import tune

    p = MatmulProblem(1, 24, 100, 40, "bfloat16", "bfloat16", True, True, True, True, const_b=True)
    result = tune.tune(MATMUL_CPU_BF16, p, CPU, mode="exhaustive", progress=False, use_cache=False)
    times = result.record.times
    assert set(times) == set(MATMUL_CPU_BF16.space(p, CPU)) and all(0 < t < 1 for t in times.values())
    assert result.schedule == min(times, key=times.get)


@given(batch=st.integers(1, 3), m=st.integers(1, 30), n=st.integers(1, 120), k=st.integers(1, 70),
       tile=st.sampled_from(TILES), cores=st.sampled_from([1, 2]), seed=st.integers(0, 2 ** 16))
@settings(max_examples=20, deadline=None)
def test_the_gemm_form_packs_b_per_call(batch, m, n, k, tile, cores, seed):
    """``gemm``: ``c[img] = a @ b[img]`` with ``a`` (a convolution's weights) read in place and each
    core packing the panels of ``b`` it uses (odd K, edge columns: zeros and repeats never stored)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(1, m, k, generator=g).bfloat16()
    b = torch.randn(batch, k, n, generator=g).bfloat16()
    cfg = Bf16Config(*tile, cores, False, gemm=True)
    c = torch.full((batch, m, n), float("nan")).bfloat16()
    build_kernel(cfg)(a, b, torch.zeros(1).bfloat16(), c, torch.empty(cfg.workspace(k)).bfloat16())
    want = a.double() @ b.double()
    assert bool(torch.isfinite(c).all())
    assert ((c.double() - want).abs() / want.abs().max()).max().item() <= 2 ** -8


def test_the_gemm_form_applies_to_convolutions():
    conv = MatmulProblem(8, 64, 3136, 256, "bfloat16", "bfloat16", a_batched=False, b_batched=True, const_a=True)
    assert MATMUL_CPU_BF16.applies(conv, WITH) and MATMUL_CPU_BF16.gemm(conv)
    assert MATMUL_CPU_BF16.config(conv, WITH, MATMUL_CPU_BF16.space(conv, WITH)[0]).gemm
    assert not MATMUL_CPU_BF16.applies(dataclasses.replace(conv, const_a=False), WITH)
