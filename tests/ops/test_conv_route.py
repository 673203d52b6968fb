"""The CPU convolution's routing as one tuning space (:mod:`taskmap.ops.conv_route`): the direct
template's points and the implicit GEMM's.  Model mode answers what the cost model's
``select`` does; every point of both kinds computes the convolution from the template's own
arguments (what the tuner measures); a measured choice (the tuning cache) routes
``ops.conv2d`` and the graph compiler."""
import dataclasses

import numpy as np
import pytest
import torch

from taskmap import ops
from taskmap.backends.base import host_cpu_target
from taskmap.graph import Conv2dAttrs, GraphBuilder, OpKind, UnaryAttrs, UnaryFn
from taskmap.graph.lower import lower_graph
from taskmap.graph.passes import optimize
from taskmap.ir.dtypes import f32
from taskmap.ops import conv as conv_module
from taskmap.ops.conv_route import CONV_ROUTE_CPU, GEMM, gemm_schedule, route
from taskmap.runtime.cache import clear_cache
from taskmap.runtime.graph import CompiledGraph
from taskmap.schedule import tune, tuning_cache
from taskmap.schedule.measure import MeasureSettings, measure_candidates
from taskmap.schedule.tuning_cache import TuningRecord
from taskmap.templates.conv_cpu import CONV_CPU, POINTWISE_EDGE, gemm_cost, gemm_space, pointwise_edge, select
from taskmap.templates.conv_problem import ConvProblem
from taskmap.testing import assert_close

CPU = host_cpu_target()
#: Fixed targets, so that the routing compared below does not depend on the machine.
TARGETS = {"zen4": dataclasses.replace(CPU, vector_bytes=64, num_cores=2, l2_bytes=2 << 20, clock_hz=2.6e9,
                                       fma512_per_cycle=1.0, llc_bandwidth=0.0, b_in_place_step=0.0,
                                       b_off_line_step=0.0),
           "cascade": dataclasses.replace(CPU, vector_bytes=64, num_cores=2, l2_bytes=2 << 20, clock_hz=2.5e9,
                                          fma512_per_cycle=1.75, llc_bandwidth=0.0, b_in_place_step=0.0,
                                          b_off_line_step=0.0),
           "avx2": dataclasses.replace(CPU, vector_bytes=32, num_cores=4, l2_bytes=4 << 19, clock_hz=3e9,
                                       llc_bandwidth=0.0, b_in_place_step=0.0, b_off_line_step=0.0)}


def conv(cin, hw, cout, k, s=1, pad=None, const=True, n=1, groups=1):
    pad = k // 2 if pad is None else pad
    return ConvProblem(n, cin, hw, hw, cout, k, k, s, s, pad, pad, pad, pad, 1, 1, groups, "float32", False, const)


LAYERS = [conv(64, 56, 64, 3), conv(256, 14, 256, 3), conv(64, 56, 256, 1), conv(256, 56, 512, 1, 2),
          conv(3, 224, 64, 7, 2), conv(512, 7, 512, 3), conv(64, 30, 64, 3, const=False), conv(32, 17, 48, 3, 2),
          conv(64, 56, 64, 1, const=False), conv(32, 9, 32, 3, n=2, groups=4)]


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    """An empty cache (tuning records, kernels) and no tuning mode from the environment."""
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TASKMAP_TUNE", raising=False)
    monkeypatch.setattr(conv_module, "_PLANS", {})
    tune.clear_memo()
    yield tmp_path
    clear_cache("tuning")
    tune.clear_memo()


@pytest.mark.parametrize("target", list(TARGETS), ids=str)
def test_the_model_routes_as_select(tuning, target):
    t = TARGETS[target]
    for p in LAYERS:
        direct, gemm = route(p, t)
        assert direct == select(p, t), p
        if direct is None:
            costs = {s: gemm_cost(p, t, s) for s in gemm_space(p, t)}
            assert gemm == min(costs, key=costs.__getitem__), p
        else:
            assert gemm is None and direct.get("vec") != GEMM


def test_a_fast_last_level_cache_sends_14x14_pointwise_layers_to_the_channel_kernel(tuning):
    """The channel kernel sweeps the image once per weight panel, from L3 when it does not stay
    in L2, at the host's measured rate (``Target.llc_bandwidth``).  Measured on a 2-core Zen 5
    (1 MB L2 per core, L3 read at ~120 GB/s by one core; exhaustive records, medians): ResNet-50's
    1024 -> 256 at 14x14 ran 0.193 ms on the channel kernel against 0.218 on the implicit GEMM,
    1024 -> 2048 with stride 2 0.415 against 0.547, while at 28x28 and 56x56 the GEMM won by
    7-13% (512 -> 128, 128 -> 512, 256 -> 64, 64 -> 256).  At the default rate (Cascade Lake's
    ~20 GB/s) all of them stay on the GEMM."""
    zen5 = dataclasses.replace(TARGETS["cascade"], fma512_per_cycle=2.0, clock_hz=2.6e9, llc_bandwidth=128e9)
    slow = dataclasses.replace(zen5, llc_bandwidth=0.0)
    to_channels = [conv(1024, 14, 256, 1), conv(1024, 14, 2048, 1, 2)]
    to_gemm = [conv(512, 28, 128, 1), conv(128, 28, 512, 1), conv(256, 56, 64, 1), conv(64, 56, 256, 1)]
    for p in to_channels:
        direct, _ = route(p, zen5)
        assert direct is not None and direct.get("vec") == "channels", p
        assert route(p, slow)[0] is None, p
    for p in to_gemm:
        assert route(p, zen5)[0] is None, p


def test_pointwise_layers_route_as_measured_on_a_zen4():
    """One full-width FMA a cycle (Zen 4), B in place as cheap as packed (its probe) and L3 read at
    ~90 GB/s: the 1x1 layers go where they ran faster side by side on that part (session 44, two
    cores, batch 1): ResNeXt-50's 1024 -> 512 at 14x14 0.91 ms on the channel kernel against 0.96
    on the GEMM, ResNet-50's 1024 -> 256 0.46 against 0.49, 2048 -> 512 at 7x7 0.46 against 0.60,
    MobileNetV2's 384 -> 64 at 14x14 46 against 50 us; at batch 8 ResNeXt-50's 1024 -> 512 and
    1024 -> 1024 at 14x14 7.3 against 8.0 and 14.6 against 15.7 ms, the stride-2 256 -> 512 at 56x56
    8.5 against 9.7; the other way, MobileNetV2's 64 -> 384 and 96 -> 576 at 14x14 56 against 50
    and 113 against 107 us (at batch 8 the first 434 against 394), ResNet-50's 64 -> 256 at 56x56
    and 128 -> 512 at 28x28 0.55 against 0.51 and 0.50 against 0.47 ms (at batch 8 the second 4.10
    against 3.83).  A core with two FMAs keeps the larger edge that a Cascade Lake and a Zen 5
    measured."""
    zen4 = dataclasses.replace(TARGETS["zen4"], llc_bandwidth=90e9, b_in_place_step=1.0, b_off_line_step=1.0)
    assert pointwise_edge(zen4) == POINTWISE_EDGE < pointwise_edge(TARGETS["cascade"])
    assert pointwise_edge(TARGETS["avx2"]) == pointwise_edge(TARGETS["cascade"])
    for p in [conv(1024, 14, 512, 1), conv(1024, 14, 256, 1), conv(2048, 7, 512, 1), conv(384, 14, 64, 1),
              conv(1024, 14, 512, 1, n=8), conv(1024, 14, 1024, 1, n=8), conv(256, 56, 512, 1, 2, n=8)]:
        direct, _ = route(p, zen4)
        assert direct is not None and direct.get("vec") == "channels", p
    for p in [conv(64, 14, 384, 1), conv(96, 14, 576, 1), conv(64, 56, 256, 1), conv(128, 28, 512, 1),
              conv(64, 14, 384, 1, n=8), conv(128, 28, 512, 1, n=8)]:
        assert route(p, zen4)[0] is None, p
    assert route(conv(1024, 14, 512, 1), TARGETS["cascade"])[0] is None


def test_grouped_layers_of_whole_vectors_route_to_the_channel_kernel():
    """ResNeXt-50's 3x3 layers whose 16 or 32 channels a group are whole vectors go to the channel
    kernel, where they ran faster on Zen 4 (two cores, isolated, side by side): stride 2 at 28x28
    1.82 against 2.73 ms on the pixel kernel at batch 8, 0.228 against 0.290 at batch 1; stride 2 at
    14x14 1.74 against 2.08 and 0.220 against 0.265; 1024 channels at 7x7 1.35 against 1.61 and
    0.175 against 0.206.  At 14x14, stride 1, both ran alike alone (1.48 against 1.47 ms), the channel
    kernel 1.05-1.3x faster in the model's flow (``GROUPED_PIXEL_FLOW``, ``PAD_EACH_SHARE``); groups of
    4 and 8 channels are not whole 16-lane vectors (the pixel kernel)."""
    zen4 = dataclasses.replace(TARGETS["zen4"], llc_bandwidth=90e9, b_in_place_step=1.0, b_off_line_step=1.0)
    for n in (1, 8):
        for c, hw, s in [(512, 28, 2), (1024, 14, 2), (1024, 7, 1), (512, 14, 1)]:
            p = conv(c, hw, c, 3, s, n=n, groups=32)
            kinds = {"gemm" if gemm_schedule(sc) is not None else sc.get("vec", "pixels")
                     for sc in CONV_ROUTE_CPU.space(p, zen4)}
            direct, _ = route(p, zen4)
            assert kinds == {"gemm", "pixels", "channels"} and direct.get("vec") == "channels" and direct["nr"] == 16, p
        for c, hw in [(128, 56), (256, 28)]:
            direct, _ = route(conv(c, hw, c, 3, n=n, groups=32), zen4)
            assert direct is not None and direct.get("vec") is None, (n, c)


def test_the_space_holds_both_kinds():
    p = conv(64, 28, 64, 3)
    space = CONV_ROUTE_CPU.space(p, CPU)
    gemms = [s for s in space if gemm_schedule(s) is not None]
    assert len(space) == len(CONV_CPU.space(p, CPU)) + len(gemms) and gemms
    assert all(gemm_schedule(s)["pack_b"] for s in gemms)                # img2col runs in the B packing
    grouped = conv(32, 9, 32, 3, n=2, groups=16)           # 2 channels a group: the implicit GEMM or the pixel kernel
    kinds = {"gemm" if gemm_schedule(s) is not None else s.get("vec", "pixels") for s in CONV_ROUTE_CPU.space(grouped, CPU)}
    assert kinds == {"gemm", "pixels"}


def _reference(p, x, w):
    t = torch.from_numpy
    return torch.nn.functional.conv2d(t(x).double(), t(w).double(), stride=(p.sh, p.sw), padding=(p.pt, p.pl),
                                      groups=p.groups).numpy()


@pytest.mark.parametrize("p", [conv(16, 13, 24, 3), conv(16, 13, 24, 3, const=False), conv(24, 12, 40, 1),
                               conv(16, 15, 32, 3, 2), conv(8, 9, 16, 3, n=2, groups=2)], ids=repr)
def test_every_kind_of_point_computes_the_convolution(p):
    """The model's best point of each kind (pixel tiles, channel tiles, Winograd, implicit GEMM)
    run from the template's own arguments — constant weights packed as a graph packs them."""
    best = {}
    for s in CONV_ROUTE_CPU.space(p, CPU):
        kind = s.get("vec", "pixels")
        cost = CONV_ROUTE_CPU.cost(p, CPU, s)
        if kind not in best or cost < best[kind][0]:
            best[kind] = (cost, s)
    assert GEMM in best
    rng = np.random.default_rng(3)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    w = rng.standard_normal((p.cout, p.cin // p.groups, p.kh, p.kw)).astype(np.float32)
    ref = _reference(p, x, w)
    for kind, (_, s) in best.items():
        out = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
        CONV_ROUTE_CPU.instantiate(p, CPU, s)(*CONV_ROUTE_CPU.arguments(p, [x, w], [out], s, CPU))
        assert_close(out, ref, rtol=1e-4, atol=1e-4 * p.cin * p.kh * p.kw, err_msg=f"{kind}: {s}")


def test_the_tuner_measures_a_direct_point_against_an_implicit_gemm():
    p = conv(32, 20, 32, 3)
    space = CONV_ROUTE_CPU.space(p, CPU)
    direct = next(s for s in space if gemm_schedule(s) is None)
    gemm = next(s for s in space if gemm_schedule(s) is not None)
    measured = measure_candidates(CONV_ROUTE_CPU, p, CPU, [direct, gemm], MeasureSettings(warmup=1, repeat=2, rounds=1))
    assert all(m.ok and m.time > 0 for m in measured), [m.error for m in measured]


def _record(p, best, other):
    return TuningRecord(CONV_ROUTE_CPU.name, repr(p), CPU.name, "topk", 2, best, {best: 1e-3, other: 2e-3})


def test_a_measured_route_sends_ops_conv2d_to_the_implicit_gemm(tuning):
    """A layer the model runs direct, with a measured record saying the implicit GEMM was
    faster: ``ops.conv2d`` runs the GEMM on the measured matmul schedule, and is right."""
    p = conv(48, 20, 48, 3, const=False)
    direct, _ = route(p, CPU)
    assert direct is not None, "the layer should run direct by the model on this host"
    gemms = [s for s in CONV_ROUTE_CPU.space(p, CPU) if gemm_schedule(s) is not None]
    slowest = max(gemms, key=lambda s: CONV_ROUTE_CPU.cost(p, CPU, s))      # not the model's GEMM either
    tuning_cache.store(CONV_ROUTE_CPU, p, CPU, _record(p, slowest, direct))
    tune.clear_memo()
    assert route(p, CPU) == (None, gemm_schedule(slowest))
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 48, 20, 20)).astype(np.float32)
    w = rng.standard_normal((48, 48, 3, 3)).astype(np.float32)
    got = ops.conv2d(x, w, None, 1, 1)
    plan = conv_module._plan(p, CPU)
    assert isinstance(plan, conv_module._Plan) and plan.schedule == gemm_schedule(slowest)
    assert_close(got, _reference(p, x, w), rtol=1e-4, atol=1e-3)


def test_a_measured_route_reaches_the_graph_compiler(tuning):
    """conv + bias + ReLU with constant weights (one kernel): routed to the implicit GEMM by a
    measured record, the group lowers to the matmul kernel and matches PyTorch."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((48, 32, 3, 3)) / 10).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    b = GraphBuilder()
    x = b.input((1, 32, 14, 14), f32)
    y = b.op(OpKind.CONV2D, [x, b.constant(w), b.constant(bias)], Conv2dAttrs((1, 1), (1, 1), (1, 1), 1))
    graph = b.build([b.op(OpKind.UNARY, [y], UnaryAttrs(UnaryFn.RELU))])
    p = conv(32, 14, 48, 3)
    points = CONV_ROUTE_CPU.space(p, CPU)
    gemm = min((s for s in points if gemm_schedule(s) is not None), key=lambda s: CONV_ROUTE_CPU.cost(p, CPU, s))
    direct = next(s for s in points if gemm_schedule(s) is None)
    tuning_cache.store(CONV_ROUTE_CPU, p, CPU, _record(p, gemm, direct))
    tune.clear_memo()
    (kg,) = lower_graph(optimize(graph), CPU)
    assert kg.kernel.__name__.startswith("matmul_cpu"), kg.kernel.__name__
    xv = rng.standard_normal((1, 32, 14, 14)).astype(np.float32)
    out = CompiledGraph(graph, "cpu", "numpy")(xv)[0]
    t = torch.from_numpy
    ref = torch.relu(torch.nn.functional.conv2d(t(xv).double(), t(w).double(), t(bias).double(), padding=1)).numpy()
    assert_close(out, ref, rtol=1e-4, atol=1e-4)
