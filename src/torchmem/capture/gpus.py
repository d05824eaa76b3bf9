"""Every GPU the monitored process touches, and the evidence of how it touched them (``torchmem run``).

:class:`GpuWatch` is what a session uses to (a) find the GPU the program really works on — discovered from
its contexts and where its memory is, never assumed to be ``cuda:0`` — (b) read every GPU it has a context on
(the allocator's figures, NVML's per-process figure) and (c) record, while the program runs, the calls that
explain what those figures show:

* the first CUDA call (torch's lazy-init queue): its line and the current device then;
* each ``torch.cuda.set_device``: its line and the GPUs that already had a context;
* each ``torch.load`` without ``map_location`` that restored storages to a GPU: its line and where to;
* each ``nn.DataParallel``: its line, ``device_ids`` and ``output_device``;
* each state dict whose making grew the GPU's allocated memory (FSDP's full state dict gathered on every
  rank): the call, its line and the growth;
* each child process started with ``subprocess`` or ``multiprocessing``: its command line and the line that
  started it (what NVML later shows it holding on each GPU is joined to that).

The wrappers call the original exactly once with the program's own arguments and return its result; any
error in torchmem's part is reported once and the recording stops, the program goes on. :meth:`remove`
puts every original back (only where the program did not replace it meanwhile).
"""

from __future__ import annotations

import importlib.abc
import os
import shlex
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from torchmem.analysis.gpus import choose_device, gpus_report
from torchmem.devices._storage import key_of_storage
from torchmem.results.gpus import GpuRow, GpusReport

_MAX_EVIDENCE = 32
_MAX_WALK = 20_000
_CHILD_POLL_S = 2.0


def _site(depth: int = 1) -> str | None:
    """``file.py:42`` of the program's own line calling into the wrapped function."""
    from torchmem._warn import user_frame

    try:
        f = user_frame(sys._getframe(depth))
    except ValueError:
        return None
    if f is None:
        return None
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def _cuda_bytes(obj: Any) -> dict[int, int]:
    """Bytes of distinct CUDA storages reachable from a loaded object (dicts, lists, tuples, tensors;
    modules' state), by device index. Bounded walk."""
    seen: set[int] = set()
    out: dict[int, int] = {}
    stack = [obj]
    visited = 0
    while stack and visited < _MAX_WALK:
        o = stack.pop()
        visited += 1
        if isinstance(o, torch.Tensor):
            try:
                if o.device.type != "cuda":
                    continue
                st = o.untyped_storage()
                key = key_of_storage(st)
                if key in seen:
                    continue
                seen.add(key)
                idx = o.device.index or 0
                out[idx] = out.get(idx, 0) + int(st.nbytes())
            except Exception:
                continue
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, torch.nn.Module):
            stack.extend(o.state_dict(keep_vars=True).values())
    return out


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after the module ``name`` is executed by an import, in the importing
    thread, before the importer binds any of its names. One use; finds nothing itself."""

    def __init__(self, name: str, then: Callable[[Any], None], on_error: Callable[[BaseException], None]):
        self.name = name
        self.then = then
        self.on_error = on_error
        self.done = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self.done:
            return None
        self.done = True
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if getattr(loader, "exec_module", None) is not None:
                self._chain(loader)
            return spec
        return None

    def _chain(self, loader: Any) -> None:
        run, then, on_error = loader.exec_module, self.then, self.on_error

        def exec_module(module: Any) -> None:
            run(module)
            try:
                then(module)
            except Exception as exc:
                on_error(exc)

        try:
            loader.exec_module = exec_module
        except Exception:  # a loader that refuses attributes: the functions stay unwrapped
            pass


class GpuWatch:
    """Finds the GPU a program works on and records how it touched every GPU (see the module's text).

    Args:
        watched: The device the session reads now.
        auto: Whether the watched device may follow the program (no ``--device`` given, not a launched rank).
        on_error: Called once with a message when torchmem's own part fails (the recording then stops).
    """

    def __init__(self, watched: torch.device, auto: bool, on_error: Callable[[str], None]) -> None:
        self.watched = watched
        self.auto = auto and watched.type == "cuda"
        self._on_error = on_error
        self._failed = False
        self._lock = threading.Lock()
        self._undo: list[Callable[[], None]] = []
        self._depth = threading.local()
        self.evidence: dict[str, Any] = {
            "cuda_init": None,
            "set_device": [],
            "loads": [],
            "data_parallel": [],
            "state_dicts": [],
        }
        self._children: dict[int, dict[str, Any]] = {}
        self._skip_pids: set[int] = set()
        self._rows: dict[int, dict[str, Any]] = {}
        self._next_child_poll = 0.0

    # -- install / remove ----------------------------------------------------------------------------
    def install(self) -> GpuWatch:
        try:
            self._on_init()
            from torchmem.devices import _allocator

            self._undo.append(_allocator.wrap_cuda_function("set_device", self._set_device_wrapper))
            self._patch(torch, "load", self._load_wrapper)
            self._patch(torch.nn.DataParallel, "__init__", self._dp_wrapper)
            self._patch(torch.nn.Module, "state_dict", self._state_dict_wrapper("state_dict"))
            self._patch_dcp()
            self._patch_popen()
        except Exception as exc:
            self._fail(exc)
        return self

    def remove(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:
                pass

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        from torchmem._patch import wrap_attribute

        self._undo.append(wrap_attribute(owner, name, make))

    def _patch_dcp(self) -> None:
        """Wrap DCP's full-state-dict functions. The program binds them by name (``from ... import
        get_model_state_dict``), so they are wrapped in the module before any such binding: now when the
        module is loaded, else by a post-import hook as the program's import loads it (in the importing
        thread: importing from another thread can deadlock on the import locks)."""
        name = "torch.distributed.checkpoint.state_dict"
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "get_model_state_dict"):
            self._wrap_dcp(mod)
            return
        hook = _AfterImport(name, self._wrap_dcp, self._fail)
        sys.meta_path.insert(0, hook)

        def undo() -> None:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)

        self._undo.append(undo)

    def _wrap_dcp(self, mod: Any) -> None:
        for fn in ("get_model_state_dict", "get_state_dict"):
            if hasattr(mod, fn):
                original = getattr(mod, fn)
                self._patch(mod, fn, self._state_dict_wrapper(fn))
                self._rebind(original, getattr(mod, fn))

    def _rebind(self, original: Any, wrapper: Any) -> None:
        """Where the program's own code already bound ``original`` by name (a ``from ... import`` that ran
        before the watch started: an ``mp.spawn`` child unpickles its target, importing the main script,
        before its session starts), bind ``wrapper`` instead; undone by :meth:`remove` where the name still
        holds the wrapper. The namespaces are found as the referrers of ``original`` (one gc pass)."""
        import gc

        from torchmem._warn import _USER, _origin

        for d in gc.get_referrers(original):
            if not isinstance(d, dict) or not isinstance(d.get("__name__"), str):
                continue
            f = d.get("__file__")
            if not isinstance(f, str) or _origin(f, d["__name__"]) != _USER:
                continue
            for k, v in list(d.items()):
                if v is original:
                    d[k] = wrapper

                    def undo(d: dict[str, Any] = d, k: str = k) -> None:
                        if d.get(k) is wrapper:
                            d[k] = original

                    self._undo.append(undo)

    def _patch_popen(self) -> None:
        import subprocess

        watch = self

        def make(original: Any) -> Any:
            def __init__(popen: Any, *args: Any, **kwargs: Any) -> None:
                original(popen, *args, **kwargs)
                try:
                    cmd = args[0] if args else kwargs.get("args")
                    watch.child_started(int(popen.pid), cmd, _site())
                except Exception as exc:
                    watch._fail(exc)

            return __init__

        self._patch(subprocess.Popen, "__init__", make)

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._on_error(f"the GPU evidence recording stopped ({type(exc).__name__}: {exc})")

    def _add(self, key: str, item: dict[str, Any]) -> None:
        with self._lock:
            items = self.evidence[key]
            if len(items) < _MAX_EVIDENCE:
                items.append(item)

    # -- evidence ------------------------------------------------------------------------------------
    def _on_init(self) -> None:
        from torchmem.devices import _allocator

        site = _site()
        ref = weakref.ref(self)  # torch keeps queued calls forever: the watch must not live that long

        def at_init() -> None:
            watch = ref()
            if watch is not None and watch.evidence["cuda_init"] is None:
                watch.evidence["cuda_init"] = {"site": _site() or None, "device": _allocator.device_now()}

        if _allocator.cuda_ready():
            self.evidence["cuda_init"] = {"site": None, "device": _allocator.current_index(), "before": site}
            return
        _allocator.on_cuda_init(at_init)

    def _set_device_wrapper(self, original: Any) -> Any:
        watch = self

        def set_device(device: Any) -> None:
            before: list[int] = []
            if not watch._failed:
                try:
                    from torchmem.devices import _allocator

                    before = _allocator.contexts()
                except Exception as exc:
                    watch._fail(exc)
            original(device)
            if not watch._failed:
                try:
                    from torchmem.devices import _allocator

                    idx = _allocator.current_index()
                    if idx is None:
                        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
                        idx = d.index
                    watch._add("set_device", {"site": _site(), "index": idx, "contexts_before": before})
                except Exception as exc:
                    watch._fail(exc)

        return set_device

    def _load_wrapper(self, original: Any) -> Any:
        watch = self

        def load(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if watch._failed or kwargs.get("map_location") is not None or len(args) > 1:
                return result
            try:
                found = _cuda_bytes(result)
                if found:
                    watch._add(
                        "loads",
                        {"site": _site(), "devices": sorted(found), "bytes": sum(found.values())},
                    )
            except Exception as exc:
                watch._fail(exc)
            return result

        return load

    def _dp_wrapper(self, original: Any) -> Any:
        watch = self

        def __init__(dp: Any, *args: Any, **kwargs: Any) -> None:
            original(dp, *args, **kwargs)
            try:
                ids = [
                    int(torch.device("cuda", i).index if isinstance(i, int) else torch.device(i).index or 0)
                    for i in (getattr(dp, "device_ids", None) or [])
                ]
                out = getattr(dp, "output_device", None)
                out_idx = None if out is None else (out if isinstance(out, int) else torch.device(out).index)
                watch._add(
                    "data_parallel",
                    {
                        "site": _site(),
                        "device_ids": ids,
                        "output_device": out_idx,
                        "module": type(getattr(dp, "module", None)).__name__,
                    },
                )
            except Exception as exc:
                watch._fail(exc)

        return __init__

    def _state_dict_wrapper(self, call: str) -> Callable[[Any], Any]:
        watch = self

        def make(original: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                depth = getattr(watch._depth, "n", 0)
                from torchmem.devices import _allocator

                if depth or watch._failed or not _allocator.cuda_ready():
                    watch._depth.n = depth + 1
                    try:
                        return original(*args, **kwargs)
                    finally:
                        watch._depth.n = depth
                idx = _allocator.current_index()
                before = (_allocator.device_figures(idx) or {}).get("allocated") if idx is not None else None
                watch._depth.n = 1
                try:
                    result = original(*args, **kwargs)
                finally:
                    watch._depth.n = 0
                try:
                    after = (
                        (_allocator.device_figures(idx) or {}).get("allocated") if idx is not None else None
                    )
                    if before is not None and after is not None and after > before:
                        watch._add(
                            "state_dicts",
                            {"site": _site(), "call": call, "device": idx, "grew": after - before},
                        )
                except Exception as exc:
                    watch._fail(exc)
                return result

            return wrapper

        return make

    # -- children ------------------------------------------------------------------------------------
    def child_started(self, pid: int, command: Any, site: str | None, followed: bool = False) -> None:
        """Note a child process (its GPU memory is joined to this at each poll). A followed child records
        its own capture: it is not described here."""
        with self._lock:
            if followed:
                self._skip_pids.add(pid)
                self._children.pop(pid, None)
                return
            if isinstance(command, (list, tuple)):
                text = shlex.join(str(c) for c in command)
                script = next((str(c) for c in command if str(c).endswith(".py")), None)
            else:
                text = str(command)
                script = next((w for w in text.split() if w.endswith(".py")), None)
            if len(text) > 160:
                text = text[:157] + "..."
            self._children[pid] = {"pid": pid, "command": text, "site": site, "script": script, "used": {}}

    def skip(self, pids: list[int]) -> None:
        """Processes described elsewhere (DataLoader workers, followed children)."""
        with self._lock:
            self._skip_pids.update(pids)

    def _poll_children(self) -> None:
        from torchmem.devices import _allocator, _nvml
        from torchmem.devices._host import process_cmdline, relation_to

        me = os.getpid()
        for i in range(_allocator.device_count()):
            nv = _nvml.device(i)
            if nv is None or not nv.processes:
                continue
            for p in nv.processes:
                if p.pid == me or p.pid in self._skip_pids or p.used is None:
                    continue
                child = self._children.get(p.pid)
                if child is None:
                    rel, _ = relation_to(p.pid, me)
                    if rel not in ("child", "descendant"):
                        continue
                    cmd = process_cmdline(p.pid) or [p.name or "?"]
                    self.child_started(p.pid, cmd, None)
                    child = self._children.get(p.pid)
                    if child is None:
                        continue
                used = child["used"]
                used[f"cuda:{i}"] = max(int(p.used), used.get(f"cuda:{i}", 0))

    # -- readings ------------------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> None:
        """Read every GPU with a context (the allocator's figures; cheap) and, every 2 s, the child
        processes' GPU memory (NVML). Never raises."""
        if self._failed:
            return
        try:
            from torchmem.devices import _allocator

            for i in _allocator.contexts():
                fig = _allocator.device_figures(i)
                if fig is None:
                    continue
                with self._lock:
                    row = self._rows.setdefault(i, {})
                    row.update(fig)
            now = time.perf_counter() if now is None else now
            if now >= self._next_child_poll and (self._children or self._rows):
                self._next_child_poll = now + _CHILD_POLL_S
                self._poll_children()
        except Exception as exc:
            self._fail(exc)

    def used_indices(self) -> list[int]:
        with self._lock:
            return sorted(self._rows)

    def choose(self) -> torch.device | None:
        """The GPU the program works on now (see :func:`~torchmem.analysis.gpus.choose_device`), ``None``
        before it has a context anywhere."""
        from torchmem.devices import _allocator

        ctx = _allocator.contexts()
        if not ctx:
            return None
        allocated = {i: (_allocator.device_figures(i) or {}).get("allocated") for i in ctx}
        idx = choose_device(ctx, _allocator.current_index(), allocated)
        return None if idx is None else torch.device("cuda", idx)

    def status(self) -> str:
        """`` | cuda:1 1.30 GiB`` for each GPU besides the watched one (the status line), ``""`` with one."""
        from torchmem._format import fmt_bytes

        with self._lock:
            rows = dict(self._rows)
        others = [(i, r) for i, r in sorted(rows.items()) if i != self.watched.index]
        if not others:
            return ""
        return "".join(f" | cuda:{i} {fmt_bytes(r.get('allocated'))}" for i, r in others)

    def report(self, context_bytes: int | None = None) -> GpusReport:
        """Every GPU this process had a context on, with the findings the evidence supports."""
        from torchmem.devices import _nvml

        self.poll(now=float("inf"))
        me = os.getpid()
        rows: list[GpuRow] = []
        with self._lock:
            items = sorted(self._rows.items())
            evidence = {k: (list(v) if isinstance(v, list) else v) for k, v in self.evidence.items()}
            children = [dict(c) for c in self._children.values() if c["used"]]
        for i, r in items:
            used = None
            nv = _nvml.device(i)
            if nv is not None and nv.processes:
                used = next((p.used for p in nv.processes if p.pid == me), None)
            name = nv.name if nv is not None else None
            rows.append(
                GpuRow(
                    f"cuda:{i}",
                    name,
                    r.get("allocated"),
                    r.get("reserved"),
                    r.get("peak_allocated"),
                    r.get("peak_reserved"),
                    used,
                    watched=(self.watched.type == "cuda" and i == (self.watched.index or 0)),
                )
            )
        return gpus_report(rows, str(self.watched), evidence, children, context_bytes)


__all__ = ["GpuWatch"]
