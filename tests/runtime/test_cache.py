"""The on-disk compile cache and the `taskmap cache` command."""

import dataclasses
import enum
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from taskmap import cli
from taskmap.errors import BuildError, CacheError
from taskmap.runtime import cache as cache_mod
from taskmap.runtime.cache import (
    CACHEDIR_TAG,
    DiskCache,
    cache_dir,
    cache_info,
    cache_key,
    clear_cache,
    compiler_version,
)


@pytest.fixture
def root(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(path))
    return path


# -- location ---------------------------------------------------------------------------------


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TASKMAP_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "taskmap"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "taskmap"


# -- keys -------------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass(frozen=True)
class Options:
    arch: str
    flags: tuple[str, ...] = ()


BASE = ("int f(){return 1;}", ("-O3", "-fPIC"), "gcc 12.2", Options("sm_90"), {"a": 1, "b": 2})


def test_key_is_deterministic_and_short():
    key = cache_key(*BASE)
    assert key == cache_key(*BASE)
    assert len(key) == 32 and all(c in "0123456789abcdef" for c in key)


@pytest.mark.parametrize("index", range(len(BASE)))
def test_key_changes_with_any_part(index):
    changed = list(BASE)
    changed[index] = {
        0: "int f(){return 2;}",
        1: ("-O2", "-fPIC"),
        2: "gcc 13.1",
        3: Options("sm_80"),
        4: {"a": 1, "b": 3},
    }[index]
    assert cache_key(*changed) != cache_key(*BASE)


def test_key_includes_taskmap_version(monkeypatch):
    before = cache_key(*BASE)
    monkeypatch.setattr(cache_mod, "__version__", "999.0")
    assert cache_key(*BASE) != before


def test_key_encoding_is_unambiguous():
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert len({cache_key(1), cache_key("1"), cache_key(True), cache_key(1.0), cache_key(b"1")}) == 5
    assert cache_key(("a", "b")) != cache_key("a", "b")
    assert cache_key(Color.RED) != cache_key(Color.BLUE)


def test_key_dicts_and_sets_are_order_insensitive():
    assert cache_key({"x": 1, "y": 2}) == cache_key({"y": 2, "x": 1})
    assert cache_key({3, 1, 2}) == cache_key({2, 3, 1})


def test_key_numpy_values():
    assert cache_key(np.int64(3)) == cache_key(3)
    assert cache_key(np.dtype("float32")) != cache_key(np.dtype("float16"))
    big = np.zeros(10_000, np.float32)
    other = big.copy()
    other[5000] = 1  # differs only where a truncated repr would hide it
    assert cache_key(big) != cache_key(other)


@dataclasses.dataclass(frozen=True)
class Holder:
    items: list
    name: str = "x"


@dataclasses.dataclass
class Mutable:
    arch: str


def test_key_frozen_dataclasses_are_encoded_once_by_value(monkeypatch):
    """A frozen, hashable instance's encoding is kept (the target in every kernel key); the key
    is the same as encoding it afresh, equal values share it, and other values do not."""
    monkeypatch.setattr(cache_mod, "_FROZEN", {})
    first = cache_key(Options("sm_90", ("-a",)))
    assert len(cache_mod._FROZEN) == 1
    assert cache_key(Options("sm_90", ("-a",))) == first               # an equal value: kept bytes
    cache_mod._FROZEN.clear()
    assert cache_key(Options("sm_90", ("-a",))) == first               # afresh: the same key
    assert cache_key(Options("sm_90", ("-b",))) != first
    assert cache_key(Options("sm_90", ("-a",)), "x") != cache_key(Options("sm_90", ("-a",)))


def test_key_unhashable_and_mutable_dataclasses_are_encoded_each_time(monkeypatch):
    """A frozen instance with a list inside (unhashable: its contents can change) and a mutable
    dataclass are encoded on every call: the key follows their current contents."""
    monkeypatch.setattr(cache_mod, "_FROZEN", {})
    held, mut = Holder([1, 2]), Mutable("sm_90")
    before = cache_key(held), cache_key(mut)
    held.items.append(3)
    mut.arch = "sm_80"
    assert cache_key(held) != before[0] and cache_key(mut) != before[1]
    assert not cache_mod._FROZEN


def test_key_rejects_objects_with_address_repr():
    with pytest.raises(TypeError, match="deterministically"):
        cache_key(object())


# -- storage ----------------------------------------------------------------------------------


def test_put_get_roundtrip(root):
    c = DiskCache("cpu")
    key = cache_key("source")
    assert c.get(key, ".so") is None
    path = c.put_bytes(key, ".so", b"\x7fELF...")
    assert path == root / "cpu" / key[:2] / f"{key}.so" == c.path_for(key, ".so")
    assert c.get(key, ".so") == path and path.read_bytes() == b"\x7fELF..."
    assert c.get(key, ".cubin") is None
    c.put_bytes(key, ".so", b"new")  # replaces
    assert path.read_bytes() == b"new"
    assert (root / CACHEDIR_TAG).is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_put_file(root, tmp_path):
    src = tmp_path / "kernel.so"
    src.write_bytes(b"binary" * 1000)
    c = DiskCache("cpu")
    key = cache_key("k")
    path = c.put_file(key, ".so", src)
    assert path.read_bytes() == src.read_bytes() and src.exists()


def test_failed_write_leaves_nothing_behind(root, monkeypatch):
    c = DiskCache("cpu")
    key, other = cache_key("k"), cache_key("other")

    def boom(*args):
        raise OSError("disk full")

    def files():
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    with monkeypatch.context() as m:  # fails while tagging the new root
        m.setattr(cache_mod.os, "fsync", boom)
        with pytest.raises(OSError, match="disk full"):
            c.put_bytes(key, ".so", b"data")
    assert files() == []

    ok = c.put_bytes(other, ".so", b"fine")
    with monkeypatch.context() as m:  # fails while writing the entry itself
        m.setattr(cache_mod.os, "fsync", boom)
        with pytest.raises(OSError, match="disk full"):
            c.put_bytes(key, ".so", b"data")
    assert c.get(key, ".so") is None
    assert files() == sorted([CACHEDIR_TAG, ok.relative_to(root).as_posix()])


def test_invalid_names_rejected(root):
    with pytest.raises(ValueError, match="namespace"):
        DiskCache("../escape")
    with pytest.raises(ValueError, match="key"):
        DiskCache("cpu").path_for("../../etc", ".so")
    with pytest.raises(ValueError, match="suffix"):
        DiskCache("cpu").path_for("abcd", "/x")


def test_build_dir_is_fresh_and_private(root):
    c = DiskCache("cuda")
    key = cache_key("k")
    a, b = c.build_dir(key), c.build_dir(key)
    assert a != b and a.is_dir() and b.is_dir()
    assert a.parent.parent == root / "cuda"
    assert str(os.getpid()) in a.name


N_WRITERS, PAYLOAD = 6, 1 << 18


def _writer(root: str, key: str, value: int, rounds: int) -> None:
    os.environ["TASKMAP_CACHE_DIR"] = root
    c = DiskCache("race")
    for _ in range(rounds):
        c.put_bytes(key, ".bin", bytes([value]) * PAYLOAD)


def _reader(root: str, key: str, rounds: int, bad) -> None:
    os.environ["TASKMAP_CACHE_DIR"] = root
    c = DiskCache("race")
    for _ in range(rounds):
        path = c.get(key, ".bin")
        if path is not None:
            data = path.read_bytes()
            if len(data) != PAYLOAD or len(set(data)) != 1:
                bad.value += 1


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_concurrent_writers_never_expose_partial_files(root):
    ctx = multiprocessing.get_context("fork")
    key = cache_key("shared kernel")
    bad = ctx.Value("i", 0)
    procs = [ctx.Process(target=_writer, args=(str(root), key, v + 1, 10)) for v in range(N_WRITERS)]
    procs.append(ctx.Process(target=_reader, args=(str(root), key, 300, bad)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    data = DiskCache("race").get(key, ".bin").read_bytes()
    assert len(data) == PAYLOAD and len(set(data)) == 1 and data[0] in range(1, N_WRITERS + 1)
    assert bad.value == 0
    leftovers = [p for p in DiskCache("race").path_for(key, ".bin").parent.iterdir() if p.name != f"{key}.bin"]
    assert leftovers == []


# -- info and clear ---------------------------------------------------------------------------


def test_info_and_clear(root):
    assert cache_info() == {"path": str(root), "namespaces": {}, "total": {"files": 0, "bytes": 0}}
    assert clear_cache()["total"]["files"] == 0  # missing directory is fine
    DiskCache("cpu").put_bytes(cache_key(1), ".so", b"x" * 100)
    DiskCache("cpu").put_bytes(cache_key(2), ".so", b"x" * 50)
    DiskCache("cuda").put_bytes(cache_key(3), ".cubin", b"y" * 10)
    info = cache_info()
    assert info["namespaces"] == {"cpu": {"files": 2, "bytes": 150}, "cuda": {"files": 1, "bytes": 10}}
    assert info["total"] == {"files": 3, "bytes": 160}

    removed = clear_cache("cuda")
    assert removed["namespaces"] == {"cuda": {"files": 1, "bytes": 10}}
    assert set(cache_info()["namespaces"]) == {"cpu"}
    removed = clear_cache()
    assert removed["total"] == {"files": 2, "bytes": 150}
    assert cache_info()["total"] == {"files": 0, "bytes": 0}
    assert DiskCache("cpu").get(cache_key(1), ".so") is None


def test_clear_refuses_foreign_directory(tmp_path, monkeypatch):
    foreign = tmp_path / "home"
    (foreign / "Documents").mkdir(parents=True)
    (foreign / "Documents" / "thesis.tex").write_text("precious")
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(foreign))
    DiskCache("cpu").put_bytes(cache_key(1), ".so", b"x")  # usable, but never tagged
    with pytest.raises(CacheError, match="refusing to clear .*CACHEDIR.TAG"):
        clear_cache()
    assert (foreign / "Documents" / "thesis.tex").exists()


# -- compiler identity ------------------------------------------------------------------------


def test_compiler_version_first_line():
    version = compiler_version([sys.executable, "--version"])
    assert version.startswith("Python 3.")
    assert compiler_version([sys.executable, "--version"]) is version  # memoized


def test_compiler_version_missing_compiler():
    with pytest.raises(BuildError, match="compiler not found: 'no-such-cc-xyz'"):
        compiler_version(["no-such-cc-xyz", "--version"])


def test_compiler_version_failing_compiler():
    with pytest.raises(BuildError, match="exited with status 3") as info:
        compiler_version([sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"])
    assert "bad flag" in info.value.log


# -- command line -----------------------------------------------------------------------------


def test_cli_cache_info_and_clear(root, capsys):
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(root) in out and "(empty)" in out

    DiskCache("cpu").put_bytes(cache_key(1), ".so", b"x" * 2048)
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "1 files" in out and "2.0 KiB" in out and "total" in out

    assert cli.main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert "removed" in out and "cpu" in out and "2.0 KiB" in out
    assert cache_info()["total"]["files"] == 0
    assert cli.main(["cache", "--clear"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_cli_cache_path(root, capsys):
    assert cli.main(["cache", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(root)


def test_cli_clear_refusal_is_reported(tmp_path, monkeypatch, capsys):
    (tmp_path / "stuff").mkdir()
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path))
    assert cli.main(["cache", "--clear"]) == 1
    assert "taskmap: error: refusing to clear" in capsys.readouterr().err


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert "taskmap 0.1.0" in capsys.readouterr().out


def test_cli_bad_arguments(root, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["cache", "path", "--clear"])
    assert info.value.code == 2
    assert "--clear cannot be combined" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["cache", "--namespace", "../x"])
    assert "invalid cache namespace" in capsys.readouterr().err


def test_human_size():
    assert cli.human_size(0) == "0 B"
    assert cli.human_size(1536) == "1.5 KiB"
    assert cli.human_size(5 * 1024**3) == "5.0 GiB"


def test_cli_target_shows_the_host_facts_the_cost_models_use(capsys):
    """``taskmap target``: the host CPU target's width, cores and the host probes' measurements,
    each with the variable that overrides it."""
    from taskmap.backends import host_probe
    from taskmap.backends.base import host_cpu_target

    assert cli.main(["target"]) == 0
    out = capsys.readouterr().out
    t = host_cpu_target()
    assert f"{8 * t.vector_bytes} bits ({t.vector_bytes // 4} f32 lanes)" in out
    assert f"cores         {t.num_cores} " in out
    for name in (host_probe.ENV_OVERRIDE, host_probe.LLC_ENV_OVERRIDE, host_probe.IN_PLACE_ENV_OVERRIDE):
        assert f"{name} sets it" in out
    if t.b_in_place_step:
        assert f"{t.b_in_place_step:g}x packed B's" in out and f"{t.b_off_line_step:g}x off one" in out
    else:
        assert "the cost models' defaults" in out
