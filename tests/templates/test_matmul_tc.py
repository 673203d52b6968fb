"""The tensor-core matmul template (f16 / bf16, mma.sync + ldmatrix + cp.async): numerics with GPU
semantics on the CPU — aligned (cp.async) and unaligned (element-wise) tiles, stored and
transposed B, split-K, f16 and f32 outputs.  Spaces, builds and GPU runs: test_matmul_simt.py."""
import numpy as np
import pytest

from taskmap.backends import cuda_target
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.templates.matmul_tc import MATMUL_TC
from taskmap.testing import assert_close
from test_matmul_simt import SM80, run, tc


@pytest.mark.parametrize("schedule,shape", [
    (tc(), (37, 29, 45)),                                   # misaligned rows: element-wise copies
    (tc(bm=64, bn=32, bk=64, wm=2, wn=1, stages=4), (33, 40, 64)),   # aligned: cp.async
    (tc(wm=1, wn=2, stages=2, split=2), (19, 24, 208)),     # split-K
    (tc(bn=64, wm=1, wn=2, split=4), (21, 19, 200)),
], ids=["unaligned", "aligned-4stage", "splitk2", "splitk4"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_tensor_cores_match_numpy(schedule, shape, trans_b):
    p = MatmulProblem(2, *shape, "float16", "float16", b_batched=False, trans_b=trans_b, bias=True)
    c, ref = run(MATMUL_TC, p, schedule, SM80, np.float16)
    assert_close(c, ref.astype(np.float16), rtol=2e-3, atol=2e-3 * np.sqrt(shape[2]))


def test_tensor_cores_f32_output():
    p = MatmulProblem(1, 20, 16, 48, "float16", "float32")
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, p.a_shape).astype(np.float16), rng.uniform(-1, 1, p.b_shape).astype(np.float16)
    c = np.zeros(p.c_shape, np.float32)
    MATMUL_TC.instantiate(p, SM80, tc())(*MATMUL_TC.arguments(p, [a, b], [c], tc()))
    assert_close(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-5)




def test_bf16_transposed_weight():
    torch = pytest.importorskip("torch")
    p = MatmulProblem(1, 18, 24, 40, "bfloat16", "bfloat16", trans_b=True, bias=True)
    g = torch.Generator().manual_seed(0)
    a, w = torch.rand(1, 18, 40, generator=g) - 0.5, torch.rand(1, 24, 40, generator=g) - 0.5
    bias = torch.rand(24, generator=g) - 0.5
    a, w, bias = a.bfloat16(), w.bfloat16(), bias.bfloat16()
    c = torch.zeros(1, 18, 24, dtype=torch.bfloat16)
    s = tc(bn=32, wm=1, wn=2)
    MATMUL_TC.instantiate(p, cuda_target("sm_90"), s)(*MATMUL_TC.arguments(p, [a, w, bias], [c], s))
    ref = a.double() @ w.double().transpose(1, 2) + bias.double()
    assert_close(c.float(), ref.float(), rtol=2e-2, atol=2e-2)
