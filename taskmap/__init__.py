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


def compile(model, example_inputs=None, *, static_shapes=False, fallback=False, progress=None,  # noqa: A001
            capture="auto", fp32_precision=None):
    """Compile a ``torch.nn.Module`` into a callable returning the model's outputs (see
    :func:`taskmap.frontend.torch.compile`).  torch is optional for the rest of taskmap, so the
    frontend is imported here, on first use."""
    from .frontend import torch as frontend  # noqa: PLC0415 - optional dependency, not a cycle

    return frontend.compile(model, example_inputs, static_shapes=static_shapes, fallback=fallback, progress=progress,
                            capture=capture, fp32_precision=fp32_precision)


def load(path, model=None):
    """A compiled model saved with ``CompiledModule.save(path)``; with ``model``, new input shapes
    compile new graphs (see :func:`taskmap.frontend.torch.load`)."""
    from .frontend import torch as frontend  # noqa: PLC0415 - optional dependency, not a cycle

    return frontend.load(path, model)

__all__ = ["CompiledKernel", "Kernel", "TaskMapping", "Tensor", "__version__", "auto_map", "compile", "custom_mapping",
           "empty", "errors", "from_dlpack", "func", "ir", "kernel", "lang", "load", "ops", "repeat", "spatial", "symbol",
           "tensor"]
