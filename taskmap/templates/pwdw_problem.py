"""The problem of the fused pointwise + depthwise convolution template (:mod:`.pwdw_cpu`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PwDwProblem:
    """``(n, cin, h, w)`` input, ``cexp`` expanded channels, a ``kh x kw`` depthwise window with
    stride ``(sh, sw)`` and padding ``(pt, pb, pl, pr)``, activation ``act`` between the two."""

    n: int
    cin: int
    h: int
    w: int
    cexp: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pb: int
    pl: int
    pr: int
    act: str
    dtype: str = "float32"

    @property
    def oh(self) -> int:
        return (self.h + self.pt + self.pb - self.kh) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pl + self.pr - self.kw) // self.sw + 1

    @property
    def flops(self) -> float:
        return 2.0 * self.n * self.cexp * (self.h * self.w * self.cin + self.oh * self.ow * self.kh * self.kw)

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """x, w1 (C_exp, C_in), b1, wd (C_exp, kh * kw), bd."""
        return [((self.n, self.cin, self.h, self.w), self.dtype), ((self.cexp, self.cin), self.dtype),
                ((self.cexp,), self.dtype), ((self.cexp, self.kh * self.kw), self.dtype), ((self.cexp,), self.dtype)]

    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [((self.n, self.cexp, self.oh, self.ow), self.dtype)]


__all__ = ["PwDwProblem"]
