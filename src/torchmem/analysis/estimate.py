"""The memory model behind ``torchmem.estimate()``: measured small steps in, predicted peaks out (pure).

A training step's memory has a batch-independent part — parameters, gradients, optimizer state — and a
part that grows with the batch: activations saved for backward and the temporaries of each op. Each
phase of the step (forward, backward, optimizer step) has its own peak, each close to linear in the
batch size; the step's peak is the largest of them. :func:`build_estimate` fits one line per phase from
two measured batch sizes, extrapolates to the sizes asked for, and splits each predicted peak into
parameters, gradients, optimizer state, activations and temporaries, as they are live in the phase that
holds the peak. Activations (bytes saved for backward) are fitted the same way and reported in every training
row, also when the optimizer step holds the peak: they are freed by then, so they are not a part of that peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchmem._errors import TorchmemError


class FitArgumentError(TorchmemError, ValueError):
    """``find_batch_size()`` or ``estimate()`` was given an argument it cannot use."""


@dataclass(frozen=True)
class StepMeasurement:
    """The figures of one measured step at one batch size, in bytes above the figure before the model
    copy existed (so parameters, optimizer state and workspaces the step created are all included).

    Attributes:
        batch_size: The batch size measured.
        forward_peak: Peak during forward and loss (training mode, autograd on).
        after_forward: Figure at the end of forward: persistent state + saved activations + outputs.
        before_forward: Figure at the start of forward (persistent state only).
        backward_peak: Peak during ``loss.backward()``.
        step_peak: Peak during ``optimizer.step()`` (``None`` without an optimizer).
        inference_peak: Peak of a forward in eval mode under ``torch.inference_mode()``.
        before_inference: Figure before that forward.
        saved_for_backward: Bytes autograd saved for backward and still held at the end of forward (each
            storage once, the model's parameters and buffers excluded); ``None`` when not measured, and then
            the growth over forward (``after_forward - before_forward``) stands in for it.
    """

    batch_size: int
    forward_peak: int | None
    after_forward: int | None
    before_forward: int | None
    backward_peak: int | None
    step_peak: int | None
    inference_peak: int | None
    before_inference: int | None
    saved_for_backward: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EstimateRow:
    """The predicted peak of one mode at one batch size, and what it is made of (bytes).

    ``activations`` is what the step saves for backward at this batch size (0 for inference). Where the
    forward or backward holds the peak, ``parameters + gradients + optimizer_state + activations +
    temporaries == peak``: the parts live in that phase, attributed in that order (gradients and activations
    overlap in time during backward; temporaries is what is left). Where the optimizer step holds it, the
    activations were freed before it (``activations_in_peak`` is ``False``) and ``parameters + gradients +
    optimizer_state + temporaries == peak``.

    Attributes:
        batch_size: The batch size.
        mode: ``"training"`` or ``"inference"``.
        peak: Predicted peak.
        phase: The phase that holds it: ``"forward"``, ``"backward"``, ``"optimizer"`` or ``"inference"``.
        measured: Whether this batch size was measured rather than extrapolated.
    """

    batch_size: int
    mode: str
    peak: int
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int
    phase: str
    measured: bool

    @property
    def activations_in_peak(self) -> bool:
        """Whether ``activations`` are a part of ``peak`` (not when the optimizer step holds it)."""
        return self.phase in ("forward", "backward")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["activations_in_peak"] = self.activations_in_peak
        return out


@dataclass(frozen=True)
class MemoryEstimate:
    """What :func:`torchmem.estimate` predicts.

    Attributes:
        model: The model's class name.
        device: The device the estimate is for (and was measured on).
        measured_on: Where the small steps ran.
        measured_at: The batch sizes measured.
        parameters / gradients / optimizer_state: Batch-independent sizes, in bytes.
        activations_per_sample: Bytes saved for backward per sample (fitted slope of
            :attr:`StepMeasurement.saved_for_backward`).
        rows: One :class:`EstimateRow` per batch size and mode (training first, then inference).
        measurements: The raw measured steps.
        weights_only: The figure weights-only estimators report (parameters and buffers, no optimizer,
            no activations), for comparison.
        notes: Caveats in words.
    """

    model: str
    device: str
    measured_on: str
    measured_at: tuple[int, ...]
    parameters: int
    gradients: int
    optimizer_state: int
    activations_per_sample: float
    rows: tuple[EstimateRow, ...]
    measurements: tuple[StepMeasurement, ...]
    weights_only: int
    notes: tuple[str, ...] = ()

    def peak(self, batch_size: int, mode: str = "training") -> int | None:
        """The predicted peak of ``mode`` at ``batch_size`` (a size in ``rows``), else ``None``."""
        for r in self.rows:
            if r.batch_size == batch_size and r.mode == mode:
                return r.peak
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        from torchmem.report.fit import render_estimate

        return render_estimate(self)


def _line(points: list[tuple[int, float | None]]) -> tuple[float, float] | None:
    """Least-squares line ``(a, b)`` through the points with a value (``None`` values are skipped)."""
    pts = [(float(x), float(y)) for x, y in points if y is not None]
    if not pts:
        return None
    if len({x for x, _ in pts}) < 2:
        return pts[0][1], 0.0
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    b = sxy / sxx
    return my - b * mx, b


def _at(line: tuple[float, float] | None, bs: int) -> float | None:
    return None if line is None else line[0] + line[1] * bs


def _split(peak: int, parts: list[tuple[str, int]]) -> dict[str, int]:
    """Attribute ``peak`` to ``parts`` in order, each capped by what is left; the rest is temporaries."""
    left = peak
    out: dict[str, int] = {}
    for name, size in parts:
        take = max(0, min(size, left))
        out[name] = take
        left -= take
    out["temporaries"] = max(left, 0)
    return out


def build_estimate(
    measurements: list[StepMeasurement],
    *,
    batch_sizes: list[int],
    parameters: int,
    gradients: int,
    optimizer_state: int,
    weights_only: int,
    training: bool,
    model: str,
    device: str,
    measured_on: str,
    notes: tuple[str, ...] = (),
) -> MemoryEstimate:
    """Fit each phase's peak against the batch size and predict the rows for ``batch_sizes``.

    Example:
        >>> m = [StepMeasurement(b, 100 + 10 * b, 90 + 8 * b, 90, 95 + 9 * b, 120, 60 + 3 * b, 50)
        ...      for b in (2, 4)]
        >>> e = build_estimate(m, batch_sizes=[100], parameters=40, gradients=40, optimizer_state=30,
        ...                    weights_only=40, training=True, model="M", device="cpu", measured_on="cpu")
        >>> e.peak(100), e.rows[0].phase, e.peak(100, "inference")
        (1100, 'forward', 360)
    """
    measured = {m.batch_size for m in measurements}
    fwd = _line([(m.batch_size, m.forward_peak) for m in measurements])
    bwd = _line([(m.batch_size, m.backward_peak) for m in measurements])
    opt = _line([(m.batch_size, m.step_peak) for m in measurements])
    if measurements and all(m.saved_for_backward is not None for m in measurements):
        acts = _line([(m.batch_size, m.saved_for_backward) for m in measurements])
    else:  # not measured: the growth over forward (saved tensors + outputs, less what existed before)
        acts = _line(
            [
                (
                    m.batch_size,
                    None
                    if m.after_forward is None or m.before_forward is None
                    else m.after_forward - m.before_forward,
                )
                for m in measurements
            ]
        )
    inf = _line([(m.batch_size, m.inference_peak) for m in measurements])
    per_sample = 0.0 if acts is None else max(acts[1], 0.0)
    rows: list[EstimateRow] = []
    if training:
        for bs in batch_sizes:
            phases = [
                ("forward", _at(fwd, bs)),
                ("backward", _at(bwd, bs)),
                ("optimizer", _at(opt, bs)),
            ]
            known = [(name, v) for name, v in phases if v is not None]
            if not known:
                continue
            phase, value = max(known, key=lambda kv: kv[1])
            peak = round(value)
            a = _at(acts, bs)
            act = 0 if a is None else max(round(a), 0)
            if phase == "forward":
                parts = [
                    ("parameters", parameters),
                    ("optimizer_state", optimizer_state),
                    ("activations", act),
                ]
                parts.append(("gradients", 0))
            elif phase == "backward":
                parts = [
                    ("parameters", parameters),
                    ("optimizer_state", optimizer_state),
                    ("activations", act),
                    ("gradients", gradients),
                ]
            else:  # the optimizer step: activations were freed in backward; reported, not in the peak
                parts = [
                    ("parameters", parameters),
                    ("gradients", gradients),
                    ("optimizer_state", optimizer_state),
                ]
            sp = _split(peak, parts)
            if phase == "optimizer":
                sp["activations"] = act
            rows.append(
                EstimateRow(
                    bs,
                    "training",
                    peak,
                    sp["parameters"],
                    sp.get("gradients", 0),
                    sp["optimizer_state"],
                    sp.get("activations", 0),
                    sp["temporaries"],
                    phase,
                    bs in measured,
                )
            )
    for bs in batch_sizes:
        v = _at(inf, bs)
        if v is None:
            continue
        peak = round(v)
        sp = _split(peak, [("parameters", parameters)])
        rows.append(
            EstimateRow(
                bs,
                "inference",
                peak,
                sp["parameters"],
                0,
                0,
                0,
                sp["temporaries"],
                "inference",
                bs in measured,
            )
        )
    return MemoryEstimate(
        model=model,
        device=device,
        measured_on=measured_on,
        measured_at=tuple(sorted(measured)),
        parameters=parameters,
        gradients=gradients,
        optimizer_state=optimizer_state,
        activations_per_sample=per_sample,
        rows=tuple(rows),
        measurements=tuple(measurements),
        weights_only=weights_only,
        notes=notes,
    )


__all__ = ["EstimateRow", "FitArgumentError", "MemoryEstimate", "StepMeasurement", "build_estimate"]
