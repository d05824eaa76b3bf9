"""``torchmem stats``: memory figures per visible device, as a table, JSON, or a refreshing view."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from torchmem._errors import TorchmemError
from torchmem.capture.snapshot import read_stats
from torchmem.cli import UsageError, int_at_least, port_number, positive_number
from torchmem.devices import cuda_available, resolve, visible_devices
from torchmem.report import json as report_json
from torchmem.results.stats import MemoryStats


def add_parser(sub: Any) -> None:
    p = sub.add_parser("stats", help="memory figures and the nvidia-smi reconciliation per device")
    p.add_argument("--device", "-d", action="append", help="device to show (repeatable); default: all")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--watch", type=positive_number, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C"
    )
    p.add_argument(
        "--count", type=int_at_least(1), default=None, help="with --watch: stop after this many readings"
    )
    p.add_argument(
        "--serve",
        type=port_number,
        metavar="PORT",
        help="serve this machine's device figures for Prometheus at http://HOST:PORT/metrics until Ctrl-C",
    )
    p.add_argument(
        "--host",
        default=None,
        help="with --serve: the address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 opens "
        "it to every network the machine is on)",
    )


def _read(devices: list[Any]) -> list[MemoryStats]:
    return [read_stats(d) for d in devices]


DEFAULT_HOST = "127.0.0.1"


def run(args: argparse.Namespace) -> int:
    serve = getattr(args, "serve", None) is not None
    if getattr(args, "host", None) is not None and not serve:
        raise UsageError(
            "--host goes with --serve.", "For example: torchmem stats --serve 9400 --host 0.0.0.0"
        )
    if serve and (args.json or args.watch is not None):
        raise UsageError("--serve does not go with --json or --watch.", "Give --serve PORT alone.")
    if args.count is not None and args.watch is None:
        raise UsageError("--count goes with --watch.", "For example: torchmem stats --watch 1 --count 10")
    devices: list[Any] = [resolve(d) for d in args.device] if args.device else visible_devices()
    if serve:
        return _serve(devices, args)
    if not args.device and not cuda_available() and not args.json:
        print(
            "No GPU is visible to torch here (CPU-only build or no device); showing this machine's memory "
            "and the torchmem command's own process (a program's figures: torchmem run, or torchmem.stats() "
            "inside it)."
        )
    if args.watch is None:
        _emit(_read(devices), args.json)
        return 0
    return _watch(devices, args)


def serving_what(devices: list[Any], host: str, port: int) -> list[str]:
    """The startup lines of ``--serve``: where, and whose figures (the machine's, never this process's)."""
    names = ", ".join(str(d) for d in devices) or "no device"
    lines = [f"torchmem: serving http://{_url_host(host)}:{port}/metrics (Ctrl-C stops)"]
    if all(getattr(d, "type", "") == "cpu" for d in devices):
        lines.append(
            'torchmem: serving this machine\'s figures: its memory, total, used and free (device="cpu"). The '
            "process figures (allocator, RSS) are left out: they would be this exporter's own. For a "
            "program's own figures, call torchmem.integrations.prometheus.serve(PORT) inside it."
        )
    else:
        lines.append(
            f"torchmem: serving this machine's figures: {names}, and every process on them (NVML). The "
            "allocator figures are left out: they would be this exporter's own. For a program's own "
            "figures, call torchmem.integrations.prometheus.serve(PORT) inside it."
        )
    if host in ("0.0.0.0", "::", ""):
        lines.append(
            "torchmem: note: listening on every network interface: anyone who can reach this machine can "
            "read these figures (process names and PIDs included)."
        )
    return lines


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _serve(devices: list[Any], args: argparse.Namespace) -> int:
    try:
        from torchmem.integrations.prometheus import serve
    except ImportError as exc:  # a missing extra: exit 1, as --plot without matplotlib
        raise TorchmemError(str(exc), "pip install 'torchmem[prometheus]'") from None
    host = args.host if args.host is not None else DEFAULT_HOST
    try:
        # This process is only the monitor: the devices and every process on them, not its own allocator.
        server, _ = serve(args.serve, addr=host, devices=devices, process=False)
    except OSError as exc:
        raise UsageError(
            f"cannot serve on {_url_host(host)}:{args.serve} ({exc.strerror or exc}).",
            "choose another --serve port (0: any free one) or --host.",
        ) from None
    try:
        # Printed inside the try: a Ctrl-C that comes as soon as the lines are read (a loaded machine may run
        # a scrape before this thread gets back) still ends the monitor cleanly, with 0 (a CI run got 130).
        print("\n".join(serving_what(devices, host, server.server_port)), flush=True)
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
