"""The ``taskmap`` command line: ``taskmap cache [path] [--clear [--namespace NAME]]``,
``taskmap records export DIR [--device D]`` (the tuning cache's measured choices, one file per
device, to ship under ``taskmap/schedule/records``), ``taskmap target`` (what the CPU cost models
plan for on this host: its flags, cache sizes, and what the host probes measured), ``--version``."""

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


def target_lines() -> list[str]:
    """The host CPU target, as the cost models see it: SIMD width, cores, caches, clock, and the
    probes' measurements with the environment variables that override them."""
    from taskmap.backends import host_probe        # noqa: PLC0415 - only this command needs them
    from taskmap.backends.base import host_cpu_target  # noqa: PLC0415

    t = host_cpu_target()
    lanes, cores = t.vector_bytes // 4, t.num_cores
    unknown = "not measured on this host: the cost models' defaults"
    fma = f"{t.fma512_per_cycle:g} a cycle and core" if t.fma512_per_cycle else unknown
    llc = f"{t.llc_bandwidth / 1e9:.1f} GB/s a core" if t.llc_bandwidth else unknown
    in_place = (f"a matmul's K step {t.b_in_place_step:g}x packed B's, rows on a cache line; "
                f"{t.b_off_line_step:g}x off one"
                if t.b_in_place_step else unknown)
    return [f"taskmap host target: {t.name}",
            f"  vector width  {8 * t.vector_bytes} bits ({lanes} f32 lanes)",
            f"  cores         {cores} (OMP_NUM_THREADS caps them)",
            f"  caches        L2 {human_size(t.l2_bytes // max(cores, 1))} a core, last level "
            f"{human_size(t.llc_bytes)}",
            f"  clock         {t.clock_hz / 1e9:.2f} GHz; peak f32 {t.peak_flops_f32 / 1e9:.0f} GFLOP/s",
            f"  512-bit FMAs  {fma} (probe; {host_probe.ENV_OVERRIDE} sets it)",
            f"  LLC read      {llc} (probe; {host_probe.LLC_ENV_OVERRIDE} sets it)",
            f"  B in place    {in_place} (probe; {host_probe.IN_PLACE_ENV_OVERRIDE} sets it)",
            f"  features      {' '.join(t.features)}"]


def _target_command(args: argparse.Namespace) -> int:
    print("\n".join(target_lines()))
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
    target = commands.add_parser(
        "target",
        help="show what the CPU cost models plan for on this host",
        description="The host CPU target: SIMD width, cores, caches, clock, and the host probes' measurements "
                    "(512-bit FMA rate, last-level cache read rate, a matmul step reading B in place), each with "
                    "the environment variable that overrides it.  The probes run once per CPU model and are "
                    "kept in the cache's 'host' namespace.",
    )
    target.set_defaults(handler=_target_command, parser=target)
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
