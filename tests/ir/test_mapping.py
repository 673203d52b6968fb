"""Task mappings (taskmap.ir.mapping) against the Hidet paper's definitions (§5.1.1-5.1.2)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.ir.mapping import (
    ComposedMapping,
    MappingLoop,
    MappingLoopKind,
    MappingOn,
    RepeatMapping,
    SpatialMapping,
    TaskMapping,
    auto_map,
    custom_mapping,
    repeat,
    spatial,
)

Task = tuple[int, ...]


# --------------------------------------------------------------------------------------------
# An independent reference, written straight from the paper: a mapping is (n, d, f) with f(w)
# the list of tasks of worker w.
@dataclasses.dataclass(frozen=True)
class Ref:
    n: int
    d: Task
    f: Callable[[int], list[Task]]


def _order(ranks: Task) -> list[int]:
    """Dimensions from slowest to fastest (rank 0 = slowest)."""
    return [ranks.index(r) for r in range(len(ranks))]


def ref_spatial(shape: Task, ranks: Task) -> Ref:
    def f(w: int) -> list[Task]:
        idx = [0] * len(shape)
        for dim in reversed(_order(ranks)):  # peel the fastest dimension off first
            w, idx[dim] = divmod(w, shape[dim])
        return [tuple(idx)]

    return Ref(math.prod(shape), shape, f)


def ref_repeat(shape: Task, ranks: Task) -> Ref:
    order = _order(ranks)
    grid = sorted(itertools.product(*map(range, shape)), key=lambda t: [t[i] for i in order])
    return Ref(1, shape, lambda w: list(grid))


def ref_compose(a: Ref, b: Ref) -> Ref:
    """f3(w) = [t1 ⊙ d2 + t2 | t1 ∈ f1(w // n2), t2 ∈ f2(w % n2)]."""
    d = tuple(x * y for x, y in zip(a.d, b.d))

    def f(w: int) -> list[Task]:
        return [
            tuple(x * dy + y for x, dy, y in zip(t1, b.d, t2))
            for t1 in a.f(w // b.n)
            for t2 in b.f(w % b.n)
        ]

    return Ref(a.n * b.n, d, f)


# --------------------------------------------------------------------------------------------
# A symbolic index that only supports + * // %: anything else (comparisons, truth tests,
# conversion to int, divmod, subtraction) fails loudly.
class Sym:
    def __init__(self, op: str, *args: object) -> None:
        self.op, self.args = op, args

    def _bin(op: str, swap: bool = False):  # type: ignore[no-untyped-def]
        def method(self: Sym, other: object) -> Sym:
            assert isinstance(other, (int, Sym)) and not isinstance(other, bool), other
            return Sym(op, other, self) if swap else Sym(op, self, other)

        return method

    __add__, __radd__ = _bin("+"), _bin("+", True)
    __mul__, __rmul__ = _bin("*"), _bin("*", True)
    __floordiv__, __rfloordiv__ = _bin("//"), _bin("//", True)
    __mod__, __rmod__ = _bin("%"), _bin("%", True)

    def _forbidden(self, *args: object) -> None:
        raise AssertionError(f"task_index used a non-arithmetic operation on {self!r}")

    __bool__ = __int__ = __index__ = __float__ = _forbidden
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _forbidden
    __hash__ = None  # type: ignore[assignment]

    def eval(self, env: dict[str, int]) -> int:
        if self.op == "var":
            return env[self.args[0]]  # type: ignore[index]
        a, b = (x.eval(env) if isinstance(x, Sym) else x for x in self.args)
        return OPS[self.op](a, b)  # type: ignore[no-any-return]

    def nodes(self) -> list[Sym]:
        return [self] + [n for x in self.args if isinstance(x, Sym) for n in x.nodes()]

    def __repr__(self) -> str:
        if self.op == "var":
            return str(self.args[0])
        return f"({self.args[0]!r} {self.op} {self.args[1]!r})"


OPS = {"+": operator.add, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


def var(name: str) -> Sym:
    return Sym("var", name)


def evaluate(x: object, env: dict[str, int]) -> int:
    return x.eval(env) if isinstance(x, Sym) else x  # type: ignore[return-value]


def symbolic_tasks(m: TaskMapping, worker: int) -> list[Task]:
    """worker2task, recomputed by evaluating one symbolic task_index per task."""
    loop_vars = [var(f"i{k}") for k in range(len(m.loop_extents()))]
    index = m.task_index(var("w"), loop_vars)
    out = []
    for values in itertools.product(*map(range, m.loop_extents())):
        env = {"w": worker, **{f"i{k}": v for k, v in enumerate(values)}}
        out.append(tuple(evaluate(x, env) for x in index))
    return out


def assert_no_trivial_ops(m: TaskMapping) -> None:
    loop_vars = [var(f"i{k}") for k in range(len(m.loop_extents()))]
    for x in m.task_index(var("w"), loop_vars):
        for node in x.nodes() if isinstance(x, Sym) else []:
            consts = [a for a in node.args if isinstance(a, int)]
            if node.op in ("*", "//", "%"):
                assert 1 not in consts and 0 not in consts, f"needless {node!r} in {m!r}"
            if node.op == "+":
                assert 0 not in consts, f"needless {node!r} in {m!r}"


# --------------------------------------------------------------------------------------------
# Strategies: random factors and their compositions, as (module mapping, reference) pairs.
@st.composite
def factors(draw: st.DrawFn, ndim: int, max_extent: int = 4) -> tuple[TaskMapping, Ref]:
    shape = tuple(draw(st.lists(st.integers(1, max_extent), min_size=ndim, max_size=ndim)))
    ranks = tuple(draw(st.permutations(range(ndim))))
    if draw(st.booleans()):
        return spatial(*shape, ranks=ranks), ref_spatial(shape, ranks)
    return repeat(*shape, ranks=ranks), ref_repeat(shape, ranks)


@st.composite
def factor_lists(draw: st.DrawFn, min_size: int = 1, max_size: int = 4) -> list:  # type: ignore[type-arg]
    ndim = draw(st.integers(1, 3))
    count = draw(st.integers(min_size, max_size))
    # keep the task grid small: at most 4**4, 3**6 or 2**12 tasks
    max_extent = 4 if ndim * count <= 4 else 3 if ndim * count <= 6 else 2
    return draw(st.lists(factors(ndim, max_extent), min_size=count, max_size=count))


def compose(pairs: list[tuple[TaskMapping, Ref]]) -> tuple[TaskMapping, Ref]:
    m, r = pairs[0]
    for m2, r2 in pairs[1:]:
        m, r = m * m2, ref_compose(r, r2)
    return m, r


def assert_covers_exactly_once(m: TaskMapping) -> None:
    seen = Counter(t for w in range(m.num_workers) for t in m.worker2task(w))
    assert set(seen) == set(itertools.product(*map(range, m.task_shape)))
    assert set(seen.values()) == {1}


# --------------------------------------------------------------------------------------------
@settings(deadline=None)
@given(factor_lists())
def test_composition_matches_paper_formula(pairs: list[tuple[TaskMapping, Ref]]) -> None:
    m, ref = compose(pairs)
    assert m.num_workers == ref.n
    assert m.task_shape == ref.d
    assert m.ndim == len(ref.d)
    assert math.prod(m.loop_extents()) == m.tasks_per_worker
    for w in range(m.num_workers):
        tasks = m.worker2task(w)
        assert tasks == ref.f(w)
        assert len(tasks) == m.tasks_per_worker
    assert_covers_exactly_once(m)


@settings(deadline=None)
@given(factor_lists(min_size=3, max_size=3))
def test_composition_is_associative(pairs: list[tuple[TaskMapping, Ref]]) -> None:
    (a, _), (b, _), (c, _) = pairs
    left, right = (a * b) * c, a * (b * c)
    assert left == right and hash(left) == hash(right)
    assert isinstance(left, ComposedMapping) and left.factors == (a, b, c)
    for w in range(left.num_workers):
        assert left.worker2task(w) == right.worker2task(w)


@settings(deadline=None)
@given(factor_lists())
def test_task_index_is_symbolic(pairs: list[tuple[TaskMapping, Ref]]) -> None:
    m, _ = compose(pairs)
    for w in range(m.num_workers):
        assert symbolic_tasks(m, w) == m.worker2task(w)
    assert_no_trivial_ops(m)


# --------------------------------------------------------------------------------------------
# Figures 8, 11, 12 of the paper, and DESIGN.md.
def test_figure11_repeat_and_spatial() -> None:
    assert repeat(2, 2).num_workers == 1
    assert repeat(2, 2).worker2task(0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert spatial(2, 2).num_workers == 4
    for w in range(4):
        assert spatial(2, 2).worker2task(w) == [(w // 2, w % 2)]


def test_figure12_composition_is_not_commutative() -> None:
    a = spatial(2, 2) * repeat(2, 2)
    b = repeat(2, 2) * spatial(2, 2)
    assert a.task_shape == b.task_shape == (4, 4) and a.num_workers == b.num_workers == 4
    assert a.worker2task(0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert b.worker2task(0) == [(0, 0), (0, 2), (2, 0), (2, 2)]
    assert b.worker2task(3) == [(1, 1), (1, 3), (3, 1), (3, 3)]
    assert a != b


def test_figure12_three_factors() -> None:
    m = spatial(2, 1) * repeat(2, 2) * spatial(1, 2)
    assert (m.num_workers, m.task_shape, m.tasks_per_worker) == (4, (4, 4), 4)
    # worker 3: spatial(2, 1) gives (1, 0), spatial(1, 2) gives (0, 1)
    assert m.worker2task(3) == [(2, 1), (2, 3), (3, 1), (3, 3)]
    assert m.worker2task(0) == [(0, 0), (0, 2), (1, 0), (1, 2)]
    assert_covers_exactly_once(m)


def test_figure12_column_major() -> None:
    m = spatial(4, 8, ranks=[1, 0])
    assert m.worker2task(0) == [(0, 0)]
    assert m.worker2task(1) == [(1, 0)]
    assert m.worker2task(4) == [(0, 1)]
    assert m.worker2task(31) == [(3, 7)]
    column_major = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert repeat(2, 3, ranks=[1, 0]).worker2task(0) == column_major
    assert repeat(2, 3, ranks=[1, 0]).loop_extents() == (3, 2)


def test_figure8_cooperative_load() -> None:
    m = repeat(4, 1) * spatial(16, 8)
    assert (m.num_workers, m.task_shape, m.tasks_per_worker) == (128, (64, 8), 4)
    assert m.worker2task(9) == [(1, 1), (17, 1), (33, 1), (49, 1)]
    assert_covers_exactly_once(m)


def test_matmul_mapping_from_the_paper() -> None:
    m = spatial(4, 2) * repeat(2, 2) * spatial(4, 8) * repeat(4, 4)
    assert (m.num_workers, m.task_shape, m.tasks_per_worker) == (256, (128, 128), 64)
    assert m.loop_extents() == (2, 2, 4, 4)
    assert_covers_exactly_once(m)


def test_design_md_example() -> None:
    m = spatial(2, 2) * repeat(2, 2)
    assert m.num_workers == 4
    assert m.task_shape == (4, 4)
    assert m.worker2task(3) == [(2, 2), (2, 3), (3, 2), (3, 3)]


# --------------------------------------------------------------------------------------------
# The lowering interface: loop_extents / task_index.
def test_loop_extents() -> None:
    assert spatial(4, 8).loop_extents() == ()
    assert repeat(2, 3).loop_extents() == (2, 3)
    assert repeat(2, 3, 5, ranks=[2, 0, 1]).loop_extents() == (3, 5, 2)
    assert (repeat(4, 1) * spatial(16, 8) * repeat(1, 2)).loop_extents() == (4, 1, 1, 2)
    assert custom_mapping((8,), 2, 4, lambda w, k: (w * 4 + k,)).loop_extents() == (4,)


def test_task_index_expressions() -> None:
    w, i, j = var("w"), var("i"), var("j")
    assert repr(spatial(4, 8).task_index(w)) == "((w // 8), (w % 8))"
    assert repr(spatial(4, 8, ranks=[1, 0]).task_index(w)) == "((w % 4), (w // 4))"
    assert repr(spatial(1, 8).task_index(w)) == "(0, w)"
    assert repr(repeat(3, 1).task_index(w, [i, j])) == "(i, 0)"
    cooperative = repeat(4, 1) * spatial(16, 8)
    assert repr(cooperative.task_index(w, [i, j])) == "(((i * 16) + (w // 8)), (w % 8))"
    warps = spatial(2, 2) * repeat(2, 2)
    assert repr(warps.task_index(w, [i, j])) == "((((w // 2) * 2) + i), (((w % 2) * 2) + j))"
    assert repr((spatial(2) * spatial(3)).task_index(w)) == "((((w // 3) * 3) + (w % 3)),)"
    assert spatial(2, 2).task_index(3) == (1, 1)  # plain ints work too


def test_custom_mapping() -> None:
    # two tasks per worker, strided by the number of workers
    m = custom_mapping((8,), 4, 2, lambda w, k: (w + k * 4,))
    assert m.worker2task(1) == [(1,), (5,)]
    assert_covers_exactly_once(m)
    assert symbolic_tasks(m, 3) == m.worker2task(3)
    assert repr(m.task_index(var("w"), [var("k")])) == "((w + (k * 4)),)"
    assert (m.num_workers, m.task_shape, m.tasks_per_worker) == (4, (8,), 2)
    # a custom mapping composes like any other
    c = spatial(2) * m
    assert c.worker2task(5) == [(9,), (13,)]
    assert symbolic_tasks(c, 5) == c.worker2task(5)
    assert "custom_mapping((8,), 4, 2" in repr(m)


# --------------------------------------------------------------------------------------------
# auto_map
def test_auto_map_examples() -> None:
    assert auto_map((64, 8), 128) == repeat(4, 1) * spatial(16, 8)
    assert auto_map((8,), 8) == spatial(8)
    assert auto_map((8,), 1) == repeat(8)
    assert auto_map([1, 1], 32) == spatial(1, 1)
    assert auto_map(12, 8) == repeat(3) * spatial(4)
    assert auto_map((8, 8), 8, ranks=[1, 0]) == repeat(1, 8, ranks=[1, 0]) * spatial(
        8, 1, ranks=[1, 0]
    )


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 24), min_size=1, max_size=3),
    st.integers(1, 300),
    st.data(),
)
def test_auto_map_covers_every_task_once(
    shape: list[int], workers: int, data: st.DataObject
) -> None:
    ranks = data.draw(st.none() | st.permutations(range(len(shape))))
    m = auto_map(shape, workers, ranks=ranks)
    assert m.task_shape == tuple(shape)
    assert m.num_workers <= workers and workers % m.num_workers == 0
    assert_covers_exactly_once(m)


# --------------------------------------------------------------------------------------------
# Values: structural equality, hashing, immutability, repr, iteration.
def test_equality_hash_and_immutability() -> None:
    assert spatial(4, 8) == spatial(4, 8, ranks=[0, 1]) == SpatialMapping((4, 8), None)  # type: ignore[arg-type]
    assert hash(spatial(4, 8)) == hash(spatial(4, 8, ranks=(0, 1)))
    assert spatial(2, 2) != repeat(2, 2)
    assert spatial(4, 8) != spatial(4, 8, ranks=[1, 0])
    assert isinstance(repeat(2), RepeatMapping)
    assert len({spatial(2) * repeat(3), spatial(2) * repeat(3), repeat(3) * spatial(2)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        spatial(2).shape = (3,)  # type: ignore[misc]


def test_repr() -> None:
    assert repr(spatial(4, 2) * repeat(2, 2)) == "spatial(4, 2)*repeat(2, 2)"
    assert repr(spatial(4, 8, ranks=[1, 0])) == "spatial(4, 8, ranks=[1, 0])"
    assert repr((spatial(2) * repeat(3)) * (spatial(4) * repeat(5))) == (
        "spatial(2)*repeat(3)*spatial(4)*repeat(5)"
    )


def test_on_parallel_vectorize_and_iteration() -> None:
    assert spatial(4, 8).on(3) == MappingOn(spatial(4, 8), 3)
    assert list(spatial(8).on(3)) == [3]  # 1-D mappings yield plain ints
    assert list((spatial(2, 2) * repeat(2, 2)).on(3)) == [(2, 2), (2, 3), (3, 2), (3, 3)]
    assert [(i, j) for i, j in spatial(2, 2).on(2)] == [(1, 0)]
    assert list(spatial(2) * repeat(3)) == [0, 1, 2, 3, 4, 5]  # worker by worker
    assert list(repeat(2, 3) * spatial(2, 1)) == [
        (i * 2 + w, j) for w in range(2) for i in range(2) for j in range(3)
    ]
    p, v = spatial(8).parallel(), spatial(4).vectorize()
    assert p == MappingLoop(spatial(8), MappingLoopKind.PARALLEL)
    assert v.kind is MappingLoopKind.VECTORIZE
    assert spatial(8).sequential().kind is MappingLoopKind.SEQUENTIAL
    assert list(p) == list(range(8))
    assert list(repeat(2, 2).vectorize()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(TypeError, match="int worker"):
        list(spatial(8).on(var("threadIdx.x")))


# --------------------------------------------------------------------------------------------
# Errors users can hit.
@pytest.mark.parametrize("ranks", [[0, 0], [0], [1, 2], [0, 1, 2], ["a", "b"], [0.0, 1.0]])
def test_bad_ranks(ranks: list[object]) -> None:
    with pytest.raises(ValueError, match=r"spatial: ranks must be a permutation of \[0, 1\]"):
        spatial(4, 8, ranks=ranks)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"repeat: ranks must be a permutation"):
        repeat(4, 8, ranks=ranks)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_bad_shapes(bad: object) -> None:
    with pytest.raises(
        ValueError, match=rf"spatial: task shape .* must be a positive int, got {bad!r}"
    ):
        spatial(4, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"repeat: .* must be a positive int, got {bad!r}"):
        repeat(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="auto_map"):
        auto_map((4, bad), 4)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=rf"auto_map: num_workers must be a positive int, got {bad!r}"
    ):
        auto_map((4, 4), bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"custom_mapping: num_workers .* got {bad!r}"):
        custom_mapping((4,), bad, 1, lambda w, k: (w,))  # type: ignore[arg-type]


def test_empty_shape() -> None:
    with pytest.raises(ValueError, match="spatial: a task shape needs at least one dimension"):
        spatial()


def test_compose_different_ndims() -> None:
    with pytest.raises(
        ValueError,
        match=r"different dimensions: spatial\(2, 2\) has task shape \(2, 2\) "
        r"but repeat\(4\) has task shape \(4,\)",
    ):
        spatial(2, 2) * repeat(4)


def test_compose_with_non_mapping() -> None:
    with pytest.raises(TypeError, match="must be task mappings"):
        spatial(2) * 3  # type: ignore[operator]
    with pytest.raises(TypeError, match="must be task mappings"):
        3 * spatial(2)  # type: ignore[operator]


@pytest.mark.parametrize("worker", [4, -1, 100])
def test_worker_out_of_range(worker: int) -> None:
    m = spatial(2, 2) * repeat(2, 2)
    with pytest.raises(ValueError, match=rf"worker {worker} out of range .* < 4"):
        m.worker2task(worker)


def test_wrong_number_of_loop_vars() -> None:
    with pytest.raises(ValueError, match=r"expected 2 loop variable\(s\), got 1"):
        repeat(2, 2).task_index(0, [0])


def test_custom_mapping_errors() -> None:
    outside = custom_mapping((4,), 2, 2, lambda w, k: (w * 2 + k + 1,))
    with pytest.raises(ValueError, match=r"worker 1's task \(4,\) not in \(4,\)"):
        outside.worker2task(1)
    with pytest.raises(ValueError, match="fn returned 2 indices for 1-D tasks"):
        custom_mapping((4,), 1, 1, lambda w, k: (w, k)).worker2task(0)
    with pytest.raises(TypeError, match="fn must be callable"):
        custom_mapping((4,), 1, 1, 3)  # type: ignore[arg-type]
