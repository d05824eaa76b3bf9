"""Metrics for long jobs: the per-device figures and this process's reconciliation in the Prometheus text
format, read at each scrape (no thread of torchmem's own; prometheus-client's HTTP server serves them).

In the training process (its allocator, its reconciliation)::

    from torchmem.integrations.prometheus import serve
    serve(9400)                      # http://127.0.0.1:9400/metrics, this machine only
    serve(9400, addr="0.0.0.0")      # every interface: scraped by Prometheus / Grafana Agent elsewhere

or from the shell, the machine's figures: every GPU on it and every process on them (NVML); on a machine
without a GPU, its memory (``device="cpu"``). The process figures (allocator, RSS) would be those of the
``torchmem`` process itself, so it leaves them out, and ``torchmem_exporter_info{scope="machine"}`` says so::

    torchmem stats --serve 9400 [--host 0.0.0.0]

Names follow Prometheus conventions (``torchmem_`` prefix, base units in the name: ``_bytes``; counters end
in ``_total``; the device as a label) and match what DCGM's exporter calls the device's memory: ``torchmem_
device_memory_used_bytes`` is ``DCGM_FI_DEV_FB_USED`` in bytes. Needs ``prometheus-client``:
``pip install 'torchmem[prometheus]'``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError as exc:  # pragma: no cover - needs the extra
    raise ImportError(
        "torchmem's metrics exporter needs prometheus-client: pip install 'torchmem[prometheus]'"
    ) from exc

from torchmem.results.stats import MemoryStats

# (metric, the MemoryStats field, help). Gauges in bytes.
_GAUGES = (
    ("torchmem_allocated_bytes", "allocated", "Bytes of live tensors in torch's caching allocator."),
    ("torchmem_reserved_bytes", "reserved", "Bytes torch's caching allocator holds from the device."),
    ("torchmem_cached_free_bytes", "cached", "Reserved bytes not allocated (the allocator's cache)."),
    ("torchmem_fragmented_bytes", "fragmented", "Cached bytes in split blocks (fragmentation)."),
    ("torchmem_peak_allocated_bytes", "peak_allocated", "Peak allocated bytes since the last reset."),
    ("torchmem_peak_reserved_bytes", "peak_reserved", "Peak reserved bytes since the last reset."),
    ("torchmem_process_device_memory_bytes", "process_used", "This process's device memory (NVML)."),
    ("torchmem_context_bytes", "context", "The CUDA context's size (an estimate, measured once)."),
    ("torchmem_unexplained_bytes", "unexplained", "This process's device memory no reading explains."),
    (
        "torchmem_device_memory_total_bytes",
        "device_total",
        "The device's memory (device=\"cpu\": the machine's physical memory).",
    ),
    (
        "torchmem_device_memory_used_bytes",
        "device_used",
        "The device's used memory, all processes (device=\"cpu\": the machine's memory in use).",
    ),
    (
        "torchmem_device_memory_free_bytes",
        "device_free",
        "The device's free memory (device=\"cpu\": the machine's available memory).",
    ),
    ("torchmem_host_rss_bytes", "host_rss", "This process's resident host memory."),
    ("torchmem_pinned_host_bytes", "pinned_host", "Page-locked host memory torch's host allocator holds."),
    ("torchmem_pinned_host_active_bytes", "pinned_host_active", "Of it, the blocks in use."),
)
_COUNTERS = (
    ("torchmem_ooms", "num_ooms", "Out-of-memory errors torch's allocator raised."),
    ("torchmem_alloc_retries", "alloc_retries", "Allocations that freed the cache and retried."),
)
# Without the allocator's figures (torchmem stats --serve runs in its own process): device-level only.
_DEVICE_FIELDS = frozenset({"device_total", "device_used", "device_free"})


class MemoryCollector:
    """A prometheus-client collector: one reading per device at each scrape.

    Args:
        devices: The devices to read (default: every visible one).
        process: Also export this process's figures (allocator, reconciliation, host); ``False`` for a
            monitor running in a process of its own, which exports the devices and every process on them.
    """

    def __init__(self, devices: Sequence[Any] | None = None, *, process: bool = True) -> None:
        from torchmem.devices import resolve, visible_devices

        self.devices = [resolve(d) for d in devices] if devices else visible_devices()
        self.process = process

    def readings(self) -> list[MemoryStats]:
        from torchmem.capture.snapshot import read_stats

        return [read_stats(d, probe=False) for d in self.devices]

    def collect(self) -> Iterator[Any]:
        readings = self.readings()
        yield self._info()
        for metric, field, text in _GAUGES:
            if self.process or field in _DEVICE_FIELDS:
                yield _family(GaugeMetricFamily, metric, text, field, readings)
        if self.process:
            for metric, field, text in _COUNTERS:
                yield _family(CounterMetricFamily, metric, text, field, readings)
            yield from _breakdown(readings)
        yield from _processes(readings)

    def _info(self) -> Any:
        """``torchmem_exporter_info``: whose figures these are, for whoever reads them without the startup
        line (a dashboard): ``scope="process"`` (this process's and its devices') or ``"machine"`` (the
        devices and every process on them; this exporter's own process figures left out)."""
        scope = "process" if self.process else "machine"
        g = GaugeMetricFamily(
            "torchmem_exporter_info",
            'Whose figures this exporter serves: scope="process" (the process serving them, pid) or '
            '"machine" (the devices and every process on them; the process figures, which would be the '
            "exporter's own, are left out).",
            labels=["scope", "pid", "devices"],
        )
        g.add_metric([scope, str(os.getpid()), ",".join(str(d) for d in self.devices)], 1.0)
        return g


def _family(kind: Any, metric: str, text: str, field: str, readings: Iterable[MemoryStats]) -> Any:
    """One metric family: the ``field`` of each reading, labelled by device; a figure that cannot be known
    (``None``) has no sample."""
    family = kind(metric, text, labels=["device", "name"])
    for s in readings:
        v = getattr(s, field)
        if v is not None:
            family.add_metric([s.device, s.name or ""], float(v))
    return family


def _breakdown(readings: Iterable[MemoryStats]) -> Iterator[Any]:
    g = GaugeMetricFamily(
        "torchmem_breakdown_bytes",
        "This process's device memory by row of the reconciliation (context, reserved, other allocators, "
        "unexplained).",
        labels=["device", "row"],
    )
    for s in readings:
        if s.platform == "cpu":
            continue
        for row in s.breakdown().process:
            if row.bytes is not None:
                g.add_metric([s.device, row.label], float(row.bytes))
    yield g


def _processes(readings: Iterable[MemoryStats]) -> Iterator[Any]:
    g = GaugeMetricFamily(
        "torchmem_other_process_device_memory_bytes",
        "Device memory of the other processes on the device (NVML), with their relation to this one.",
        labels=["device", "pid", "process", "relation"],
    )
    for s in readings:
        for p in s.other_processes or ():
            if p.used is not None:
                g.add_metric([s.device, str(p.pid), p.name or "", p.relation], float(p.used))
    yield g


def serve(
    port: int,
    *,
    addr: str = "127.0.0.1",
    devices: Sequence[Any] | None = None,
    process: bool = True,
    registry: CollectorRegistry | None = None,
) -> tuple[Any, Any]:
    """Serve the figures at ``http://addr:port/metrics`` (prometheus-client's server, a daemon thread).

    ``addr`` is ``127.0.0.1`` by default: only this machine can scrape. ``addr="0.0.0.0"`` (``"::"`` for
    IPv6) listens on every interface, for a Prometheus elsewhere; anyone who can reach the port reads the
    figures, with the names and PIDs of the processes on the devices.

    Returns ``(server, thread)``; ``server.shutdown()`` then ``server.server_close()`` stop it. ``port=0``
    picks a free port (``server.server_port``). The figures are read at each scrape, in the scraping
    thread.
    """
    reg = registry if registry is not None else CollectorRegistry()
    reg.register(MemoryCollector(devices, process=process))  # type: ignore[arg-type]
    server, thread = start_http_server(port, addr=addr, registry=reg)
    return server, thread


__all__ = ["MemoryCollector", "serve"]
