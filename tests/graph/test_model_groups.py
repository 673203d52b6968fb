"""Kernel counts of whole models after the graph passes and the partition into fusion groups
(no kernel is built: this is what ``taskmap.compile`` launches per call), on the CPU and for a GPU
(sm_90: the GPU matmul, window, norm and attention templates as anchors).

ResNet-50: every conv with its folded batch norm, ReLU and residual add is one kernel; the max
pool is a template anchor (a prepared kernel, no ``taskmap.ops`` runner).
BERT-base: q/k/v projections with their head split (reshape + permute), attention with its head
merge (permute + reshape) as an epilogue, the output projection with the residual add as an
epilogue, layer norm, FFN1 + GELU, FFN2 + residual, layer norm: 9 launches per layer, every one
an anchored kernel; the embeddings' gathers and adds are the prologue of their layer norm."""
import sys
from pathlib import Path

import pytest
import torch

from taskmap.backends import cuda_target
from taskmap.backends.base import host_cpu_target
from taskmap.frontend.torch.capture import bind, capture, try_symbolic_trace
from taskmap.graph import OpKind
from taskmap.graph.lower import graph_groups, lower_graph, summary
from taskmap.graph.partition import GroupKind
from taskmap.graph.passes import optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.models.cnn_defs import ResNet50, randomize_bn


TARGETS = {"cpu": host_cpu_target, "sm_90": lambda: cuda_target("sm_90")}


def groups_of(model, *args, target="cpu"):
    imported, _ = capture(model, try_symbolic_trace(model), bind(model, args, {}), fallback=False, name="m")
    graph = optimize(imported.graph)
    return imported.graph, graph, graph_groups(graph, TARGETS[target]())


@pytest.mark.parametrize("target", list(TARGETS))
def test_resnet50_kernel_count(target):
    torch.manual_seed(0)
    source, graph, groups = groups_of(randomize_bn(ResNet50()), torch.randn(1, 3, 224, 224), target=target)
    assert sum(op.kind is OpKind.BATCH_NORM for op in graph.ops) == 0         # all folded into the convs
    convs = [g for g in groups if g.anchor is not None and g.anchor.kind is OpKind.CONV2D]
    assert len(convs) == 53
    assert not any(g.kind is GroupKind.INJECTIVE for g in groups)    # every relu / add is an epilogue
    assert len(source.ops) == 175
    assert len(groups) == 56        # 53 fused convs + max pool + global average pool + fc
    assert all(g.kind is GroupKind.ANCHORED for g in groups)
    if target != "cpu":             # and each lowers whole: no fallback, no runner (split-K: two launches)
        counts = summary(lower_graph(graph, TARGETS[target]()))
        assert counts["launches"] == 56 and counts["runners"] == 0 and not counts["fallbacks"]


@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_bert_base_kernel_count(target):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(attn_implementation="sdpa")).eval()
    source, _, groups = groups_of(model, torch.randint(0, 30000, (1, 128)), target=target)
    anchored = [g for g in groups if g.kind is GroupKind.ANCHORED]
    # 6 linears, attention and 2 layer norms per layer + the embeddings' layer norm + the pooler
    assert len(anchored) == len(groups) == 12 * 9 + 2
    assert sum(g.anchor.kind is OpKind.ATTENTION and len(g.epilogue) == 2 for g in anchored) == 12
    # the embeddings (gathers + adds) -> their layer norm; the [CLS] slice -> the pooler
    assert sum(bool(g.prologues) for g in anchored) == 1 + 1
    assert len(source.ops) == 248
