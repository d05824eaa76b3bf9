"""What the metrics exporter serves, and to whom: ``torchmem stats --serve`` listens on 127.0.0.1 unless
``--host`` opens it, and says (on start and in the scraped data) that it serves the machine's figures, never
its own process's as if they were a program's."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import IO

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from torchmem.integrations.prometheus import serve


def _families(port: int, host: str = "127.0.0.1") -> dict[str, object]:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {fam.name: fam for fam in text_string_to_metric_families(text)}


def _info(fams: dict[str, object]) -> dict[str, str]:
    fam = fams["torchmem_exporter_info"]
    (sample,) = fam.samples  # type: ignore[attr-defined]
    assert sample.value == 1.0
    return dict(sample.labels)


def test_serve_listens_on_this_machine_only_by_default() -> None:
    server, _ = serve(0, devices=["cpu"])
    try:
        assert server.server_address[0] == "127.0.0.1"  # was 0.0.0.0: every interface
        fams = _families(server.server_port)
        # in the process: its own figures, said so with its pid
        assert _info(fams) == {"scope": "process", "pid": str(os.getpid()), "devices": "cpu"}
        assert "torchmem_host_rss_bytes" in {s.name for f in fams.values() for s in f.samples}  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def _lines(stream: IO[str], n: int, timeout: float = 60.0) -> list[str]:
    """The first ``n`` lines of ``stream``; a line that never comes fails the test instead of hanging it."""
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [got.put(stream.readline()) for _ in range(n)], daemon=True).start()
    try:
        return [got.get(timeout=timeout) for _ in range(n)]
    except queue.Empty:
        raise AssertionError(f"the monitor printed fewer than {n} lines in {timeout:.0f} s") from None


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def monitor(request: pytest.FixtureRequest) -> Iterator[tuple[list[str], int]]:
    """``torchmem stats --serve 0 --device cpu`` and the test's arguments: its startup lines, its port."""
    extra: list[str] = getattr(request, "param", [])
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchmem", "stats", "--serve", "0", "--device", "cpu", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_sigint_default,
    )
    try:
        assert proc.stdout is not None
        lines = _lines(proc.stdout, 2 + bool(extra))
        port = int(lines[0].split("/metrics")[0].rsplit(":", 1)[1])
        yield lines, port
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_cli_says_it_serves_the_machine_on_127_0_0_1(monitor: tuple[list[str], int]) -> None:
    lines, port = monitor
    assert lines[0].startswith(f"torchmem: serving http://127.0.0.1:{port}/metrics")
    assert "serving this machine's figures" in lines[1]
    assert "they would be this exporter's own" in lines[1]
    fams = _families(port)
    info = _info(fams)
    assert info["scope"] == "machine" and info["devices"] == "cpu"
    assert info["pid"] != str(os.getpid())  # the exporter's, named: not a training process's
    total = fams["torchmem_device_memory_total_bytes"]
    assert "the machine's physical memory" in total.documentation  # type: ignore[attr-defined]
    assert "torchmem_host_rss_bytes" not in fams and "torchmem_allocated_bytes" not in fams


@pytest.mark.parametrize("monitor", [["--host", "0.0.0.0"]], indirect=True)
def test_host_opens_it_to_every_interface_and_says_so(monitor: tuple[list[str], int]) -> None:
    lines, port = monitor
    assert lines[0].startswith(f"torchmem: serving http://0.0.0.0:{port}/metrics")
    assert "listening on every network interface" in lines[2]
    assert _info(_families(port))["scope"] == "machine"  # reachable on 127.0.0.1 too
