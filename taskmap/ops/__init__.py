"""Operators, named and shaped like ``torch`` / ``torch.nn.functional``: numpy arrays, torch
tensors or taskmap Tensors in, the same kind out (see :mod:`.arrays`).  Element-wise and
transform operators are compute definitions scheduled by rules; reductions, softmax and the
norms are templates (:mod:`taskmap.templates.reduce`).  ``emulate_gpu(arch)`` runs the GPU
schedules on host arrays, with GPU semantics, for tests."""
from ._dispatch import emulate_gpu
from .elementwise import (abs, acos, acosh, add, asin, asinh, atan, atan2, atanh, bitwise_and, bitwise_left_shift,
                          bitwise_or, bitwise_right_shift, bitwise_xor, cast, ceil, cos, cosh, div, eq,
                          erf, exp, expm1, floor, floor_divide, fmod, ge, gelu, gt, hardsigmoid, hardswish, le,
                          lgamma, log, log1p, logsigmoid, lt, maximum, minimum, mish, mul, ne, neg, pow, reciprocal,
                          relu, relu6, remainder, round, rsqrt, selu, sigmoid, sign, silu, sin, sinh, softplus, sqrt,
                          square, sub, tan, tanh, trunc, where)
from .transform import (broadcast_to, cat, concat, expand, flatten, gather, narrow, pad, permute, reshape, slice,
                        squeeze, transpose, unsqueeze)
from .reduction import amax, amin, layer_norm, log_softmax, max, mean, min, prod, rms_norm, softmax, sum, var
from .linalg import bmm, linear, matmul  # noqa: E402,F401
from .pool import adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d  # noqa: E402,F401
from .scan import cummax, cummin, cumprod, cumsum, logcumsumexp, sort, topk  # noqa: E402,F401
from .scatter import index_add, index_copy, scatter, scatter_add, scatter_reduce  # noqa: E402,F401
from .depthwise import depthwise_conv2d  # noqa: E402,F401
from .attention import scaled_dot_product_attention  # noqa: E402,F401
from .conv import conv2d  # noqa: E402,F401
from .misc import batch_norm, embedding, masked_fill  # noqa: E402,F401
