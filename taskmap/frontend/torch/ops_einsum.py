"""Registry: ``torch.einsum`` as taskmap ops — sums over the labels only one operand has, then a
batched matmul per pair of operands (labels of both and of the output: the batch; of both only:
contracted; of one and the output: its rows / columns), then a permute to the output's order.

``...`` stands for the same leading dimensions in every operand.  Labels repeated within one
operand (diagonals) and operands that broadcast a label are not supported (they raise the
frontend's ``NotConvertible``, so the op is reported, or run by PyTorch under fallback)."""
from __future__ import annotations

import string
from typing import Any, Sequence

import torch

from ...graph import OpKind, ReduceAttrs, ReduceFn, Tensor
from .registry import Converter, NotConvertible, register


def _parse(equation: str, operands: Sequence[Tensor]) -> tuple[list[str], str]:
    """Each operand's labels and the output's (implicit output: the labels seen once, sorted)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise NotConvertible(f"einsum {equation!r}: {len(terms)} terms for {len(operands)} operands")
    spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in eq]
    ell = None
    out_terms = []
    for t, x in zip(terms, operands):
        if "..." in t:
            k = x.ndim - (len(t) - 3)
            if ell is None:
                ell = "".join(spare[:k])
            elif len(ell) != k:
                raise NotConvertible(f"einsum {equation!r}: '...' of different ranks")
            t = t.replace("...", ell)
        if len(t) != x.ndim or len(set(t)) != len(t):
            raise NotConvertible(f"einsum {equation!r}: term {t!r} for a {x.ndim}-d operand (repeated labels "
                                 "are not supported)")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell or "")
    else:
        seen = "".join(out_terms)
        out = (ell or "") + "".join(sorted(c for c in set(seen) if seen.count(c) == 1 and c not in (ell or "")))
    return out_terms, out


def _sum_out(cv: Converter, x: Tensor, labels: str, keep: set[str]) -> tuple[Tensor, str]:
    axes = tuple(k for k, c in enumerate(labels) if c not in keep)
    if not axes:
        return x, labels
    y = cv.op(OpKind.REDUCE, [x], ReduceAttrs(ReduceFn.SUM, axes, False))
    return y, "".join(c for c in labels if c in keep)


def _pair(cv: Converter, a: Tensor, la: str, b: Tensor, lb: str, keep: set[str]) -> tuple[Tensor, str]:
    """``a`` and ``b`` contracted over the labels they share that ``keep`` does not need."""
    sizes: dict[str, int] = {}
    for x, ls in ((a, la), (b, lb)):
        for c, n in zip(ls, x.shape):
            if sizes.setdefault(c, n) != n:
                raise NotConvertible(f"einsum: label {c!r} has sizes {sizes[c]} and {n} (broadcasting is not "
                                     "supported)")
    a, la = _sum_out(cv, a, la, set(lb) | keep)
    b, lb = _sum_out(cv, b, lb, set(la) | keep)
    batch = [c for c in la if c in lb and c in keep]
    contract = [c for c in la if c in lb and c not in keep]
    rows = [c for c in la if c not in lb]
    cols = [c for c in lb if c not in la]
    prod = lambda ls: int(torch.tensor([sizes[c] for c in ls], dtype=torch.int64).prod()) if ls else 1  # noqa: E731
    a3 = cv.reshape(cv.permute(a, [la.index(c) for c in batch + rows + contract]),
                    (prod(batch), prod(rows), prod(contract)))
    b3 = cv.reshape(cv.permute(b, [lb.index(c) for c in batch + contract + cols]),
                    (prod(batch), prod(contract), prod(cols)))
    c3 = cv.op(OpKind.MATMUL, [a3, b3])
    labels = batch + rows + cols
    return cv.reshape(c3, tuple(sizes[c] for c in labels)), "".join(labels)


@register(torch.einsum)
def einsum(cv: Converter, equation: str, *operands: Any) -> Tensor:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(x, Tensor) for x in operands):
        raise NotConvertible("einsum of non-tensor operands")
    terms, out = _parse(equation, operands)
    x, lx = operands[0], terms[0]
    for k in range(1, len(operands)):
        later = set(out).union(*terms[k + 1:])
        x, lx = _pair(cv, x, lx, operands[k], terms[k], later)
    x, lx = _sum_out(cv, x, lx, set(out))
    if sorted(lx) != sorted(out):
        raise NotConvertible(f"einsum {equation!r}: output labels {out!r} not among the operands'")
    return cv.permute(x, [lx.index(c) for c in out])


__all__: list[str] = []
