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

The :class:`Profiler` is the hooks and the report; its parts: the module table
(:mod:`~torchmem.capture.profile_plan`), the level, peaks and phase windows
(:mod:`~torchmem.capture.profile_peaks`) and the storage sets it counts
(:mod:`~torchmem.capture.profile_storages`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any

import torch

from torchmem._errors import TorchmemError, TrackingError
from torchmem._warn import ReportedOnce, emit_warning
from torchmem.analysis.profile import ProfileReport, build_profile, reconcile
from torchmem.capture.profile_peaks import PeakMeter, PhaseWindow
from torchmem.capture.profile_plan import ORIG, is_compiled_wrapper, plan_modules
from torchmem.capture.profile_storages import Activations, Alive, storage_of, tensors_in
from torchmem.devices import DeviceLike, backend, default_device, resolve

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


class _Call:
    """One forward call of a module, carried to its backward hooks."""

    __slots__ = ("bw", "done", "row")

    def __init__(self, row: int) -> None:
        self.row = row
        self.bw: PhaseWindow | None = None
        self.done = False


class _Fwd:
    __slots__ = ("recompute", "row", "saved", "window")

    def __init__(self, row: int, window: PhaseWindow | None, recompute: bool) -> None:
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
        self._error = ReportedOnce(
            self._say_error, "torchmem.profile: a hook failed in {where} ({error}); figures may be incomplete"
        )
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
                s = storage_of(t)
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

    def _register_static(self) -> None:
        """Storages of parameters and buffers: excluded from activations, counted in the reconciliation."""
        static = Alive()
        bufs = Alive()
        for p in self._params:
            s = storage_of(p)
            if s is not None:
                static.add(s)
                self._meter.note_pre(s)
        for b in self._model.buffers():
            s = storage_of(b)
            if s is not None:
                bufs.add(s)
                self._meter.note_pre(s)
        self._static = static
        self._bufs = bufs
        self._observe_grads()
        self._observe_state()

    def _start(self) -> None:
        dev = self._device()
        self._dev = str(dev)
        be = backend(dev)
        self._rows, self._row_of, self._hooked, self._params = plan_modules(self._model)
        self._meter = PeakMeter(self._dev, be, self._rows)
        n = len(self._params)
        self._grad_bytes = [0] * n
        self._state_bytes = [0] * n if self._opts else None
        self._pidx = {id(p): i for i, p in enumerate(self._params)}
        self._grads = Alive()
        self._ostate = Alive()
        self._act = Activations(self._rows)
        self._handles: list[Any] = []
        self._grad_handles: list[Any] = []
        self._restore: list[tuple[torch.Tensor, str]] = []
        self._fwd: list[_Fwd] = []
        self._steps = 0
        self._tasks: set[int] = set()
        self._recomputed: set[int] = set()

        # Level and peaks.
        self._meter.open(self._stack, self._peaks, self._model_bytes, self._notes.append)
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
        self._meter.begin(self._grads.bytes, self._ostate.bytes, self._act.bytes)

    def _set_snap(self) -> None:
        self._meter.set_snap(self._grads.bytes, self._ostate.bytes, self._act.bytes)

    def _say_error(self, msg: str) -> None:
        self._notes.append(msg)
        # the frames above the hook's: this one, ReportedOnce's call, _error
        emit_warning(msg, stacklevel=5)

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
                self._act.flush_outside()
            self._meter.tick()
            self._fwd.append(_Fwd(row, self._meter.open_window(row, "forward"), False))
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
            self._meter.tick()
            if frame.window is not None:
                self._meter.close_window(frame.window)
            r = self._rows[row]
            r.calls += 1
            alive = self._act.forward_ended(row, frame.saved)
            parent = next((f for f in reversed(self._fwd) if not f.recompute), None)
            if parent is not None:
                parent.saved.update(alive)
            else:
                self._act.end_pass()
            if output is not None and torch.is_grad_enabled():
                self._hook_backward(row, args, kwargs, output)
            self._set_snap()
        except Exception as exc:
            self._error("a forward hook", exc)

    def _hook_backward(self, row: int, args: Any, kwargs: Any, output: Any) -> None:
        outs = [t for t in tensors_in(output) if t.requires_grad]
        if not outs:
            return
        call = _Call(row)
        mg = torch.autograd.graph.register_multi_grad_hook
        self._grad_handles.append(mg(outs, lambda _g, c=call: self._bw_pre(c), mode="any"))
        ins = [t for t in tensors_in((args, kwargs)) if t.requires_grad and t.grad_fn is not None]
        if ins:
            self._grad_handles.append(mg(ins, lambda _g, c=call: self._bw_post(c), mode="all"))

    # -- autograd hooks --------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        packed = t.detach()  # never the tensor itself: that makes a reference cycle through its grad_fn
        try:
            s = storage_of(t)
            if s is not None and s._cdata not in self._static and s.device.type != "meta":
                self._meter.note_pre(s)
                nb = self._act.add(s, packed)
                if not self._in_backward():
                    frame = next((f for f in reversed(self._fwd) if not f.recompute), None)
                    if frame is not None:
                        frame.saved[s._cdata] = nb
                    else:  # the loss, usually: freed early in backward, so its high mark is taken now
                        self._act.add_outside(s._cdata, nb)
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
                self._act.flush_outside()
                end: Callable[[], None] = functools.partial(self._bw_end, task)
                if task == -1 or not _queue_engine_callback(end):
                    self._notes.append("backward end is not observable here: open windows close at exit")
            self._meter.tick()
            call.bw = self._meter.open_window(call.row, "backward", task)
            self._set_snap()
        except Exception as exc:
            self._error("a backward pre-hook", exc)

    def _bw_post(self, call: _Call) -> None:
        try:
            if call.bw is None or call.done:
                return
            call.done = True
            self._meter.tick()
            self._meter.close_window(call.bw)
            self._set_snap()
        except Exception as exc:
            self._error("a backward hook", exc)

    def _bw_end(self, task: int) -> None:
        try:
            self._tasks.discard(task)
            self._meter.tick()
            self._meter.close_windows("backward", task)
            self._observe_grads()
            self._set_snap()
        except Exception as exc:
            self._error("the end of backward", exc)

    def _on_grad(self, p: torch.Tensor) -> None:
        try:
            g = p.grad
            if g is not None:
                s = storage_of(g)
                if s is not None:
                    self._meter.note_pre(s)
                    self._grads.add(s)
        except Exception as exc:
            self._error("a gradient hook", exc)

    # -- optimizer hooks -------------------------------------------------------------------------------
    def _step_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            self._meter.tick()
            self._observe_grads()
            self._meter.open_window(-1, "step")
            self._set_snap()
        except Exception as exc:
            self._error("the optimizer step pre-hook", exc)

    def _step_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            self._meter.tick()
            self._meter.close_windows("step")
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
            s = storage_of(g)
            if s is not None:
                self._meter.note_pre(s)
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
                        s = storage_of(v)
                        if s is not None:
                            seen[s._cdata] = int(s.nbytes())
                            self._meter.note_pre(s)
                            self._ostate.add(s)
                self._state_bytes[i] = max(self._state_bytes[i], sum(seen.values()))

    # -- exit --------------------------------------------------------------------------------------------
    def _finish(self) -> ProfileReport:
        meter = self._meter
        meter.tick()
        meter.close_all()
        if any(not f.recompute for f in self._fwd):
            self._act.end_pass()
        self._fwd.clear()
        self._act.flush_outside()
        self._observe_grads()
        self._observe_state()
        for row in self._recomputed:
            self._rows[row].notes.append(
                "recomputed in backward (activation checkpointing): activations are approximate "
                "(not kept after forward), the backward peak includes the recomputation"
            )
        measured = meter.measured
        level, grads, ostate, act, where = meter.best_snap
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
            other_at_entry=meter.entry_other,
        )
        notes = list(self._notes)
        if self._steps == 0:
            notes.append("no forward pass of the model ran inside the block: only static figures")
        if not self._opts:
            notes.append("no optimizer given: optimizer state is n/a (pass optimizer=...)")
        if meter.cpu:
            notes.append(
                "CPU: exact ledger figures; tensors made before the block count only if they belong to the "
                "model, its optimizer, or are saved for backward"
            )
        elif meter.counters_reset:
            notes.append(
                "torch's peak counters were reset at every hook event; after the block "
                "max_memory_allocated() covers only its last interval (the block's peak is measured_peak)"
            )
        return build_profile(
            device=self._dev,
            model=(
                f"{type(getattr(self._model, ORIG)).__name__} (torch.compile)"
                if is_compiled_wrapper(self._model)
                else type(self._model).__name__
            ),
            steps=self._steps,
            modules=self._rows,
            param_bytes=[p.numel() * p.element_size() for p in self._params],
            grad_bytes=self._grad_bytes,
            state_bytes=self._state_bytes,
            saved_outside=self._act.outside_peak,
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
            meter = getattr(self, "_meter", None)
            if meter is not None:
                meter.close()
        finally:
            self._stack.close()
            for a in ("_grads", "_ostate", "_act", "_meter"):
                part = getattr(self, a, None)
                if part is not None:
                    part.clear()
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
