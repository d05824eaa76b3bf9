"""What would make it fit: the changes of a plan that does not fit, each estimated by fake runs.

Checkpointing every repeated block, bf16 autocast or bf16 weights, FSDP over more GPUs, a smaller batch
with gradient accumulation (the samples per optimizer step kept): each alone, most bytes saved first; when
none fits, stacked. A change whose fake run fails is a note, never an error (:class:`_Tries`).
:func:`_largest_batch` finds the largest batch size that fits with a few fake runs.

Example:
    >>> from torchmem.capture.fake.suggest import _batch_words, _largest_batch
    >>> _largest_batch({8: 800, 16: 1600}, 1000, lambda b: 100 * b)  # peak 100 bytes per sample
    (10, True)
    >>> _batch_words(True, 4, 16, 1)
    'batch size 4 with grad_accum=4 (16 samples per optimizer step, was 16)'
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem.analysis.targets import Target
from torchmem.capture.fake.plan import _Plan, _Run
from torchmem.capture.fake.run import _guarded, _measure, _run_guarded
from torchmem.capture.fake.sharding import _device_peak, _estimate_of, _Sharding
from torchmem.results.fit import Change


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
        key = _key(plan, b)
        got = self.runs.get(key)
        if got is None:
            try:
                got = _run_guarded(plan, [b], infer=not self.training)[-1]
            except Exception as exc:  # this variant cannot be evaluated: a note, the others go on
                got = exc
            self.runs[key] = got
        return self._said(got, what)

    def _said(self, got: _Run | BaseException, what: str) -> _Run | None:
        if isinstance(got, BaseException):
            self.failed.append(_could_not(what, got))
            return None
        return got

    def peak(self, plan: _Plan, sh: _Sharding, b: int, what: str) -> int | None:
        """The device peak of ``plan`` at ``b`` on one rank of ``sh`` (``None`` where it fails)."""
        r = self.run(plan, b, what)
        return None if r is None else self.of_run(r, sh, b)

    @contextmanager
    def sizes(
        self,
        plan: _Plan,
        sh: _Sharding,
        what: Callable[[int], str],
        opened: Generator[list[_Run], int, None] | None = None,
    ) -> Iterator[Callable[[int], int | None]]:
        """:meth:`peak` of ``plan`` at the sizes a search asks for, one after another, from one fake run:
        the model is built and warmed up once, then each size is one measured step (a run per size cost a
        build, an inference call, a warm-up and the measured step). The same figures; a size that fails is
        a note as in :meth:`run`, and the next size asked starts a new run. ``opened``: the plan's run that
        measured the estimate's own sizes, still open (:func:`~torchmem.capture.fake.run._opened`), to go on
        with (closed at the end)."""
        gen = opened

        def peak_at(b: int) -> int | None:
            nonlocal gen
            key = _key(plan, b)
            got = self.runs.get(key)
            if got is None:
                try:
                    if gen is None:
                        gen = _measure(plan, (), infer=False)
                        next(gen)
                    got = gen.send(b)[-1]
                except Exception as exc:  # this size cannot be evaluated: a note (the run is over)
                    gen = None
                    got = _guarded(plan, exc)
                self.runs[key] = got
            r = self._said(got, what(b))
            return None if r is None else self.of_run(r, sh, b)

        try:
            yield peak_at
        finally:
            if gen is not None:
                gen.close()


def _key(plan: _Plan, b: int) -> tuple[Any, ...]:
    """What tells the runs of one estimate's variants apart (the changes :func:`_levers` makes, the size)."""
    return (plan.amp, plan.dtype, plan.checkpoint, plan.grad_accum, plan.fsdp_world, b)


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
    with t.sizes(accum, sh, lambda b: f"batch size {b}") as peak_at:
        return _smaller_batch_of(t, plan, bs, hint, peak_at)


def _smaller_batch_of(
    t: _Tries, plan: _Plan, bs: int, hint: int | None, peak_at: Callable[[int], int | None]
) -> tuple[str, int | None]:
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
