"""taskmap: a deep-learning compiler built on task mappings.

Public names only; see DESIGN.md §1.  ``taskmap.lang`` holds the kernel DSL (dtypes, ``attrs``,
``threadIdx``, ``syncthreads``, shared/register tensors, math builtins); ``taskmap.testing``
holds hypothesis strategies and tolerance-aware comparisons for users' own kernels;
``taskmap.ops`` the operators (``matmul``, ``softmax``, ``layer_norm``, element-wise, ...).
"""
from . import errors, ir, lang, ops
from .ir.mapping import TaskMapping, auto_map, custom_mapping, repeat, spatial
from .lang import func, kernel, symbol
from .runtime.kernel import CompiledKernel, Kernel
from .runtime.tensor import Tensor, empty, from_dlpack, tensor
from .version import __version__

__all__ = ["CompiledKernel", "Kernel", "TaskMapping", "Tensor", "__version__", "auto_map", "custom_mapping", "empty",
           "errors", "from_dlpack", "func", "ir", "kernel", "lang", "ops", "repeat", "spatial", "symbol", "tensor"]
