"""The constants of taskmap's f32 ``exp`` (Cody-Waite reduction and a polynomial), shared by the
IR helper :func:`taskmap.schedule.fastmath.fast_exp` and the C runtime's ``tm_expf``::

    x = n * ln2 + r,   |r| <= ln2 / 2,   n = round(x / ln2)     (two-constant Cody-Waite)
    exp(x) = 2^(n-1) * q(r),   q(r) = 2 * p(r)

``n`` is rounded by adding ``SHIFTER`` (1.5 * 2^23), which leaves it in the low bits of the sum's
bits.  ``p`` is a degree-6 polynomial fitted to ``exp`` on ``[-ln2/2, ln2/2]`` (relative error
2e-9); its coefficients are rounded to f32 and doubled in ``EXP_POLY`` (exact).
"""
from __future__ import annotations

import math

LN2_HI = 0.693145751953125           # ln 2 split so that n * LN2_HI is exact for |n| < 2^9
LN2_LO = 1.4286068203094172321e-06
LOG2E = 1.0 / math.log(2.0)
SHIFTER = 12582912.0                 # 1.5 * 2^23: t = x * log2e + SHIFTER rounds; n is in t's low bits
#: 2 * p(r), lowest degree first.
EXP_POLY = tuple(2.0 * c for c in (1.0, 1.0, 0.4999999403953552, 0.16666428744792938, 0.04166801646351814,
                                   0.008374389261007309, 0.0013843380147591233))


def c_defines() -> str:
    """The constants as C macros (``TM_EXP_*``) for the C runtime."""
    lines = [f"#define TM_EXP_P{i} {c!r}f" for i, c in enumerate(EXP_POLY)]
    lines += [f"#define TM_LN2_HI {LN2_HI!r}f", f"#define TM_LN2_LO {LN2_LO!r}f", f"#define TM_LOG2E {LOG2E!r}f",
              f"#define TM_EXP_SHIFTER {SHIFTER!r}f"]
    return "\n".join(lines) + "\n"


__all__ = ["EXP_POLY", "LN2_HI", "LN2_LO", "LOG2E", "SHIFTER", "c_defines"]
