"""``torchmem stats``: memory figures per visible device, as a table, JSON, or a refreshing view."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from torchmem.capture.snapshot import read_stats
from torchmem.devices import cuda_available, resolve, visible_devices
from torchmem.report import json as report_json
from torchmem.results.stats import MemoryStats


def add_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="memory figures and the nvidia-smi reconciliation per device")
    p.add_argument("--device", "-d", action="append", help="device to show (repeatable); default: all")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after this many readings")
    p.add_argument(
        "--serve",
        type=int,
        metavar="PORT",
        help="serve the figures for Prometheus at http://0.0.0.0:PORT/metrics until Ctrl-C",
    )


def _read(devices: list[Any]) -> list[MemoryStats]:
    return [read_stats(d) for d in devices]


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        print("torchmem: error: --watch needs a positive number of seconds", file=sys.stderr)
        return 2
    if args.count is not None and args.count < 1:
        print("torchmem: error: --count needs a positive number", file=sys.stderr)
        return 2
    devices: list[Any] = [resolve(d) for d in args.device] if args.device else visible_devices()
    if getattr(args, "serve", None) is not None:
        return _serve(devices, args)
    if not args.device and not cuda_available() and not args.json:
        print(
            "No GPU is visible to torch here (CPU-only build or no device); showing CPU and process figures."
        )
    if args.watch is None:
        _emit(_read(devices), args.json)
        return 0
    return _watch(devices, args)


def _serve(devices: list[Any], args: argparse.Namespace) -> int:
    if args.json or args.watch is not None:
        print("torchmem: error: --serve does not go with --json or --watch", file=sys.stderr)
        return 2
    if not 0 <= args.serve <= 65535:
        print(f"torchmem: error: --serve needs a port number (0-65535), not {args.serve}", file=sys.stderr)
        return 2
    try:
        from torchmem.integrations.prometheus import serve
    except ImportError as exc:
        print(f"torchmem: error: {exc}", file=sys.stderr)
        return 2
    try:
        # This process is only the monitor: the devices and every process on them, not its own allocator.
        server, _ = serve(args.serve, devices=devices, process=False)
    except OSError as exc:
        print(f"torchmem: error: cannot serve on port {args.serve} ({exc})", file=sys.stderr)
        return 2
    print(f"torchmem: serving http://0.0.0.0:{server.server_port}/metrics (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        # Bounded: a scrape that never finishes must not keep Ctrl-C from ending the monitor.
        import threading

        stopper = threading.Thread(target=server.shutdown, name="torchmem-serve-stop", daemon=True)
        stopper.start()
        stopper.join(5.0)
        server.server_close()
    return 0


def _emit(readings: list[MemoryStats], as_json: bool) -> None:
    if as_json:
        print(report_json.dumps({"devices": readings}))
    else:
        from torchmem.report.terminal import render_stats

        render_stats(readings, sys.stdout)


def _watch(devices: list[Any], args: argparse.Namespace) -> int:
    n = 0
    if args.json or not sys.stdout.isatty():
        while args.count is None or n < args.count:
            readings = _read(devices)
            if args.json:
                print(report_json.dumps({"devices": readings}, indent=None), flush=True)
            else:
                _emit(readings, False)
            n += 1
            if args.count is None or n < args.count:
                time.sleep(args.watch)
        return 0
    from rich.live import Live

    from torchmem.report.terminal import console_for, stats_renderable

    with Live(console=console_for(), auto_refresh=False) as live:
        while args.count is None or n < args.count:
            live.update(stats_renderable(_read(devices)), refresh=True)
            n += 1
            if args.count is None or n < args.count:
                time.sleep(args.watch)
    return 0
