"""``torchmem.profile(model)``: memory per module over one or more training steps.

How it measures (see docs/profile.md):

- **Peaks.** Every hook event (a module's forward entry/exit, its backward start/end, the optimizer step's
  start/end) reads the device's allocated bytes and the peak since the previous event, then starts a new
  interval: on CUDA on torch's peak counter shared as ``track()`` shares it (enclosing ``track()`` blocks and
  the program's own ``max_memory_allocated()`` keep their peaks; XPU resets torch's counters), on the CPU on
  a ledger watermark torchmem owns. A module's forward (backward) peak is the
  highest interval peak while its window was open, above the level when it opened. Exact at hook granularity.
- **Activations.** One ``saved_tensors_hooks`` pair for the whole block: each tensor autograd saves is
  attributed to the innermost module whose forward is running; at that forward's end the storages still
  alive are its activations (each storage once; parameters and buffers excluded), and they count for every
  enclosing module too.
- **Backward windows.** A multi-grad hook ("any") on a call's outputs opens it, a multi-grad hook ("all") on
  its non-leaf inputs closes it; windows still open close at the end of the backward pass (an engine
  callback). Tensor hooks, not full module backward hooks, so in-place ops on outputs keep working.
- **Parameters, gradients, optimizer state** are read from the tensors (no hooks needed), gradients at each
  optimizer step and each backward's end, optimizer state after each step.

Every hook is removed at exit, also when the block raises; an error inside a hook is reported once and the
step goes on.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch

from torchmem._errors import TorchmemError, TrackingError
from torchmem._warn import emit_warning
from torchmem.analysis.profile import ProfileReport, RawModule, build_profile, reconcile
from torchmem.capture.track import _Frame as _TrackFrame
from torchmem.capture.track import _open, _open_lock
from torchmem.devices import Backend, CpuBackend, DeviceLike, backend, default_device, ledger, resolve

_ORIG = "_orig_mod"
_active: Profiler | None = None


class ProfileError(TorchmemError):
    """``torchmem.profile()`` was given something it cannot profile (not a module, not an optimizer)."""


def _graph_task_id() -> int:
    """The running backward's id, -1 outside backward (private API, guarded: -1 when missing)."""
    fn = getattr(torch._C, "_current_graph_task_id", None)
    return int(fn()) if fn is not None else -1


def _queue_engine_callback(cb: Callable[[], None]) -> bool:
    """Run ``cb`` when the current backward pass ends (the engine's callback queue; False if unavailable)."""
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    queue = getattr(engine, "queue_callback", None)
    if queue is None:
        return False
    queue(cb)
    return True


def _storage(t: torch.Tensor) -> Any | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 3:
        return
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1)


def _is_compiled_wrapper(m: torch.nn.Module) -> bool:
    return type(m).__name__ == "OptimizedModule" and isinstance(getattr(m, _ORIG, None), torch.nn.Module)


def _clean_name(name: str) -> str | None:
    """The user's name of a module under a ``torch.compile`` wrapper; ``None`` for the wrapped module."""
    parts = name.split(".") if name else []
    if parts and parts[-1] == _ORIG:
        return None
    return ".".join(p for p in parts if p != _ORIG)


class _Alive:
    """Bytes of a set of storages that are still alive (each storage once; weak references)."""

    __slots__ = ("__weakref__", "bytes", "refs")

    def __init__(self) -> None:
        self.bytes = 0
        self.refs: dict[int, tuple[int, weakref.ref[Any]]] = {}

    def add(self, storage: Any) -> tuple[int, weakref.ref[Any]]:
        key = storage._cdata
        old = self.refs.get(key)
        if old is not None and old[1]() is not None:
            return old
        nb = int(storage.nbytes())
        me = weakref.ref(self)

        def gone(r: weakref.ref[Any], key: int = key, nb: int = nb) -> None:
            owner = me()
            if owner is not None and owner.refs.get(key, (0, None))[1] is r:
                del owner.refs[key]
                owner.bytes -= nb

        entry = (nb, weakref.ref(storage, gone))
        self.refs[key] = entry
        self.bytes += nb
        return entry

    def __contains__(self, key: int) -> bool:
        e = self.refs.get(key)
        return e is not None and e[1]() is not None

    def clear(self) -> None:
        self.refs.clear()
        self.bytes = 0


class _Saved:
    """Bytes of storages autograd still holds as saved tensors (each storage once).

    A storage counts while at least one packed tensor (what the pack hook handed to autograd) is alive: when
    the graph is freed the packed tensors die, even if the user still holds the storage (an input).
    """

    __slots__ = ("__weakref__", "bytes", "keys", "refs")

    def __init__(self) -> None:
        self.bytes = 0
        self.keys: dict[int, list[int]] = {}  # storage key -> [nbytes, live packed tensors]
        self.refs: set[weakref.ref[Any]] = set()

    def add(self, storage: Any, packed: torch.Tensor) -> int:
        key = storage._cdata
        e = self.keys.get(key)
        if e is None:
            e = self.keys[key] = [int(storage.nbytes()), 0]
            self.bytes += e[0]
        e[1] += 1
        me = weakref.ref(self)

        def gone(r: weakref.ref[Any], key: int = key) -> None:
            owner = me()
            if owner is None or r not in owner.refs:
                return
            owner.refs.discard(r)
            ent = owner.keys.get(key)
            if ent is not None:
                ent[1] -= 1
                if ent[1] <= 0:
                    del owner.keys[key]
                    owner.bytes -= ent[0]

        self.refs.add(weakref.ref(packed, gone))
        return e[0]

    def held(self, key: int) -> bool:
        return key in self.keys

    def clear(self) -> None:
        self.refs.clear()
        self.keys.clear()
        self.bytes = 0


@dataclass
class _PhaseWindow:
    """One module phase (forward, backward) or the optimizer step being measured: where it started and the
    highest allocated bytes seen inside it."""

    row: int
    kind: str  # "forward", "backward", "step"
    start: int
    peak: int
    task: int = -1


class _Call:
    """One forward call of a module, carried to its backward hooks."""

    __slots__ = ("bw", "done", "row")

    def __init__(self, row: int) -> None:
        self.row = row
        self.bw: _PhaseWindow | None = None
        self.done = False


class _Fwd:
    __slots__ = ("recompute", "row", "saved", "window")

    def __init__(self, row: int, window: _PhaseWindow | None, recompute: bool) -> None:
        self.row = row
        self.window = window
        self.recompute = recompute
        self.saved: dict[int, int] = {}  # storage key -> bytes


class Profiler:
    """The live profiler returned by :func:`profile`: a context manager; :meth:`report` after the block."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: DeviceLike = None,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        peaks: bool = True,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise ProfileError(
                f"profile() needs a torch.nn.Module, got {type(model).__name__}.",
                "Pass the model whose modules should be measured: torchmem.profile(model).",
            )
        if optimizer is None:
            opts: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            opts = [optimizer]
        elif isinstance(optimizer, (list, tuple)) and all(
            isinstance(o, torch.optim.Optimizer) for o in optimizer
        ):
            opts = list(optimizer)
        else:
            raise ProfileError(
                "optimizer must be a torch.optim.Optimizer (or a list of them), "
                f"got {type(optimizer).__name__}.",
                "Pass the optimizer that steps this model's parameters, or leave it out.",
            )
        self._model = model
        self._spec = device
        self._opts = opts
        self._peaks = peaks
        self._state = "new"
        self._report: ProfileReport | None = None
        self._errors: set[str] = set()
        self._notes: list[str] = []

    # -- public ------------------------------------------------------------------------------------
    def report(self) -> ProfileReport:
        """The :class:`ProfileReport` of the finished block.

        Raises:
            TrackingError: the block has not finished yet.
        """
        if self._report is None:
            raise TrackingError(
                "The profiled block has not finished yet.", "Call report() after the `with` block ends."
            )
        return self._report

    def __str__(self) -> str:
        return str(self._report) if self._report is not None else "<torchmem.profile: running>"

    def __enter__(self) -> Profiler:
        global _active
        if self._state != "new":
            raise TrackingError(
                "This torchmem.profile() object was already used.", "Call torchmem.profile(model) again."
            )
        if _active is not None:
            raise TrackingError(
                "Another torchmem.profile() block is open; profiles do not nest.",
                "Profile one model at a time (close the other block first).",
            )
        self._state = "open"
        _active = self
        self._stack = ExitStack()
        try:
            self._start()
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if et is not None:
                self._notes.append(f"the block raised {et.__name__}: figures cover what ran before it")
            self._report = self._finish()
        finally:
            self._cleanup()

    def _model_bytes(self) -> int:
        """Bytes the model already holds (parameters, buffers, gradients, its optimizer state), each once."""
        seen: dict[int, int] = {}

        def add(t: Any) -> None:
            if isinstance(t, torch.Tensor):
                s = _storage(t)
                if s is not None:
                    seen[s._cdata] = int(s.nbytes())

        for p in self._model.parameters():
            add(p)
            add(p.grad)
            for opt in self._opts:
                st = opt.state.get(p)
                if isinstance(st, dict):
                    for v in st.values():
                        add(v)
        for b in self._model.buffers():
            add(b)
        return sum(seen.values())

    # -- setup -------------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        if self._spec is not None:
            return resolve(self._spec)
        if any(True for _ in self._model.parameters()) or any(True for _ in self._model.buffers()):
            return resolve(self._model)
        return default_device()

    def _plan(self) -> None:
        """Rows, the modules to hook and the parameter table."""
        model = self._model
        self._rows: list[RawModule] = []
        self._row_of: dict[int, int] = {}  # id(module) -> row (alive for the block: the model holds them)
        self._hooked: list[torch.nn.Module] = []
        skip_under: list[str] = []  # prefixes (raw names) whose modules get no hooks
        params = list(model.parameters())
        self._params = params
        pidx = {id(p): i for i, p in enumerate(params)}
        names_seen: dict[int, str] = {}
        for raw, m in model.named_modules(remove_duplicate=False):
            if id(m) in names_seen:
                first = _clean_name(names_seen[id(m)])
                alias = _clean_name(raw)
                if first is not None and alias is not None and first != alias and id(m) in self._row_of:
                    rec = self._rows[self._row_of[id(m)]]
                    note = f"also reachable as '{alias}' (one module: counted once)"
                    if note not in rec.notes:
                        rec.notes.append(note)
                continue
            names_seen[id(m)] = raw
            name = _clean_name(raw)
            if name is None:  # the module inside a compile wrapper: the wrapper's row stands for it
                continue
            row = len(self._rows)
            sub = tuple(sorted({pidx[id(p)] for p in m.parameters() if id(p) in pidx}))
            self._rows.append(RawModule(name=name, type=type(m).__name__, params=sub))
            self._row_of[id(m)] = row
            inside = any(raw == s or raw.startswith(s + ".") for s in skip_under)
            if inside:
                self._rows[row].activations = None
                self._rows[row].notes.append("inside a compiled module: only its parameters are measured")
                continue
            if getattr(m, "_compiled_call_impl", None) is not None:  # module.compile() in place
                skip_under.append(raw)
                self._rows[row].activations = None
                self._rows[row].notes.append(
                    "compiled in place (module.compile()): hooks would run inside the compiled code, so "
                    "only its parameters are measured; profile it before compiling, or use torch.compile(m)"
                )
                continue
            if isinstance(m, torch.jit.ScriptModule):
                skip_under.append(raw)
                self._rows[row].activations = None
                self._rows[row].notes.append("TorchScript module: hooks are not supported; parameters only")
                continue
            if _is_compiled_wrapper(m):
                skip_under.append(f"{raw}.{_ORIG}" if raw else _ORIG)
                self._rows[row].notes.append(
                    "torch.compile'd: measured as one block (hooks inside compiled code break the graph)"
                )
            self._hooked.append(m)

    def _register_static(self) -> None:
        """Storages of parameters and buffers: excluded from activations, counted in the reconciliation."""
        static = _Alive()
        bufs = _Alive()
        for p in self._params:
            s = _storage(p)
            if s is not None:
                static.add(s)
                self._note_pre(s)
        for b in self._model.buffers():
            s = _storage(b)
            if s is not None:
                bufs.add(s)
                self._note_pre(s)
        self._static = static
        self._bufs = bufs
        self._observe_grads()
        self._observe_state()

    def _start(self) -> None:
        dev = self._device()
        self._dev = str(dev)
        self._be: Backend = backend(dev)
        self._cpu = isinstance(self._be, CpuBackend)
        self._plan()
        n = len(self._params)
        self._grad_bytes = [0] * n
        self._state_bytes = [0] * n if self._opts else None
        self._pidx = {id(p): i for i, p in enumerate(self._params)}
        self._grads = _Alive()
        self._ostate = _Alive()
        self._act = _Saved()
        self._pre = _Alive()  # CPU: storages the ledger does not count (born before it was on)
        self._handles: list[Any] = []
        self._grad_handles: list[Any] = []
        self._restore: list[tuple[torch.Tensor, str]] = []
        self._fwd: list[_Fwd] = []
        self._open_w: list[_PhaseWindow] = []
        self._pass: dict[int, dict[int, int]] = {}
        self._outside: dict[int, int] = {}
        self._saved_outside = 0
        self._steps = 0
        self._tasks: set[int] = set()
        self._recomputed: set[int] = set()
        self._measure = True
        self._tframe: _TrackFrame | None = None
        self._ptoken: int | None = None  # the shared peak counter's reader (CUDA)
        self._ptoken_used: bool | None = None
        self._mark: Any = None
        self._started = False
        self._entry_other = 0

        # Level and peaks.
        if self._cpu:
            led = ledger()
            self._stack.enter_context(led.enabled())
            self._led = led
            self._mark = led.open_watermark(self._dev)
        else:
            h = self._be.hot()
            if h.allocated is not None:
                self._entry_other = max(int(h.allocated) - self._model_bytes(), 0)
            if h.allocated is None:
                self._measure = False
                self._notes.append(f"{self._dev} has no allocator statistics: peaks are not measured")
            elif self._peaks:
                self._tframe = _TrackFrame()
                self._ptoken = self._be.open_peak()  # CUDA: the shared counter, the program's peaks stay
                self._ptoken_used = self._ptoken is not None
                if self._ptoken is None:
                    with _open_lock:
                        prior = h.peak_allocated or 0
                        for other in _open.get(self._dev, ()):
                            other.carried = max(other.carried, prior)
                        self._be.reset_peak()
                        _open.setdefault(self._dev, []).append(self._tframe)
            else:
                self._notes.append("peaks=False: forward/backward peaks and the measured peak are not read")
        self._register_static()

        # Hooks.
        for m in self._hooked:
            self._handles.append(m.register_forward_pre_hook(self._fw_pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._fw_post, with_kwargs=True, always_call=True))
        for p in self._params:
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                if getattr(p, "_post_accumulate_grad_hooks", None) is None:
                    self._restore.append((p, "_post_accumulate_grad_hooks"))
                self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        for o in self._opts:
            self._handles.append(o.register_step_pre_hook(self._step_pre))
            self._handles.append(o.register_step_post_hook(self._step_post))
            foreign = sum(1 for g in o.param_groups for p in g["params"] if id(p) not in self._pidx)
            if foreign:
                self._notes.append(
                    f"{foreign} parameter(s) of the optimizer are not in the model: not counted"
                )
        try:
            self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
        except Exception as exc:  # e.g. inside disable_saved_tensors_hooks()
            self._notes.append(f"saved-tensor hooks are unavailable here ({exc}): activations not measured")
            for r in self._rows:
                r.activations = None
        self._level = 0
        self._best = -1
        self._snap: tuple[int, int, int, int, str] = (0, 0, 0, 0, "at the start of the block")
        self._tick()
        self._best = self._level
        self._set_snap()
        self._best_snap = self._snap
        self._started = True

    # -- measurement core ----------------------------------------------------------------------------
    def _note_pre(self, storage: Any) -> None:
        """CPU: count a storage the ledger does not (born before it was on) in the absolute level.

        Found mid-block, it was alive all along: the level, the best peak and every open window move up
        together, so no window sees a rise that is only a discovery.
        """
        if not self._cpu or storage._cdata in self._led._live or storage.device.type != "cpu":
            return
        before = self._pre.bytes
        self._pre.add(storage)
        nb = self._pre.bytes - before
        if nb and self._started:
            self._level += nb
            self._best += nb
            lv, g, o, a, where = self._best_snap
            self._best_snap = (lv + nb, g, o, a, where)
            lv, g, o, a, where = self._snap
            self._snap = (lv + nb, g, o, a, where)
            for w in self._open_w:
                w.start += nb
                w.peak += nb

    def _read(self) -> tuple[int, int] | None:
        if self._cpu:
            led = self._led
            cur = led.current(self._dev) + self._pre.bytes
            pk = self._mark.peak + self._pre.bytes
            self._mark.peak = led.current(self._dev)
            return cur, max(pk, cur)
        if not self._measure:
            return None
        h = self._be.hot()
        if h.allocated is None:
            return None
        cur = h.allocated
        if self._tframe is None:
            return cur, cur
        if self._ptoken is not None:  # the interval's peak, then a new interval
            got = self._be.restart_peak(self._ptoken)
            return cur, max(got[0] if got else cur, cur)
        pk = max(h.peak_allocated or cur, self._tframe.carried, cur)
        with _open_lock:
            self._tframe.carried = 0
            for other in _open.get(self._dev, ()):
                if other is not self._tframe:
                    other.carried = max(other.carried, pk)
            self._be.reset_peak()
        return cur, pk

    def _tick(self) -> None:
        r = self._read()
        if r is None:
            return
        cur, pk = r
        if pk > self._best:
            self._best = pk
            self._best_snap = self._snap
        for w in self._open_w:
            if pk > w.peak:
                w.peak = pk
        self._level = cur

    def _where(self) -> str:
        if not self._open_w:
            return "outside the model's modules"
        w = self._open_w[-1]
        if w.kind == "step":
            return "optimizer step"
        name = self._rows[w.row].name
        label = f"'{name}'" if name else f"the model ({self._rows[w.row].type})"
        return f"{w.kind} of {label}"

    def _set_snap(self) -> None:
        self._snap = (self._level, self._grads.bytes, self._ostate.bytes, self._act.bytes, self._where())

    def _open_window(self, row: int, kind: str, task: int = -1) -> _PhaseWindow:
        w = _PhaseWindow(row, kind, self._level, self._level, task)
        self._open_w.append(w)
        return w

    def _close_window(self, w: _PhaseWindow) -> None:
        if w in self._open_w:
            self._open_w.remove(w)
        if not self._measure or (self._tframe is None and not self._cpu):
            return
        rise = max(w.peak - w.start, 0)
        r = self._rows[w.row] if w.kind != "step" else None
        if r is None:
            return
        if w.kind == "forward":
            r.forward_peak = rise if r.forward_peak is None else max(r.forward_peak, rise)
        else:
            r.backward_peak = rise if r.backward_peak is None else max(r.backward_peak, rise)

    def _error(self, where: str, exc: BaseException) -> None:
        if where in self._errors:
            return
        self._errors.add(where)
        msg = (
            f"torchmem.profile: a hook failed in {where} ({type(exc).__name__}: {exc}); "
            "figures may be incomplete"
        )
        self._notes.append(msg)
        emit_warning(msg, stacklevel=3)

    def _in_backward(self) -> bool:
        return _graph_task_id() != -1

    # -- module hooks ----------------------------------------------------------------------------------
    def _fw_pre(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        try:
            row = self._row_of[id(module)]
            if self._in_backward():  # activation checkpointing recomputes this forward inside backward
                self._fwd.append(_Fwd(row, None, True))
                self._recomputed.add(row)
                return
            if not any(not f.recompute for f in self._fwd):
                self._steps += 1
                self._flush_outside()
            self._tick()
            self._fwd.append(_Fwd(row, self._open_window(row, "forward"), False))
            self._set_snap()
        except Exception as exc:
            self._error("a forward pre-hook", exc)

    def _fw_post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        try:
            row = self._row_of[id(module)]
            pos = next((i for i in range(len(self._fwd) - 1, -1, -1) if self._fwd[i].row == row), None)
            if pos is None:
                return
            frame = self._fwd[pos]
            del self._fwd[pos:]  # frames above it belong to calls that raised
            if frame.recompute:
                return
            self._tick()
            if frame.window is not None:
                self._close_window(frame.window)
            r = self._rows[row]
            r.calls += 1
            held = self._act.held
            alive = {k: v for k, v in frame.saved.items() if held(k)}
            self._pass.setdefault(row, {}).update(alive)
            parent = next((f for f in reversed(self._fwd) if not f.recompute), None)
            if parent is not None:
                parent.saved.update(alive)
            else:
                self._end_pass()
            if output is not None and torch.is_grad_enabled():
                self._hook_backward(row, args, kwargs, output)
            self._set_snap()
        except Exception as exc:
            self._error("a forward hook", exc)

    def _hook_backward(self, row: int, args: Any, kwargs: Any, output: Any) -> None:
        outs = [t for t in _tensors(output) if t.requires_grad]
        if not outs:
            return
        call = _Call(row)
        mg = torch.autograd.graph.register_multi_grad_hook
        self._grad_handles.append(mg(outs, lambda _g, c=call: self._bw_pre(c), mode="any"))
        ins = [t for t in _tensors((args, kwargs)) if t.requires_grad and t.grad_fn is not None]
        if ins:
            self._grad_handles.append(mg(ins, lambda _g, c=call: self._bw_post(c), mode="all"))

    def _end_pass(self) -> None:
        for row, saved in self._pass.items():
            r = self._rows[row]
            if r.activations is None:
                continue
            b = sum(saved.values())
            r.activations = max(r.activations, b)
        self._pass.clear()

    def _flush_outside(self) -> None:
        if self._outside:
            b = sum(nb for k, nb in self._outside.items() if self._act.held(k))
            self._saved_outside = max(self._saved_outside, b)
            self._outside.clear()

    # -- autograd hooks --------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        packed = t.detach()  # never the tensor itself: that makes a reference cycle through its grad_fn
        try:
            s = _storage(t)
            if s is not None and s._cdata not in self._static and s.device.type != "meta":
                self._note_pre(s)
                nb = self._act.add(s, packed)
                if not self._in_backward():
                    frame = next((f for f in reversed(self._fwd) if not f.recompute), None)
                    if frame is not None:
                        frame.saved[s._cdata] = nb
                    else:  # the loss, usually: freed early in backward, so its high mark is taken now
                        self._outside[s._cdata] = nb
                        held = self._act.held
                        b = sum(n for k, n in self._outside.items() if held(k))
                        self._saved_outside = max(self._saved_outside, b)
        except Exception as exc:
            self._error("the saved-tensor pack hook", exc)
        return packed

    @staticmethod
    def _unpack(t: Any) -> Any:
        return t

    def _bw_pre(self, call: _Call) -> None:
        try:
            if call.bw is not None or call.done:
                return
            task = _graph_task_id()
            if task not in self._tasks:
                self._tasks.add(task)
                self._flush_outside()
                end: Callable[[], None] = functools.partial(self._bw_end, task)
                if task == -1 or not _queue_engine_callback(end):
                    self._notes.append("backward end is not observable here: open windows close at exit")
            self._tick()
            call.bw = self._open_window(call.row, "backward", task)
            self._set_snap()
        except Exception as exc:
            self._error("a backward pre-hook", exc)

    def _bw_post(self, call: _Call) -> None:
        try:
            if call.bw is None or call.done:
                return
            call.done = True
            self._tick()
            self._close_window(call.bw)
            self._set_snap()
        except Exception as exc:
            self._error("a backward hook", exc)

    def _bw_end(self, task: int) -> None:
        try:
            self._tasks.discard(task)
            self._tick()
            for w in [w for w in self._open_w if w.kind == "backward" and w.task == task]:
                self._close_window(w)
            self._observe_grads()
            self._set_snap()
        except Exception as exc:
            self._error("the end of backward", exc)

    def _on_grad(self, p: torch.Tensor) -> None:
        try:
            g = p.grad
            if g is not None:
                s = _storage(g)
                if s is not None:
                    self._note_pre(s)
                    self._grads.add(s)
        except Exception as exc:
            self._error("a gradient hook", exc)

    # -- optimizer hooks -------------------------------------------------------------------------------
    def _step_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            self._tick()
            self._observe_grads()
            self._open_window(-1, "step")
            self._set_snap()
        except Exception as exc:
            self._error("the optimizer step pre-hook", exc)

    def _step_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            self._tick()
            for w in [w for w in self._open_w if w.kind == "step"]:
                self._close_window(w)
            self._observe_state()
            self._set_snap()
        except Exception as exc:
            self._error("the optimizer step hook", exc)

    def _observe_grads(self) -> None:
        for i, p in enumerate(self._params):
            g = p.grad
            if g is None:
                continue
            self._grad_bytes[i] = max(self._grad_bytes[i], g.numel() * g.element_size())
            s = _storage(g)
            if s is not None:
                self._note_pre(s)
                self._grads.add(s)

    def _observe_state(self) -> None:
        if self._state_bytes is None:
            return
        for o in self._opts:
            for p, st in o.state.items():
                i = self._pidx.get(id(p))
                if i is None or not isinstance(st, dict):
                    continue
                seen: dict[int, int] = {}
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        s = _storage(v)
                        if s is not None:
                            seen[s._cdata] = int(s.nbytes())
                            self._note_pre(s)
                            self._ostate.add(s)
                self._state_bytes[i] = max(self._state_bytes[i], sum(seen.values()))

    # -- exit --------------------------------------------------------------------------------------------
    def _finish(self) -> ProfileReport:
        self._tick()
        while self._open_w:
            self._close_window(self._open_w[-1])
        if any(not f.recompute for f in self._fwd):
            self._end_pass()
        self._fwd.clear()
        self._flush_outside()
        self._observe_grads()
        self._observe_state()
        for row in self._recomputed:
            self._rows[row].notes.append(
                "recomputed in backward (activation checkpointing): activations are approximate "
                "(not kept after forward), the backward peak includes the recomputation"
            )
        measured = self._best if self._best >= 0 and (self._cpu or self._tframe is not None) else None
        level, grads, ostate, act, where = self._best_snap
        rec = reconcile(
            measured,
            level if measured is not None else None,
            {
                "parameters": self._static.bytes,
                "buffers": self._bufs.bytes,
                "gradients": grads,
                "optimizer_state": ostate,
                "activations": act,
            },
            where,
            other_at_entry=self._entry_other,
        )
        notes = list(self._notes)
        if self._steps == 0:
            notes.append("no forward pass of the model ran inside the block: only static figures")
        if not self._opts:
            notes.append("no optimizer given: optimizer state is n/a (pass optimizer=...)")
        if self._cpu:
            notes.append(
                "CPU: exact ledger figures; tensors made before the block count only if they belong to the "
                "model, its optimizer, or are saved for backward"
            )
        elif self._tframe is not None and self._ptoken_used is False:
            notes.append(
                "torch's peak counters were reset at every hook event; after the block "
                "max_memory_allocated() covers only its last interval (the block's peak is measured_peak)"
            )
        return build_profile(
            device=self._dev,
            model=(
                f"{type(getattr(self._model, _ORIG)).__name__} (torch.compile)"
                if _is_compiled_wrapper(self._model)
                else type(self._model).__name__
            ),
            steps=self._steps,
            modules=self._rows,
            param_bytes=[p.numel() * p.element_size() for p in self._params],
            grad_bytes=self._grad_bytes,
            state_bytes=self._state_bytes,
            saved_outside=self._saved_outside,
            reconciliation=rec,
            notes=notes,
        )

    def _cleanup(self) -> None:
        global _active
        try:
            for h in getattr(self, "_grad_handles", []):
                h.remove()
            for h in getattr(self, "_handles", []):
                h.remove()
            for t, attr in getattr(self, "_restore", []):
                hooks = getattr(t, attr, None)
                if hooks is not None and len(hooks) == 0:
                    setattr(t, attr, None)
            token = getattr(self, "_ptoken", None)
            if token is not None:
                self._ptoken = None
                self._be.close_peak(token)
            if getattr(self, "_tframe", None) is not None:
                with _open_lock:
                    frames = _open.get(self._dev, [])
                    if self._tframe in frames:
                        frames.remove(self._tframe)
                    for other in frames:
                        other.carried = max(other.carried, max(self._best, 0))
            if getattr(self, "_mark", None) is not None:
                self._led.close_watermark(self._mark)
        finally:
            self._stack.close()
            for a in ("_grads", "_ostate", "_act", "_pre"):
                alive = getattr(self, a, None)
                if alive is not None:
                    alive.clear()
            self._handles = []
            self._grad_handles = []
            self._state = "done"
            _active = None


def profile(
    model: torch.nn.Module,
    *,
    device: DeviceLike = None,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    peaks: bool = True,
) -> Profiler:
    """Measure memory per module over the training steps run inside a ``with`` block.

    For each module (by qualified name; the model's own row holds the totals): parameters, gradients,
    optimizer state of its parameters, activations saved for backward during its forward, its forward
    transient peak and its backward peak. ``report().reconciliation`` splits the block's measured peak into
    the parts alive when it happened and names what is left unexplained. Every hook is removed at exit.

    Args:
        model: The model to profile (a ``torch.compile`` wrapper is measured as one block).
        device: The device to measure (default: where the model's parameters are).
        optimizer: The optimizer(s) stepping the model, for optimizer-state figures and the step window.
        peaks: Read peaks at every hook event: on CUDA on torch's peak counter shared with the program and
            enclosing ``track()`` blocks (their peaks and ``max_memory_allocated()`` stay); on XPU by
            resetting torch's counters. ``False`` leaves the counters alone; peaks are then ``None``.
            Ignored on the CPU, where torchmem keeps its own peaks.

    Returns:
        A :class:`Profiler`; ``report()`` gives the frozen :class:`~torchmem.analysis.profile.ProfileReport`.

    Raises:
        ProfileError: ``model`` is not a module or ``optimizer`` not an optimizer.
        TrackingError: another profile block is open (on entry).

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        >>> opt = torch.optim.Adam(model.parameters())
        >>> x = torch.randn(16, 64)
        >>> with torchmem.profile(model, optimizer=opt) as prof:
        ...     model(x).sum().backward()
        ...     opt.step()
        >>> r = prof.report()
        >>> r.row("0").activations == x.numel() * 4   # a Linear saves its input
        True
        >>> r.totals.params == sum(p.numel() * 4 for p in model.parameters())
        True
    """
    return Profiler(model, device=device, optimizer=optimizer, peaks=peaks)


__all__ = ["ProfileError", "Profiler", "profile"]
