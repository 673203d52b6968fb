"""The ``taskmap`` command line: ``taskmap cache [path] [--clear [--namespace NAME]]``,
``taskmap records export DIR [--device D]`` (the tuning cache's measured choices, one file per
device, to ship under ``taskmap/schedule/records``), ``--version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from taskmap.errors import TaskmapError
from taskmap.runtime.cache import DiskCache, cache_dir, cache_info, clear_cache
from taskmap.version import __version__


def human_size(n: int) -> str:
    """``1536 -> '1.5 KiB'``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _print_usage_table(info: dict) -> None:
    rows = [(name, u["files"], u["bytes"]) for name, u in info["namespaces"].items()]
    rows.append(("total", info["total"]["files"], info["total"]["bytes"]))
    width = max(len(name) for name, _, _ in rows)
    for name, files, size in rows:
        print(f"  {name:<{width}}  {files:>7} files  {human_size(size):>10}")


def _cache_command(args: argparse.Namespace) -> int:
    if args.what == "path":
        if args.clear:
            args.parser.error("--clear cannot be combined with 'path'")
        print(cache_dir())
        return 0
    if args.clear:
        removed = clear_cache(args.namespace)
        if not removed["namespaces"]:
            print(f"nothing to remove in {removed['path']}")
            return 0
        print(f"removed from {removed['path']}:")
        _print_usage_table(removed)
        return 0
    info = cache_info()
    print(f"taskmap cache: {info['path']}")
    if args.namespace is not None:
        ns = info["namespaces"].get(args.namespace, {"files": 0, "bytes": 0})
        info = {"namespaces": {args.namespace: ns}, "total": ns}
    if not info["namespaces"]:
        print("  (empty)")
        return 0
    _print_usage_table(info)
    return 0


def _records_command(args: argparse.Namespace) -> int:
    from taskmap.schedule import shipped     # noqa: PLC0415 - only this command needs it

    written = shipped.export(Path(args.directory), device=args.device)
    if not written:
        print("no measured tuning records in the cache" + (f" for {args.device}" if args.device else "")
              + " (tune with TASKMAP_TUNE=topk or exhaustive first)")
        return 0
    for path, n in written.items():
        print(f"{path}: {n} records")
    return 0


def _namespace(name: str) -> str:
    try:
        return DiskCache(name).namespace
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskmap", description="taskmap deep-learning compiler")
    parser.add_argument("--version", action="version", version=f"taskmap {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    cache = commands.add_parser(
        "cache",
        help="show or clear the on-disk compile cache",
        description="Show the compile cache's location and size, or clear it.",
    )
    cache.add_argument(
        "what", nargs="?", choices=("info", "path"), default="info",
        help="'info' (default): location and per-namespace usage; 'path': print the directory",
    )
    cache.add_argument("--clear", action="store_true", help="remove cached entries")
    cache.add_argument(
        "--namespace", metavar="NAME", type=_namespace, help="limit to one namespace (e.g. cpu, cuda)"
    )
    cache.set_defaults(handler=_cache_command, parser=cache)
    records = commands.add_parser(
        "records",
        help="export measured tuning choices to ship with taskmap",
        description="Merge the tuning cache's measured schedule choices into DIR/<device>.json, one file per "
                    "device (target and core count); files under taskmap/schedule/records answer later "
                    "model-mode choices on that device.",
    )
    records.add_argument("action", choices=("export",))
    records.add_argument("directory", metavar="DIR", help="where the per-device files are written (merged)")
    records.add_argument("--device", metavar="D", help="only this device, e.g. cuda:sm_90/132")
    records.set_defaults(handler=_records_command, parser=records)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 1
    try:
        return args.handler(args)
    except TaskmapError as exc:
        print(f"taskmap: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
