"""What the trust fixes of ``torchmem run`` cost the program (issue 10).

Two things sit on the program's path now:

* while the live status line shows (a terminal), ``sys.stdout``/``sys.stderr`` are wrapped so the line is
  cleared before the program writes: the cost of one ``print()`` through the wrapper, against a plain
  ``print()`` to the same stream (the anchor);
* a warning torchmem raises finds the user's frame (``emit_warning``): its cost against ``warnings.warn``
  with a fixed ``stacklevel`` (the anchor), both under an "always" filter, 20 frames deep.

Run: ``OMP_NUM_THREADS=1 python benchmarks/run_trust.py``. Prints a table with ratios to the anchors.
"""

from __future__ import annotations

import io
import statistics
import sys
import time
import warnings
from collections.abc import Callable

from torchmem._warn import emit_warning
from torchmem.run.status import StatusAwareStream, StatusLine

N = 20000
REPEATS = 7


def _per_call(fn: Callable[[], None], n: int = N) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times) * 1e6


def _print_costs() -> tuple[float, float]:
    sink = io.StringIO()
    line = StatusLine(io.StringIO(), True)
    wrapped = StatusAwareStream(sink, line)
    shown = "[torchmem] step 12 | allocated 1.00 GiB"  # a status line is showing: every write clears it first

    def plain() -> None:
        line.show(shown)  # the same drawing on both sides: the difference is the wrapper's clearing
        print("step 12 loss 0.1234", file=sink)

    def through() -> None:
        line.show(shown)
        print("step 12 loss 0.1234", file=wrapped)

    a = b = 0.0
    for _ in range(2):  # A B A B
        a += _per_call(plain)
        b += _per_call(through)
    return a / 2, b / 2


def _deep(n: int, fn: Callable[[], None]) -> None:
    if n:
        _deep(n - 1, fn)
    else:
        fn()


def _warn_costs() -> tuple[float, float]:
    def anchor() -> None:
        _deep(20, lambda: warnings.warn("x", RuntimeWarning, stacklevel=2))

    def ours() -> None:
        _deep(20, lambda: emit_warning("x", RuntimeWarning))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = b = 0.0
        for _ in range(2):
            a += _per_call(anchor, 5000)
            b += _per_call(ours, 5000)
    return a / 2, b / 2


def main() -> None:
    import logging

    logging.getLogger("torchmem").setLevel(logging.ERROR)
    p_plain, p_wrapped = _print_costs()
    w_plain, w_ours = _warn_costs()
    print(f"python {sys.version.split()[0]}, {N} calls x {REPEATS} repeats (median), A B A B")
    print(f"{'what':<52} {'µs/call':>9} {'vs anchor':>10}")
    print(f"{'print() to a stream [anchor]':<52} {p_plain:>9.3f} {1.0:>10.2f}")
    print(f"{'print() through the status-line wrapper':<52} {p_wrapped:>9.3f} {p_wrapped / p_plain:>10.2f}")
    print(f"{'warnings.warn(stacklevel=2), 20 frames deep [anchor]':<52} {w_plain:>9.3f} {1.0:>10.2f}")
    label = "emit_warning (finds the user frame), 20 frames deep"
    print(f"{label:<52} {w_ours:>9.3f} {w_ours / w_plain:>10.2f}")


if __name__ == "__main__":
    main()
