"""Test helpers for taskmap users and taskmap's own tests.

``assert_close``/``is_close`` compare numpy arrays or torch tensors with the per-dtype
:data:`TOLERANCES`; ``shapes``, ``dtypes`` and ``arrays`` are hypothesis strategies (install
``taskmap[test]`` for hypothesis).
"""

from taskmap.testing.compare import TOLERANCES, assert_close, dtype_name, is_close, to_numpy, tolerance
from taskmap.testing.strategies import arrays, dtypes, shapes

__all__ = [
    "TOLERANCES",
    "arrays",
    "assert_close",
    "dtype_name",
    "dtypes",
    "is_close",
    "shapes",
    "to_numpy",
    "tolerance",
]
