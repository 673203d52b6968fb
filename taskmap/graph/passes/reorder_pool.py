"""Average pooling and a pointwise convolution trade places when that is less work.

An average pool is linear and treats every channel alike (its divisors depend on the position
only); a 1x1 convolution of stride 1 mixes channels pixel by pixel.  So without the conv's bias
the two commute exactly, zero padding included (the conv of zeros is zero)::

    conv1x1(avg_pool(x), W) + b  ==  avg_pool(conv1x1(x, W)) + b

* **Pool, then a conv to fewer channels** (Inception's ``branch_pool``: a 3x3 / 1 average pool of
  192-2048 channels, then a 1x1 conv to 32-192): with a pool of stride 1 the conv costs the same
  either way, and the pool runs on the conv's ``C_out`` channels instead of its ``C_in``.  The
  conv's bias becomes an ``ADD`` after the pool (an epilogue of the pool's kernel).
* **A conv, then a strided pool** (DenseNet's transitions: a 1x1 conv, then a 2x2 / 2 average
  pool): the conv runs on the pooled pixels, a quarter of them.  A bias moves with the conv only
  where the pool keeps a constant a constant — no divisor override, and no zero padding counted
  in the divisor — else that pair stays as it is.

The moved op's result must have no other reader.  float32 / float64 only (a half-precision pair
would round at other points); the results differ from the original order by the rounding of a
reassociated sum.
"""
from __future__ import annotations

from ..attrs import BinaryAttrs, BinaryFn, Pool2dAttrs, ShapeAttrs
from ..ir import Graph, Op, Tensor
from ..kinds import OpKind
from .common import rebuild, use_counts

_FLOATS = ("float32", "float64")


def _pointwise(op: Op | None) -> bool:
    """A 1x1, stride-1, unpadded, ungrouped conv2d over NCHW float32 / float64."""
    if op is None or op.kind is not OpKind.CONV2D:
        return False
    a, w = op.attrs, op.inputs[1]
    return (w.ndim == 4 and w.shape[2:] == (1, 1) and a.stride == (1, 1) and a.padding == (0, 0)
            and a.groups == 1 and op.output.dtype.name in _FLOATS and op.inputs[0].dtype is op.output.dtype)


def _avg_pool(op: Op | None) -> bool:
    return op is not None and op.kind is OpKind.AVG_POOL2D and op.inputs[0].ndim == 4 \
        and op.output.dtype.name in _FLOATS


def _keeps_constants(a: Pool2dAttrs) -> bool:
    """Whether the pool maps a constant plane to the same constant (its divisor counts only the
    elements it sums)."""
    return a.divisor_override is None and (a.padding == (0, 0) or not a.count_include_pad)


def _tensor(like: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
    return Tensor(shape, like.dtype, like.device, name)


def _conv_first(pool: Op, conv: Op) -> list[Op]:
    """``conv(pool(x)) + b`` -> ``pool(conv(x)) + b``: the pool on the conv's channels."""
    x, w = pool.inputs[0], conv.inputs[1]
    y = conv.output
    mixed = _tensor(y, (x.shape[0], w.shape[0], *x.shape[2:]), f"{conv.name}_unpooled")
    ops = [Op(OpKind.CONV2D, (x, w), (mixed,), conv.attrs, conv.name, conv.source)]
    if len(conv.inputs) < 3:
        return [*ops, Op(OpKind.AVG_POOL2D, (mixed,), (y,), pool.attrs, pool.name, pool.source)]
    b = conv.inputs[2]
    pooled = _tensor(y, y.shape, f"{pool.name}_nobias")
    ops.append(Op(OpKind.AVG_POOL2D, (mixed,), (pooled,), pool.attrs, pool.name, pool.source))
    shape = (1, w.shape[0], 1, 1)
    if b.is_constant:
        bias = Tensor(shape, b.dtype, b.device, f"{b.name}_4d", b.data.reshape(shape))
    else:
        bias = _tensor(b, shape, f"{conv.name}_bias_4d")
        ops.append(Op(OpKind.RESHAPE, (b,), (bias,), ShapeAttrs(shape), f"{conv.name}_bias_4d", conv.source))
    return [*ops, Op(OpKind.BINARY, (pooled, bias), (y,), BinaryAttrs(BinaryFn.ADD), f"{conv.name}_bias", conv.source)]


def _pool_first(conv: Op, pool: Op) -> list[Op]:
    """``pool(conv(x))`` -> ``conv(pool(x))``: the conv on the pooled pixels."""
    x = conv.inputs[0]
    z = pool.output
    pooled = _tensor(x, (*x.shape[:2], *z.shape[2:]), f"{pool.name}_first")
    return [Op(OpKind.AVG_POOL2D, (x,), (pooled,), pool.attrs, pool.name, pool.source),
            Op(OpKind.CONV2D, (pooled, *conv.inputs[1:]), (z,), conv.attrs, conv.name, conv.source)]


def reorder_pool(graph: Graph) -> Graph:
    """Swap every average pool / pointwise conv pair that the module's rules make cheaper."""
    uses = use_counts(graph)
    swapped: dict[Op, list[Op]] = {}            # the pair's second op -> the ops taking its place
    dropped: set[Op] = set()
    for op in graph.ops:
        first = graph.producer(op.inputs[0]) if op.inputs else None
        if first is None or first in dropped or first in swapped or uses.get(op.inputs[0], 0) != 1:
            continue
        if _avg_pool(first) and _pointwise(op) and first.attrs.stride == (1, 1) \
                and op.inputs[1].shape[0] < op.inputs[1].shape[1]:
            swapped[op] = _conv_first(first, op)
        elif _pointwise(first) and _avg_pool(op) and op.output.shape[2] * op.output.shape[3] < \
                op.inputs[0].shape[2] * op.inputs[0].shape[3] and (len(first.inputs) < 3 or _keeps_constants(op.attrs)):
            swapped[op] = _pool_first(first, op)
        else:
            continue
        dropped.add(first)
    if not swapped:
        return graph
    return rebuild(graph, [new for op in graph.ops if op not in dropped for new in swapped.get(op, [op])])


__all__ = ["reorder_pool"]
