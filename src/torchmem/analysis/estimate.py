"""The memory model behind ``torchmem.estimate()``: measured small steps in, predicted peaks out (pure).

A training step's memory has a batch-independent part — parameters, gradients, optimizer state — and a
part that grows with the batch: activations saved for backward and the temporaries of each op. Each
phase of the step (forward, backward, optimizer step) has its own peak, each close to linear in the
batch size; the step's peak is the largest of them. :func:`build_estimate` reads each phase's peak
piecewise linearly through the measured batch sizes (extrapolating from the two largest), and splits
each predicted peak into parameters, gradients, optimizer state, activations and temporaries, as they
are live in the phase that holds the peak. Activations (bytes saved for backward) are fitted the same
way and reported in every training row, also when the optimizer step holds the peak: they are freed by
then, so they are not a part of that peak.

Pure arithmetic: a piecewise line per phase through the few measurements (a note where the three
largest are not on one line), then one row per batch size and mode; no device is touched. The result
types (:class:`StepMeasurement`, :class:`EstimateRow`, :class:`MemoryEstimate`) live in
:mod:`torchmem.results.fit` and are re-exported here.
"""

from __future__ import annotations

from torchmem._errors import TorchmemError
from torchmem._format import fmt_bytes
from torchmem.results.fit import EstimateRow, MemoryEstimate, StepMeasurement


class FitArgumentError(TorchmemError, ValueError):
    """``find_batch_size()`` or ``estimate()`` was given an argument it cannot use."""


Curve = list[tuple[float, float]]


def _curve(points: list[tuple[int, float | None]]) -> Curve | None:
    """The measured points with a value, sorted by batch size (repeated sizes averaged); ``None`` if none.

    :func:`_at` reads the curve piecewise linearly: exact at every measured size, between two sizes on the
    segment joining them, beyond the ends on the end segments' lines. A phase's peak is the maximum over
    the phase of (what is batch-independent then + the batch-dependent bytes then): a maximum of lines,
    so it bends upwards where the moment of the peak moves (the backward peak: at the end of backward for
    small batches, where gradients dominate, at its start for large ones). Extrapolating from the two
    largest measured sizes follows the steepest part seen; a line through all of them would not.
    """
    by_x: dict[float, list[float]] = {}
    for x, y in points:
        if y is not None:
            by_x.setdefault(float(x), []).append(float(y))
    if not by_x:
        return None
    return [(x, sum(ys) / len(ys)) for x, ys in sorted(by_x.items())]


def _segment(curve: Curve, bs: float) -> tuple[float, float]:
    """``(a, b)`` of the line ``a + b * bs`` that :func:`_at` reads ``curve`` from at ``bs``."""
    if len(curve) == 1:
        return curve[0][1], 0.0
    i = 0
    while i < len(curve) - 2 and bs > curve[i + 1][0]:
        i += 1
    (x0, y0), (x1, y1) = curve[i], curve[i + 1]
    b = (y1 - y0) / (x1 - x0)
    return y0 - b * x0, b


def _at(curve: Curve | None, bs: int) -> float | None:
    if curve is None:
        return None
    a, b = _segment(curve, float(bs))
    return a + b * bs


def _slope_change(curve: Curve | None) -> tuple[float, float, float, float] | None:
    """``(x_mid, x_end, slope before, slope after)`` for the two largest segments of ``curve`` when the
    slope grew or shrank by more than a fifth (and by more than 1 KiB per sample); else ``None``."""
    if curve is None or len(curve) < 3:
        return None
    (x0, y0), (x1, y1), (x2, y2) = curve[-3:]
    s0 = (y1 - y0) / (x1 - x0)
    s1 = (y2 - y1) / (x2 - x1)
    if abs(s1 - s0) > max(0.2 * max(abs(s0), abs(s1)), 1024.0):
        return x1, x2, s0, s1
    return None


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


def _linearity_notes(
    measurements: list[StepMeasurement], training: bool, inf: Curve | None
) -> tuple[str, ...]:
    """A note per mode whose peak did not grow linearly over the three largest measured sizes."""

    def step_peak(m: StepMeasurement) -> int | None:
        vals = [v for v in (m.forward_peak, m.backward_peak, m.step_peak) if v is not None]
        return max(vals) if vals else None

    curves = [("inference", inf)]
    if training:
        curves.insert(0, ("training", _curve([(m.batch_size, step_peak(m)) for m in measurements])))
    out = []
    for mode, curve in curves:
        bend = _slope_change(curve)
        if bend is None:
            continue
        mid, end, s0, s1 = bend
        out.append(
            f"the {mode} peak is not linear in the batch size: {fmt_bytes(max(s0, 0.0))} per sample up to "
            f"batch size {mid:g}, {fmt_bytes(max(s1, 0.0))} from there to {end:g}; larger sizes are "
            f"extrapolated from the last (measure closer to them for certainty)"
        )
    return tuple(out)


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
    fwd = _curve([(m.batch_size, m.forward_peak) for m in measurements])
    bwd = _curve([(m.batch_size, m.backward_peak) for m in measurements])
    opt = _curve([(m.batch_size, m.step_peak) for m in measurements])
    if measurements and all(m.saved_for_backward is not None for m in measurements):
        acts = _curve([(m.batch_size, m.saved_for_backward) for m in measurements])
    else:  # not measured: the growth over forward (saved tensors + outputs, less what existed before)
        acts = _curve(
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
    inf = _curve([(m.batch_size, m.inference_peak) for m in measurements])
    per_sample = 0.0 if acts is None else max(_segment(acts, acts[-1][0])[1], 0.0)
    notes = notes + _linearity_notes(measurements, training, inf)
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
