"""Device-free estimates: the model runs under fake tensors and a byte ledger counts every tensor it makes.

``torchmem.estimate(..., target="H100-80GB")`` lands here (:func:`estimate_fake`). The model is built (a
factory is called) or mirrored (a real model's parameters become fake tensors of the same shapes and
dtypes, without copying a byte) under ``FakeTensorMode``, and a training step (forward + loss, backward,
optimizer step) and an inference forward run on it. Nothing is allocated: each op computes only its
outputs' shapes. A dispatch mode above the fake mode counts each new storage once, at the caching
allocator's block size for CUDA (512-byte multiples), and uncounts it when it dies, so the figures per
phase are the live tensor bytes a real device would hold — parameters, gradients, optimizer state,
activations saved for backward and the temporaries of each op. The fake run is a CPU run; for a GPU
target it takes that GPU's kernel choices where they hold different tensors (fused attention, fused
dropout, the transformer fast paths' temporaries, composite ops' temporaries under ``inference_mode``,
foreach optimizers: see "the target GPU's kernel choices" below). What the tensors do not show (the CUDA
context and libraries, the cuBLAS workspaces, fragmentation, NCCL, sharding) comes from
:mod:`torchmem.analysis.targets`.

Where ``FakeTensorMode`` (a private torch API) cannot be imported, the same run happens on the ``meta``
device, which computes shapes the same way.

Cost: no device and no tensor data; a 7B-parameter decoder at sequence 512 takes about a second per fake
training step on a laptop CPU. An op without a fake (meta) kernel or with a data-dependent output
(``nonzero``, ``.item()``) stops the run with :class:`FakeTensorError`, which names the op and the
alternative: the measured :func:`torchmem.estimate` on a device.
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem._format import fmt_bytes
from torchmem.analysis.estimate import FitArgumentError, build_estimate
from torchmem.analysis.targets import (
    Target,
    attention_backend,
    reserved_for,
    resolve_target,
    round_block,
    shard,
)
from torchmem.results.fit import Change, EstimateRow, MemoryEstimate, StepMeasurement, TargetEstimate

OptimizerSpec = str | type | torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None
Inputs = Any  # a tensor, a tuple/list, a dict, or a callable batch_size -> one of those


class FakeTensorError(TorchmemError):
    """The model cannot run under fake tensors: an op without a fake kernel or with a data-dependent output.

    Attributes:
        op: The op that failed (``"aten.nonzero.default"``), or ``""`` if unknown.
    """

    def __init__(self, message: str, hint: str = "", op: str = "") -> None:
        super().__init__(message, hint)
        self.op = op


# -- what the measured and the fake estimate share ------------------------------------------------------
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


def _call(model: Callable[..., Any], inputs: Any, **extra: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs, **extra)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs, **extra)
    return model(inputs, **extra)


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


def _make_optimizer(spec: OptimizerSpec, user: torch.nn.Module | None, model: torch.nn.Module) -> Any:
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
        pos = {id(p): i for i, p in enumerate(user.parameters())} if user is not None else {}
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


# -- the byte ledger of fake storages -------------------------------------------------------------------
def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2's parameters, gradients and optimizer state); other tensors as they
    are."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


class _Entry(weakref.ref):  # type: ignore[type-arg]
    __slots__ = ("grad", "key", "nbytes")
    key: int
    nbytes: int
    grad: bool


class _Ledger:
    """Live bytes of the storages born while it counts (each once, at the allocator's block size), the
    peak, and the gradients live at the peak."""

    def __init__(self, rounding: bool) -> None:
        self.rounding = rounding
        self.live: dict[int, _Entry] = {}
        self.current = 0
        self.peak = 0
        self.grads = 0
        self.grads_at_peak = 0

    def size(self, nbytes: int) -> int:
        return round_block(nbytes) if self.rounding else nbytes

    def count(self, t: torch.Tensor) -> None:
        try:
            st = _local(t).untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return
        key = int(st._cdata)
        n = self.size(int(st.nbytes()))
        e = self.live.get(key)
        if e is not None:
            if e.nbytes != n:  # resize_, set_
                self.current += n - e.nbytes
                if e.grad:
                    self.grads += n - e.nbytes
                e.nbytes = n
            else:
                return
        else:
            e = _Entry(st, self._dead)
            e.key, e.nbytes, e.grad = key, n, False
            self.live[key] = e
            self.current += n
        if self.current > self.peak:
            self.peak = self.current
            self.grads_at_peak = self.grads

    def _dead(self, e: _Entry) -> None:  # type: ignore[override]
        if self.live.get(e.key) is e:
            del self.live[e.key]
            self.current -= e.nbytes
            if e.grad:
                self.grads -= e.nbytes

    def recount(self, st: Any) -> None:
        """A storage counted before was resized in place (``UntypedStorage.resize_``, not an aten op:
        FSDP2 frees and refills its unsharded parameters so)."""
        e = self.live.get(int(st._cdata))
        if e is None:
            return
        n = self.size(int(st.nbytes()))
        if n != e.nbytes:
            self.current += n - e.nbytes
            if e.grad:
                self.grads += n - e.nbytes
            e.nbytes = n
            if self.current > self.peak:
                self.peak = self.current
                self.grads_at_peak = self.grads

    def mark_grad(self, t: torch.Tensor) -> None:
        try:
            e = self.live.get(int(_local(t).untyped_storage()._cdata))
        except (RuntimeError, NotImplementedError, TypeError):
            return
        if e is not None and not e.grad:
            e.grad = True
            self.grads += e.nbytes

    def key_of(self, t: torch.Tensor) -> int | None:
        try:
            return int(_local(t).untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError, TypeError):
            return None

    def reset_peak(self) -> None:
        self.peak = self.current
        self.grads_at_peak = self.grads


def _dispatch_mode_base() -> Any:
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:  # pragma: no cover - torch >= 2.4 has it
        return None
    return TorchDispatchMode


_COMPOSITE: dict[Any, bool] = {}


def _composite(func: Any) -> bool:
    """Whether ``func`` is a CompositeImplicitAutograd op (made of other aten ops). Cached per op."""
    hit = _COMPOSITE.get(func)
    if hit is None:
        try:
            hit = bool(
                torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
            ) and hasattr(func, "decompose")
        except Exception:  # private API moved, or not an OpOverload
            hit = False
        _COMPOSITE[func] = hit
    return hit


def _ledger_mode(led: _Ledger, decompose: bool = False) -> Any:
    """The counting mode. With ``decompose``, a composite op that reaches it whole (under
    ``inference_mode`` or ``no_grad`` autograd does not split it: ``cross_entropy_loss``,
    ``scaled_dot_product_attention``, ``linear``) runs as its parts under the mode, so the temporaries a
    device allocates inside it (``log_softmax``'s output, the attention scores) are counted too; the fake
    mode below would otherwise build them unseen."""
    base = _dispatch_mode_base()
    if base is None:  # pragma: no cover
        raise FakeTensorError("This torch has no dispatch modes: no device-free estimate.", _ALTERNATIVE)

    class _CountingMode(base):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            if decompose and _composite(func):
                with self:
                    out = func.decompose(*args, **(kwargs or {}))
                if out is not NotImplemented:
                    return out
            out = func(*args, **(kwargs or {}))
            try:
                if isinstance(out, torch.Tensor):
                    led.count(out)
                elif isinstance(out, (tuple, list)):
                    for t in out:
                        if isinstance(t, torch.Tensor):
                            led.count(t)
            except Exception:  # a tensor without a storage: not counted
                pass
            return out

    return _CountingMode()


_ALTERNATIVE = (
    "Measure on a device instead: torchmem.estimate(model, batch, device='cuda') runs two small real steps."
)


def _fake_mode() -> tuple[Any, str]:
    """``(mode, device)``: a FakeTensorMode and ``"cpu"``, or (where it cannot be imported) ``None`` and
    ``"meta"``."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:  # pragma: no cover - private API moved
        return None, "meta"
    try:
        return FakeTensorMode(allow_non_fake_inputs=False), "cpu"
    except TypeError:  # pragma: no cover - an older signature
        return FakeTensorMode(), "cpu"


def _translate(exc: BaseException) -> FakeTensorError | None:
    """A :class:`FakeTensorError` for an exception the fake run raised because of fake tensors."""
    name = type(exc).__name__
    op = getattr(exc, "func", None)
    op_text = str(op) if op is not None else ""
    text = str(exc)
    if name in ("DynamicOutputShapeException", "DataDependentOutputException") or (
        "GuardOnDataDependent" in name
    ):
        why = "its output depends on tensor values (data-dependent shape or a Python scalar read)"
    elif name in ("UnsupportedOperatorException", "UnsupportedFakeTensorException"):
        why = "it has no fake (meta) kernel"
    elif isinstance(exc, NotImplementedError) and ("'Meta' backend" in text or "meta" in text.lower()):
        why = "it has no meta kernel"
        if not op_text:
            import re

            m = re.search(r"run '([^']+)'", text)
            op_text = m.group(1) if m else ""
    else:
        return None
    where = f"The op {op_text}" if op_text else "An op of the model"
    return FakeTensorError(
        f"{where} cannot run under fake tensors: {why}. No device-free estimate for this model.",
        _ALTERNATIVE,
        op=op_text,
    )


# -- the model under fake tensors ------------------------------------------------------------------------
@dataclass
class _Plan:
    """One fake run's settings."""

    model: Any  # nn.Module (real or meta) or a factory
    inputs: Inputs
    b0: int
    optimizer: OptimizerSpec
    training: bool
    dtype: torch.dtype | None
    amp: torch.dtype | None
    loss_fn: Callable[[Any], torch.Tensor]
    checkpoint: tuple[str, ...]
    grad_accum: int
    generate_tokens: int
    rounding: bool
    workspace: int  # cuBLAS workspace bytes in an inference row
    workspace_training: int = 0  # in a training row (the forward and the backward thread's)
    sm: tuple[int, int] | None = None  # the target GPU's compute capability: reproduce its kernel choices
    fsdp_world: int = 0  # > 1: the twin is sharded by FSDP2 on a fake process group of this many ranks


@dataclass
class _Run:
    """What one fake run measured, for one batch size."""

    batch_size: int
    m: StepMeasurement
    parameters: int
    gradients: int
    optimizer_state: int
    weights_only: int
    forward_grads: int = 0  # gradients live at the forward peak (gradient accumulation)
    backward_grads: int = 0  # gradients live at the backward peak
    kv_cache: int = 0
    generate_peak: int | None = None
    block_saved: dict[str, int] = field(default_factory=dict)  # saved-for-backward bytes per block
    block_input: dict[str, int] = field(default_factory=dict)
    block_params: dict[str, int] = field(default_factory=dict)
    sharded: bool = False  # measured under FSDP2 on a fake process group: the figures are per rank
    largest_parameter: int = 0  # the largest unsharded parameter, bytes (a full state dict gathers it)
    full_parameters: int = 0  # every parameter unsharded, bytes
    step_temporaries: int = 0  # the optimizer step's own (foreach) temporaries: they scale with the state


def _blocks(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The repeated blocks (children of a ModuleList, or of a Sequential of two or more of one class, that
    hold parameters), by qualified name: the units FSDP wraps and checkpointing targets."""
    found: dict[str, torch.nn.Module] = {}
    for name, mod in model.named_modules():
        kids = list(mod.named_children())
        if len(kids) < 2:
            continue
        same = len({type(k) for _, k in kids}) == 1
        if isinstance(mod, torch.nn.ModuleList) or (isinstance(mod, torch.nn.Sequential) and same):
            for kn, k in kids:
                if any(True for _ in k.parameters()):
                    q = f"{name}.{kn}" if name else kn
                    if not any(q.startswith(f + ".") for f in found):
                        found[q] = k
    # drop blocks nested inside another block
    names = sorted(found, key=len)
    keep: dict[str, torch.nn.Module] = {}
    for n in names:
        if not any(n.startswith(k + ".") for k in keep):
            keep[n] = found[n]
    return keep


def _select(names: Sequence[str], model: torch.nn.Module, blocks: dict[str, torch.nn.Module]) -> list[str]:
    """Qualified module names for ``checkpoint=``: names, glob patterns (``layers.*``), class names, or
    ``"blocks"`` (every repeated block)."""
    mods = dict(model.named_modules())
    out: list[str] = []
    for spec in names:
        if spec in ("blocks", "*"):
            out.extend(blocks)
        elif spec in mods:
            out.append(spec)
        else:
            hit = [
                n for n, m in mods.items() if n and (fnmatch.fnmatchcase(n, spec) or type(m).__name__ == spec)
            ]
            if not hit:
                err = FitArgumentError(
                    f"checkpoint={spec!r} names no module of {type(model).__name__}.",
                    "Use qualified names (model.named_modules()), a pattern such as 'layers.*', a class "
                    "name, or 'blocks'.",
                )
                err.param = "checkpoint"  # type: ignore[attr-defined]  # the CLI names its option
                raise err
            out.extend(hit)
    return list(dict.fromkeys(n for n in out if not any(n.startswith(o + ".") for o in out if o != n)))


def _checkpointed(module: torch.nn.Module) -> None:
    """Run ``module``'s forward under non-reentrant activation checkpointing (on the fake copy only)."""
    from torch.utils.checkpoint import checkpoint

    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def _fake_twin(plan: _Plan, dev: str, led: _Ledger) -> torch.nn.Module:
    """The model under the fake mode: a factory called, or a real/meta model mirrored with fake parameters
    and buffers (nothing copied). Called inside the fake and counting modes."""
    src = plan.model
    if isinstance(src, torch.nn.Module):
        memo: dict[int, Any] = {}
        for t in [*src.parameters(), *src.buffers()]:
            fake = torch.empty(t.shape, dtype=t.dtype, device=dev)
            if isinstance(t, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
            memo[id(t)] = fake
            if t.grad is not None:
                memo[id(t.grad)] = None
        twin = copy.deepcopy(src, memo)
        for p in twin.parameters():
            p.grad = None
    else:  # pragma: no cover - _run_plan builds factories on the meta device first
        raise FitArgumentError("internal: the factory was not built", "")
    if plan.dtype is not None:
        _cast(twin, plan.dtype)
    for t in [*twin.parameters(), *twin.buffers()]:
        led.count(t)
    return twin


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers to ``dtype``, in place by re-registering (``Module.to`` swaps
    tensors, which fake tensors with weak references refuse)."""
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                mod._parameters[name] = torch.nn.Parameter(
                    p.detach().to(dtype), requires_grad=p.requires_grad
                )
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                mod._buffers[name] = b.to(dtype)


def _fake_inputs(plan: _Plan, bs: int, dev: str) -> Any:
    if callable(plan.inputs) and not isinstance(plan.inputs, torch.Tensor):
        with torch.device(dev):
            return plan.inputs(bs)

    def conv(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            shape = list(x.shape)
            if shape and shape[0] == plan.b0:
                shape[0] = bs
            if x.is_floating_point():
                return torch.empty(shape, dtype=x.dtype, device=dev)
            return torch.zeros(shape, dtype=x.dtype, device=dev)
        if isinstance(x, Mapping):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(conv(v) for v in x)
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x

    return conv(plan.inputs)


def _bytes_of(tensors: Iterator[torch.Tensor], led: _Ledger) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        k = led.key_of(t)
        if k is not None:
            seen[k] = led.size(int(_local(t).untyped_storage().nbytes()))
    return sum(seen.values())


class _Saved:
    """Bytes saved for backward, each storage once, parameters excluded; per block while a block runs."""

    def __init__(self, led: _Ledger, exclude: set[int]) -> None:
        self.led = led
        self.exclude = exclude
        self.saved: dict[int, tuple[int, list[weakref.ref[torch.Tensor]]]] = {}
        self.block: list[str] = []
        self.per_block: dict[str, int] = {}
        self.block_input: dict[str, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        packed = t.detach()
        try:
            key = self.led.key_of(t)
            if key is not None and key not in self.exclude:
                entry = self.saved.get(key)
                if entry is None or not any(r() is not None for r in entry[1]):
                    n = self.led.size(int(t.untyped_storage().nbytes()))
                    entry = (n, [])
                    self.saved[key] = entry
                    if self.block:
                        self.per_block[self.block[-1]] = self.per_block.get(self.block[-1], 0) + n
                entry[1].append(weakref.ref(packed))
        except Exception:
            pass
        return packed

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def held(self) -> int:
        return sum(nb for nb, refs in self.saved.values() if any(r() is not None for r in refs))

    def hooks(self, blocks: dict[str, torch.nn.Module]) -> list[Any]:
        handles = []
        for name, mod in blocks.items():

            def pre(_m: Any, args: Any, kwargs: Any = None, name: str = name) -> None:
                self.block.append(name)
                if name not in self.block_input:
                    first = next(_tensors(args), None) if args else None
                    self.block_input[name] = (
                        0 if first is None else self.led.size(first.untyped_storage().nbytes())
                    )

            def post(_m: Any, _a: Any, _o: Any, name: str = name) -> None:
                if self.block and self.block[-1] == name:
                    self.block.pop()

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
        return handles


def _autocast(amp: torch.dtype | None, dev: str) -> Any:
    if amp is None or dev == "meta":
        return nullcontext()
    return torch.autocast(dev, dtype=amp)


# -- the target GPU's kernel choices ----------------------------------------------------------------------
# The fake run is a CPU run: torch picks CPU kernels. Where the GPU's pick holds different tensors, the fake
# run is steered to the GPU's (only while a GPU target's fake run is on, on its thread):
# - scaled_dot_product_attention: the CUDA kernel the target would take (analysis.targets.attention_backend)
#   is called through its aten op, whose fake (meta) kernel gives the outputs and autograd the saved tensors
#   of the real one: flash/efficient keep the output and a logsumexp where the CPU's math path (its choice
#   with dropout) materialises the scores; the math path where the GPU takes it (grouped-query heads in
#   fp32) and the CPU does not.
# - dropout: the fused native_dropout (a boolean mask saved) where the CPU's composite saves a float mask.
# - nn.MultiheadAttention / TransformerEncoderLayer inference fast paths: one fused op whose temporaries
#   the fake mode builds unseen; rebuilt from the ops its CUDA kernel runs (each counted).
# - optimizers: foreach on CUDA parameters (torch's default there), per-parameter loops on the CPU.
# - composite ops reaching the fake mode whole (inference): decomposed under the counting mode.
_GPU = threading.local()
_GPU_LOCK = threading.Lock()
_GPU_USERS = [0]
_STAND_IN_ERRORS: set[str] = set()  # what a stand-in could not run (the CPU's kernel ran instead)


def _gpu_sdpa(
    sm: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``scaled_dot_product_attention`` as the CUDA kernel of a GPU of compute capability ``sm`` runs it,
    on fake tensors; ``NotImplemented`` where it does not apply (the CPU's own choice runs)."""
    q, k, v = query, key, value
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_nested for t in (q, k, v)):
        return NotImplemented
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        return NotImplemented
    b, hq, lq, d = (int(x) for x in q.shape)
    hk, lk, dv = int(k.shape[1]), int(k.shape[2]), int(v.shape[3])
    if hq != hk and not enable_gqa:
        return NotImplemented
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    strides = [int(t.stride(-1)) for t in (q, k, v)] + (
        [int(attn_mask.stride(-1))] if attn_mask is not None else []
    )
    backend = attention_backend(
        sm,
        dtype=str(q.dtype).removeprefix("torch."),
        q_heads=hq,
        kv_heads=hk,
        head_dim=d,
        v_head_dim=dv,
        q_len=lq,
        kv_len=lk,
        mask=attn_mask is not None,
        causal=bool(is_causal),
        grad=grad,
        last_dim_contiguous=all(st == 1 for st in strides),
    )
    aten = torch.ops.aten
    if backend == "flash":
        pad = (-d) % 8  # the CUDA wrapper pads the head dim to a multiple of 8 (copies)
        sc = scale if scale is not None else d**-0.5
        if pad:
            q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
        flash = aten._scaled_dot_product_flash_attention
        out = flash(q, k, v, dropout_p, bool(is_causal), False, scale=sc)[0]
        return out[..., :dv] if pad else out
    if backend == "efficient":
        bias = attn_mask
        if bias is not None:
            if bias.dtype == torch.bool:  # the CUDA wrapper turns a boolean mask into an additive one
                bias = torch.zeros(bias.shape, dtype=q.dtype, device=bias.device).masked_fill(
                    bias.logical_not(), float("-inf")
                )
            elif bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            tail = (-int(bias.shape[-1])) % 16  # and pads its last dim to 16 elements (a copy)
            if tail:
                bias = torch.nn.functional.pad(bias, (0, tail))[..., : int(bias.shape[-1])]
            bias = bias.expand(b, hq, lq, lk)
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, grad, dropout_p, bool(is_causal), scale=scale
        )[0]
    return _math_sdpa(q, k, v, attn_mask, dropout_p, bool(is_causal), scale, hq // hk if hq != hk else 1)


def _math_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    groups: int,
) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` as CUDA runs it (torch 2.4-2.11, ``attention.cpp``): q and k
    scaled by the square root of the scale, the scores, the mask added in place, ``_safe_softmax``, and the
    dropout through CUDA's fused ``native_dropout`` (a boolean mask; the composite on the fake run's CPU
    tensors saves a float one). Its saved tensors are the real path's: the scaled q, the copied k and v of
    the batched matmuls, the probabilities, the mask and the dropped probabilities."""
    d = int(q.shape[-1])
    sc = scale if scale is not None else d**-0.5
    f = abs(sc) ** 0.5
    query = q * (-f if sc < 0 else f)
    mask = attn_mask
    if is_causal:
        lq, lk = int(q.shape[-2]), int(k.shape[-2])
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask.dtype == torch.bool:  # convert_boolean_attn_mask
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            mask.logical_not(), float("-inf")
        )
    if groups > 1:  # pre_process_group_query_attention_input
        k, v = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
    attn = torch.matmul(query, k.transpose(-2, -1) * f)
    if mask is not None:
        attn.add_(mask)
    safe = getattr(torch.ops.aten, "_safe_softmax", None)
    attn = safe(attn, -1) if safe is not None else torch.softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.ops.aten.native_dropout(attn, float(dropout_p), True)[0]
    return torch.matmul(attn, v)


def _gpu_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """``dropout`` as CUDA runs it: the fused ``native_dropout``, which saves a boolean mask (1 byte per
    element); the CPU's composite saves a mask of the input's dtype (4 bytes in fp32)."""
    if (
        not training
        or inplace
        or not isinstance(input, torch.Tensor)
        or not 0.0 < float(p) < 1.0
        or input.numel() == 0
        or not input.is_floating_point()
    ):
        return NotImplemented
    return torch.ops.aten.native_dropout(input, float(p), True)[0]


def _gpu_mha(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> Any:
    """``nn.MultiheadAttention``'s inference fast path (``_native_multi_head_attention``) as its CUDA
    kernel runs self-attention without a mask: one QKV GEMM, fused attention on views of it, the output
    projection. The fused op's temporaries are then tensors the ledger sees."""
    F = torch.nn.functional
    if need_weights or mask is not None or query is not key or key is not value:
        return NotImplemented
    if not isinstance(query, torch.Tensor) or query.dim() != 3 or query.is_nested:
        return NotImplemented
    b, n = int(query.shape[0]), int(query.shape[1])
    qkv = F.linear(query, qkv_weight, qkv_bias)
    q, k, v = (c.view(b, n, num_head, embed_dim // num_head).transpose(1, 2) for c in qkv.chunk(3, -1))
    y = F.scaled_dot_product_attention(q, k, v)  # the stand-in: the GPU's kernel
    del q, k, v, qkv
    return F.linear(y.transpose(1, 2).reshape(b, n, embed_dim), proj_weight, proj_bias), None


def _gpu_encoder_layer(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> Any:
    """``nn.TransformerEncoderLayer``'s inference fast path (``_transformer_encoder_layer_fwd``) as its
    CUDA kernel runs it: the attention above, residual adds and ReLU in place, GELU not."""
    F = torch.nn.functional
    if mask is not None or not isinstance(src, torch.Tensor) or src.dim() != 3 or src.is_nested:
        return NotImplemented
    shape = (int(embed_dim),)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    att = _gpu_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, None, False)
    if att is NotImplemented:
        return NotImplemented
    x = att[0]
    del att
    x.add_(src)
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    pre = x
    if norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else h.relu_()
    x = F.linear(h, ffn_weight_2, ffn_bias_2)
    del h
    x.add_(pre)
    del pre
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    return x


# cuDNN's recurrent layers (nn.LSTM, nn.GRU, nn.RNN on CUDA in fp32/fp16): one kernel per call that keeps, for
# backward, a reserve space the CPU's kernels do not have (they save each layer's input and output, or every
# gate of every step for the GRU). Its size (cudnnGetRNNTempSpaceSizes), per layer and direction, in elements
# of time steps x batch x hidden: the LSTM's four gates and its cell state (5), the GRU's six terms (6), the
# plain RNN's activation (1); plus each layer's output but the last's (the last is the returned output), and
# with dropout between layers, one bit per element of those outputs. Measured on the H100 (cuDNN 9.19, torch
# 2.11: the uint8 tensor _cudnn_rnn saves, over cells, 1-3 layers, both directions, inputs of 128-1024,
# hidden 256-1024, benchmarks/estimate_accuracy.py), exact to 256 bytes (its alignment); it is also cuDNN
# 7's reported reserve for a 4-layer LSTM and GRU (23 and 27 units, pytorch/pytorch#2895) and a 1-layer
# bidirectional GRU (12 units, SeanNaren/deepspeech.pytorch#172). Training with dropout also makes cuDNN's
# dropout state, one buffer per GPU that stays for the process (and is saved with each call): 6,488,064
# bytes on the H100.
_RNN_MODES = {"lstm": (4, 5), "gru": (3, 6), "rnn_tanh": (1, 1), "rnn_relu": (1, 1)}  # gates, reserve units
_CUDNN_DROPOUT_STATE = 6_488_064


def _cudnn_reserve_units(mode: str, layers: int, directions: int) -> int:
    """cuDNN's training reserve space in units of ``steps x batch x hidden`` elements (see above), without
    the dropout bits."""
    per_layer = _RNN_MODES[mode][1]
    return directions * (per_layer * layers + (layers - 1))


def _cudnn_reserve_bytes(
    mode: str, layers: int, directions: int, steps: int, batch: int, hidden: int, element: int, dropout: bool
) -> int:
    """cuDNN's training reserve space in bytes: :func:`_cudnn_reserve_units` elements, and with dropout a
    bit per element of the layer outputs it drops."""
    elements = steps * batch * hidden
    bits = directions * (layers - 1) * elements if dropout else 0
    return _cudnn_reserve_units(mode, layers, directions) * elements * element + -(-bits // 8)


def _cudnn_dropout_state(like: torch.Tensor) -> torch.Tensor:
    """cuDNN's dropout state of this fake run, made on first use and kept until the run ends (as the real
    one stays for the process)."""
    held = getattr(_GPU, "held", None)
    if held is None:
        held = _GPU.held = {}
    state = held.get("cudnn_dropout_state")
    if state is None:
        state = held["cudnn_dropout_state"] = like.new_empty((_CUDNN_DROPOUT_STATE,), dtype=torch.uint8)
    return state  # type: ignore[no-any-return]


class _CudnnRNN(torch.autograd.Function):
    """``_cudnn_rnn`` and its backward as they hold memory, on fake tensors: what cuDNN allocates (the
    seq-first copies of a batch-first input and output gradient, the output, the final states, the reserve
    space kept for backward, the input, state and flat weight gradients), none of its arithmetic."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        spec: tuple[Any, ...],
        input: torch.Tensor,
        hx: torch.Tensor,
        cx: Any,
        *weights: torch.Tensor,
    ) -> Any:
        mode, hidden, layers, directions, batch_first, train, dropout = spec
        steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        x = input.transpose(0, 1).contiguous() if batch_first else input.contiguous()  # seq-first
        y = input.new_empty((steps, batch, directions * hidden))
        hy = hx.new_empty(hx.shape)
        cy = cx.new_empty(cx.shape) if isinstance(cx, torch.Tensor) else None
        del x
        size = (
            _cudnn_reserve_bytes(
                mode, layers, directions, steps, batch, hidden, input.element_size(), dropout and layers > 1
            )
            if train
            else 0
        )
        reserve = input.new_empty((size,), dtype=torch.uint8)
        state = _cudnn_dropout_state(input) if train and dropout else None
        ctx.spec = spec
        ctx.weights_like = [(w.numel(), w.shape) for w in weights]
        ctx.save_for_backward(input, hx, cx if isinstance(cx, torch.Tensor) else None, y, reserve, state)
        out = y.transpose(0, 1) if batch_first else y
        return out, hy, cy

    @staticmethod
    def backward(ctx: Any, dout: Any, dhy: Any, dcy: Any) -> Any:
        input, hx, cx, _y, _reserve, _state = ctx.saved_tensors
        weights_like = ctx.weights_like
        batch_first = ctx.spec[4]
        x = input.transpose(0, 1).contiguous() if batch_first else input.contiguous()
        dy = (dout.transpose(0, 1) if batch_first else dout).contiguous()
        dx = x.new_empty(x.shape)
        del x, dy
        dhx = hx.new_empty(hx.shape)
        dcx = cx.new_empty(cx.shape) if cx is not None else None
        flat = input.new_zeros((sum(int(n) for n, _ in weights_like),))
        grads, at = [], 0
        for n, shape in weights_like:
            grads.append(flat[at : at + n].view(shape))
            at += n
        return (None, dx.transpose(0, 1) if batch_first else dx, dhx, dcx, *grads)


def _gpu_rnn(mode: str) -> Callable[..., Any]:
    """``torch._VF.<mode>`` (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``) as CUDA runs it through cuDNN
    for fp32/fp16 inputs (bf16 and packed sequences keep the CPU's kernels)."""
    gates = _RNN_MODES[mode][0]

    def run(
        input: Any,
        hx: Any,
        params: Any = None,
        has_biases: Any = True,
        num_layers: Any = 1,
        dropout: Any = 0.0,
        train: Any = False,
        bidirectional: Any = False,
        batch_first: Any = False,
    ) -> Any:
        if not isinstance(input, torch.Tensor) or (isinstance(hx, torch.Tensor) and mode == "lstm"):
            return NotImplemented
        if not isinstance(params, (list, tuple)) or input.dim() != 3:
            return NotImplemented  # a packed sequence (batch_sizes in second place) or another call
        if input.dtype not in (torch.float32, torch.float16):
            return NotImplemented
        h, c = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
        directions = 2 if bidirectional else 1
        per_layer = 4 if has_biases else 2
        if len(params) != per_layer * int(num_layers) * directions or not isinstance(h, torch.Tensor):
            return NotImplemented  # projections (proj_size) or an unexpected layout
        hidden = int(h.shape[-1])
        if int(params[0].shape[0]) != gates * hidden:
            return NotImplemented
        drop = bool(train) and float(dropout) > 0.0
        spec = (mode, hidden, int(num_layers), directions, bool(batch_first), bool(train), drop)
        out, hy, cy = _CudnnRNN.apply(spec, input, h, c, *params)
        return (out, hy, cy) if mode == "lstm" else (out, hy)

    return run


# Names replaced while a GPU target's fake run is on: (module, name) -> what the GPU runs (NotImplemented
# where that does not apply), for the original's arguments.
_GPU_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch.nn.functional", "scaled_dot_product_attention"): _gpu_sdpa,
    ("torch.nn.functional", "dropout"): _gpu_dropout,
    ("torch", "_native_multi_head_attention"): _gpu_mha,
    ("torch", "_transformer_encoder_layer_fwd"): _gpu_encoder_layer,
    **{("torch._VF", mode): _gpu_rnn(mode) for mode in _RNN_MODES},
}
_ORIGINALS: dict[tuple[str, str], Any] = {}
_OWN: dict[tuple[str, str], bool] = {}  # whether the name was the module's own attribute


def _module(name: str) -> Any:
    return {"torch.nn.functional": torch.nn.functional, "torch._VF": torch._VF}.get(name, torch)


_CANNOT_RUN = (AttributeError, TypeError, NotImplementedError, RuntimeError)


def _cannot_run(exc: BaseException) -> bool:
    """Whether ``exc`` says the GPU's kernel cannot run here (an op, a signature or a fake kernel this torch
    lacks), so that torch's own may run instead.

    Not what code the stand-in calls back raises through it: autograd's saved-tensor hooks run inside
    its ops, and activation checkpointing's recompute raises from them on purpose (a plain ``Exception``,
    ``_StopRecomputationError``, once every tensor the forward saved is recomputed; a ``CheckpointError``
    on a mismatch). Running torch's own kernel after that saves its tensors a second time: checkpoint's
    ``AssertionError: Unexpected state: target_frame.early_stop is set`` (GPT-2, whose blocks end in a
    dropout, with ``checkpoint=``)."""
    if not isinstance(exc, _CANNOT_RUN) or type(exc).__module__.startswith("torch.utils.checkpoint"):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            return False
        tb = tb.tb_next
    return True


def _stand_in(where: tuple[str, str]) -> Callable[..., Any]:
    gpu = _GPU_FUNCTIONS[where]
    needs_sm = gpu is _gpu_sdpa

    def hook(*args: Any, **kwargs: Any) -> Any:
        """Stands in for a torch function while a GPU target's fake run is on: on that run's thread,
        what the GPU runs; anywhere else (and on any failure), torch's own."""
        original = _ORIGINALS[where]
        sm = getattr(_GPU, "sm", None)
        if sm is not None:
            try:
                out = gpu(sm, *args, **kwargs) if needs_sm else gpu(*args, **kwargs)
            except Exception as exc:
                if not _cannot_run(exc):  # raised through the stand-in (a saved-tensor hook): not ours
                    raise
                # an op or a signature this torch lacks: the CPU's choice, said once
                _STAND_IN_ERRORS.add(f"{where[1]}: {type(exc).__name__}: {str(exc)[:200]}")
                out = NotImplemented
            if out is not NotImplemented:
                return out
        return original(*args, **kwargs)

    hook.__name__ = where[1]
    hook.__torchmem_stand_in__ = True  # type: ignore[attr-defined]
    return hook


@contextmanager
def _gpu_kernels(sm: tuple[int, int] | None) -> Iterator[None]:
    """While on (this thread): the fake run takes the target GPU's kernels (see above). No-op for
    ``sm=None`` (a CPU-ledger comparison)."""
    if sm is None:
        yield
        return
    with _GPU_LOCK:
        if _GPU_USERS[0] == 0:
            for where in _GPU_FUNCTIONS:
                current = getattr(_module(where[0]), where[1], None)
                if current is None or getattr(current, "__torchmem_stand_in__", False):
                    continue
                _ORIGINALS[where] = current
                _OWN[where] = where[1] in vars(_module(where[0]))
                setattr(_module(where[0]), where[1], _stand_in(where))
        _GPU_USERS[0] += 1
    prev = getattr(_GPU, "sm", None)
    _GPU.sm = sm
    held = getattr(_GPU, "held", None)
    _GPU.held = {}  # buffers a GPU library keeps for the process (cuDNN's dropout state): this run's
    try:
        yield
    finally:
        _GPU.sm = prev
        _GPU.held = held
        with _GPU_LOCK:
            _GPU_USERS[0] -= 1
            if _GPU_USERS[0] == 0:
                for where, original in list(_ORIGINALS.items()):
                    if _OWN.get(where, True):
                        setattr(_module(where[0]), where[1], original)
                    else:  # torch._VF serves its functions through __getattr__: the stand-in goes
                        delattr(_module(where[0]), where[1])
                _ORIGINALS.clear()
                _OWN.clear()


def _foreach_like_cuda(opt: Any) -> None:
    """torch's optimizers default to their foreach (multi-tensor) implementation for CUDA parameters and
    to per-parameter loops on the CPU; the foreach one holds a temporary the size of the parameters (e.g.
    Adam's ``sqrt(exp_avg_sq)`` for all of them at once). Set it where the user left the default."""
    for group in getattr(opt, "param_groups", ()):
        default = "foreach" in group and group["foreach"] is None
        if default and not group.get("fused") and not group.get("differentiable"):
            group["foreach"] = True


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# -- FSDP2 on a fake process group ----------------------------------------------------------------------
class _NoFakeGroup(Exception):
    """FSDP2 cannot run on a fake process group here (the reason is the message): sharding arithmetic."""


def _fully_shard() -> Any:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import (  # type: ignore[attr-defined]  # torch 2.4, 2.5
                fully_shard,
            )
        except ImportError:
            return None
    return fully_shard


@contextmanager
def _fake_group(world: int) -> Iterator[Any]:
    """A device mesh of ``world`` ranks over a fake process group (torch's ``"fake"`` backend: collectives
    do nothing), this process being rank 0; destroyed on the way out. Raises :class:`_NoFakeGroup` where
    torch lacks the pieces or a process group already exists (the user's: never touched)."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            raise _NoFakeGroup("torch.distributed is not available")
        if _fully_shard() is None:
            raise _NoFakeGroup("this torch has no FSDP2 fully_shard")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
    except _NoFakeGroup:
        raise
    except Exception as exc:  # private module moved or missing
        raise _NoFakeGroup(f"no fake process group in this torch ({type(exc).__name__})") from exc
    with _FAKE_GROUP_LOCK:
        if dist.is_initialized():
            raise _NoFakeGroup("a process group is already initialised in this process (left untouched)")
        try:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        except Exception as exc:
            raise _NoFakeGroup(f"the fake process group did not start ({type(exc).__name__}: {exc})") from exc
        try:
            try:
                mesh = init_device_mesh("cpu", (world,))  # outside the fake mode: it reads tensor values
            except Exception as exc:
                raise _NoFakeGroup(f"no device mesh ({type(exc).__name__}: {exc})") from exc
            yield mesh
        finally:
            dist.destroy_process_group()


# On: ``sharding="fsdp"`` runs FSDP2 itself on a fake process group (the arithmetic of ``_per_rank`` is the
# fallback where that cannot run: no fake backend or FSDP2 in this torch, a process group already in this
# process, a model fully_shard refuses). Its per-rank peak equals the allocator's on real 2- and 4-rank
# gloo runs, less gloo's own buffers inside the collectives (tests/capture/test_fake_estimate.py). A
# DTensor (FSDP2's sharded parameters, gradients, optimizer state) is counted by its local shard: its
# wrapper's storage reports the global size but holds no memory.
_FSDP_ON_FAKE_GROUP = True
_FAKE_GROUP_LOCK = threading.Lock()
_RESIZE_LEDGERS: dict[int, _Ledger] = {}  # thread id -> the ledger that storage resizes on it update
_RESIZE_LOCK = threading.Lock()
_RESIZE_ORIGINAL: list[Any] = []


def _resize_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
    out = _RESIZE_ORIGINAL[0](self, *args, **kwargs)
    led = _RESIZE_LEDGERS.get(threading.get_ident())
    if led is not None:
        try:
            led.recount(self)
        except Exception:  # the count is best effort; the resize itself happened
            pass
    return out


@contextmanager
def _storage_resizes(led: _Ledger) -> Iterator[None]:
    """While on (this thread only): ``UntypedStorage.resize_`` updates ``led``. FSDP2 frees an unsharded
    parameter after forward and refills it before backward by resizing its storage, which is no aten op
    the counting mode would see."""
    me = threading.get_ident()
    with _RESIZE_LOCK:
        if not _RESIZE_LEDGERS:
            _RESIZE_ORIGINAL[:] = [torch.UntypedStorage.resize_]
            torch.UntypedStorage.resize_ = _resize_counted  # type: ignore[method-assign]
        _RESIZE_LEDGERS[me] = led
    try:
        yield
    finally:
        with _RESIZE_LOCK:
            _RESIZE_LEDGERS.pop(me, None)
            if not _RESIZE_LEDGERS and _RESIZE_ORIGINAL:
                torch.UntypedStorage.resize_ = _RESIZE_ORIGINAL[0]  # type: ignore[method-assign]
                _RESIZE_ORIGINAL.clear()


def _shard_twin(twin: torch.nn.Module, blocks: dict[str, torch.nn.Module], mesh: Any) -> None:
    """FSDP2 as ``sharding="fsdp"`` documents it: ``fully_shard`` per repeated block, then the root."""
    fully_shard = _fully_shard()
    for b in blocks.values():
        fully_shard(b, mesh=mesh)
    fully_shard(twin, mesh=mesh)


def _run_plan(plan: _Plan, sizes: Sequence[int]) -> list[_Run]:
    """Build the fake model once and measure every size (under FSDP2 on a fake process group when
    ``plan.fsdp_world > 1``)."""
    if plan.fsdp_world <= 1:
        return _run_plan_on(plan, sizes, None)
    with _fake_group(plan.fsdp_world) as mesh:
        return _run_plan_on(plan, sizes, mesh)


def _run_plan_on(plan: _Plan, sizes: Sequence[int], mesh: Any) -> list[_Run]:
    """Build the fake model once and measure every size: inference first (weights only), then a warm-up
    training step and one measured step per size."""
    mode, dev = _fake_mode()
    led = _Ledger(plan.rounding)
    runs: list[_Run] = []
    if not isinstance(plan.model, torch.nn.Module):
        # Built on the meta device (no initialisation runs: weight init may read values, which fake
        # tensors cannot), then mirrored with fake tensors like a real model.
        with torch.device("meta"):
            built = plan.model()
        if not isinstance(built, torch.nn.Module):
            raise FitArgumentError(
                f"The model factory returned {type(built).__name__}, not a torch.nn.Module.", ""
            )
        plan = replace(plan, model=built, optimizer=plan.optimizer)
    with ExitStack() as stack:
        if mode is not None:
            stack.enter_context(mode)
        stack.enter_context(_ledger_mode(led, decompose=plan.sm is not None))
        stack.enter_context(_gpu_kernels(plan.sm))
        stack.enter_context(torch.random.fork_rng(devices=[]))
        twin = _fake_twin(plan, dev, led)
        blocks = _blocks(twin)
        sizes_now = [p.numel() * p.element_size() for p in twin.parameters()]
        largest_parameter, full_parameters = max(sizes_now, default=0), sum(sizes_now)
        for name in _select(plan.checkpoint, twin, blocks) if plan.checkpoint else []:
            _checkpointed(twin.get_submodule(name))
        if mesh is not None:
            stack.enter_context(_storage_resizes(led))
            try:
                _shard_twin(twin, blocks, mesh)
            except Exception as exc:
                raise _NoFakeGroup(f"fully_shard failed ({type(exc).__name__}: {str(exc)[:200]})") from exc
        params = _bytes_of(twin.parameters(), led)
        weights = _bytes_of(iter([*twin.parameters(), *twin.buffers()]), led)
        block_params = {n: _bytes_of(b.parameters(), led) for n, b in blocks.items()}
        own = {k for k in (led.key_of(t) for t in [*twin.parameters(), *twin.buffers()]) if k is not None}
        ws = plan.workspace

        inference: dict[int, tuple[int, int, int, int | None]] = {}
        for bs in sizes:
            was = twin.training
            twin.eval()
            try:
                batch = _fake_inputs(plan, bs, dev)
                before = led.current
                led.reset_peak()
                kv, gen = 0, None
                # FSDP2 keeps its unsharded parameters between steps: made under inference_mode they
                # could not be used by the training step after, so a sharded run infers under no_grad.
                no_grad = torch.inference_mode() if mesh is None else torch.no_grad()
                with no_grad, _autocast(plan.amp, dev):
                    if plan.generate_tokens > 0 and _accepts(twin.forward, "use_cache"):
                        extra: dict[str, Any] = {"use_cache": True}
                        if _accepts(twin.forward, "logits_to_keep"):
                            extra["logits_to_keep"] = 1
                        pre_peak_base = led.current
                        out = _call(twin, batch, **extra)
                        prefill_peak = led.peak
                        outs = _bytes_of(_tensors(out), led)
                        cache_now = max(led.current - pre_peak_base - outs, 0)
                        seq = _seq_len(batch)
                        full = cache_now if not seq else int(cache_now * (seq + plan.generate_tokens) / seq)
                        kv = full
                        # The prefill's temporaries are gone before the cache grows: the call's peak is the
                        # prefill's or the last token's (all held now, the cache grown to its full length,
                        # and one decode step's temporaries, which grow with the cache they copy).
                        resident = led.current
                        step = _decode_step_bytes(twin, batch, out, led, extra)
                        grown = full / cache_now if cache_now else 1.0
                        gen = max(prefill_peak, resident + (full - cache_now) + int(step * grown)) + ws
                        led.reset_peak()
                        led.peak = max(led.peak, prefill_peak)
                        del out
                    else:
                        _call(twin, batch)
                inference[bs] = (led.peak + ws, before + ws, kv, gen)
                del batch
            finally:
                twin.train(was)
        if not plan.training:
            for bs in sizes:
                ip, ib, kv, gen = inference[bs]
                m = StepMeasurement(bs, None, None, None, None, None, ip, ib, None)
                runs.append(
                    _Run(
                        bs, m, params, 0, 0, weights, kv_cache=kv, generate_peak=gen, sharded=mesh is not None
                    )
                )
            return runs

        opt = _make_optimizer(
            plan.optimizer, plan.model if isinstance(plan.model, torch.nn.Module) else None, twin
        )
        no_cache = bool(plan.checkpoint) and _accepts(twin.forward, "use_cache")
        if plan.sm is not None:
            _foreach_like_cuda(opt)
        ws = plan.workspace_training
        hooks = []
        for p in twin.parameters():
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                hooks.append(p.register_post_accumulate_grad_hook(lambda q: led.mark_grad(q.grad)))
        try:
            twin.train()
            for i, bs in enumerate([sizes[0], *sizes]):
                measured = i > 0
                f: dict[str, int] = {}
                saved = _Saved(led, own)
                handles = saved.hooks(blocks) if measured else []
                batch = _fake_inputs(plan, bs, dev)
                try:
                    for micro in range(min(max(plan.grad_accum, 1), 2)):
                        last = micro == min(max(plan.grad_accum, 1), 2) - 1
                        f["before_forward"] = led.current
                        led.reset_peak()
                        with (
                            torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack),
                            _autocast(plan.amp, dev),
                        ):
                            out = _call(twin, batch, **_no_cache(batch) if no_cache else {})
                            loss = plan.loss_fn(out)
                        f["forward_peak"], f["forward_grads"] = led.peak, led.grads_at_peak
                        f["after_forward"] = led.current
                        f["saved"] = saved.held()
                        del out
                        led.reset_peak()
                        loss.backward()
                        f["backward_peak"], f["backward_grads"] = led.peak, led.grads_at_peak
                        del loss
                        if not last:
                            saved = _Saved(led, own)
                finally:
                    for h in handles:
                        h.remove()
                del batch
                f["grads"] = led.grads
                if mesh is not None:  # FSDP2 sets the sharded gradients itself (no accumulation hook)
                    f["grads"] = _bytes_of(
                        iter([p.grad for p in twin.parameters() if p.grad is not None]), led
                    )
                led.reset_peak()
                if opt is not None:
                    f["before_step"] = led.current
                    opt.step()
                    f["step_peak"] = led.peak
                state = 0
                if opt is not None:
                    state = _bytes_of(
                        iter(
                            [
                                v
                                for st in opt.state.values()
                                for v in st.values()
                                if isinstance(v, torch.Tensor)
                            ]
                        ),
                        led,
                    )
                grads = f["grads"]
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                else:
                    twin.zero_grad(set_to_none=True)
                if not measured:
                    continue
                ip, ib, kv, gen = inference[bs]
                m = StepMeasurement(
                    bs,
                    f["forward_peak"] + ws,
                    f["after_forward"] + ws,
                    f["before_forward"] + ws,
                    f["backward_peak"] + ws,
                    f["step_peak"] + ws if "step_peak" in f else None,
                    ip,
                    ib,
                    f["saved"],
                )
                runs.append(
                    _Run(
                        bs,
                        m,
                        params,
                        grads,
                        state,
                        weights,
                        forward_grads=f["forward_grads"],
                        backward_grads=f["backward_grads"],
                        kv_cache=kv,
                        generate_peak=gen,
                        block_saved=dict(saved.per_block),
                        block_input=dict(saved.block_input),
                        block_params=block_params,
                        sharded=mesh is not None,
                        largest_parameter=largest_parameter,
                        full_parameters=full_parameters,
                        step_temporaries=f["step_peak"] - f["before_step"] if "step_peak" in f else 0,
                    )
                )
        finally:
            for h in hooks:
                h.remove()
            del opt
    return runs


def _no_cache(batch: Any) -> dict[str, Any]:
    """``{"use_cache": False}`` for a checkpointed training step of a model whose forward takes
    ``use_cache`` (unless the batch sets it), as Hugging Face's gradient checkpointing does: a KV cache that
    grows in forward makes the recompute run other ops, and checkpoint raises (T5's decoder)."""
    return {} if isinstance(batch, Mapping) and "use_cache" in batch else {"use_cache": False}


def _decode_step_bytes(
    twin: torch.nn.Module, batch: Any, out: Any, led: Any, extra: Mapping[str, Any]
) -> int:
    """The bytes one decode step of a generate call holds above what it starts with (its temporaries, the
    next token's logits, the cache's copies): the prompt's last token fed again with the prefill's cache.
    0 where the model's output has no cache or the step cannot run (the prefill's figures stand)."""
    past = out.get("cache") if isinstance(out, Mapping) else None  # transformers >= 5.x names it so
    if past is None:
        past = getattr(out, "past_key_values", None)
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if past is None or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return 0
    step: dict[str, Any] = {"input_ids": ids[:, -1:]}
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        step["attention_mask"] = torch.cat([mask, mask[:, -1:]], dim=1)
    before = led.current
    led.reset_peak()
    try:
        named = inspect.signature(twin.forward).parameters
    except (TypeError, ValueError):
        named = {}  # type: ignore[assignment]
    name = "cache" if "cache" in named else "past_key_values"
    try:
        res = twin(**step, **{name: past}, **extra)
    except Exception:  # a model whose decode step needs more than ids and the cache
        return 0
    peak = led.peak
    del res
    return max(int(peak) - int(before), 0)


def _seq_len(batch: Any) -> int | None:
    for t in _tensors(batch):
        if t.dim() >= 2 and not t.is_floating_point():
            return int(t.shape[1])
    return None


def _run_guarded(plan: _Plan, sizes: Sequence[int]) -> list[_Run]:
    try:
        return _run_plan(plan, sizes)
    except TorchmemError:
        raise
    except Exception as exc:
        err = _translate(exc)
        if err is not None:
            raise err from exc
        if plan.checkpoint and type(exc).__module__ == "torch.utils.checkpoint":
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FitArgumentError(
                f"Activation checkpointing of {', '.join(plan.checkpoint)} cannot run on this model: {first}",
                "The checkpointed modules run other ops when recomputed (a cache, a Python-side state): "
                "checkpoint other modules, or none.",
            ) from exc
        raise


# -- per rank ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Sharding:
    strategy: str
    world_size: int


def _per_rank(run: _Run, sh: _Sharding) -> tuple[StepMeasurement, int, int, int, int]:
    """The run's figures for one rank: ``(measurement, parameters, gradients, optimizer_state, nccl)``."""
    if sh.strategy == "none" or (sh.world_size <= 1 and sh.strategy == "ddp"):
        return run.m, run.parameters, run.gradients, run.optimizer_state, 0
    if run.sharded:  # FSDP2 ran on a fake process group: the figures are the rank's; NCCL is outside
        nccl = shard(sh.strategy, sh.world_size, parameters=0, gradients=0, optimizer_state=0).nccl
        return run.m, run.parameters, run.gradients, run.optimizer_state, nccl
    blocks = run.block_params
    largest = max(blocks.values(), default=0)
    root = max(run.parameters - sum(blocks.values()), 0)
    s = shard(
        sh.strategy,
        sh.world_size,
        parameters=run.parameters,
        gradients=run.gradients,
        optimizer_state=run.optimizer_state,
        largest_unit=largest,
        root_unit=root,
    )
    m = run.m
    gshare = s.gradients / run.gradients if run.gradients else 1.0
    base = -run.parameters - run.optimizer_state + s.parameters + s.optimizer_state
    sharded_params = sh.strategy in ("zero3", "fsdp")
    gather = s.gather if sharded_params else 0
    ddp = s.reduce if sh.strategy == "ddp" else 0
    unit_reduce = s.reduce if sh.strategy != "ddp" else 0

    def at(v: int | None, grads_live: int, extra: int) -> int | None:
        if v is None:
            return None
        return int(v + base - grads_live + grads_live * gshare + extra)

    fwd = at(m.forward_peak, run.forward_grads, gather + ddp)
    bwd = at(m.backward_peak, run.backward_grads, gather + unit_reduce + ddp)
    # the step's foreach temporaries are as large as the state it updates: the rank's share of it
    step_share = s.optimizer_state / run.optimizer_state if run.optimizer_state else 1.0
    step = at(m.step_peak, run.gradients, ddp - int(run.step_temporaries * (1 - step_share)))
    after = at(m.after_forward, run.forward_grads, ddp)
    before = at(m.before_forward, run.forward_grads, ddp)
    inf = None if m.inference_peak is None else int(m.inference_peak - run.parameters + s.parameters + gather)
    binf = None if m.before_inference is None else int(m.before_inference - run.parameters + s.parameters)
    out = replace(
        m,
        forward_peak=fwd,
        backward_peak=bwd,
        step_peak=step,
        after_forward=after,
        before_forward=before,
        inference_peak=inf,
        before_inference=binf,
    )
    return out, s.parameters, s.gradients, s.optimizer_state, s.nccl


# -- the public entry ------------------------------------------------------------------------------------
def _estimate_of(
    runs: list[_Run], sh: _Sharding, training: bool, model_name: str, notes: tuple[str, ...]
) -> tuple[MemoryEstimate, int]:
    """Exact rows (one fake run per size): one ``build_estimate`` per size, merged."""
    rows: list[EstimateRow] = []
    ms: list[StepMeasurement] = []
    nccl = 0
    last: MemoryEstimate | None = None
    for r in runs:
        m, p, g, o, nccl = _per_rank(r, sh)
        ms.append(m)
        e = build_estimate(
            [m],
            batch_sizes=[r.batch_size],
            parameters=p,
            gradients=g if training else 0,
            optimizer_state=o,
            weights_only=r.weights_only,
            training=training,
            model=model_name,
            device="fake",
            measured_on="fake tensors (no device)",
            notes=notes,
        )
        rows.extend(e.rows)
        last = e
    assert last is not None
    rows.sort(key=lambda row: (row.mode != "training", row.batch_size))
    per_sample = 0.0
    if len(runs) >= 2 and runs[-1].batch_size != runs[0].batch_size and training:
        a, b = runs[0], runs[-1]
        sa, sb = a.m.saved_for_backward or 0, b.m.saved_for_backward or 0
        per_sample = max((sb - sa) / (b.batch_size - a.batch_size), 0.0)
    elif training and runs and runs[0].m.saved_for_backward:
        per_sample = (runs[0].m.saved_for_backward or 0) / runs[0].batch_size
    est = replace(
        last,
        measured_at=tuple(r.batch_size for r in runs),
        rows=tuple(rows),
        measurements=tuple(ms),
        activations_per_sample=per_sample,
    )
    return est, nccl


def _device_peak(allocated: int, target: Target, nccl: int, fragmentation: float) -> int:
    return reserved_for(allocated, fragmentation) + target.overhead + nccl


def _state_dict_note(full: int, largest: int) -> str:
    """What a full state dict of an FSDP2 model adds: measured on 2 H100s (docs/benchmarks.md), +the whole
    unsharded model on every rank on the GPU, +the largest parameter with ``cpu_offload=True``."""
    return (
        f"a full state dict (get_model_state_dict(full_state_dict=True)) adds {fmt_bytes(full)} on every "
        f"rank (every parameter unsharded on the GPU); with cpu_offload=True {fmt_bytes(largest)} (one "
        f"parameter at a time; rank 0 keeps {fmt_bytes(full)} in host memory)"
    )


def estimate_fake(
    model: torch.nn.Module | Callable[[], torch.nn.Module],
    example_inputs: Inputs,
    *,
    optimizer: OptimizerSpec = None,
    batch_sizes: Sequence[int] | None = None,
    training: bool = True,
    target: str | Target = "H100-80GB",
    dtype: torch.dtype | None = None,
    amp: torch.dtype | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    checkpoint: Sequence[str] | str | bool | None = None,
    grad_accum: int = 1,
    sharding: str | None = None,
    world_size: int = 1,
    generate_tokens: int = 0,
    fragmentation: float | None = None,
    suggest: bool = True,
) -> TargetEstimate:
    """Estimate a step's peak memory on ``target`` without any device: the model runs on fake tensors.

    ``torchmem.estimate(..., target=...)`` calls this. The answer is per rank, for the largest of
    ``batch_sizes`` (``.fits``, ``.device_peak`` against ``.target_total``, ``.largest_batch_size``), with
    one row per batch size and mode, and — when it does not fit — the changes that would make it fit,
    ranked by the bytes they save (``.changes``).

    Args:
        model: A model (real, or on the ``meta`` device: only shapes and dtypes are read; it is not
            changed), or a factory ``() -> model``, called under fake tensors (nothing allocated).
        example_inputs: One batch (tensors whose first dimension is the batch size are resized; values
            are not used), or a factory ``batch_size -> batch`` called under fake tensors.
        optimizer: ``None``, a ``torch.optim`` name, a class, a factory ``params -> optimizer``, or an
            instance (its kind and settings).
        batch_sizes: The per-rank batch sizes to estimate (default: the example's).
        training: A training step (else inference only).
        target: A GPU name from :data:`torchmem.analysis.targets.TARGETS` (``"H100-80GB"``, ``"A100-40GB"``,
            ``"L4"``, ``"T4"``, ``"RTX4090"``, ``"H200"``, ...), a size (``"24GiB"``) or a ``Target``.
        dtype: Cast the model to this dtype (``torch.bfloat16``: weights, gradients and Adam state too).
        amp: Run forward under autocast with this dtype.
        loss_fn: ``output -> scalar loss`` (default: the output's ``loss``, else the mean of its outputs).
        checkpoint: Activation checkpointing of these modules: qualified names, patterns (``"layers.*"``),
            class names, ``"blocks"`` or ``True`` (every repeated block).
        grad_accum: Micro-batches per optimizer step (from the second one on, gradients are live during
            forward); ``batch_sizes`` are micro-batch sizes.
        sharding: ``None``/``"none"``, ``"ddp"``, ``"fsdp"`` (FSDP2 ``fully_shard`` per repeated block and
            the root), ``"zero1"``, ``"zero2"``, ``"zero3"``.
        world_size: Ranks sharing the model.
        generate_tokens: With ``training=False``: a generate call of this many new tokens after the
            prompt (the example's sequence): its KV cache is estimated (models whose forward takes
            ``use_cache``).
        fragmentation: Reserved bytes above the allocated peak, as a fraction (default
            :data:`torchmem.analysis.targets.FRAGMENTATION`).
        suggest: When it does not fit, estimate the changes (a few more fake runs).

    Returns:
        A :class:`TargetEstimate` (a :class:`MemoryEstimate` with the verdict); ``str()`` prints it.

    Raises:
        FakeTensorError: an op of the model cannot run under fake tensors (named in the message).
        FitArgumentError: bad arguments (unknown target, optimizer, module names, sizes).

    Example:
        >>> import torch
        >>> from torchmem.capture.fake import estimate_fake
        >>> est = estimate_fake(lambda: torch.nn.Linear(1024, 1024), lambda bs: torch.randn(bs, 1024),
        ...                     optimizer="adamw", batch_sizes=[64], target="T4")
        >>> est.fits, est.parameters == 1024 * 1025 * 4
        (True, True)
    """
    tgt = resolve_target(target)
    if not isinstance(model, torch.nn.Module):
        try:
            inspect.signature(model).bind()
            ok = True
        except TypeError:  # not callable, or it needs arguments
            ok = False
        except ValueError:  # no signature (a builtin): try it
            ok = callable(model)
        if not ok:
            raise FitArgumentError(
                f"model must be a torch.nn.Module or a factory () -> module, got {type(model).__name__}.", ""
            )
    if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor):
        b0 = min(int(b) for b in batch_sizes) if batch_sizes else 1
    else:
        found = _batch_of(example_inputs)
        if found is None or found <= 0:
            raise FitArgumentError(
                "example_inputs has no tensor with a batch dimension.",
                "Pass one batch, e.g. torch.randn(4, 64), or a factory batch_size -> batch.",
            )
        b0 = found
    sizes = sorted({int(b) for b in (batch_sizes or (b0,))})
    if not sizes or any(isinstance(b, bool) or b <= 0 for b in sizes):
        raise FitArgumentError(f"batch_sizes must be positive ints, got {batch_sizes!r}.", "")
    if grad_accum < 1:
        raise FitArgumentError(f"grad_accum must be >= 1, got {grad_accum}.", "")
    if world_size < 1:
        raise FitArgumentError(f"world_size must be >= 1, got {world_size}.", "")
    strategy = (sharding or "none").lower()
    if strategy == "fsdp2":
        strategy = "fsdp"
    if strategy not in ("none", "ddp", "fsdp", "zero1", "zero2", "zero3"):
        raise FitArgumentError(f"Unknown sharding {sharding!r}.", "Use ddp, fsdp, zero1, zero2 or zero3.")
    if checkpoint is True:
        ckpt: tuple[str, ...] = ("blocks",)
    elif not checkpoint:
        ckpt = ()
    elif isinstance(checkpoint, str):
        ckpt = (checkpoint,)
    else:
        ckpt = tuple(str(c) for c in checkpoint)
    frag = fragmentation if fragmentation is not None else None
    from torchmem.analysis.targets import FRAGMENTATION

    frag_f = FRAGMENTATION if frag is None else float(frag)
    plan = _Plan(
        model=model,
        inputs=example_inputs,
        b0=b0,
        optimizer=optimizer,
        training=training,
        dtype=dtype,
        amp=amp,
        loss_fn=loss_fn or default_loss,
        checkpoint=ckpt,
        grad_accum=grad_accum,
        generate_tokens=int(generate_tokens) if not training else 0,
        rounding=True,
        workspace=tgt.workspaces(False),
        workspace_training=tgt.workspaces(True),
        sm=tgt.sm,
    )
    sh = _Sharding(strategy, int(world_size))
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "model")
    notes: list[str] = ["device-free: fake tensors, allocator block rounding, the target's cuBLAS workspace"]
    if tgt.sm is not None:
        notes.append(
            f"{tgt.name}'s kernels (sm {tgt.sm[0]}.{tgt.sm[1]}): fused attention as CUDA picks it, foreach "
            "optimizers, composite ops' temporaries"
        )
    if not tgt.measured:
        notes.append(f"{tgt.name}: context and library figures are typical, not measured by torchmem")
    if training and optimizer is None:
        notes.append("no optimizer: the training step is forward and backward only")
    errors_before = set(_STAND_IN_ERRORS)
    runs = _run_guarded(plan, sizes)
    per_rank = runs
    if strategy == "fsdp" and world_size > 1 and _FSDP_ON_FAKE_GROUP:
        fsdp_plan = replace(plan, fsdp_world=int(world_size))
        try:
            per_rank = _run_guarded(fsdp_plan, sizes)
            plan = fsdp_plan
            notes.append(
                f"FSDP2 ran: fully_shard per repeated block and the root on a fake process group of "
                f"{world_size} ranks (its all-gather buffers and resharding are in the figures)"
            )
        except Exception as exc:  # no fake process group here, or FSDP2 failed on this model
            reason = str(exc.__cause__ or exc) if isinstance(exc, FakeTensorError) else str(exc)
            notes.append(f"FSDP per rank by arithmetic on one unsharded run ({reason[:200]})")
    if strategy == "fsdp" and world_size > 1 and runs[-1].full_parameters:
        notes.append(_state_dict_note(runs[-1].full_parameters, runs[-1].largest_parameter))
    for err in sorted(_STAND_IN_ERRORS - errors_before)[:1]:
        notes.append(f"kept the CPU's kernel where the GPU's could not run on fake tensors ({err})")
    est, nccl = _estimate_of(per_rank, sh, training, name, tuple(notes))
    mode = "training" if training else "inference"
    bs = sizes[-1]
    last = per_rank[-1]
    alloc = est.peak(bs, mode) or 0
    gen_peak = None
    if not training and plan.generate_tokens and last.generate_peak is not None:
        gen_peak = last.generate_peak
        alloc = max(alloc, gen_peak)
    dpeak = _device_peak(alloc, tgt, nccl, frag_f)
    fits = dpeak <= tgt.total

    failed: list[str] = []
    tries = _Tries(tgt, training, name, frag_f, failed)
    known = {r.batch_size: tries.of_run(r, sh, r.batch_size) for r in per_rank}
    largest, exact = _largest_batch(
        known, tgt.total, lambda b: tries.peak(plan, sh, b, f"batch size {b} (the largest that fits)")
    )
    changes: tuple[Change, ...] = ()
    closest: Change | None = None
    if suggest and not fits:
        changes, closest = _suggest(tries, plan, sh, runs[-1], bs, dpeak, largest)
    if failed:
        est = replace(est, notes=(*est.notes, *dict.fromkeys(failed)))
    return TargetEstimate(
        **{f: getattr(est, f) for f in MemoryEstimate.__dataclass_fields__},
        target=tgt.name,
        target_total=tgt.total,
        overhead=tgt.overhead + nccl,
        workspace=tgt.workspaces(training),
        fragmentation=frag_f,
        batch_size=bs,
        mode=mode,
        allocated_peak=alloc,
        reserved_peak=reserved_for(alloc, frag_f),
        device_peak=dpeak,
        fits=fits,
        largest_batch_size=largest,
        largest_batch_exact=exact,
        strategy=strategy,
        world_size=int(world_size),
        grad_accum=grad_accum,
        checkpointed=ckpt,
        kv_cache=last.kv_cache,
        generate_tokens=plan.generate_tokens,
        changes=changes,
        closest=closest,
        method="fake-tensor" if _fake_mode()[0] is not None else "meta-device",
    )


# -- what would make it fit -------------------------------------------------------------------------------
class _Tries:
    """Device peaks of variants of one estimate (a plan, a sharding, a batch size): each fake run once, and
    one that fails is a note in ``failed`` (what, and the error's first line), never raised."""

    def __init__(self, tgt: Target, training: bool, name: str, frag: float, failed: list[str]) -> None:
        self.tgt, self.training, self.name, self.frag, self.failed = tgt, training, name, frag, failed
        self.mode = "training" if training else "inference"
        self.runs: dict[tuple[Any, ...], _Run | BaseException] = {}

    def of_run(self, run: _Run, sh: _Sharding, b: int) -> int:
        """The device peak of a fake run at batch size ``b``, for one rank of ``sh`` (arithmetic)."""
        e, nccl = _estimate_of([run], sh, self.training, self.name, ())
        a = e.peak(b, self.mode) or 0
        if not self.training and run.generate_peak is not None:
            a = max(a, run.generate_peak)
        return _device_peak(a, self.tgt, nccl, self.frag)

    def run(self, plan: _Plan, b: int, what: str) -> _Run | None:
        """``plan``'s fake run at ``b`` (``None``, said once, where it fails)."""
        key = (plan.amp, plan.dtype, plan.checkpoint, plan.grad_accum, plan.fsdp_world, b)
        got = self.runs.get(key)
        if got is None:
            try:
                got = _run_guarded(plan, [b])[-1]
            except Exception as exc:  # this variant cannot be evaluated: a note, the others go on
                got = exc
            self.runs[key] = got
        if isinstance(got, BaseException):
            self.failed.append(_could_not(what, got))
            return None
        return got

    def peak(self, plan: _Plan, sh: _Sharding, b: int, what: str) -> int | None:
        """The device peak of ``plan`` at ``b`` on one rank of ``sh`` (``None`` where it fails)."""
        r = self.run(plan, b, what)
        return None if r is None else self.of_run(r, sh, b)


def _largest_batch(
    known: dict[int, int], total: int, peak_at: Callable[[int], int | None], max_runs: int = 4
) -> tuple[int | None, bool]:
    """The largest batch size whose device peak (``peak_at``, a fake run) is within ``total``, and whether
    it is exact: a line through the sizes ``known``, then a few fake runs to check it (``None`` if even 1
    does not fit). A run that fails (``None``) stops the search: the answer is then the largest size known
    to fit, a lower bound (``False``)."""
    known = dict(known)
    for _ in range(max_runs):
        ok = [b for b, v in known.items() if v <= total]
        bad = [b for b, v in known.items() if v > total]
        lo = max(ok, default=0)
        hi = min((b for b in bad if b > lo), default=None)
        if hi is not None and hi - lo <= max(1, lo // 50):
            return lo or None, True
        pts = sorted(known.items())
        if len(pts) < 2:
            guess = pts[0][0] * 2 if pts[0][0] > 1 else 2
            if hi is not None and hi <= guess:
                guess = max(1, (lo + hi) // 2) if lo else max(1, hi // 2)
        else:
            (x1, y1), (x2, y2) = pts[-2], pts[-1]
            if lo and hi is not None:
                (x1, y1), (x2, y2) = (lo, known[lo]), (hi, known[hi])
            slope = (y2 - y1) / (x2 - x1) if x2 != x1 else 0.0
            if slope <= 0 or (y2 - y1) < 0.01 * y2:  # a batch-independent phase holds the peak
                guess = (lo + hi) // 2 if hi is not None else x2 * 8
            else:
                guess = int(x1 + (total - y1) / slope)
            if hi is not None:
                guess = min(guess, hi - 1)
            guess = max(guess, 1, lo + 1 if lo else 1)
            if guess > 1 << 22:
                return guess, True
        if guess in known:
            return lo or None, True
        v = peak_at(guess)
        if v is None:
            return lo or None, False
        known[guess] = v
    ok = [b for b, v in known.items() if v <= total]
    return (max(ok) if ok else None), True


def _could_not(what: str, exc: BaseException) -> str:
    """The note for a change (or a size) that could not be evaluated: what, and the error's first line."""
    text = str(getattr(exc, "message", "") or exc).strip()
    first = text.splitlines()[0][:200] if text else ""
    return f"could not evaluate {what}: {type(exc).__name__}" + (f": {first}" if first else "")


@dataclass(frozen=True)
class _Lever:
    """One change to a plan: its kind, its words alone and in a combination, the changed plan."""

    kind: str
    what: str
    short: str
    apply: Callable[[_Plan], _Plan]
    stacks: bool = True  # part of the combinations (bf16 weights in training is tried alone)


def _levers(plan: _Plan, base: _Run, training: bool) -> list[_Lever]:
    """The changes of the plan to try, in the order they are combined: checkpointing every block and bf16
    autocast in training (bf16 weights alone), bf16 weights in inference."""
    out: list[_Lever] = []
    if training and base.block_saved and not plan.checkpoint:
        per = sorted(
            ((n, max(s - base.block_input.get(n, 0), 0)) for n, s in base.block_saved.items()),
            key=lambda kv: -kv[1],
        )
        top = ", ".join(f"{n} {fmt_bytes(v)}" for n, v in per[:3])
        more = f" (+{len(per) - 3} more)" if len(per) > 3 else ""
        out.append(
            _Lever(
                "checkpoint",
                f"activation checkpointing of {len(per)} blocks: {top}{more}",
                f"activation checkpointing of the {len(per)} blocks",
                lambda p: replace(p, checkpoint=("blocks",)),
            )
        )
    if plan.dtype in (None, torch.float32):
        amp = _Lever(
            "dtype",
            "bf16 autocast (amp=torch.bfloat16)",
            "bf16 autocast",
            lambda p: replace(p, amp=torch.bfloat16),
        )
        weights = _Lever(
            "dtype",
            "bf16 weights (dtype=torch.bfloat16: weights, gradients and optimizer state in bf16)",
            "bf16 weights",
            lambda p: replace(p, dtype=torch.bfloat16),
            stacks=not training,
        )
        if training and plan.amp is None:
            out += [amp, weights]
        elif not training:
            out.append(weights)
    return out


def _suggest(
    t: _Tries, plan: _Plan, sh: _Sharding, base: _Run, bs: int, dpeak: int, largest: int | None
) -> tuple[tuple[Change, ...], Change | None]:
    """What would make it fit at ``bs``: every change that fits, alone, most bytes saved first; if none
    does, the changes combined (checkpointing and bf16 autocast, then more GPUs or a smaller batch). When
    nothing tried fits, no change is suggested: the second value is the smallest peak found, and how."""
    total = t.tgt.total
    tried: list[Change] = []

    def said(kind: str, what: str, peak: int | None) -> bool:
        if peak is not None:
            tried.append(Change(kind, what, max(dpeak - peak, 0), peak, peak <= total))
        return peak is not None and peak <= total

    levers = _levers(plan, base, t.training)
    for lever in levers:
        said(lever.kind, lever.what, t.peak(lever.apply(plan), sh, bs, lever.what))
    if t.training:
        said("sharding", *_more_gpus(t, base, sh, bs))
    if largest is not None and largest < bs:
        said("batch_size", *_smaller_batch(t, plan, sh, bs, largest))
    if not any(c.fits for c in tried):
        _combined(t, plan, sh, bs, [lever for lever in levers if lever.stacks], said)
    fit = sorted((c for c in tried if c.fits), key=lambda c: -c.saves)
    if fit:
        return tuple(fit), None
    return (), min(tried, key=lambda c: c.peak, default=None)


def _combined(
    t: _Tries,
    plan: _Plan,
    sh: _Sharding,
    bs: int,
    levers: list[_Lever],
    said: Callable[[str, str, int | None], bool],
) -> None:
    """The levers stacked one after another, then (with all of them) more GPUs, a smaller batch, or both:
    the first combination that fits ends it."""
    stack = plan
    names: list[str] = []
    for i, lever in enumerate(levers):
        stack, names = lever.apply(stack), [*names, lever.short]
        if i == 0:
            continue  # tried alone
        if said("combined", " + ".join(names), t.peak(stack, sh, bs, " + ".join(names))):
            return
    head = " + ".join(names) + " + " if names else ""
    found = False
    if t.training and names:
        unsharded = t.run(replace(stack, fsdp_world=0), bs, head + "more GPUs")
        if unsharded is not None:
            what, peak = _more_gpus(t, unsharded, sh, bs)
            found = said("combined", head + what, peak)
    if names:
        what, peak = _smaller_batch(t, stack, sh, bs, None)
        found = said("combined", head + what, peak) or found
    if found or not t.training:
        return
    # the most GPUs tried and the largest batch that fits with them
    most = _more_gpus_sharding(sh, 64)
    flat = replace(stack, fsdp_world=0)
    what, peak = _smaller_batch(t, flat, most, bs, None)
    said("combined", f"{head}FSDP over {most.world_size} GPUs + {what}", peak)


def _more_gpus_sharding(sh: _Sharding, n: int) -> _Sharding:
    """``n`` times the ranks: FSDP (or the ZeRO-3 / FSDP already used) over them."""
    if sh.strategy in ("fsdp", "zero3"):
        return _Sharding(sh.strategy, max(sh.world_size, 1) * n)
    return _Sharding("fsdp", max(sh.world_size, 1) * n)


def _more_gpus(t: _Tries, run: _Run, sh: _Sharding, bs: int) -> tuple[str, int | None]:
    """The fewest GPUs (2x to 64x the ranks) whose FSDP peak fits, else 64x: in words, and the peak
    (sharding arithmetic on the unsharded ``run``)."""
    peak, alt = None, sh
    try:
        for n in (2, 4, 8, 16, 32, 64):
            alt = _more_gpus_sharding(sh, n)
            peak = t.of_run(run, alt, bs)
            if peak <= t.tgt.total:
                break
    except Exception as exc:
        t.failed.append(_could_not("FSDP over more GPUs", exc))
        return "FSDP over more GPUs", None
    return f"FSDP over {alt.world_size} GPUs (fully_shard each block)", peak


def _smaller_batch(
    t: _Tries, plan: _Plan, sh: _Sharding, bs: int, hint: int | None
) -> tuple[str, int | None]:
    """The largest batch size below ``bs`` that fits with ``plan`` (``hint``: a size known to fit without
    gradient accumulation), in words and its peak. Training keeps the samples per optimizer step with
    gradient accumulation, which holds the gradients through the next micro-batch: evaluated so."""
    accum = replace(plan, grad_accum=max(plan.grad_accum, 2)) if t.training else plan

    def peak_at(b: int) -> int | None:
        return t.peak(accum, sh, b, f"batch size {b}")

    one = peak_at(1)
    if one is None or one > t.tgt.total:
        return _batch_words(t.training, 1, bs, plan.grad_accum), one
    known = {1: one}
    if hint is not None and 1 < hint < bs:
        at_hint = peak_at(hint)
        if at_hint is not None:
            known[hint] = at_hint
    k, _exact = _largest_batch(known, t.tgt.total, lambda b: peak_at(b) if b < bs else t.tgt.total + 1)
    k = min(k or 1, bs - 1) if bs > 1 else 1
    samples = bs * plan.grad_accum if t.training else bs
    # the samples split evenly where a divisor is near (4 x 4 for 16, not 6 x 3 = 18), else as evenly as
    # the steps allow (24 x 2 for 48, not 43 x 2)
    even = next((d for d in range(k, max(k // 2, 1) - 1, -1) if samples % d == 0), None)
    k = even or -(-samples // -(-samples // k))
    return _batch_words(t.training, k, bs, plan.grad_accum), peak_at(k)


def _batch_words(training: bool, k: int, bs: int, grad_accum: int) -> str:
    """Batch size ``k`` in place of ``bs``, in words: with the gradient accumulation that keeps the samples
    per optimizer step (training), or the calls it takes (inference)."""
    if not training:
        return f"batch size {k} ({-(-bs // k)} calls for the {bs} samples)"
    samples = bs * grad_accum
    g = -(-samples // k)
    return f"batch size {k} with grad_accum={g} ({k * g} samples per optimizer step, was {samples})"


__all__ = ["FakeTensorError", "default_loss", "estimate_fake"]
