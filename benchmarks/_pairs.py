"""The measuring method of the cost benchmarks (issue 29): interleaved pairs, a pinned process, the median
ratio with a distribution-free 95 % interval.

A cost of 2 % cannot be shown by one run against another on a host whose run-to-run noise is ±10 %. Here:

- the process is pinned (:func:`pin`): one CPU set (``os.sched_setaffinity``), one intra-op thread count
  (``torch.set_num_threads`` and ``OMP_NUM_THREADS`` for child processes), so that the two sides of a pair
  run on the same cores with the same threads;
- the two sides run in **pairs**, ``A B`` then ``B A`` alternately (:func:`measure_pairs`), each after a
  ``gc.collect()``: a drift of the machine (clock, cache, another process) falls on both sides of a pair,
  and the order inside a pair does not favour either side;
- each pair gives one ratio ``B / A``; the figure is the **median** of the pair ratios, and its **95 %
  interval** is the order-statistic (sign-test) interval of the median: with ``n`` pairs, the ``k``-th
  smallest and ``k``-th largest ratios, ``k`` the largest with ``P(Binomial(n, 1/2) < k) <= 2.5 %``. It
  assumes nothing about the noise's shape (no normality), only that pairs are independent; with 10 pairs
  it is the 2nd and 9th of the sorted ratios (97.9 % coverage), with 20 the 6th and 15th (95.9 %).

``python3 benchmarks/_pairs.py`` prints the interval's ranks for a few ``n`` (a check of the table).
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def pin(cpus: str | None = None, threads: int = 1, count: int = 1) -> str:
    """Pin this process (and its future children) to ``cpus`` (``"2"``, ``"0-3"``, ``"1,3"``; default: the
    last ``max(count, threads)`` CPUs it may run on, leaving CPU 0 to the system) and ``threads`` intra-op
    threads. Returns what was set, in words, for the table's header. A GPU run wants a few CPUs (``count``
    4: the CUDA driver's threads, torchmem's sampler) so that it is not made CPU-starved by the pinning."""
    chosen: set[int] | None = None
    if hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        if cpus:
            chosen = set()
            for part in cpus.split(","):
                lo, _, hi = part.partition("-")
                chosen.update(range(int(lo), int(hi or lo) + 1))
        else:
            need = max(1, threads, count)
            chosen = set(allowed[-need:])
        os.sched_setaffinity(0, chosen)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    where = f"CPUs {','.join(map(str, sorted(chosen)))}" if chosen is not None else "CPUs unpinned"
    return f"{where}, {threads} thread(s)"


def interval_ranks(n: int, level: float = 0.95) -> tuple[int, int] | None:
    """The 1-based ranks ``(k, n + 1 - k)`` of the order-statistic interval of the median of ``n`` values at
    ``level`` (``None`` when ``n`` is too small for it: fewer than 6 values)."""
    alpha = (1.0 - level) / 2
    k = 0
    cum = 0.0
    for i in range(n + 1):  # P(X <= i), X ~ Binomial(n, 1/2)
        cum += math.comb(n, i) / 2**n
        if cum > alpha:
            break
        k = i + 1
    if k < 1:
        return None
    return k, n + 1 - k


def coverage(n: int, k: int) -> float:
    """The coverage of the interval between the ``k``-th smallest and the ``k``-th largest of ``n``."""
    tail = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1.0 - 2 * tail


@dataclass
class Pairs:
    """The pairs of one comparison: ``a`` and ``b`` (each side's figures, in pair order), the ratios ``b/a``,
    and what each run returned beside its figure (``extra``: ``(a_extra, b_extra)`` per pair)."""

    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    extra: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [y / x for x, y in zip(self.a, self.b) if x > 0]

    @property
    def n(self) -> int:
        return len(self.ratios)

    def median(self) -> float:
        return statistics.median(self.ratios)

    def interval(self, level: float = 0.95) -> tuple[float, float] | None:
        """The order-statistic interval of the median ratio (``None`` with fewer than 6 pairs)."""
        r = sorted(self.ratios)
        ranks = interval_ranks(len(r), level)
        if ranks is None:
            return None
        return r[ranks[0] - 1], r[ranks[1] - 1]

    def diff_median(self) -> float:
        """The median of ``b - a`` over the pairs (the added cost, in the figures' unit)."""
        return statistics.median([y - x for x, y in zip(self.a, self.b)])

    def diff_interval(self, level: float = 0.95) -> tuple[float, float] | None:
        d = sorted(y - x for x, y in zip(self.a, self.b))
        ranks = interval_ranks(len(d), level)
        if ranks is None:
            return None
        return d[ranks[0] - 1], d[ranks[1] - 1]

    def summary(self) -> str:
        """``1.012 [0.998, 1.027]`` (median ratio and its 95 % interval)."""
        ci = self.interval()
        span = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci is not None else " [n/a: < 6 pairs]"
        return f"{self.median():.3f}{span}"


def measure_pairs(
    run_a: Callable[[], Any],
    run_b: Callable[[], Any],
    pairs: int,
    *,
    collect: bool = True,
    progress: Callable[[int, float, float], None] | None = None,
    stop: Callable[[float], bool] | None = None,
) -> Pairs:
    """``pairs`` pairs of ``run_a()`` and ``run_b()``, ``A B`` then ``B A`` alternately, each after a
    ``gc.collect()`` (``collect``). Each run returns its figure (a float: seconds, µs per step), or a tuple
    ``(figure, extra)`` whose ``extra`` is kept in :attr:`Pairs.extra`. ``progress(i, a, b)`` after each
    pair. ``stop(seconds)``, given the longest pair's wall time so far (0 before the first), is asked before
    each pair: ``True`` ends the measurement there (a time budget; the pairs done are kept)."""
    out = Pairs()
    longest = 0.0
    for i in range(pairs):
        if stop is not None and stop(longest):
            break
        t0 = time.perf_counter()
        order = (("a", run_a), ("b", run_b)) if i % 2 == 0 else (("b", run_b), ("a", run_a))
        got: dict[str, Any] = {}
        for side, fn in order:
            if collect:
                gc.collect()
            got[side] = fn()
        fa, xa = _split(got["a"])
        fb, xb = _split(got["b"])
        out.a.append(fa)
        out.b.append(fb)
        out.extra.append((xa, xb))
        longest = max(longest, time.perf_counter() - t0)
        if progress is not None:
            progress(i, fa, fb)
    return out


def _split(v: Any) -> tuple[float, Any]:
    if isinstance(v, tuple):
        return float(v[0]), v[1]
    return float(v), None


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table: right-aligned columns, a rule under the header."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a measured child process that runs in a folder of its own: this one's, one intra-op
    thread, ``PYTHONPATH`` made absolute (``PYTHONPATH=src`` names the checkout's source from the repository
    root only), and ``extra``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    path = env.get("PYTHONPATH")
    if path:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in path.split(os.pathsep) if p)
    return env


def overhead_record(folder: Path, pattern: str = "torchmem-*.jsonl") -> dict[str, Any] | None:
    """The ``overhead`` record of the capture ``torchmem run`` wrote in ``folder`` (its own estimate of its
    cost), ``None`` when there is none."""
    for path in sorted(folder.glob(pattern)):
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if '"overhead"' in line:
                        rec = json.loads(line)
                        if rec.get("type") == "overhead":
                            return dict(rec)
        except (OSError, ValueError):
            continue
    return None


def fmt_interval(ci: tuple[float, float] | None, spec: str = ".3f") -> str:
    if ci is None:
        return "n/a"
    return f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"


if __name__ == "__main__":
    rows = []
    for n in (6, 8, 10, 12, 16, 20, 30):
        ranks = interval_ranks(n)
        assert ranks is not None
        rows.append((n, f"#{ranks[0]} .. #{ranks[1]}", f"{coverage(n, ranks[0]):.3f}"))
    print(table(("pairs", "interval (sorted ratios)", "coverage"), rows))
