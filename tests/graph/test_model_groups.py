"""Kernel counts of whole models after the graph passes and the partition into fusion groups
(no kernel is built: this is what ``taskmap.compile`` launches per call on the CPU).

ResNet-50: every conv with its folded batch norm, ReLU and residual add is one kernel.
BERT-base: q/k/v projections with their head split (reshape + permute), the output projection
with attention's head merge as a prologue and the residual add as an epilogue, FFN1 + GELU,
FFN2 + residual: 9 launches per layer."""
import sys
from pathlib import Path

import pytest
import torch

from taskmap.backends.base import host_cpu_target
from taskmap.frontend.torch.capture import bind, capture, try_symbolic_trace
from taskmap.graph import OpKind
from taskmap.graph.lower import graph_groups
from taskmap.graph.partition import GroupKind
from taskmap.graph.passes import optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models.cnn_defs import ResNet50, randomize_bn


def groups_of(model, *args):
    imported, _ = capture(model, try_symbolic_trace(model), bind(model, args, {}), fallback=False, name="m")
    graph = optimize(imported.graph)
    return imported.graph, graph, graph_groups(graph, host_cpu_target())


def test_resnet50_kernel_count():
    torch.manual_seed(0)
    source, graph, groups = groups_of(randomize_bn(ResNet50()), torch.randn(1, 3, 224, 224))
    assert sum(op.kind is OpKind.BATCH_NORM for op in graph.ops) == 0         # all folded into the convs
    convs = [g for g in groups if g.anchor is not None and g.anchor.kind is OpKind.CONV2D]
    assert len(convs) == 53
    assert not any(g.kind is GroupKind.INJECTIVE for g in groups)    # every relu / add is an epilogue
    assert len(source.ops) == 175
    assert len(groups) == 56        # 53 fused convs + max pool + global average pool + fc


@pytest.mark.slow
def test_bert_base_kernel_count():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(attn_implementation="sdpa")).eval()
    source, _, groups = groups_of(model, torch.randint(0, 30000, (1, 128)))
    anchored = [g for g in groups if g.kind is GroupKind.ANCHORED]
    assert len(anchored) == 12 * 6 + 1                      # 6 linears per layer + the pooler
    # attention's head merge -> each output projection; the [CLS] slice -> the pooler
    assert sum(bool(g.prologues) for g in anchored) == 12 + 1
    assert len(source.ops) == 248
    assert len(groups) == 111       # 12 x 9 + embeddings + their layer norm + pooler
