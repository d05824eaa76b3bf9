"""``torchmem.estimate()``: predict a model's peak memory from a couple of measured small steps.

The small steps run for real, on a copy of the model, on the device the estimate is for: the CUDA
caching allocator's peaks there (measured like :func:`torchmem.track`), the exact ledger on the CPU. So
kernel workspaces, allocator rounding and library temporaries are in the figures, not guessed.
The user's model, its gradients, any optimizer passed in, the training/eval mode and the RNG state are
left as they were.

Cost: one deep copy of the model (and a fresh optimizer for it) on the target device, and per probe size one
inference forward plus two training steps (a warm-up and the measured one), each phase under a tracker. The
fit itself is :func:`torchmem.analysis.estimate.build_estimate`; the result is a
:class:`torchmem.results.fit.MemoryEstimate`.
"""

from __future__ import annotations

import copy
import gc
import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError, build_estimate
from torchmem.capture.track import Tracker
from torchmem.devices import DeviceLike, backend, ledger, resolve
from torchmem.devices import _ops as ops
from torchmem.results.fit import MemoryEstimate, StepMeasurement

OptimizerSpec = str | type | torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None


def _storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            continue
        seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def _batch_of(inputs: Any) -> int | None:
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() > 0 else None
    if isinstance(inputs, Mapping):
        for v in inputs.values():
            b = _batch_of(v)
            if b is not None:
                return b
    if isinstance(inputs, (list, tuple)):
        for v in inputs:
            b = _batch_of(v)
            if b is not None:
                return b
    return None


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


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, Mapping):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)
    else:
        loss = getattr(out, "loss", None)
        if isinstance(loss, torch.Tensor):
            yield loss
        logits = getattr(out, "logits", None)
        if loss is None and isinstance(logits, torch.Tensor):
            yield logits


def default_loss(out: Any) -> torch.Tensor:
    """The loss ``estimate()`` backpropagates when none is given: the output's ``loss`` if it has one (a
    Hugging Face-style output), else the sum of the means of its floating tensors that need a gradient."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    parts = [t.float().mean() for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise FitArgumentError(
            "The model's output has no floating tensor that needs a gradient: nothing to backward.",
            "Pass loss_fn=..., or training=False for an inference estimate.",
        )
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _make_optimizer(spec: OptimizerSpec, user: torch.nn.Module, model: torch.nn.Module) -> Any:
    if spec is None:
        return None
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(spec, str):
        names = {n.lower(): n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)}
        name = names.get(spec.lower())
        cls = None if name is None else getattr(torch.optim, name)
        if cls is None or not issubclass(cls, torch.optim.Optimizer):
            raise FitArgumentError(
                f"{spec!r} is not a torch.optim optimizer.", "Use e.g. 'adamw', 'adam', 'sgd' or a class."
            )
        return cls(params)
    if isinstance(spec, torch.optim.Optimizer):
        # A fresh optimizer of the same kind and settings on the copy's parameters (the user's keeps its
        # state): groups are mapped by parameter position.
        pos = {id(p): i for i, p in enumerate(user.parameters())}
        copies = list(model.parameters())
        groups = []
        for g in spec.param_groups:
            mapped = [copies[pos[id(p)]] for p in g["params"] if id(p) in pos]
            if mapped:
                groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": mapped})
        if not groups:
            raise FitArgumentError(
                "The optimizer given holds none of the model's parameters.", "Pass the model's optimizer."
            )
        try:
            accepted = set(inspect.signature(type(spec).__init__).parameters)
        except (TypeError, ValueError):
            accepted = set()
        kwargs = {k: v for k, v in spec.defaults.items() if k in accepted and k != "params"}
        return type(spec)(groups, **kwargs)
    if callable(spec):
        return spec(params)
    raise FitArgumentError(
        f"optimizer must be None, a name, a class or an optimizer, not {type(spec).__name__}.", ""
    )


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
) -> dict[str, int | None]:
    figures: dict[str, int | None] = {}
    model.train()
    own = {int(t.untyped_storage()._cdata) for t in [*model.parameters(), *model.buffers()]}
    for measured in (False, True):  # the first step creates optimizer state and workspaces
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


def estimate(
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    optimizer: OptimizerSpec = None,
    batch_sizes: Sequence[int] = (1, 8, 32, 128),
    training: bool = True,
    device: DeviceLike = None,
    dtype: torch.dtype | None = None,
    amp: torch.dtype | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    probe_sizes: Sequence[int] | None = None,
) -> MemoryEstimate:
    """Predict the peak memory of training and inference steps at several batch sizes.

    Two small steps run for real on a copy of ``model`` on ``device`` (default: the model's device), at
    the example's batch size and twice that (``probe_sizes`` to choose). Each step is measured phase by
    phase (forward, backward, optimizer step; then an inference forward in eval mode under
    ``inference_mode``) — on CUDA with the caching allocator's peak like :func:`torchmem.track` (torch's
    peak counters are reset at each phase), on the CPU with the exact ledger — after a first warm-up
    step, so optimizer state and library workspaces are in the figures. Each phase's peak is fitted
    linearly in the batch size and extrapolated; the training peak is the largest phase. Activations are
    the bytes autograd saves for backward in the measured forward (``saved_tensors_hooks``: each storage
    once, the model's parameters and buffers excluded, the input batch included when a layer saves it):
    exact at the measured sizes, fitted linearly elsewhere, and reported in every training row, also where
    the optimizer step holds the peak (they are freed by then; see :class:`EstimateRow`).

    The copy needs room for itself and a small step; nothing of the user's changes: the model's
    parameters, gradients, buffers and training/eval mode, an optimizer passed in (a fresh one of the same
    kind and settings is used) and the RNG state (``torch.random.fork_rng``).

    Args:
        model: The model.
        example_inputs: One batch: a tensor, a tuple/list (positional arguments) or a dict (keyword
            arguments); tensors whose first dimension is the batch size are resized for the probes.
        optimizer: ``None`` (no optimizer step), a ``torch.optim`` name (``"adamw"``), a class, a factory
            ``params -> optimizer``, or an optimizer instance (its kind and settings are copied).
        batch_sizes: The batch sizes to predict.
        training: Predict training steps (else inference only).
        device: The device to estimate for (default: the model's device).
        dtype: Cast the copy to this dtype first (e.g. ``torch.bfloat16``).
        amp: Run forward under ``torch.autocast`` with this dtype.
        loss_fn: ``output -> scalar loss`` (default: :func:`default_loss`).
        probe_sizes: The two (or more) batch sizes to measure.

    Returns:
        A :class:`MemoryEstimate`; ``str()`` prints the table, ``.peak(bs)`` one figure.

    Raises:
        FitArgumentError: no batch dimension in the inputs, non-positive sizes, an unknown optimizer.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
        >>> est = torchmem.estimate(model, torch.randn(4, 64), optimizer="adamw", batch_sizes=[64])
        >>> est.parameters == sum(p.numel() * 4 for p in model.parameters())
        True
    """
    if not isinstance(model, torch.nn.Module):
        raise FitArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}.", "")
    b0 = _batch_of(example_inputs)
    if b0 is None or b0 <= 0:
        raise FitArgumentError(
            "example_inputs has no tensor with a batch dimension.",
            "Pass one batch, e.g. torch.randn(4, 64) or a tuple/dict of batch-first tensors.",
        )
    sizes = [int(b) for b in batch_sizes]
    if not sizes or any(isinstance(b, bool) or b <= 0 for b in sizes):
        raise FitArgumentError(f"batch_sizes must be positive ints, got {list(batch_sizes)!r}.", "")
    probes = sorted({int(p) for p in (probe_sizes or (b0, 2 * b0))})
    if len(probes) < 2 or probes[0] <= 0:
        raise FitArgumentError(
            f"probe_sizes needs two different positive sizes, got {probe_sizes!r}.", "E.g. (2, 4)."
        )
    if device is None:
        try:
            dev = resolve(model)
        except Exception:
            dev = torch.device("cpu")
    else:
        dev = resolve(device)
    be = backend(dev)
    loss = loss_fn or default_loss
    cuda_devices = [dev.index or 0] if dev.type == "cuda" else []

    def autocast() -> Any:
        if amp is None:
            return nullcontext()
        return torch.autocast(dev.type, dtype=amp)

    weights_only = _storage_bytes(iter([*model.parameters(), *model.buffers()]))
    if dtype is not None:
        weights_only = sum(
            t.numel()
            * (torch.empty((), dtype=dtype).element_size() if t.is_floating_point() else t.element_size())
            for t in [*model.parameters(), *model.buffers()]
        )
    notes: list[str] = []
    measurements: list[StepMeasurement] = []
    with ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=cuda_devices))
        if dev.type == "cpu":
            stack.enter_context(ledger().enabled())
        gc.collect()
        ops.empty_cache(dev)
        hot = be.hot()
        origin = hot.allocated or 0
        with torch.no_grad():
            twin = copy.deepcopy(model)
            for p in twin.parameters():
                p.grad = None
            twin = twin.to(device=dev, dtype=dtype) if dtype is not None else twin.to(dev)
        opt = _make_optimizer(optimizer, model, twin) if training else None
        params = _storage_bytes(iter(twin.parameters()))
        grads = _storage_bytes(iter([p for p in twin.parameters() if p.requires_grad]))
        try:
            # Inference first, while the copy holds only its weights (as an inference process does).
            inference = []
            for m in probes:
                batch = _resize(example_inputs, b0, m, dev)
                inference.append(_measure_inference(twin, batch, dev, autocast))
                del batch
            for m, inf in zip(probes, inference):
                tr: dict[str, int | None] = {}
                if training:
                    batch = _resize(example_inputs, b0, m, dev)
                    tr = _measure_training(twin, opt, batch, dev, loss, autocast)
                    del batch
                measurements.append(_measurement(m, inf, tr, origin))
            state = 0
            if opt is not None:
                state = _storage_bytes(
                    iter([v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)])
                )
        finally:
            del opt, twin
            gc.collect()
            ops.empty_cache(dev)
    if dev.type == "cuda":
        notes.append(
            "measured with the caching allocator's allocated bytes (torch's peak counters were reset)"
        )
    if optimizer is None and training:
        notes.append("no optimizer: the training step is forward and backward only")
    return build_estimate(
        measurements,
        batch_sizes=sizes,
        parameters=params,
        gradients=grads if training else 0,
        optimizer_state=state,
        weights_only=weights_only,
        training=training,
        model=type(model).__name__,
        device=str(dev),
        measured_on=str(dev),
        notes=tuple(notes),
    )


__all__ = ["default_loss", "estimate"]
