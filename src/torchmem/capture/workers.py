"""Runtime checks of DataLoader workers and host caches, for ``torchmem.watch()`` and ``torchmem run``.

Each check warns once, with the fix:

- ``dataset-cuda``: a DataLoader with workers is iterated over a Dataset that holds CUDA tensors. With the
  'fork' start method after CUDA was initialised, indexing it in a worker fails ("Cannot re-initialize CUDA in
  forked subprocess"); with 'spawn'/'forkserver' every worker creates its own CUDA context to read them.
- ``worker-context``: a worker of a DataLoader this process iterates created a CUDA context on
  the watched GPU (NVML's process list): something in the Dataset, ``collate_fn`` or ``worker_init_fn`` uses
  CUDA, and each worker pays a context (~0.5 GiB).
- ``outlived``: DataLoader workers still alive 10 s after their iterator was shut down or collected.
- ``worker-rss``: a worker's own memory (USS, psutil) keeps growing — the classic "DataLoader workers leak
  RAM": reading Python lists/dicts of a Dataset touches their reference counts, so each forked worker copies
  the pages it reads (copy-on-read).
- ``pinned-growth``: torch's pinned host allocator keeps holding more (``pin_memory=True`` with batches of
  varying sizes fills its cache, which it never gives back by itself).

:class:`WorkerChecks` wraps ``DataLoader.__iter__`` (public) while installed; :meth:`WorkerChecks.poll` is
called from the session's sampler thread or a watcher's step and does nothing until its interval has passed.
Nothing here raises into the program: an error switches the checks off, reported once.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from torchmem._format import fmt_bytes

MiB = 1 << 20


class WorkerWarning(UserWarning):
    """A DataLoader worker or host-cache problem seen while the program runs (``torchmem.watch()``)."""


POLL_S = 2.0
USS_POLL_S = 10.0
OUTLIVE_S = 10.0
WORKER_GROWTH = 256 * MiB
PINNED_GROWTH = 256 * MiB


def start_method(loader: Any) -> str:
    """The start method a DataLoader's workers use (its ``multiprocessing_context``, else the default)."""
    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is not None:
        try:
            return str(ctx.get_start_method())
        except Exception:
            return str(ctx)
    method = multiprocessing.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]  # the first is the platform's default


def cuda_tensors_in(dataset: Any, limit: int = 64) -> list[tuple[str, int]]:
    """``(where, bytes)`` of CUDA tensors a Dataset holds in its attributes (a shallow, bounded look: the
    attributes, and the items of lists, tuples and dicts among them)."""
    out: list[tuple[str, int]] = []
    seen = 0

    def look(name: str, v: Any, depth: int) -> None:
        nonlocal seen
        seen += 1
        if seen > limit * 4 or len(out) >= limit:
            return
        if isinstance(v, torch.Tensor):
            if v.device.type == "cuda":
                out.append((name, int(v.untyped_storage().nbytes())))
            return
        if depth >= 2:
            return
        if isinstance(v, (list, tuple)):
            for i, x in enumerate(v[:limit]):
                look(f"{name}[{i}]", x, depth + 1)
        elif isinstance(v, dict):
            for i, (k, x) in enumerate(v.items()):
                if i >= limit:
                    break
                look(f"{name}[{k!r}]", x, depth + 1)

    attrs = getattr(dataset, "__dict__", None)
    if isinstance(attrs, dict):
        for k, v in list(attrs.items()):
            look(f"dataset.{k}", v, 0)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


class _Loader:
    __slots__ = ("dead_since", "iterator", "label", "pids")

    def __init__(self, iterator: Any, pids: list[int], label: str) -> None:
        try:
            self.iterator: Any = weakref.ref(iterator)
        except TypeError:
            self.iterator = None
        self.pids = pids
        self.label = label
        self.dead_since: float | None = None


class WorkerChecks:
    """The checks for one watched device; ``report(code, text)`` gets each warning once."""

    def __init__(self, device: torch.device, report: Callable[[str, str], None]) -> None:
        self.device = device
        self._report = report
        self._said: set[str] = set()
        self._loaders: list[_Loader] = []
        self._lock = threading.Lock()
        self._orig: Any = None
        self._next = 0.0
        self._next_uss = 0.0
        self._uss: dict[int, list[int]] = {}
        self._pinned: list[int] = []
        self._off = False
        self._me = os.getpid()

    # -- install -----------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.utils.data import DataLoader

        if self._orig is not None:
            return
        orig = DataLoader.__iter__
        checks = self

        def __iter__(loader: Any) -> Any:
            it = orig(loader)
            try:
                if not checks._off and os.getpid() == checks._me:
                    checks._on_iter(loader, it)
            except Exception as exc:
                checks._fail(exc)
            return it

        __iter__.__wrapped__ = orig  # type: ignore[attr-defined]
        __iter__._torchmem = True  # type: ignore[attr-defined]
        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
        self._orig = orig

    def uninstall(self) -> None:
        from torch.utils.data import DataLoader

        orig, self._orig = self._orig, None
        if orig is not None and getattr(DataLoader.__iter__, "_torchmem", False):
            DataLoader.__iter__ = orig  # type: ignore[method-assign]

    def _say(self, code: str, text: str) -> None:
        if code in self._said:
            return
        self._said.add(code)
        try:
            self._report(code, text)
        except Exception:
            pass

    def _fail(self, exc: Exception) -> None:
        self._off = True
        self._say("error", f"the DataLoader checks stopped ({type(exc).__name__}: {exc})")

    # -- at each DataLoader iteration start ----------------------------------------------------------
    def _on_iter(self, loader: Any, it: Any) -> None:
        n = int(getattr(loader, "num_workers", 0) or 0)
        if n <= 0:
            return
        method = start_method(loader)
        found = cuda_tensors_in(getattr(loader, "dataset", None))
        if found:
            where = ", ".join(w for w, _ in found[:3]) + (
                f" and {len(found) - 3} more" if len(found) > 3 else ""
            )
            size = fmt_bytes(sum(b for _, b in found))
            if method == "fork":
                what = (
                    f"DataLoader(num_workers={n}) forks its workers over a Dataset that holds CUDA tensors "
                    f"({where}, {size}): indexing them in a worker fails with 'Cannot re-initialize CUDA in "
                    "forked subprocess'"
                )
            else:
                what = (
                    f"DataLoader(num_workers={n}, '{method}') workers read a Dataset that holds CUDA tensors "
                    f"({where}, {size}): each of the {n} workers creates its own CUDA context (~0.5 GiB) to "
                    "read them"
                )
            self._say(
                "dataset-cuda",
                f"{what}. Fix: keep the Dataset's tensors on the CPU and move each batch in the training "
                "loop (`batch.to(device, non_blocking=True)` with `pin_memory=True`), or use num_workers=0 "
                "for data already on the GPU.",
            )
        workers = getattr(it, "_workers", None) or []
        pids = [int(w.pid) for w in workers if getattr(w, "pid", None)]
        if pids:
            with self._lock:
                if not any(entry.pids == pids for entry in self._loaders):
                    label = f"DataLoader(num_workers={n}, '{method}') of {type(loader.dataset).__name__}"
                    self._loaders.append(_Loader(it, pids, label))

    # -- periodic ----------------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> None:
        """Run the checks that are due (every 2 s; worker memory every 10 s). Never raises."""
        if self._off:
            return
        now = time.perf_counter() if now is None else now
        if now < self._next:
            return
        self._next = now + POLL_S
        try:
            self._check_outlived(now)
            if self.device.type == "cuda":
                self._check_contexts()
                self._check_pinned()
            if now >= self._next_uss:
                self._next_uss = now + USS_POLL_S
                self._check_uss()
        except Exception as exc:
            self._fail(exc)

    def _worker_pids(self) -> dict[int, str]:
        with self._lock:
            return {pid: e.label for e in self._loaders for pid in e.pids}

    def _check_outlived(self, now: float) -> None:
        with self._lock:
            entries = list(self._loaders)
        for e in entries:
            it = e.iterator() if e.iterator is not None else None
            gone = it is None or bool(getattr(it, "_shutdown", False))
            del it
            alive = [p for p in e.pids if _alive(p)]
            if not alive:
                with self._lock:
                    if e in self._loaders:
                        self._loaders.remove(e)
                continue
            if not gone:
                e.dead_since = None
                continue
            if e.dead_since is None:
                e.dead_since = now
            elif now - e.dead_since >= OUTLIVE_S:
                self._say(
                    "outlived",
                    f"{len(alive)} worker process(es) of a {e.label} "
                    f"(pid {', '.join(map(str, alive[:4]))}) are "
                    f"still running {now - e.dead_since:.0f} s after their iterator was shut down: they keep "
                    "their memory (and any CUDA context). Fix: make the Dataset's code return (no blocking "
                    "calls, no signal handlers that ignore SIGTERM), or end them with "
                    "`loader_iter._shutdown_workers()`; `persistent_workers=True` keeps one set for the "
                    "loader's life instead of one per epoch.",
                )

    def _check_contexts(self) -> None:
        from torchmem.devices import _nvml

        workers = self._worker_pids()
        if not workers:
            return
        nv = _nvml.device(self.device.index or 0)
        if nv is None or not nv.processes:
            return
        for p in nv.processes:
            if p.pid == self._me:
                continue
            role = workers.get(p.pid)
            if role is None:
                # Not a worker of a DataLoader this process iterates: another child process is described by
                # its command line and the line that started it (capture/gpus.py), never as a worker.
                continue
            self._say(
                "worker-context",
                f"worker pid {p.pid} ({role}) created a CUDA context on {self.device} "
                f"({fmt_bytes(p.used)}): something in its Dataset, collate_fn or worker_init_fn uses CUDA, "
                "and every worker pays a context. Fix: keep worker code on the CPU (no .cuda()/.to('cuda'), "
                "no CUDA tensors in the Dataset) and move batches to the GPU in the training loop.",
            )
            return

    def _check_pinned(self) -> None:
        from torchmem.devices import backend

        be = backend(self.device)
        if not be.is_initialized():
            return
        held, active = be.pinned_host_figures()
        if held is None:
            return
        series = self._pinned
        if series and held < series[-1]:
            series.clear()
        series.append(held)
        del series[:-30]
        # held - active: torch counts a freed block as active until its events are processed, so this
        # is a lower bound of the cache; the growth of what is held is the signal
        cached = max(held - (active or 0), 0)
        if len(series) >= 6 and series[-1] - series[0] >= PINNED_GROWTH:
            rises = sum(1 for a, b in itertools.pairwise(series) if b > a)
            if rises >= 4:
                self._say(
                    "pinned-growth",
                    f"pinned host memory held by torch's host allocator keeps growing "
                    f"({fmt_bytes(series[0])} -> {fmt_bytes(held)}, {fmt_bytes(cached)} of it cached, not in "
                    "use): pinned buffers of varying sizes (pin_memory=True with batches of different "
                    "shapes) fill a cache it never gives back by itself. Fix: fixed batch shapes "
                    "(drop_last=True, padding to a few bucket sizes), or fewer pinned buffers.",
                )

    def _check_uss(self) -> None:
        from torchmem.devices._host import process_uss

        for pid, label in self._worker_pids().items():
            uss = process_uss(pid)
            if uss is None:
                self._uss.pop(pid, None)
                continue
            series = self._uss.setdefault(pid, [])
            series.append(uss)
            del series[1:-20]  # the first reading and the latest ones
            rises = sum(1 for a, b in itertools.pairwise(series) if b > a)
            if len(series) >= 3 and series[-1] - series[0] >= WORKER_GROWTH and rises >= 2:
                self._say(
                    "worker-rss",
                    f"DataLoader worker pid {pid} ({label}) keeps growing: its own memory (USS) went from "
                    f"{fmt_bytes(series[0])} to {fmt_bytes(series[-1])}. Reading Python lists/dicts of a "
                    "Dataset in a forked worker touches their reference counts, so each worker copies every "
                    "page it reads (copy-on-read). Fix: store the Dataset's items as NumPy arrays or tensors "
                    "(one object, no per-item reference counts) instead of lists of Python objects.",
                )


__all__ = ["WorkerChecks", "WorkerWarning", "cuda_tensors_in", "start_method"]
