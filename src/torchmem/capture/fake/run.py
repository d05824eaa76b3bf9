"""The fake run: a plan's model built once under fake tensors and measured at every batch size.

Inference first, while the model holds only its weights (an eval forward under ``inference_mode``, or a
prefill and one decode step of a generate call with ``generate_tokens``), then a warm-up training step
(creates optimizer state) and one measured step per size: forward and loss, backward, optimizer step,
each phase's peak read from the ledger. Under FSDP2 (``plan.fsdp_world > 1``) the model is sharded on a
fake process group first. An exception the fake tensors cause is a
:class:`~torchmem.capture.fake.ledger.FakeTensorError` (:func:`_run_guarded`).

Example:
    >>> import torch
    >>> from torchmem.capture.fake.plan import _Plan
    >>> from torchmem.capture.fake.run import _run_guarded
    >>> from torchmem.capture.fake.step import default_loss
    >>> plan = _Plan(torch.nn.Linear(256, 256), torch.randn(4, 256), 4, "sgd", True, None, None,
    ...              default_loss, (), 1, 0, rounding=True, workspace=0)
    >>> run = _run_guarded(plan, [4])[-1]
    >>> run.parameters, run.gradients
    (263168, 263168)
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem.analysis.estimate import FitArgumentError
from torchmem.capture.fake.kernels import _foreach_like_cuda, _gpu_kernels
from torchmem.capture.fake.ledger import _bytes_of, _fake_mode, _Ledger, _ledger_mode, _Saved, _translate
from torchmem.capture.fake.plan import (
    _autocast,
    _blocks,
    _checkpointed,
    _fake_inputs,
    _fake_twin,
    _Plan,
    _Run,
    _select,
)
from torchmem.capture.fake.sharding import _fake_group, _NoFakeGroup, _shard_twin, _storage_resizes
from torchmem.capture.fake.step import _accepts, _call, _make_optimizer, _tensors
from torchmem.results.fit import StepMeasurement


@dataclass
class _Twin:
    """The fake model of one run and what it holds before any step."""

    model: torch.nn.Module
    blocks: dict[str, torch.nn.Module]  # the repeated blocks, by qualified name
    sharded: bool  # by FSDP2 on a fake process group: the figures are per rank
    parameters: int
    weights: int  # parameters and buffers
    block_params: dict[str, int]
    own: set[int]  # the storages of its parameters and buffers (not saved activations)
    largest_parameter: int  # unsharded, bytes
    full_parameters: int  # every parameter unsharded, bytes


def _run_plan(plan: _Plan, sizes: Sequence[int], infer: bool = True) -> list[_Run]:
    """Build the fake model once and measure every size (under FSDP2 on a fake process group when
    ``plan.fsdp_world > 1``): inference first (weights only; left out with ``infer=False`` in training,
    where only the training figures are read), then a warm-up training step and one measured step per
    size."""
    gen = _measure(plan, sizes, infer)
    try:
        return next(gen)
    finally:
        gen.close()


def _measure(plan: _Plan, sizes: Sequence[int], infer: bool = True) -> Generator[list[_Run], int, None]:
    """One fake run: the model built once and ``sizes`` measured as :func:`_run_plan` says, their runs
    yielded first; then it goes on measuring each size sent to it (``gen.send(bs)``, a list of one run)
    for a search whose next size depends on the last run's figures: in training one measured step (no
    inference call: only the training figures are read), the warm-up step first where ``sizes`` is empty.
    An exception ends the run, raised as it came (:func:`_guarded` translates it)."""
    with ExitStack() as stack:
        mesh = stack.enter_context(_fake_group(plan.fsdp_world)) if plan.fsdp_world > 1 else None
        mode, dev = _fake_mode()
        led = _Ledger(plan.rounding)
        plan = _built(plan)
        twin = _enter(plan, mode, dev, led, mesh, stack)
        none: tuple[int | None, int | None, int, int | None] = (None, None, 0, None)
        inference = {bs: _infer(plan, twin, led, bs, dev) if infer else none for bs in sizes}
        if not plan.training:
            bs = yield [_inference_run(twin, b, inference[b]) for b in sizes]
            while True:
                bs = yield [_inference_run(twin, bs, _infer(plan, twin, led, bs, dev))]
        opt, no_cache, hooks = _training_setup(plan, twin, led)
        try:
            twin.model.train()
            runs: list[_Run] = []
            for i, b in enumerate([sizes[0], *sizes] if sizes else []):
                f, saved = _train_step(plan, twin, opt, led, b, dev, i > 0, no_cache)
                if i > 0:
                    runs.append(_measured_run(plan, twin, b, f, saved, inference[b]))
            bs = yield runs
            if not sizes:
                _train_step(plan, twin, opt, led, bs, dev, False, no_cache)
            while True:
                f, saved = _train_step(plan, twin, opt, led, bs, dev, True, no_cache)
                bs = yield [_measured_run(plan, twin, bs, f, saved, none)]
        finally:
            for h in hooks:
                h.remove()
            del opt


@contextmanager
def _opened(
    plan: _Plan, sizes: Sequence[int]
) -> Iterator[tuple[list[_Run], Generator[list[_Run], int, None]]]:
    """:func:`_run_guarded`'s runs of ``sizes``, and the run kept open (:func:`_measure`) to measure the
    sizes a search asks for next without building and warming up the model again; closed on exit. No other
    fake run may start while it is open (its modes are pushed)."""
    gen = _measure(plan, sizes)
    try:
        try:
            runs = next(gen)
        except Exception as exc:
            err = _guarded(plan, exc)
            if err is exc:
                raise
            raise err from exc
        yield runs, gen
    finally:
        gen.close()


def _built(plan: _Plan) -> _Plan:
    """``plan`` with its model built where it is a factory: on the meta device (no initialisation runs:
    weight init may read values, which fake tensors cannot), then mirrored with fake tensors like a real
    model."""
    if isinstance(plan.model, torch.nn.Module):
        return plan
    with torch.device("meta"):
        built = plan.model()
    if not isinstance(built, torch.nn.Module):
        raise FitArgumentError(
            f"The model factory returned {type(built).__name__}, not a torch.nn.Module.", ""
        )
    return replace(plan, model=built, optimizer=plan.optimizer)


def _enter(plan: _Plan, mode: Any, dev: str, led: _Ledger, mesh: Any, stack: ExitStack) -> _Twin:
    """The fake, counting and kernel modes entered on ``stack``, and the plan's model under them."""
    if mode is not None:
        stack.enter_context(mode)
    stack.enter_context(_ledger_mode(led, decompose=plan.sm is not None))
    stack.enter_context(_gpu_kernels(plan.sm))
    stack.enter_context(torch.random.fork_rng(devices=[]))
    return _build_twin(plan, dev, led, mesh, stack)


def _inference_run(twin: _Twin, bs: int, inf: tuple[int | None, int | None, int, int | None]) -> _Run:
    """The run of an inference-only plan at ``bs`` from its inference call's figures."""
    ip, ib, kv, gen = inf
    m = StepMeasurement(bs, None, None, None, None, None, ip, ib, None)
    p, w = twin.parameters, twin.weights
    return _Run(bs, m, p, 0, 0, w, kv_cache=kv, generate_peak=gen, sharded=twin.sharded)


def _build_twin(plan: _Plan, dev: str, led: _Ledger, mesh: Any, stack: ExitStack) -> _Twin:
    """The plan's model under the fake and counting modes, checkpointed and sharded as the plan says."""
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
    return _Twin(
        model=twin,
        blocks=blocks,
        sharded=mesh is not None,
        parameters=_bytes_of(twin.parameters(), led),
        weights=_bytes_of(iter([*twin.parameters(), *twin.buffers()]), led),
        block_params={n: _bytes_of(b.parameters(), led) for n, b in blocks.items()},
        own={k for k in (led.key_of(t) for t in [*twin.parameters(), *twin.buffers()]) if k is not None},
        largest_parameter=largest_parameter,
        full_parameters=full_parameters,
    )


def _infer(plan: _Plan, t: _Twin, led: _Ledger, bs: int, dev: str) -> tuple[int, int, int, int | None]:
    """One inference call at ``bs`` in eval mode: ``(peak, before, kv_cache, generate_peak)``, with the
    inference cuBLAS workspace."""
    twin, ws = t.model, plan.workspace
    was = twin.training
    twin.eval()
    try:
        batch = _fake_inputs(plan, bs, dev)
        before = led.current
        led.reset_peak()
        kv, gen = 0, None
        # FSDP2 keeps its unsharded parameters between steps: made under inference_mode they could not be
        # used by the training step after, so a sharded run infers under no_grad.
        no_grad = torch.inference_mode() if not t.sharded else torch.no_grad()
        with no_grad, _autocast(plan.amp, dev):
            if plan.generate_tokens > 0 and _accepts(twin.forward, "use_cache"):
                kv, gen = _generate(plan, twin, batch, led)
            else:
                _call(twin, batch)
        return led.peak + ws, before + ws, kv, gen
    finally:
        twin.train(was)


def _generate(plan: _Plan, twin: torch.nn.Module, batch: Any, led: _Ledger) -> tuple[int, int]:
    """A generate call of ``plan.generate_tokens`` new tokens after the prompt: ``(kv_cache, its peak)``.
    The prefill runs; the cache it made grows in proportion to the sequence; the ledger's peak is left at
    the prefill's."""
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
    # The prefill's temporaries are gone before the cache grows: the call's peak is the prefill's or the
    # last token's (all held now, the cache grown to its full length, and one decode step's temporaries,
    # which grow with the cache they copy).
    resident = led.current
    step = _decode_step_bytes(twin, batch, out, led, extra)
    grown = full / cache_now if cache_now else 1.0
    gen = max(prefill_peak, resident + (full - cache_now) + int(step * grown)) + plan.workspace
    led.reset_peak()
    led.peak = max(led.peak, prefill_peak)
    del out
    return full, gen


def _training_setup(plan: _Plan, t: _Twin, led: _Ledger) -> tuple[Any, bool, list[Any]]:
    """The optimizer of the fake model, whether its steps run without a KV cache, and the hooks that mark
    accumulated gradients in the ledger (removed by the caller)."""
    twin = t.model
    opt = _make_optimizer(
        plan.optimizer, plan.model if isinstance(plan.model, torch.nn.Module) else None, twin
    )
    no_cache = bool(plan.checkpoint) and _accepts(twin.forward, "use_cache")
    if plan.sm is not None:
        _foreach_like_cuda(opt)
    hooks = []
    for p in twin.parameters():
        if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
            hooks.append(p.register_post_accumulate_grad_hook(lambda q: led.mark_grad(q.grad)))
    return opt, no_cache, hooks


def _measured_run(
    plan: _Plan,
    t: _Twin,
    bs: int,
    f: dict[str, int],
    saved: _Saved,
    inf: tuple[int | None, int | None, int, int | None],
) -> _Run:
    """The run of one measured training step at ``bs`` (its figures ``f``), with the inference call's."""
    ws = plan.workspace_training
    ip, ib, kv, gen = inf
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
    return _Run(
        bs,
        m,
        t.parameters,
        f["grads"],
        f["state"],
        t.weights,
        forward_grads=f["forward_grads"],
        backward_grads=f["backward_grads"],
        kv_cache=kv,
        generate_peak=gen,
        block_saved=dict(saved.per_block),
        block_input=dict(saved.block_input),
        block_params=t.block_params,
        sharded=t.sharded,
        largest_parameter=t.largest_parameter,
        full_parameters=t.full_parameters,
        step_temporaries=f["step_peak"] - f["before_step"] if "step_peak" in f else 0,
    )


def _train_step(
    plan: _Plan, t: _Twin, opt: Any, led: _Ledger, bs: int, dev: str, measured: bool, no_cache: bool
) -> tuple[dict[str, int], _Saved]:
    """One training step at ``bs`` (two micro-batches with gradient accumulation): its figures by name
    (ledger bytes, without workspaces) and what its last forward saved for backward."""
    twin = t.model
    f: dict[str, int] = {}
    saved = _Saved(led, t.own)
    handles = saved.hooks(t.blocks) if measured else []
    batch = _fake_inputs(plan, bs, dev)
    micro_batches = min(max(plan.grad_accum, 1), 2)
    try:
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            f["before_forward"] = led.current
            led.reset_peak()
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack), _autocast(plan.amp, dev):
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
                saved = _Saved(led, t.own)
    finally:
        for h in handles:
            h.remove()
    del batch
    f["grads"] = led.grads
    if t.sharded:  # FSDP2 sets the sharded gradients itself (no accumulation hook)
        f["grads"] = _bytes_of(iter([p.grad for p in twin.parameters() if p.grad is not None]), led)
    led.reset_peak()
    f["state"] = 0
    if opt is not None:
        f["before_step"] = led.current
        opt.step()
        f["step_peak"] = led.peak
        state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        f["state"] = _bytes_of(iter(state), led)
        del state
        opt.zero_grad(set_to_none=True)
    else:
        twin.zero_grad(set_to_none=True)
    return f, saved


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


def _run_guarded(plan: _Plan, sizes: Sequence[int], infer: bool = True) -> list[_Run]:
    try:
        return _run_plan(plan, sizes, infer)
    except Exception as exc:
        err = _guarded(plan, exc)
        if err is exc:
            raise
        raise err from exc


def _guarded(plan: _Plan, exc: Exception) -> Exception:
    """The error a fake run of ``plan`` raises for ``exc``: torchmem's own as it is, one the fake tensors
    caused as a :class:`~torchmem.capture.fake.ledger.FakeTensorError`, a checkpointed module that
    recomputes other ops as a :class:`FitArgumentError` (``__cause__``: ``exc``), else ``exc``."""
    if isinstance(exc, TorchmemError):
        return exc
    err = _translate(exc)
    if err is not None:
        err.__cause__ = exc
        return err
    if plan.checkpoint and type(exc).__module__ == "torch.utils.checkpoint":
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fit = FitArgumentError(
            f"Activation checkpointing of {', '.join(plan.checkpoint)} cannot run on this model: {first}",
            "The checkpointed modules run other ops when recomputed (a cache, a Python-side state): "
            "checkpoint other modules, or none.",
        )
        fit.__cause__ = exc
        return fit
    return exc
