"""Leak analysis: is memory growing step over step, and which allocation site and holder make it grow.

Pure functions over numbers and typed holder paths captured by :mod:`torchmem.capture.watch`: nothing here
reads a device or changes an object, so every rule is testable with plain data. The parts live beside this
module and every name is re-exported here:

- :mod:`torchmem.analysis.growth` — growth statistics: :func:`detect_growth` judges a per-step series (a
  steady test, a noise-robust one: Theil–Sen slope, rising floors, Mann–Kendall; a staircase test for short
  runs) and says why when it is not a leak; :class:`GrowthStream` gives the same verdict one reading at a
  time, at O(1) per reading for the series that are not leaks.
- :mod:`torchmem.analysis.run_growth` — growth over a whole run: :func:`detect_run_growth` (a threshold never
  hides growth that is large over the run) and :func:`timeline_growth` / :func:`timeline_report` for a run
  with no repeating step.
- :mod:`torchmem.analysis.culprits` — culprit attribution: :func:`site_growth` finds the allocation sites
  whose live bytes keep rising; :func:`attribute` groups them by the holder that keeps them
  (:func:`holder_pattern`) and decides each group's kind from the *kinds of the steps* of its holder paths,
  never from the rendered text.
- :mod:`torchmem.analysis.leak_fixes` — the culprit kinds (:data:`KINDS`) and the one-line fix each is printed
  with (:func:`fix_for`).

The result types (:class:`Growth`, :class:`SiteGrowth`, :class:`Culprit`, :class:`LeakReport`) live in
:mod:`torchmem.results.leaks` and are re-exported here.
"""

from __future__ import annotations

from torchmem.analysis.culprits import attribute, holder_name, holder_pattern, site_growth, through_hook
from torchmem.analysis.growth import (
    ROBUST_SAMPLES,
    SHORT_BAND,
    SHORT_MIN_RISE,
    STAIR_SAMPLES,
    STEADY_EVIDENCE,
    detect_growth,
    inner_growth,
    short_run_growth,
    suggested_threshold,
)
from torchmem.analysis.growth_stream import ROBUST_EVERY, GrowthStream
from torchmem.analysis.leak_fixes import (
    ACCUMULATION,
    CACHE,
    CYCLE,
    EXCEPTION,
    GLOBAL,
    GRAPH_CHAIN,
    GROWING_TENSOR,
    HOOK,
    KEPT_OPTIMIZER,
    KINDS,
    RETAINED_GRAPH,
    UNKNOWN,
    fix_for,
)
from torchmem.analysis.run_growth import (
    LARGE_DOUBLED_MIN,
    LARGE_TOTAL,
    TIMELINE_MIN_BYTES_PER_SECOND,
    TIMELINE_WINDOW,
    detect_run_growth,
    large_growth,
    large_total,
    run_threshold,
    timeline_growth,
    timeline_report,
    total_words,
    with_total,
)
from torchmem.results.leaks import Culprit, Growth, LeakReport, SiteGrowth

__all__ = [
    "ACCUMULATION",
    "CACHE",
    "CYCLE",
    "EXCEPTION",
    "GLOBAL",
    "GRAPH_CHAIN",
    "GROWING_TENSOR",
    "HOOK",
    "KEPT_OPTIMIZER",
    "KINDS",
    "LARGE_DOUBLED_MIN",
    "LARGE_TOTAL",
    "RETAINED_GRAPH",
    "ROBUST_EVERY",
    "ROBUST_SAMPLES",
    "SHORT_BAND",
    "SHORT_MIN_RISE",
    "STAIR_SAMPLES",
    "STEADY_EVIDENCE",
    "TIMELINE_MIN_BYTES_PER_SECOND",
    "TIMELINE_WINDOW",
    "UNKNOWN",
    "Culprit",
    "Growth",
    "GrowthStream",
    "LeakReport",
    "SiteGrowth",
    "attribute",
    "detect_growth",
    "detect_run_growth",
    "fix_for",
    "holder_name",
    "holder_pattern",
    "inner_growth",
    "large_growth",
    "large_total",
    "run_threshold",
    "short_run_growth",
    "site_growth",
    "suggested_threshold",
    "through_hook",
    "timeline_growth",
    "timeline_report",
    "total_words",
    "with_total",
]
