"""One 2-D convolution problem (shapes, window, groups, dtype, bias): what the convolution
templates are instantiated for (:mod:`.conv_cpu`) and what :mod:`taskmap.ops.conv` plans for; its
implicit-GEMM view is a :class:`~.matmul_problem.MatmulProblem`."""
from __future__ import annotations

from dataclasses import dataclass

from .matmul_problem import MatmulProblem


def output_size(size: int, k: int, s: int, p_lo: int, p_hi: int, d: int) -> int:
    """torch's output size of a window ``k`` (dilation ``d``, stride ``s``) over ``size`` padded
    by ``p_lo`` / ``p_hi`` (0 when the padded input is smaller than the window)."""
    span = size + p_lo + p_hi - d * (k - 1) - 1
    return span // s + 1 if span >= 0 else 0


@dataclass(frozen=True)
class ConvProblem:
    """One convolution: shapes, window, groups, dtype, bias (hashable: the plan cache key)."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pb: int
    pl: int
    pr: int
    dh: int
    dw: int
    groups: int
    dtype: str
    bias: bool
    #: the weights are constants (a compiled graph's): templates may take them pre-packed
    const_weights: bool = False
    #: the output is read channels-last (a graph's epilogue permutes it to NHWC): the channel
    #: kernel stores each pixel's channels together
    channels_last: bool = False

    @property
    def oh(self) -> int:
        return output_size(self.h, self.kh, self.sh, self.pt, self.pb, self.dh)

    @property
    def ow(self) -> int:
        return output_size(self.w, self.kw, self.sw, self.pl, self.pr, self.dw)

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution without stride or padding: the input is its own img2col."""
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pb, self.pl, self.pr) == (1, 1, 1, 1, 0, 0, 0, 0)

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        """x (N, C_in, H, W), w (C_out, C_in / groups, kh, kw) (the tuner's example inputs)."""
        return [((self.n, self.cin, self.h, self.w), self.dtype),
                ((self.cout, self.cin // self.groups, self.kh, self.kw), self.dtype)]

    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [((self.n, self.cout, self.oh, self.ow), self.dtype)]

    def matmul(self) -> MatmulProblem:
        g = self.groups
        return MatmulProblem(self.n * g, self.cout // g, self.oh * self.ow, self.cin // g * self.kh * self.kw,
                             self.dtype, self.dtype, a_batched=g > 1, b_batched=True,
                             const_a=self.const_weights and (g == 1 or self.n == 1))


__all__ = ["ConvProblem", "output_size"]
