"""The memory model behind ``torchmem.estimate()``: measured small steps in, predicted peaks out (pure).

A training step's memory has a batch-independent part — parameters, gradients, optimizer state — and a
part that grows with the batch: activations saved for backward and the temporaries of each op. Each
phase of the step (forward, backward, optimizer step) has its own peak, each close to linear in the
batch size; the step's peak is the largest of them. :func:`build_estimate` fits one line per phase from
two measured batch sizes, extrapolates to the sizes asked for, and splits each predicted peak into
parameters, gradients, optimizer state, activations and temporaries, as they are live in the phase that
holds the peak. Activations (bytes saved for backward) are fitted the same way and reported in every training
row, also when the optimizer step holds the peak: they are freed by then, so they are not a part of that peak.

Pure arithmetic: a least-squares line per phase over the few measurements, then one row per batch size and
mode; no device is touched. The result types (:class:`StepMeasurement`, :class:`EstimateRow`,
:class:`MemoryEstimate`) live in :mod:`torchmem.results.fit` and are re-exported here.
"""

from __future__ import annotations

from torchmem._errors import TorchmemError
from torchmem.results.fit import EstimateRow, MemoryEstimate, StepMeasurement


class FitArgumentError(TorchmemError, ValueError):
    """``find_batch_size()`` or ``estimate()`` was given an argument it cannot use."""


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
