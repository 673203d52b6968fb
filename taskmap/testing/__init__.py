"""Test helpers for taskmap users and taskmap's own tests.

``assert_close``/``is_close`` compare numpy arrays or torch tensors with the per-dtype
:data:`TOLERANCES` (``round_tf32``: the operands of a TF32 tensor-core
reference); ``shapes``, ``dtypes`` and ``arrays`` are hypothesis strategies (install
``taskmap[test]`` for hypothesis).
"""

from taskmap.testing.compare import TOLERANCES, assert_close, dtype_name, is_close, round_tf32, to_numpy, tolerance
from taskmap.testing.strategies import arrays, dtypes, shapes

__all__ = [
    "TOLERANCES",
    "arrays",
    "assert_close",
    "dtype_name",
    "dtypes",
    "is_close",
    "round_tf32",
    "shapes",
    "to_numpy",
    "tolerance",
]
