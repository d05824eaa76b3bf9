"""``torchmem.estimate()``: predict a model's peak memory from a couple of measured small steps.

The small steps run for real, on a copy of the model, on the device the estimate is for: the CUDA
caching allocator's peaks there (measured like :func:`torchmem.track`), the exact ledger on the CPU. So
kernel workspaces, allocator rounding and library temporaries are in the figures, not guessed.
The user's model, its gradients, any optimizer passed in, the training/eval mode and the RNG state are
left as they were.

Cost: one deep copy of the model (and a fresh optimizer for it) on the target device, and per probe size one
inference forward plus two training steps (a warm-up and the measured one; on the CPU one after the first
size), each phase under a tracker. Probe sizes double from the example's toward half the largest size asked
for, within the free memory and 15 s. The
fit itself is :func:`torchmem.analysis.estimate.build_estimate`; the result is a
:class:`torchmem.results.fit.MemoryEstimate`.
"""

from __future__ import annotations

import copy
import gc
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError, build_estimate
from torchmem.capture.fake.estimate import device_free_estimate
from torchmem.capture.fake.options import (
    DEFAULT_TARGET,
    EstimateArgs,
    Inputs,
    ModelArg,
    takes_estimate_args,
)
from torchmem.capture.fake.step import _batch_of, _call, _make_optimizer, default_loss
from torchmem.capture.track import Tracker
from torchmem.devices import _ops as ops
from torchmem.devices import backend, ledger, resolve
from torchmem.results.fit import MemoryEstimate, StepMeasurement


def _storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def _resize(inputs: Any, b0: int, m: int, dev: torch.device) -> Any:
    """``inputs`` with every batch-first tensor repeated/cut to ``m`` rows, on ``dev``."""
    if isinstance(inputs, torch.Tensor):
        x = inputs
        if x.dim() > 0 and x.shape[0] == b0:
            idx = torch.arange(m, device=x.device) % b0
            x = x.index_select(0, idx)
        return x.to(dev)
    if isinstance(inputs, Mapping):
        return {k: _resize(v, b0, m, dev) for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(_resize(v, b0, m, dev) for v in inputs)
    if isinstance(inputs, list):
        return [_resize(v, b0, m, dev) for v in inputs]
    return inputs


class _SavedForBackward:
    """Counts the bytes autograd saves for backward while it is entered (``saved_tensors_hooks``).

    Each storage counts once, whatever views of it were saved; the storages in ``exclude`` (the model's
    parameters and buffers) do not count. :meth:`held` is what is still saved: a branch of the graph that
    dies during forward frees what it saved. The pack hook stores a detached alias (never the tensor itself,
    which would make a reference cycle through its ``grad_fn``), so nothing is copied and nothing is kept
    longer than autograd keeps it.
    """

    def __init__(self, exclude: set[int]) -> None:
        self._exclude = exclude
        self._saved: dict[int, tuple[int, list[weakref.ref[torch.Tensor]]]] = {}
        self.problem: str | None = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        packed = t.detach()
        try:
            st = t.untyped_storage()
            key = int(st._cdata)
            if key not in self._exclude and st.device.type != "meta":
                entry = self._saved.get(key)
                if entry is None or not any(r() is not None for r in entry[1]):  # new, or an address reused
                    entry = (int(st.nbytes()), [])
                    self._saved[key] = entry
                entry[1].append(weakref.ref(packed))
        except Exception as exc:  # a tensor without storage (sparse, a subclass): the figure is unknown
            self.problem = f"{type(exc).__name__}: {exc}"
        return packed

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @contextmanager
    def counting(self) -> Iterator[None]:
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        try:
            hooks.__enter__()
        except Exception as exc:  # e.g. inside disable_saved_tensors_hooks()
            self.problem = f"saved-tensor hooks unavailable ({type(exc).__name__}: {exc})"
            yield
            return
        try:
            yield
        finally:
            hooks.__exit__(None, None, None)

    def held(self) -> int | None:
        """Bytes of the storages still saved for backward; ``None`` when they could not all be seen."""
        if self.problem is not None:
            return None
        return sum(nb for nb, refs in self._saved.values() if any(r() is not None for r in refs))


@contextmanager
def _phase(dev: torch.device, out: dict[str, int | None], key: str) -> Iterator[None]:
    tracker = Tracker(dev, survivors=False)
    with tracker:
        yield
    res = tracker.result
    assert res is not None
    out[key + "_peak"] = res.peak
    out[key + "_before"] = res.allocated_before
    out[key + "_after"] = res.allocated_after


def _measure_inference(
    model: torch.nn.Module, inputs: Any, dev: torch.device, autocast: Callable[[], Any]
) -> dict[str, int | None]:
    figures: dict[str, int | None] = {}
    was = model.training
    model.eval()
    try:
        with torch.inference_mode(), _phase(dev, figures, "inference"), autocast():
            _call(model, inputs)
    finally:
        model.train(was)
    return figures


def _measure_training(
    model: torch.nn.Module,
    optimizer: Any,
    inputs: Any,
    dev: torch.device,
    loss_fn: Callable[[Any], torch.Tensor],
    autocast: Callable[[], Any],
    warmup: bool = True,
) -> dict[str, int | None]:
    figures: dict[str, int | None] = {}
    model.train()
    own = {int(t.untyped_storage()._cdata) for t in [*model.parameters(), *model.buffers()]}
    for measured in (False, True) if warmup else (True,):  # the first creates optimizer state, workspaces
        f: dict[str, int | None] = figures if measured else {}
        saved = _SavedForBackward(own)
        with _phase(dev, f, "forward"), saved.counting(), autocast():
            out = _call(model, inputs)
            loss = loss_fn(out)
        f["saved"] = saved.held()  # at the end of forward, while the graph holds them
        del out, saved
        with _phase(dev, f, "backward"):
            loss.backward()
        del loss
        if optimizer is not None:
            with _phase(dev, f, "step"):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
    return figures


def _measurement(
    bs: int, inf: dict[str, int | None], tr: dict[str, int | None], origin: int
) -> StepMeasurement:
    def rel(v: int | None) -> int | None:
        return None if v is None else v - origin

    return StepMeasurement(
        batch_size=bs,
        forward_peak=rel(tr.get("forward_peak")),
        after_forward=rel(tr.get("forward_after")),
        before_forward=rel(tr.get("forward_before")),
        backward_peak=rel(tr.get("backward_peak")),
        step_peak=rel(tr.get("step_peak")),
        inference_peak=rel(inf.get("inference_peak")),
        before_inference=rel(inf.get("inference_before")),
        saved_for_backward=tr.get("saved"),
    )


_LADDER_SECONDS = 15.0  # probing beyond the first two sizes stops when the next would pass this
_LADDER_STEPS = 4  # and after this many more sizes (up to 32 times the example's batch)


def _room(be: Any, dev: torch.device) -> int | None:
    """Bytes a probe may still take on ``dev``: free device memory plus what the cache holds unused, under
    any per-process cap; ``None`` when unknown."""
    try:
        info = be.mem_info()
        hot = be.hot()
        cap = ops.memory_limit(dev)
    except Exception:
        return None
    if info is None:
        return None
    room = int(info[0]) + max((hot.reserved or 0) - (hot.allocated or 0), 0)
    if cap is not None:
        room = min(room, cap - (hot.allocated or 0))
    return room


def _probe(
    first: Sequence[int],
    limit: int,
    measure: Callable[[int], int | None],
    be: Any,
    dev: torch.device,
    origin: int,
) -> str | None:
    """Measure the ``first`` sizes, then double the largest (at most ``_LADDER_STEPS`` times) while it
    stays within ``limit``, the next probe's predicted peak (the line through the last two) takes at most
    half of :func:`_room`, and the time spent probing beyond ``first`` stays under ``_LADDER_SECONDS``.
    Returns a note when memory or time stopped it short of ``limit``."""
    done: list[tuple[int, int]] = []
    for m in first:
        peak = measure(m)
        if peak is not None:
            done.append((m, peak - origin))
    spent = 0.0
    last_took = 0.0
    while len(done) >= 2:
        (x0, y0), (x1, y1) = done[-2], done[-1]
        nxt = 2 * x1
        if nxt > limit or len(done) >= len(first) + _LADDER_STEPS:
            return None
        slope = max((y1 - y0) / (x1 - x0), 0.0)
        grow = slope * (nxt - x1)
        room = _room(be, dev)
        if room is not None and y1 + grow - ((be.hot().allocated or 0) - origin) > room // 2:
            return f"probing stopped at batch size {x1}: batch size {nxt} might not fit in the free memory"
        if last_took and spent + 2.5 * last_took > _LADDER_SECONDS:
            return f"probing stopped at batch size {x1} (time budget); larger sizes are extrapolated"
        t0 = time.perf_counter()
        peak = measure(nxt)
        last_took = time.perf_counter() - t0
        spent += last_took
        if peak is None:
            return None
        done.append((nxt, peak - origin))
    return None


@takes_estimate_args
def estimate(model: ModelArg, example_inputs: Inputs, **options: Any) -> MemoryEstimate:
    """Predict the peak memory of training and inference steps at several batch sizes.

    **Two ways.** Measured (the default): small real steps on a copy of the model on ``device``.
    Device-free: with ``target=`` (a GPU name such as ``"H100-80GB"``), ``device="fake"``/``"meta"``, a
    model factory instead of a model, or a model on the ``meta`` device, nothing runs on any device: the
    model runs under fake tensors (:func:`torchmem.capture.fake.estimate_fake`) and the result is a
    :class:`~torchmem.results.fit.TargetEstimate` — the same rows plus "fits / does not fit on <target>,
    peak X of Y GiB, largest batch size N" and, when it does not fit, the changes ranked by the bytes
    they save. Only the device-free path takes ``checkpoint``, ``grad_accum``, ``sharding``,
    ``world_size``, ``generate_tokens``, ``fragmentation`` and ``suggest``; its ``batch_sizes`` default to
    the example's batch size.

        >>> import torch, torchmem
        >>> est = torchmem.estimate(lambda: torch.nn.Linear(512, 512), torch.randn(8, 512),
        ...                         optimizer="adamw", target="L4")
        >>> est.fits
        True

    Small steps run for real on a copy of ``model`` on ``device`` (default: the model's device), at
    the example's batch size and twice that, then at twice the largest again (up to four more) while
    it stays within half the largest size asked for, the next one's predicted peak takes at most half
    the free memory, and probing stays within 15 s (``probe_sizes`` to choose them yourself): peaks
    measured at small sizes bend (the CUDA allocator rounds tensors of a few MiB up by as much as
    1 MiB; the moment of the backward peak moves as activations outgrow gradients), so the line is
    taken where the asked sizes are. On CUDA the cuBLAS workspaces are freed first, so the probes make
    them again and they are in the figures, as in a process running only this model. Each step is
    measured phase by phase (forward, backward, optimizer step; then an inference forward in eval mode under
    ``inference_mode``) — on CUDA with the caching allocator's peak like :func:`torchmem.track` (torch's
    peak counters are reset at each phase), on the CPU with the exact ledger — after a first warm-up
    step, so optimizer state and library workspaces are in the figures. Each phase's peak is read
    piecewise linearly through the probes and extrapolated from the two largest (a note says where
    the three largest are not on one line); the training peak is the largest phase. Activations are
    the bytes autograd saves for backward in the measured forward (``saved_tensors_hooks``: each storage
    once, the model's parameters and buffers excluded, the input batch included when a layer saves it):
    exact at the measured sizes, fitted linearly elsewhere, and reported in every training row, also where
    the optimizer step holds the peak (they are freed by then; see :class:`EstimateRow`).

    The copy needs room for itself and a small step; nothing of the user's changes: the model's
    parameters, gradients, buffers and training/eval mode, an optimizer passed in (a fresh one of the same
    kind and settings is used) and the RNG state (``torch.random.fork_rng``).

    Args:

    Returns:
        A :class:`MemoryEstimate`; ``str()`` prints the table, ``.peak(bs)`` one figure. Device-free, a
        :class:`~torchmem.results.fit.TargetEstimate` (a :class:`MemoryEstimate` with the verdict).

    Raises:
        FitArgumentError: no batch dimension in the inputs, non-positive sizes, an unknown optimizer, a
            device-free parameter on the measured path.
        UnknownTargetError: ``target`` names no GPU torchmem knows (a :class:`FitArgumentError`).
        FakeTensorError: the device-free estimate (``target=``, a meta model, a model factory) cannot run the
            model under fake tensors (data-dependent shapes, an op with no fake kernel); ``.op`` names it.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
        >>> est = torchmem.estimate(model, torch.randn(4, 64), optimizer="adamw", batch_sizes=[64])
        >>> est.parameters == sum(p.numel() * 4 for p in model.parameters())
        True
    """
    a = EstimateArgs.bind("estimate", model, example_inputs, options)
    if a.device_free or not isinstance(model, torch.nn.Module):  # (a model that is no module is device-free)
        if not isinstance(model, torch.nn.Module) and not callable(model):
            raise FitArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}.", "")
        return device_free_estimate(a)
    if a.device_free_only():
        raise FitArgumentError(
            "checkpoint, grad_accum, sharding, world_size, generate_tokens, fragmentation and suggest need "
            "the device-free estimate.",
            f"Pass target={DEFAULT_TARGET!r} (or another GPU name) to estimate without a device.",
        )
    return _measured(model, a)


def _measured(model: torch.nn.Module, a: EstimateArgs) -> MemoryEstimate:
    """The measured estimate: small real steps on a copy of ``model`` (see :func:`estimate`)."""
    batch_sizes = a.batch_sizes if a.batch_sizes is not None else (1, 8, 32, 128)
    b0 = _batch_of(a.example_inputs)
    if b0 is None or b0 <= 0:
        raise FitArgumentError(
            "example_inputs has no tensor with a batch dimension.",
            "Pass one batch, e.g. torch.randn(4, 64) or a tuple/dict of batch-first tensors.",
        )
    sizes = [int(b) for b in batch_sizes]
    if not sizes or any(isinstance(b, bool) or b <= 0 for b in sizes):
        raise FitArgumentError(f"batch_sizes must be positive ints, got {list(batch_sizes)!r}.", "")
    probes = sorted({int(p) for p in (a.probe_sizes or (b0, 2 * b0))})
    if len(probes) < 2 or probes[0] <= 0:
        raise FitArgumentError(
            f"probe_sizes needs two different positive sizes, got {a.probe_sizes!r}.", "E.g. (2, 4)."
        )
    if a.device is None:
        try:
            dev = resolve(model)
        except Exception:
            dev = torch.device("cpu")
    else:
        dev = resolve(a.device)
    be = backend(dev)
    loss = a.loss_fn or default_loss
    cuda_devices = [dev.index or 0] if dev.type == "cuda" else []

    def autocast() -> Any:
        if a.amp is None:
            return nullcontext()
        return torch.autocast(dev.type, dtype=a.amp)

    weights_only = _storage_bytes(iter([*model.parameters(), *model.buffers()]))
    if a.dtype is not None:
        weights_only = sum(
            t.numel()
            * (torch.empty((), dtype=a.dtype).element_size() if t.is_floating_point() else t.element_size())
            for t in [*model.parameters(), *model.buffers()]
        )
    notes: list[str] = []
    # Probes up to half the largest size asked for (the example's size and twice that, then doubling while
    # the next one fits in half the free memory and the time budget): small probes bend the line (at
    # small sizes the CUDA allocator's blocks round tensors of a few MiB up by as much as 1 MiB, and the
    # moment of the backward peak moves), so the fit is made where the asked sizes are.
    limit = 0 if a.probe_sizes is not None else max(sizes) // 2
    measurements: list[StepMeasurement] = []
    inference: dict[int, dict[str, int | None]] = {}
    training_figs: dict[int, dict[str, int | None]] = {}
    with ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=cuda_devices))
        if dev.type == "cpu":
            stack.enter_context(ledger().enabled())
        gc.collect()
        if dev.type == "cuda":
            # The cuBLAS workspaces count, as in a process running only this model: earlier GEMMs'
            # are freed here and made again by the probes' first GEMMs (in the figures).
            ops.synchronize(dev)
            ops.clear_blas_workspaces(dev)
        ops.empty_cache(dev)
        hot = be.hot()
        origin = hot.allocated or 0
        with torch.no_grad():
            twin = copy.deepcopy(model)
            for p in twin.parameters():
                p.grad = None
            twin = twin.to(device=dev, dtype=a.dtype) if a.dtype is not None else twin.to(dev)
        opt = _make_optimizer(a.optimizer, model, twin) if a.training else None
        params = _storage_bytes(iter(twin.parameters()))
        grads = _storage_bytes(iter([p for p in twin.parameters() if p.requires_grad]))
        work: dict[str, Any] = {"model": twin, "opt": opt}  # dropped with them in the end

        def infer(m: int) -> int | None:
            batch = _resize(a.example_inputs, b0, m, dev)
            inference[m] = _measure_inference(work["model"], batch, dev, autocast)
            return inference[m].get("inference_peak")

        def train(m: int) -> int | None:
            batch = _resize(a.example_inputs, b0, m, dev)
            warm = not training_figs or dev.type != "cpu"  # the CPU ledger has no workspaces to make
            f = _measure_training(work["model"], work["opt"], batch, dev, loss, autocast, warm)
            training_figs[m] = f
            vals = [f[k] for k in ("forward_peak", "backward_peak", "step_peak") if f.get(k) is not None]
            return max(v for v in vals if v is not None) if vals else None

        try:
            # Inference first, while the copy holds only its weights (as an inference process does).
            stopped = _probe(probes, limit, infer, be, dev, origin)
            if a.training:
                stopped = _probe(probes, limit, train, be, dev, origin) or stopped
            if stopped:
                notes.append(stopped)
            for m in sorted({*inference, *training_figs}):
                measurements.append(_measurement(m, inference.get(m, {}), training_figs.get(m, {}), origin))
            state = 0
            if opt is not None:
                state = _storage_bytes(
                    iter([v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)])
                )
        finally:
            work.clear()
            del opt, twin
            gc.collect()
            ops.empty_cache(dev)
    if dev.type == "cuda":
        notes.append(
            "measured with the caching allocator's allocated bytes (torch's peak counters were reset)"
        )
    if a.optimizer is None and a.training:
        notes.append("no optimizer: the training step is forward and backward only")
    return build_estimate(
        measurements,
        batch_sizes=sizes,
        parameters=params,
        gradients=grads if a.training else 0,
        optimizer_state=state,
        weights_only=weights_only,
        training=a.training,
        model=type(model).__name__,
        device=str(dev),
        measured_on=str(dev),
        notes=tuple(notes),
    )


__all__ = ["default_loss", "estimate"]
