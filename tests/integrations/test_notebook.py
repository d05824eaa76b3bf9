"""``%load_ext torchmem`` in a real IPython InteractiveShell on the CPU: the line and cell magics, release
with output history, bad input, and the OOM handler it installs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import torchmem

InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell


@pytest.fixture
def shell() -> Iterator[Any]:
    sh = InteractiveShell.instance()
    try:
        res = sh.run_cell("%load_ext torchmem")
        assert res.success, res.error_in_exec
        yield sh
    finally:
        torchmem.uninstall()
        InteractiveShell.clear_instance()


def test_stats_and_live(shell: Any, capsys: Any) -> None:
    import torch

    # the OOM handler is installed with the extension: an OOM in a cell gets its diagnosis
    assert any(issubclass(torch.OutOfMemoryError, e) for e in shell.custom_exceptions)
    shell.run_cell("import torch\nw = torch.ones(1024, 1024)")
    shell.run_cell("%torchmem")
    out = capsys.readouterr().out
    assert "cpu" in out and "where this process's memory goes" in out
    shell.run_cell("%torchmem live cpu")
    out = capsys.readouterr().out
    assert "live tensor storage" in out and "held by:" in out and "__main__.w" in out


def test_the_cell_magic_names_what_the_cell_left_alive(shell: Any, capsys: Any) -> None:
    shell.run_cell("import torch\nkept = []")
    capsys.readouterr()
    shell.run_cell(
        "%%torchmem cpu\nkept.append(torch.ones(1024, 1024))\ntmp = torch.ones(2048, 1024)\ndel tmp"
    )
    out = capsys.readouterr().out
    assert "torchmem [cpu]: the cell peaked at 12.00 MiB above its start; " in out
    assert "4.00 MiB of what it made is still alive" in out
    assert "1 storage, 4.00 MiB still alive" in out and "kept[0]" in out, out
    shell.run_cell("%%torchmem cpu\nx = torch.ones(10).sum().item()")
    out = capsys.readouterr().out
    assert "0 B of what it made is still alive" in out


def test_release_frees_variables_and_output_history(shell: Any, capsys: Any) -> None:
    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        shell.run_cell("import torch\nmodel = torch.nn.Linear(256, 256)")
        shell.run_cell("model.weight * 2", store_history=True)  # the result lands in Out[...] and _
        assert cpu.allocated > start
        capsys.readouterr()
        shell.run_cell("%torchmem release model")
        out = capsys.readouterr().out
        assert "IPython output history" in out, out
        assert cpu.allocated == start


def test_bad_input_gets_the_usage(shell: Any, capsys: Any) -> None:
    for line in (
        "%torchmem release",
        "%torchmem release nothing_here",
        "%torchmem frobnicate",
        "%torchmem stats '",
    ):
        res = shell.run_cell(line)
        assert res.success, line
        out = capsys.readouterr().out
        assert out.startswith("torchmem: ") and "usage: %torchmem" in out, (line, out)
    assert "no variable named nothing_here" in (
        shell.run_cell("%torchmem release nothing_here") and capsys.readouterr().out
    )
