"""Capture by ``torch.export.export(strict=False)`` — ``taskmap.compile``'s choice for forwards
``torch.fx`` cannot trace (transformers' models), several times faster than
``torch._dynamo.export``: ATen overloads through the registry's handlers
(``taskmap/frontend/torch/aten.py``), in-place ops as rebindings, writes through views as item
assignment, and what is left to dynamo (writes it cannot prove safe, ops without a handler)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskmap
from taskmap.errors import CaptureError, UnsupportedError, UnsupportedOpsError
from test_frontend_torch import ACTIVATIONS, ARITHMETIC, MATMULS, SHAPE_OPS, Fn, _same

torch.manual_seed(0)


def compiled(model, *inputs, capture="export", rtol=1e-4, atol=1e-5):
    """``model`` compiled with ``capture``, checked against eager; and its capturing tracer."""
    model = model.eval()
    fast = taskmap.compile(model, progress=False, capture=capture)
    got = fast(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    _same(got, want, rtol, atol)
    (entry,) = fast.entries.values()
    return fast, entry.capture.tracer


x2, x4 = torch.randn(6, 16), torch.randn(2, 3, 8, 8)
CASES = ([(f, (x2,)) for f in ACTIVATIONS] + [(f, (x4,)) for f in SHAPE_OPS] +
         [(f, (x2, torch.randn(6, 16))) for f in ARITHMETIC] +
         [(f, tuple(torch.randn(s) for s in shapes)) for f, shapes in MATMULS])


@pytest.mark.parametrize("fn, inputs", CASES, ids=lambda v: "" if isinstance(v, tuple) else "op")
def test_op_table_through_aten(fn, inputs):
    # the frontend's op table again, captured as ATen calls: every op converts, none runs in PyTorch
    fast, tracer = compiled(Fn(fn, len(inputs)), *inputs, rtol=1e-3, atol=1e-4)
    assert tracer == "torch.export" and "run by PyTorch" not in fast.summary()


def test_layers_and_norms_through_aten():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4), nn.GroupNorm(2, 8), nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, padding_mode="reflect"), nn.InstanceNorm2d(8, affine=True),
        nn.Upsample(scale_factor=2, mode="bilinear"), nn.MaxPool2d(2), nn.AvgPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten(), nn.Dropout(0.3), nn.Linear(32, 10), nn.LayerNorm(10),
        nn.GELU(), nn.ELU(), nn.Hardswish())
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    _, tracer = compiled(model, torch.randn(2, 3, 16, 16))
    assert tracer == "torch.export"


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)

    def forward(self, ids):
        h = self.emb(ids) + torch.arange(ids.shape[1])[None, :, None]
        return h[:, [-1, 0]], h[..., [-2], :], torch.embedding(self.emb.weight, ids[:, 0])


def test_embeddings_and_negative_list_indices():
    # x[..., [-2], :] becomes aten.index with a constant index tensor holding -2: wrapped as in torch
    _, tracer = compiled(Embed(), torch.randint(0, 50, (2, 7)))
    assert tracer == "torch.export"


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        h += x                              # in place on a result: a rebinding
        h.mul_(0.5).relu_()
        out = torch.zeros(x.shape[0], 10)
        out[:, 1:9] = h                     # copy_ into slices of a fresh tensor
        out[:, 0] = 3.0                     # fill_ through a select
        out[0, -1] = torch.tensor(7.0)      # a 0-d tensor broadcast to the region
        return out * 2


def test_in_place_ops_and_writes_through_views():
    _, tracer = compiled(InPlace(), torch.randn(4, 8))
    assert tracer == "torch.export"


class UpdatesThroughViews(nn.Module):
    def forward(self, x, m):
        h = torch.einsum("bij,bkj->bik", x, x)
        v = h[..., :5]
        v *= m                              # an update through a slice: h and v both read after
        w = v + 1
        h[:, 0] += 2.0                      # ... through a select
        g = torch.reshape(x * 3, (2, 7, 6))[:, 1:].reshape(2, 6, 6)[..., :4]
        g *= m[:, :, :4]                    # through reshapes; nothing reads x * 3 after (Funnel)
        c = x.permute(0, 2, 1).contiguous()
        c[:, :, 0] += 1                     # contiguous of a permutation: a copy, not a view
        q = (x * 5).view(2, 6, 7, 1).permute(0, 2, 1, 3)
        q /= 4.0                            # read after through views of the updated view (DeBERTa)
        return h * 2, w, g, c, q.transpose(-1, -2).to(torch.float32) * 2


def test_updates_through_views_are_functional():
    _, tracer = compiled(UpdatesThroughViews(), torch.randn(2, 6, 7), torch.randn(2, 6, 5))
    assert tracer == "torch.export"


class UpdatedTwice(nn.Module):
    def forward(self, x, m):
        acc = torch.zeros_like(x).float()   # an alias (x is float32), updated twice (Autoformer)
        acc += x
        acc += x * 2.0
        h = x * 2
        v = h[..., :5]
        v *= m
        if m.shape[0] == 2:                  # (the second update of a slice: refused, not miscompiled)
            v += 1
        return acc, h


def test_a_second_update_of_an_updated_view():
    x, m = torch.randn(2, 6, 7), torch.randn(1, 6, 5)
    _, tracer = compiled(UpdatedTwice(), x, m)
    assert tracer == "torch.export"
    with pytest.raises(UnsupportedError, match=r"aten.add_.Tensor writes through the view .* v \+= 1"):
        taskmap.compile(UpdatedTwice(), progress=False, capture="export")(x, m.expand(2, 6, 5))


class ViewReadAfterWrite(nn.Module):
    def forward(self, x):
        h = x * 2
        v = h[:, :2]                        # a view of h ...
        h.add_(1)                           # ... h changes ...
        return v * 3, h                     # ... and the view is read after: it sees the change


class ViewsOfAWrittenView(nn.Module):
    """Qwen3.5's rotary frequencies: ``f0 = freq[0]`` written through stepped slices from other
    rows of ``freq`` (views taken before, disjoint from the writes), then ``f0`` read whole."""

    def forward(self, x):
        freq = x * 2.0
        f0 = freq[0]
        for row, offset in ((1, 1), (2, 2)):
            f0[..., offset:12:3] = freq[row, ..., offset:12:3]
        f0[:, ::2, -1] = 7.0                # a stepped slice in the middle, a number
        return torch.cat((f0, f0), dim=-1), freq[2] * 1.5


class WritesInput(nn.Module):
    def forward(self, x):
        if x.shape[0] > 1:                  # Python branching on a size: torch.fx cannot trace it
            x.add_(1)
        return x * 2


def test_views_read_after_a_write_and_input_writes_left_to_dynamo(capsys, monkeypatch):
    # a view read after its base changed in place: the ATen graph takes the view again from the
    # new value (torch.fx's graph refuses it, so "auto" goes there too); dynamo's torch-level graph
    # would silently give the view's old value, so that capture refuses with the model's line
    x = torch.randn(3, 4)
    for capture in ("auto", "export"):
        _, tracer = compiled(ViewReadAfterWrite(), x, capture=capture)
        assert tracer == "torch.export"
    with pytest.raises(UnsupportedError, match=r"view \S+,? \(?taken before\)?,? is read after") as info:
        taskmap.compile(ViewReadAfterWrite().eval(), progress=False, capture="dynamo")(x)
    assert 'test_export_capture.py", line' in str(info.value) and "h.add_(1)" in str(info.value)
    assert "clone the view" in str(info.value)
    # writes into an input: dynamo's graph, which writes them back
    monkeypatch.setenv("TASKMAP_DEBUG", "capture")
    fast = taskmap.compile(WritesInput(), progress=False)
    a = torch.randn(3, 4)
    b = a.clone()
    got = fast(a)
    torch.testing.assert_close(a, b + 1)
    torch.testing.assert_close(got, (b + 1) * 2)
    assert next(iter(fast.entries.values())).capture.tracer == "torch._dynamo.export"
    assert "writes into an input" in capsys.readouterr().err
    with pytest.raises(CaptureError, match=r"torch.export.export could not capture(?s:.*)writes into an input"):
        taskmap.compile(WritesInput(), progress=False, capture="export")(torch.randn(3, 4))


def test_views_taken_before_writes_through_stepped_slices():
    _, tracer = compiled(ViewsOfAWrittenView(), torch.randn(3, 2, 5, 16))
    assert tracer == "torch.export"


class SteppedAssignments(nn.Module):
    def forward(self, x, v):
        y = x * 1.0
        y[:, 1::3] = v
        y[::2, :, 0] = -1.0
        y[1:, 2:7:2, 1:] = v[1:, :3, 1:] * 2
        return y


@pytest.mark.parametrize("capture", ["export", "dynamo"])
def test_item_assignment_into_stepped_slices(capture):
    """``x[:, 1::3] = v``: the value spread along the step, as torch writes it (the ATen graph's
    writes through views and dynamo's ``operator.setitem``; torch.fx cannot trace item assignment)."""
    x, v = torch.randn(4, 10, 3), torch.randn(4, 3, 3)
    _, tracer = compiled(SteppedAssignments(), x, v, capture=capture, rtol=0, atol=0)
    assert tracer == {"export": "torch.export", "dynamo": "torch._dynamo.export"}[capture]


def test_multi_output_ops_need_multi_output_handlers():
    # aten.adaptive_max_pool2d returns (values, indices); F.adaptive_max_pool2d's handler returns
    # the values only, so [0] would pick a row of them: not converted, dynamo's graph is used
    # (with capture="export": the error names the op; fallback=True runs it in PyTorch)
    fn = Fn(lambda x: F.adaptive_max_pool2d(x, 2) + 1)
    _, tracer = compiled(fn, x4, capture="dynamo")
    with pytest.raises(UnsupportedOpsError, match="adaptive_max_pool2d.default at .*returns 2 tensors"):
        taskmap.compile(fn, progress=False, capture="export")(x4)
    fast = taskmap.compile(fn, progress=False, capture="export", fallback=True)
    _same(fast(x4), fn(x4), 1e-6, 1e-6)
    assert "run by PyTorch: aten.adaptive_max_pool2d.default" in fast.summary()


def test_capture_option_and_save_load(tmp_path):
    with pytest.raises(ValueError, match="capture='fx2'"):
        taskmap.compile(nn.ReLU(), capture="fx2")
    model = InPlace().eval()
    x = torch.randn(4, 8)
    fast = taskmap.compile(model, progress=False, capture="export")
    want = fast(x)
    assert "captured by torch.export" in fast.summary()
    fast.save(tmp_path / "m.taskmap")
    loaded = taskmap.load(tmp_path / "m.taskmap")
    torch.testing.assert_close(loaded(x), want)


def test_aten_argument_orders_through_fx():
    # torch.batch_norm / torch.embedding take ATen's argument order (weight before statistics,
    # the table before the indices); they shared F.batch_norm's / F.embedding's handlers
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.rand(4) + 0.5), nn.Parameter(torch.randn(4))
            self.register_buffer("mean", torch.randn(4))
            self.register_buffer("var", torch.rand(4) + 0.5)
            self.table = nn.Parameter(torch.randn(10, 4))

        def forward(self, x, ids):
            y = torch.batch_norm(x, self.w, self.b, self.mean, self.var, False, 0.1, 1e-5, True)
            return y + torch.embedding(self.table, ids, -1, False, False).sum(-1)[:, :, None, None]

    fast, tracer = compiled(M(), torch.randn(2, 4, 3, 3), torch.randint(0, 10, (2, 4)), capture="auto")
    assert tracer == "torch.fx"


def test_dynamic_negative_indices_wrap():
    # an index tensor computed at run time may hold negative indices: they count from the end
    class M(nn.Module):
        def forward(self, x, i):
            return x[i] + x[:, i - 1].sum(-1)[:4, None]
    i = torch.tensor([-1, 2, -4, 0])
    _, tracer = compiled(M(), torch.randn(5, 6), i, capture="auto")
    assert tracer == "torch.fx"


class TopkRouter(nn.Module):
    def forward(self, x):
        probs = torch.softmax(x, -1)
        values, indices = torch.topk(probs, 2, dim=-1)
        values /= values.sum(dim=-1, keepdim=True)   # in place on one output; the other read after
        return values * 2, indices


@pytest.mark.parametrize("capture", ["auto", "export"])
def test_in_place_on_one_output_of_topk_leaves_the_other(capture):
    # Mixtral's router: topk's values and indices are tensors of their own, not views of one another
    fast, _ = compiled(TopkRouter(), torch.randn(5, 8), capture=capture)
    assert "run by PyTorch" not in fast.summary()


class TracedOtherwise(nn.Module):
    """Runs eagerly, raises when traced (a branch on torch.compiler.is_compiling())."""

    def forward(self, x):
        if torch.compiler.is_compiling():
            return x + torch.ones(3)
        return x - 1


class CountsCalls(nn.Module):
    """Raises eagerly too, after changing a buffer: the model's own error."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x + torch.ones(3)


def test_errors_of_the_forward_under_dynamo():
    """dynamo's trace raising inside the forward: a CaptureError naming the traced error and the
    line when the forward runs eagerly, else the forward's own eager error (its buffers put back
    as they were)."""
    x = torch.randn(2, 4)
    with pytest.raises(CaptureError, match=r"runs eagerly but raises when traced(?s:.*)"
                                           r"(must match the size|broadcast a dimension of length 3)"
                                           r"(?s:.*)line \d+, in forward"):
        taskmap.compile(TracedOtherwise().eval(), (x,), progress=False, capture="dynamo")
    model = CountsCalls().eval()
    with pytest.raises(RuntimeError, match=r"^The size of tensor a \(4\) must match the size of tensor b \(3\)"):
        taskmap.compile(model, (x,), progress=False, capture="dynamo")
    assert float(model.calls) == 0


def test_tracing_loggers_are_silent_while_capturing(monkeypatch):
    """torch's fake-tensor logger prints a whole traceback when an op fails on fake tensors
    (Nystromformer: 34 lines) before dynamo raises: silenced during the capture, restored after."""
    import logging
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    enabled = []

    def failing_export(model, **options):
        def run(*args, **kwargs):
            enabled.append(logger.isEnabledFor(logging.ERROR))
            raise torch._dynamo.exc.TorchRuntimeError("RuntimeError when making fake tensor call")
        return run
    monkeypatch.setattr(torch._dynamo, "export", failing_export)
    with pytest.raises(CaptureError, match="runs eagerly but raises when traced"):
        taskmap.compile(TracedOtherwise().eval(), (torch.randn(2, 4),), progress=False, capture="dynamo")
    assert enabled == [False] and logger.level == level and logger.isEnabledFor(logging.ERROR)
