"""The metrics exporter: scraped over HTTP, in the process (its allocator and host figures) and from
``torchmem stats --serve`` (the devices), with values that agree with torchmem.stats()."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest
import torch

import torchmem

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from torchmem.integrations.prometheus import serve


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def test_the_process_figures_are_scraped_and_agree_with_stats() -> None:
    keep = torch.ones(1024, 1024)
    server, _ = serve(0, addr="127.0.0.1", devices=["cpu"])
    try:
        m = _scrape(server.server_port)
        s = torchmem.stats("cpu")
        ((labels, rss),) = m["torchmem_host_rss_bytes"]
        assert labels == {"device": "cpu", "name": s.name or ""}
        assert s.host_rss is not None and abs(rss - s.host_rss) < 64 << 20  # read a moment apart
        ((_, total),) = m["torchmem_device_memory_total_bytes"]
        assert total == s.device_total
        assert "torchmem_allocated_bytes" not in m  # the CPU has no allocator: no sample, never a made-up 0
    finally:
        server.shutdown()
        server.server_close()
    del keep


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_cli_serves_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "torchmem", "stats", "--serve", "0", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Ctrl-C as from a terminal: an ignored SIGINT is inherited through exec, and once (CI, late in the
        # suite) this test process had it ignored, so the monitor never saw the signal.
        preexec_fn=_sigint_default,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("torchmem: serving http://127.0.0.1:"), line  # this machine only, by default
        port = int(line.split(":")[3].split("/")[0])
        m = _scrape(port)
        assert "torchmem_device_memory_total_bytes" in m
        assert "torchmem_host_rss_bytes" not in m  # the monitor's own process is not the job
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:  # say where it hangs: faulthandler dumps every thread on SIGABRT
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=20)
            here = signal.getsignal(signal.SIGINT)
            raise AssertionError(f"the monitor did not stop on SIGINT (here: {here}):\n{err}") from None
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def test_bad_serve_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from torchmem.cli import main

    assert main(["stats", "--serve", "70000"]) == 2
    assert "needs a port number" in capsys.readouterr().err
    assert main(["stats", "--serve", "0", "--json"]) == 2
    assert "does not go with --json" in capsys.readouterr().err
