"""A PNG timeline of a capture with matplotlib (the optional ``plot`` extra), drawn with the Agg backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from torchmem._errors import TorchmemError
from torchmem._version import __version__
from torchmem.report._output import write_atomic
from torchmem.results.capture import final_leak, step_time

if TYPE_CHECKING:
    from torchmem.results.capture import Capture


class PlotUnavailableError(TorchmemError):
    """matplotlib, needed for ``--plot``, is not installed."""


def require_matplotlib() -> None:
    """Raise :class:`PlotUnavailableError` with the install line when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed.",
            "pip install 'torchmem[plot]' (or pip install matplotlib); --html needs nothing extra.",
        ) from None


_MIB = 1024 * 1024


def _unit(peak: float) -> tuple[float, str]:
    for div, name in ((1024**3, "GiB"), (_MIB, "MiB"), (1024, "KiB")):
        if peak >= div:
            return float(div), name
    return 1.0, "B"


def _draw(cap: Capture, file: IO[bytes]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # Agg canvas: no GUI, no pyplot global state

    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    peak = max(cap.peak_allocated or 0, cap.peak_reserved or 0, 1)
    div, unit = _unit(peak)

    def series(attr: str) -> tuple[list[float], list[float]]:
        pts = [(s.t, getattr(s, attr)) for s in cap.samples if getattr(s, attr) is not None]
        return [t for t, _ in pts], [v / div for _, v in pts]

    styles: list[tuple[str, str, dict[str, Any]]] = [
        ("reserved", "reserved", {"color": "#e8894a", "linewidth": 1.6}),
        ("allocated", "allocated", {"color": "#2f6fb3", "linewidth": 1.8}),
        ("peak_allocated", "peak allocated", {"color": "#777777", "linewidth": 1.0, "linestyle": "--"}),
    ]
    for attr, label, kw in styles:
        xs, ys = series(attr)
        if xs:
            ax.plot(xs, ys, label=label, **kw)
    if cap.steps:
        stride = max(1, len(cap.steps) // 50)
        for s in cap.steps[::stride]:
            ax.axvline(s.t, color="#cccccc", linewidth=0.5, zorder=0)
    leak = final_leak(cap)
    if leak is not None and leak.leaking:
        t = step_time(cap, leak.detected_at)
        if t is not None:
            ax.axvline(t, color="#8e44ad", linestyle=":", linewidth=1.5)
            ax.annotate(
                f"leak found (step {leak.detected_at})",
                (t, 0.97),
                xycoords=("data", "axes fraction"),
                color="#8e44ad",
                fontsize=8,
                ha="right",
                va="top",
                rotation=90,
            )
    for o in cap.ooms:
        ax.axvline(o.t, color="#c0392b", linewidth=1.8)
        ax.annotate(
            "OOM", (o.t, 0.97), xycoords=("data", "axes fraction"), color="#c0392b", fontsize=9, ha="right",
            va="top", rotation=90,
        )  # fmt: skip
    if cap.truncated and cap.samples:
        ax.axvline(cap.samples[-1].t, color="#c0392b", linestyle="--", linewidth=1.0)
    device = str(cap.header.get("device") or "?")
    title = f"{os.path.basename(cap.path)}: {device}, {cap.step_count or 0} steps"
    if cap.truncated:
        title += " (file truncated)"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", color="#eeeeee")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no timeline samples in this capture", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(file, format="png", metadata={"Software": f"torchmem {__version__} (matplotlib)"})


def write_plot(cap: Capture, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the timeline of ``cap`` as a PNG at ``path`` (whole or not at all).

    Args:
        cap: A capture from :func:`torchmem.capture.file.read_capture`.
        path: The PNG file to create.
        force: Replace an existing PNG that torchmem wrote (never any other file).

    Returns:
        The absolute path written.

    Raises:
        PlotUnavailableError: matplotlib is not installed.
        OutputError: the path cannot be written.

    Example:
        >>> write_plot(read_capture("run.jsonl"), "timeline.png")  # doctest: +SKIP
    """
    require_matplotlib()
    return write_atomic(path, lambda f: _draw(cap, f), what="plot", kind="png", force=force)


__all__ = ["PlotUnavailableError", "require_matplotlib", "write_plot"]
