"""The terminal summary of a capture file (``torchmem report CAPTURE``): written to a file-like object.

The text itself is the capture's plain-text rendering (:func:`torchmem.results.capture.render_summary`, which
``str(capture)`` also gives); the shared views (final leak verdict, module table, run facts) live beside it in
:mod:`torchmem.results.capture`, so the summary, the HTML report and the plot agree. Re-exported here.
"""

from __future__ import annotations

from torchmem.results.capture import (
    RunFacts,
    final_leak,
    fmt_seconds,
    module_rows,
    render_summary,
    row_total,
    run_facts,
    stats_record,
    step_time,
    write_summary,
)

__all__ = [
    "RunFacts",
    "final_leak",
    "fmt_seconds",
    "module_rows",
    "render_summary",
    "row_total",
    "run_facts",
    "stats_record",
    "step_time",
    "write_summary",
]
