"""The fake mode and the byte ledger: what the tensors of a fake run would hold on a device.

Under ``FakeTensorMode`` (or the ``meta`` device where it cannot be imported) each op computes only its
outputs' shapes. The counting mode (:func:`_ledger_mode`), a dispatch mode above the fake mode, counts each
new storage once in a :class:`_Ledger`, at the caching allocator's block size for CUDA (512-byte multiples),
and uncounts it when it dies; :class:`_Saved` counts the bytes autograd saves for backward. An exception
the fake run raises because of fake tensors becomes a :class:`FakeTensorError` (:func:`_translate`).

Example:
    >>> import torch
    >>> from torchmem.capture.fake.ledger import _Ledger, _fake_mode, _ledger_mode
    >>> led = _Ledger(rounding=True)
    >>> mode, dev = _fake_mode()
    >>> with mode, _ledger_mode(led):
    ...     x = torch.empty(1000, device=dev)  # 4000 bytes, one 4096-byte block
    ...     y = x * 2
    ...     del y
    >>> led.current, led.peak
    (4096, 8192)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem.analysis.targets import round_block
from torchmem.capture.fake.step import _tensors


class FakeTensorError(TorchmemError):
    """The model cannot run under fake tensors: an op without a fake kernel or with a data-dependent output.

    Attributes:
        op: The op that failed (``"aten.nonzero.default"``), or ``""`` if unknown.
    """

    def __init__(self, message: str, hint: str = "", op: str = "") -> None:
        super().__init__(message, hint)
        self.op = op


_ALTERNATIVE = (
    "Measure on a device instead: torchmem.estimate(model, batch, device='cuda') runs two small real steps."
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
