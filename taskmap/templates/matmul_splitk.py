"""Split-K (parallel-K) for the GPU matmul templates, and what they share.

When ``m x n`` gives too few thread blocks to fill the GPU and K is long, the templates cut K
into ``split`` ranges: block ``(x, y, z)`` with ``z = batch_index * split + s`` multiplies its
tile over the ``s``-th range and writes the partial tile, in f32, to a workspace of shape
``(batch * split, m, n)``; then :func:`build_reduce` — an epilogue kernel with one thread per
4 output elements (``spatial`` over the grid, ``repeat(4)`` per thread) — sums the ``split``
partial results, adds the bias, converts to the output dtype and writes C.

:class:`KernelChain` runs such a pair as one callable: ``chain(*args)`` with the template's
arguments, each kernel taking its own subset; ``chain.build(target, arch)`` builds both.
"""
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..lang.kernel import kernel
from ..ir.mapping import repeat, spatial
from ..lang import attrs, blockIdx, f32, symbol, threadIdx

from ..backends.base import Target
from ..ir.dtypes import scalar_type
from ..runtime.kernel import Kernel

REDUCE_THREADS = 256
PER_THREAD = 4


@dataclass(frozen=True)
class ReduceConfig:
    split: int
    out_dtype: str
    bias: bool


def build_reduce(cfg: ReduceConfig) -> Kernel:
    """``c[b, i, j] = sum_s part[b * split + s, i, j] (+ bias[j])``, converted to the output dtype."""
    S, OUT, BIAS = cfg.split, scalar_type(cfg.out_dtype), cfg.bias
    pz, batch, m, n, nbias = symbol("pz"), symbol("batch"), symbol("m"), symbol("n"), symbol("nbias")
    per_block = REDUCE_THREADS * PER_THREAD
    threads = spatial(REDUCE_THREADS) * repeat(PER_THREAD)
    BIAS_T = OUT[n] if BIAS else OUT[nbias]

    @kernel
    def splitk_reduce(part: f32[pz, m, n], bias: BIAS_T, c: OUT[batch, m, n]):
        attrs.grid_dim = ((m * n + per_block - 1) // per_block, batch)
        attrs.block_dim = REDUCE_THREADS
        bi = blockIdx.y
        for q in threads.on(threadIdx.x):
            e = blockIdx.x * per_block + q
            if e < m * n:
                i = e // n
                j = e % n
                s = 0.0
                for t in range(S):
                    s += part[bi * S + t, i, j]
                if BIAS:
                    s += f32(bias[j])
                c[bi, i, j] = s

    return splitk_reduce


class KernelChain:
    """Kernels run one after another as one operation; ``picks[i]`` are the indices of the chain's
    arguments that kernel ``i`` takes."""

    def __init__(self, kernels: Sequence[Kernel], picks: Sequence[Sequence[int]]) -> None:
        self.kernels = tuple(kernels)
        self.picks = tuple(tuple(p) for p in picks)
        self.__name__ = "+".join(k.__name__ for k in self.kernels)

    def __call__(self, *args: Any) -> None:
        for k, pick in zip(self.kernels, self.picks):
            k(*(args[i] for i in pick))

    def build(self, target: str = "cpu", arch: str | None = None) -> "CompiledChain":
        return CompiledChain([k.build(target, arch) for k in self.kernels], self.picks)

    def __repr__(self) -> str:
        return f"<taskmap KernelChain {self.__name__}>"


class CompiledChain:
    """A :class:`KernelChain` built for one target (``.compiled``: one CompiledKernel per kernel)."""

    def __init__(self, compiled: Sequence[Any], picks: Sequence[Sequence[int]]) -> None:
        self.compiled = list(compiled)
        self.picks = picks

    def __call__(self, *args: Any) -> None:
        for k, pick in zip(self.compiled, self.picks):
            k(*(args[i] for i in pick))

    def prepare(self, *args: Any) -> Callable[..., None]:
        """Each kernel's launch checked and packed once (``CompiledKernel.prepare``); calling the
        result (with an optional stream, as a prepared launch) launches them in order."""
        launches = [k.prepare(*(args[i] for i in pick)) for k, pick in zip(self.compiled, self.picks)]

        def launch(stream: Any = None) -> None:
            for one in launches:
                one(stream)
        return launch

    @property
    def source(self) -> str:
        return "\n\n".join(k.source for k in self.compiled)

    @property
    def target(self) -> Target:
        return self.compiled[0].target

    @property
    def launcher(self) -> Any:
        """The first kernel's launcher, or None when any of them cannot be launched here."""
        launchers = [k.launcher for k in self.compiled]
        return None if any(x is None for x in launchers) else launchers[0]


def splits_for(target: Target, tiles: int, k: int, bk: int) -> list[int]:
    """Split-K factors worth trying: 1, and — when the tiles leave multiprocessors idle and K is
    long — the smallest power of two that fills them, and twice that (each range keeps at least
    4 K tiles; at most 16 ranges)."""
    sms = max(1, target.num_cores)
    if tiles >= sms:
        return [1]
    s = 2
    while s < 16 and tiles * s < sms:
        s *= 2
    return [1] + [x for x in (s, 2 * s) if x <= 16 and k >= x * 4 * bk]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["KernelChain", "CompiledChain", "PER_THREAD", "REDUCE_THREADS", "ReduceConfig", "build_reduce",
           "ceil_div", "splits_for"]
