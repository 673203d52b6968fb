"""Hypothesis strategies for shapes, dtypes and random arrays (needs ``hypothesis``: taskmap[test]).

Arrays are filled by numpy's RNG from one drawn seed rather than element by element, which keeps
large arrays fast to generate; hypothesis still shrinks the shape and replays the seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from taskmap.testing.compare import TOLERANCES, dtype_name

# Sides that tend to break index arithmetic: 1, primes, powers of two and their neighbours.
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 61, 127, 251, 509, 1021)
_SPECIAL_SIDES = tuple(sorted({1, *_PRIMES, *(2**k + d for k in range(1, 12) for d in (-1, 0, 1))}))

DTYPE_GROUPS: dict[str, tuple[str, ...]] = {
    "float": ("float16", "float32", "float64"),
    "int": ("int8", "int16", "int32", "int64"),
    "uint": ("uint8", "uint16", "uint32", "uint64"),
}


def _sides(lo: int, hi: int, odd: bool) -> SearchStrategy[int]:
    special = [n for n in (lo, hi, *_SPECIAL_SIDES) if lo <= n <= hi and (n % 2 == 1 or not odd)]
    if odd:
        if not special:
            raise ValueError(f"no odd side in [{lo}, {hi}]")
        uniform = st.integers(lo // 2, (hi - 1) // 2).map(lambda k: 2 * k + 1)
    else:
        uniform = st.integers(lo, hi)
    return st.one_of(uniform, st.sampled_from(sorted(set(special))))


def shapes(
    min_dims: int = 1,
    max_dims: int = 4,
    min_side: int = 1,
    max_side: int = 64,
    odd: bool = False,
    max_elements: int = 1 << 18,
) -> SearchStrategy[tuple[int, ...]]:
    """Tuples of ``min_dims..max_dims`` sides in ``[min_side, max_side]``.

    Biased towards 1, primes and powers of two +-1; ``odd=True`` draws only odd sides. The
    product is kept at most ``max_elements`` so tests stay fast (sides drawn later are capped by
    what earlier ones left, then the dims are shuffled).
    """
    if not 0 <= min_dims <= max_dims:
        raise ValueError(f"need 0 <= min_dims <= max_dims, got {min_dims}, {max_dims}")
    if not 1 <= min_side <= max_side:
        raise ValueError(f"need 1 <= min_side <= max_side, got {min_side}, {max_side}")
    smallest = min_side if not odd or min_side % 2 else min_side + 1
    if smallest > max_side:
        raise ValueError(f"no odd side in [{min_side}, {max_side}]")
    if smallest**min_dims > max_elements:
        raise ValueError(f"even the smallest shape has more than max_elements={max_elements}")
    top_dims = min_dims  # the most dims whose smallest shape still fits in max_elements
    while top_dims < max_dims and smallest ** (top_dims + 1) <= max_elements:
        top_dims += 1

    @st.composite
    def draw_shape(draw) -> tuple[int, ...]:
        ndim = draw(st.integers(min_dims, top_dims))
        sides: list[int] = []
        for i in range(ndim):  # leave room for the smallest side in every later dim
            room = max_elements // (math.prod(sides) * smallest ** (ndim - i - 1))
            sides.append(draw(_sides(smallest, min(max_side, room), odd)))
        return tuple(draw(st.permutations(sides)))

    return draw_shape()


def dtypes(kinds: tuple[str, ...] = ("float32",)) -> SearchStrategy[str]:
    """Dtype names drawn from ``kinds``: names (``'float16'``) or groups (``'float'``, ``'int'``)."""
    names: list[str] = []
    for kind in kinds:
        for name in DTYPE_GROUPS.get(kind, (dtype_name(kind),)):
            if name not in TOLERANCES:
                raise ValueError(f"unknown dtype {kind!r}")
            if name not in names:
                names.append(name)
    return st.sampled_from(names)


def _fill(rng: np.random.Generator, dtype: np.dtype, shape, low, high) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo = max(info.min, -100 if low is None else int(low))
        hi = min(info.max, 100 if high is None else int(high))
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    if dtype.kind == "f":
        lo = -2.0 if low is None else float(low)
        hi = 2.0 if high is None else float(high)
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    raise AssertionError(dtype)  # _numpy_dtype admits only the kinds above


def arrays(
    dtype: Any,
    shape: tuple[int, ...] | SearchStrategy[tuple[int, ...]],
    low: float | None = None,
    high: float | None = None,
) -> SearchStrategy[np.ndarray]:
    """C-contiguous numpy arrays of ``dtype`` and ``shape`` (each a value or a strategy).

    Floats are uniform in ``[low, high]`` (default [-2, 2]), ints in [-100, 100] (clipped to the
    type; unsigned from 0), bools random. A non-empty array is never all zero (or all False).
    numpy has no bfloat16: draw float32 and convert with torch.
    """
    if not isinstance(dtype, SearchStrategy):
        _numpy_dtype(dtype)  # fail at definition time, not inside the test
    return _arrays(dtype, shape, low, high)


def _numpy_dtype(dtype: Any) -> np.dtype:
    name = dtype_name(dtype)
    if name == "bfloat16":
        raise ValueError("arrays(): numpy has no bfloat16; draw float32 and convert with torch")
    result = np.dtype(name)
    if result.kind not in "biuf":
        raise ValueError(f"arrays(): unsupported dtype {name!r}")
    return result


@st.composite
def _arrays(draw, dtype, shape, low, high) -> np.ndarray:
    if isinstance(dtype, SearchStrategy):
        dtype = draw(dtype)
    if isinstance(shape, SearchStrategy):
        shape = draw(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arr = np.ascontiguousarray(_fill(rng, _numpy_dtype(dtype), tuple(shape), low, high))
    if arr.size and not arr.any():
        arr.flat[0] = 1
    return arr
