"""The on-disk compile cache: content-addressed artifacts shared safely between processes.

Layout: ``cache_dir()/<namespace>/<key[:2]>/<key><suffix>``, e.g. ``.../cpu/3f/3f9a...e1.so``.
Namespaces separate producers (one per backend, the tuning cache, ...). Entries are written
atomically (temp file in the same directory, fsync, ``os.replace``), so a reader sees either no
file or a complete one, however many processes compile the same kernel at once.

Keys come from :func:`cache_key`. Callers must pass *everything* that affects the artifact: the
generated source, compiler flags, the compiler's version (:func:`compiler_version`) and the
target; the taskmap version is mixed in automatically.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from taskmap.errors import BuildError, CacheError
from taskmap.version import __version__

CACHEDIR_TAG = "CACHEDIR.TAG"
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks the taskmap compile cache (https://bford.info/cachedir/).\n"
    "# Remove it with `taskmap cache --clear`, or delete the directory.\n"
)
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SCRATCH = "tmp"  # per-namespace folder holding build_dir() scratch directories


def cache_dir() -> Path:
    """The cache root: ``$TASKMAP_CACHE_DIR``, else ``$XDG_CACHE_HOME/taskmap``, else ``~/.cache/taskmap``.

    Read on every call, so changing the environment takes effect immediately.
    """
    if root := os.environ.get("TASKMAP_CACHE_DIR"):
        return Path(root).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "taskmap"
    return Path.home() / ".cache" / "taskmap"


# ---------------------------------------------------------------------------------------------
# Keys


def cache_key(*parts: object) -> str:
    """A 32-hex-digit digest of ``parts`` (and the taskmap version), stable across processes.

    Accepted parts: None, bool, int, float, str, bytes, Path, enums, tuples/lists, dicts and sets
    (order-insensitive), dataclass instances (type name + fields), numpy arrays, dtypes and
    scalars (as the Python scalar), and any object with a deterministic ``repr``. The encoding is tagged and length-prefixed, so
    ``("ab", "c")`` and ``("a", "bc")``, or ``1`` and ``"1"`` and ``True``, never collide.
    """
    h = hashlib.sha256()
    _encode(("taskmap", __version__, parts), h.update)
    return h.hexdigest()[:32]


def _blob(out, tag: bytes, data: bytes) -> None:
    """One tagged, length-prefixed item of a key's encoding."""
    out(tag + struct.pack("<Q", len(data)) + data)


def _encode(obj: object, out) -> None:
    def blob(tag: bytes, data: bytes) -> None:
        _blob(out, tag, data)

    if obj is None:
        out(b"N")
    elif isinstance(obj, np.generic):
        _encode(obj.item(), out)
    elif isinstance(obj, np.ndarray):
        dtype = obj.dtype.name if obj.dtype.kind == "V" else obj.dtype.str    # ml_dtypes' bfloat16: '<V2'
        _encode(("ndarray", dtype, obj.shape, np.ascontiguousarray(obj).tobytes()), out)
    elif isinstance(obj, np.dtype):
        blob(b"Y", (obj.name if obj.kind == "V" else obj.str).encode())
    elif isinstance(obj, bool):
        out(b"T" if obj else b"F")
    elif isinstance(obj, enum.Enum):
        blob(b"E", f"{type(obj).__qualname__}.{obj.name}".encode())
    elif isinstance(obj, int):
        blob(b"I", str(obj).encode())
    elif isinstance(obj, float):
        blob(b"D", obj.hex().encode())
    elif isinstance(obj, str):
        blob(b"S", obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        blob(b"B", bytes(obj))
    elif isinstance(obj, Path):
        blob(b"P", str(obj).encode("utf-8", "surrogateescape"))
    elif isinstance(obj, (tuple, list)):
        out(b"L" + struct.pack("<Q", len(obj)))
        for item in obj:
            _encode(item, out)
    elif isinstance(obj, dict):
        _encode_unordered(b"M", [(k, v) for k, v in obj.items()], out)
    elif isinstance(obj, (set, frozenset)):
        _encode_unordered(b"U", list(obj), out)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _encode_dataclass(obj, out)
    else:
        text = repr(obj)
        if " at 0x" in text:  # default object repr: the address would make keys random
            raise TypeError(
                f"cache_key: cannot encode {type(obj).__qualname__!r} deterministically; "
                "pass its relevant fields, or make it a dataclass"
            )
        blob(b"R", f"{type(obj).__module__}.{type(obj).__qualname__}:{text}".encode())


#: Encodings of frozen, hashable dataclass instances, by value (hashable: no list, dict or array
#: inside, so the value cannot change).  A compiled graph's kernel keys each name the target,
#: whose features and sizes were nine in ten of their encoding calls.
_FROZEN: dict[object, bytes] = {}


def _encode_dataclass(obj: object, out) -> None:
    """Type name + fields; for a frozen instance, encoded once per value (see ``_FROZEN``)."""
    memo = type(obj).__dataclass_params__.frozen        # type: ignore[attr-defined]
    if memo:
        try:
            hit = _FROZEN.get(obj)
        except TypeError:                                  # an unhashable field
            hit, memo = None, False
        if hit is not None:
            out(hit)
            return
    chunks: list[bytes] = []
    _blob(chunks.append, b"C", f"{type(obj).__module__}.{type(obj).__qualname__}".encode())
    _encode({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, chunks.append)
    data = b"".join(chunks)
    if memo:
        if len(_FROZEN) >= 4096:
            _FROZEN.clear()
        _FROZEN[obj] = data
    out(data)


def _encode_unordered(tag: bytes, items: list, out) -> None:
    encoded = []
    for item in items:
        chunks: list[bytes] = []
        _encode(item, chunks.append)
        encoded.append(b"".join(chunks))
    out(tag + struct.pack("<Q", len(encoded)))
    for chunk in sorted(encoded):
        out(chunk)


# ---------------------------------------------------------------------------------------------
# Storage


class DiskCache:
    """One namespace of the cache. The root is looked up on every call (see :func:`cache_dir`)."""

    def __init__(self, namespace: str):
        self.namespace = _check_namespace(namespace)

    def __repr__(self) -> str:
        return f"DiskCache({self.namespace!r})"

    @property
    def root(self) -> Path:
        return cache_dir() / self.namespace

    def path_for(self, key: str, suffix: str = "") -> Path:
        """Where the entry ``key`` + ``suffix`` lives (whether or not it exists)."""
        if not key or not re.fullmatch(r"[A-Za-z0-9_-]+", key):
            raise ValueError(f"invalid cache key {key!r}: use cache_key(...)")
        if "/" in suffix or os.sep in suffix:
            raise ValueError(f"invalid cache suffix {suffix!r}")
        return self.root / key[:2] / (key + suffix)

    def get(self, key: str, suffix: str = "") -> Path | None:
        """The entry's path if it is present, else None."""
        path = self.path_for(key, suffix)
        return path if path.is_file() else None

    def put_bytes(self, key: str, suffix: str, data: bytes) -> Path:
        """Store ``data`` atomically as the entry; returns its path. Replaces an existing entry."""
        return self._put(key, suffix, lambda f: f.write(data))

    def put_file(self, key: str, suffix: str, src_path: str | os.PathLike[str]) -> Path:
        """Copy the file at ``src_path`` atomically into the entry; returns its path."""
        with open(src_path, "rb") as src:
            return self._put(key, suffix, lambda f: shutil.copyfileobj(src, f))

    def build_dir(self, key: str) -> Path:
        """A fresh private directory for compiler intermediates (source, objects, logs).

        Unique per call and process. The caller removes it after a successful build
        (``shutil.rmtree``) and may keep it on failure, so a BuildError can point at the source;
        ``clear_cache`` removes leftovers.
        """
        scratch = self.root / _SCRATCH
        _make_dirs(scratch)
        return Path(tempfile.mkdtemp(prefix=f"{key[:16]}-{os.getpid()}-", dir=scratch))

    def _put(self, key: str, suffix: str, write) -> Path:
        path = self.path_for(key, suffix)
        _make_dirs(path.parent)
        _atomic_write(path, write)
        return path


def _atomic_write(path: Path, write) -> None:
    """Write ``path`` via a temp file in its directory + fsync + os.replace; no partial files."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
        raise ValueError(f"invalid cache namespace {namespace!r}: use letters, digits, '_', '.', '-'")
    return namespace


def _make_dirs(path: Path) -> None:
    """Create ``path`` (inside the cache root), tagging the root if taskmap creates it."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    tag = root / CACHEDIR_TAG
    # Tag only a root that is new (empty): a pre-existing folder of other files stays untagged,
    # so clear_cache() refuses to wipe it.
    if not tag.exists() and not any(root.iterdir()):
        _atomic_write(tag, lambda f: f.write(_TAG_TEXT.encode()))
    path.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------------------------------
# Inspection and cleanup


def _usage(path: Path) -> dict[str, int]:
    files = size = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                size += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # removed concurrently
                continue
            files += 1
    return {"files": files, "bytes": size}


def _namespaces(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())


def cache_info() -> dict:
    """Disk usage of the cache: ``{"path", "namespaces": {name: {"files", "bytes"}}, "total"}``."""
    root = cache_dir()
    namespaces = {p.name: _usage(p) for p in _namespaces(root)}
    total = {
        "files": sum(u["files"] for u in namespaces.values()),
        "bytes": sum(u["bytes"] for u in namespaces.values()),
    }
    return {"path": str(root), "namespaces": namespaces, "total": total}


def clear_cache(namespace: str | None = None) -> dict:
    """Remove every entry (or one namespace's); returns what was removed, shaped like cache_info().

    Safe when the cache does not exist. Refuses (CacheError) to clear a non-empty directory that
    lacks the ``CACHEDIR.TAG`` taskmap writes, so a mistyped ``TASKMAP_CACHE_DIR`` cannot wipe
    unrelated files.
    """
    root = cache_dir()
    if namespace is not None:
        _check_namespace(namespace)
    if not root.is_dir():
        return {"path": str(root), "namespaces": {}, "total": {"files": 0, "bytes": 0}}
    if not (root / CACHEDIR_TAG).is_file() and any(root.iterdir()):
        raise CacheError(
            f"refusing to clear {root}: it has no {CACHEDIR_TAG}, so it does not look like a "
            "taskmap cache (check TASKMAP_CACHE_DIR)"
        )
    targets = [root / namespace] if namespace is not None else _namespaces(root)
    removed = {}
    for path in targets:
        if path.is_dir():
            removed[path.name] = _usage(path)
            shutil.rmtree(path, ignore_errors=True)
    total = {
        "files": sum(u["files"] for u in removed.values()),
        "bytes": sum(u["bytes"] for u in removed.values()),
    }
    return {"path": str(root), "namespaces": removed, "total": total}


# ---------------------------------------------------------------------------------------------
# Compiler identity


def compiler_version(cmd: Sequence[str]) -> str:
    """The first line a compiler prints for ``cmd`` (e.g. ``["gcc", "--version"]``), memoized.

    Raises BuildError when the compiler is missing or fails. Put the result in cache keys.
    """
    return _compiler_version(tuple(cmd))


@functools.lru_cache(maxsize=None)
def _compiler_version(cmd: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise BuildError(
            f"compiler not found: {cmd[0]!r} is not on PATH (install it, or choose another backend)",
            command=list(cmd),
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"could not run {cmd[0]!r}: {exc}", command=list(cmd)) from None
    if proc.returncode != 0:
        raise BuildError(
            f"{cmd[0]!r} exited with status {proc.returncode} while reporting its version",
            log=proc.stdout + proc.stderr,
            command=list(cmd),
        )
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        if line.strip():
            return line.strip()
    return ""
