"""A self-contained HTML report of a capture: one file, no network (inline CSS, JS and SVG, no fonts).

The timeline is an SVG drawn here in Python; a few lines of inline JavaScript add a hover read-out. The
page's Content-Security-Policy forbids every fetch, so a report that tried to load anything would show it
as an error in the browser console (the browser test checks there are none). Every text from the capture
(holder paths, file names, messages) is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from torchmem._format import fmt_bytes
from torchmem.report._output import write_atomic
from torchmem.results.capture import (
    MODULE_LABELS,
    final_leak,
    fmt_seconds,
    module_rows,
    row_total,
    run_facts,
    source_words,
    step_time,
)
from torchmem.results.leaks import fmt_rate
from torchmem.results.ranks import end_words

if TYPE_CHECKING:
    from torchmem.results.capture import Capture, Sample
    from torchmem.results.leaks import LeakReport
    from torchmem.results.stats import BreakdownRow

_MAX_POINTS = 2000  # per series drawn; longer timelines keep each bucket's min and max


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _i(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ---------------------------------------------------------------------------------------------------------
# the timeline SVG


def _thin(points: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """At most about ``_MAX_POINTS`` points, keeping each bucket's lowest and highest reading."""
    if len(points) <= _MAX_POINTS:
        return points
    buckets = _MAX_POINTS // 2
    size = len(points) / buckets
    out: list[tuple[float, int]] = []
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(1, ticks)
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return float(m * mag)
    return float(10 * mag)


def _unit(peak: float) -> tuple[float, str]:
    for div, name in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if peak >= div:
            return float(div), name
    return 1.0, "B"


def _t_end(cap: Capture) -> float:
    """The right end of the time axis: the last thing recorded, or the run's duration."""
    times = [s.t for s in cap.samples] + [s.t for s in cap.steps] + [o.t for o in cap.ooms]
    t = max([*times, cap.duration or 0.0])
    return t if t > 0 else 1.0


def timeline_svg(cap: Capture, width: int = 960, height: int = 340) -> str:
    """The timeline of allocated, reserved and peak bytes, with step, leak and OOM markers, as SVG."""
    left, right, top, bottom = 64, 16, 16, 44
    pw, ph = width - left - right, height - top - bottom
    samples: Sequence[Sample] = cap.samples
    t_end = _t_end(cap)
    peak = float(max(cap.peak_allocated or 0, cap.peak_reserved or 0, 1))
    div, unit = _unit(peak)
    ystep = _nice_step(peak / div)
    ymax = ystep * (int(peak / div / ystep) + 1)

    def x(t: float) -> float:
        return left + pw * t / t_end

    def y(v: float) -> float:
        return top + ph * (1 - (v / div) / ymax)

    out = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="memory timeline">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot-bg"/>',
    ]
    # y grid and labels
    k = 0
    while k * ystep <= ymax + 1e-9:
        yy = top + ph * (1 - k * ystep / ymax)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>')
        out.append(
            f'<text x="{left - 6}" y="{yy + 4:.1f}" class="tick" text-anchor="end">{k * ystep:g}</text>'
        )
        k += 1
    out.append(
        f'<text x="14" y="{top + ph / 2:.1f}" class="axis" transform="rotate(-90 14 {top + ph / 2:.1f})" '
        f'text-anchor="middle">{unit}</text>'
    )
    # x ticks
    xstep = _nice_step(t_end, 8)
    k = 0
    while k * xstep <= t_end + 1e-9:
        xx = x(k * xstep)
        out.append(
            f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top + ph}" y2="{top + ph + 4}" class="axisline"/>'
        )
        out.append(
            f'<text x="{xx:.1f}" y="{top + ph + 16}" class="tick" text-anchor="middle">{k * xstep:g}</text>'
        )
        k += 1
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 6}" class="axis" text-anchor="middle">'
        "seconds since start</text>"
    )
    # step markers (at most ~60 drawn)
    if cap.steps:
        stride = max(1, len(cap.steps) // 60)
        out.append('<g class="steps">')
        for s in cap.steps[::stride]:
            out.append(
                f'<line x1="{x(s.t):.1f}" x2="{x(s.t):.1f}" y1="{top}" y2="{top + ph}" class="step">'
                f"<title>step {s.step} at {s.t:.3f} s: allocated {_e(fmt_bytes(s.allocated))}</title></line>"
            )
        out.append("</g>")
    # series
    series = [
        ("reserved", "reserved", [(s.t, s.reserved) for s in samples if s.reserved is not None]),
        ("allocated", "allocated", [(s.t, s.allocated) for s in samples if s.allocated is not None]),
        (
            "peak",
            "peak allocated",
            [(s.t, s.peak_allocated) for s in samples if s.peak_allocated is not None],
        ),
    ]
    for cls, label, pts in series:
        pts2 = _thin([(t, int(v)) for t, v in pts])
        if not pts2:
            continue
        d = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts2)
        out.append(f'<polyline class="series {cls}" points="{d}"><title>{_e(label)}</title></polyline>')
    # leak and OOM annotations
    leak = final_leak(cap)
    if leak is not None and leak.leaking:
        t = step_time(cap, leak.detected_at)
        if t is not None:
            out.append(
                f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{top + ph}" class="leak-mark"/>'
                f'<text x="{x(t) + 4:.1f}" y="{top + 12}" class="leak-label">leak found (step '
                f"{_e(leak.detected_at)})</text>"
            )
    for o in cap.ooms:
        at = f" at step {o.step}" if o.step is not None else ""
        out.append(
            f'<line x1="{x(o.t):.1f}" x2="{x(o.t):.1f}" y1="{top}" y2="{top + ph}" class="oom-mark">'
            f"<title>out of memory{_e(at)}, {o.t:.3f} s</title></line>"
            f'<text x="{x(o.t) - 4:.1f}" y="{top + 12}" class="oom-label" text-anchor="end">OOM</text>'
        )
    if cap.truncated and samples:
        xt = x(samples[-1].t)
        out.append(
            f'<line x1="{xt:.1f}" x2="{xt:.1f}" y1="{top}" y2="{top + ph}" class="cut-mark"/>'
            f'<text x="{xt - 4:.1f}" y="{top + ph - 6}" class="cut-label" text-anchor="end">file stops</text>'
        )
    if not samples:
        out.append(
            f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" class="axis">'
            "no timeline samples in this capture</text>"
        )
    out.append(
        f'<line id="cursor" x1="0" x2="0" y1="{top}" y2="{top + ph}" class="cursor" visibility="hidden"/>'
    )
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# sections


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str, num: Iterable[int] = ()) -> str:
    """A table; cells are HTML already (escape before). Columns in ``num`` are right-aligned figures."""
    nums = set(num)
    th = "".join(f"<th{' class=num' if i in nums else ''}>{h}</th>" for i, h in enumerate(head))
    body = []
    for r in rows:
        tds = "".join(f"<td{' class=num' if i in nums else ''}>{c}</td>" for i, c in enumerate(r))
        body.append(f"<tr>{tds}</tr>")
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _timeline_forecast(cap: Capture) -> str:
    """Under the timeline: where the line goes at the leak's rate."""
    leak = final_leak(cap)
    fc = cap.forecasts[-1].as_forecast() if cap.forecasts and leak is not None and leak.leaking else None
    return f'<p class="forecast">At this rate: {_e(fc.short())}.</p>' if fc is not None else ""


def _gpus(cap: Capture) -> str:
    """Every GPU the process used (its allocator's peaks per GPU), what they show, the child processes."""
    g = cap.gpus_report
    if g is None or not (g.several or g.findings or g.children):
        return ""
    rows = [
        [
            _e(r.device + (" (watched)" if r.watched else "")),
            _e(fmt_bytes(r.allocated)),
            _e(fmt_bytes(r.peak_allocated)),
            _e(fmt_bytes(r.reserved)),
            _e(fmt_bytes(r.process_used)),
        ]
        for r in g.rows
    ]
    table = (
        _table(
            ["GPU", "allocated", "peak allocated", "reserved", "process (NVML)"], rows, "gpus", (1, 2, 3, 4)
        )
        if rows
        else ""
    )
    items = "".join(f"<li>{_e(f.text)}. <b>Fix:</b> {_e(f.fix)}</li>" for f in g.findings)
    items += "".join(f"<li>child process {_e(c)}</li>" for c in g.children)
    return (
        '<section id="gpus"><h2>GPUs this process used</h2>'
        + table
        + (f"<ul>{items}</ul>" if items else "")
        + "</section>"
    )


def _breakdown_rows(rows: Sequence[BreakdownRow], depth: int = 0) -> list[list[str]]:
    out = []
    for r in rows:
        pad = f'<span class="indent" style="padding-left:{depth * 1.2:.1f}em"></span>'
        out.append([pad + _e(r.label), _e(fmt_bytes(r.bytes)), _e(r.note)])
        out += _breakdown_rows(r.children, depth + 1)
    return out


def _reconciliation(cap: Capture) -> str:
    parts = []
    for rec in cap.stats:
        bd = rec.as_breakdown()
        st = rec.as_stats()
        moment = f"the {rec.when} of the run" if rec.when in ("start", "end") else f"{rec.when}()"
        title = f"At {_e(moment)} ({rec.t:.2f} s)"
        block = [f"<h3>{title}</h3>"]
        if bd is not None:
            rows = _breakdown_rows(bd.process)
            if bd.platform != "cpu":
                rows.append(["= this process (nvidia-smi process row)", _e(fmt_bytes(bd.process_used)), ""])
                for p in bd.other_processes or ():
                    name = f"+ other process {p.pid}" + (f" ({p.name})" if p.name else "")
                    rows.append([_e(name), _e(fmt_bytes(p.used)), ""])
                rows.append(["+ not attributed to any process", _e(fmt_bytes(bd.unattributed)), ""])
                rows.append(["= device used (nvidia-smi Memory-Usage)", _e(fmt_bytes(bd.device_used)), ""])
            else:
                rows.append(["machine memory used (all processes)", _e(fmt_bytes(bd.device_used)), ""])
            total = "of machine total" if bd.platform == "cpu" else "of device total"
            rows.append([total, _e(fmt_bytes(bd.device_total)), ""])
            block.append(_table(["", "bytes", "note"], rows, "reconcile", num=[1]))
            block += [f'<p class="note">{_e(n)}</p>' for n in bd.notes]
        if st is not None:
            from torchmem.results.stats import stats_rows

            block.append(
                "<details><summary>All figures</summary>"
                + _table(["figure", "value"], [[_e(a), _e(b)] for a, b in stats_rows(st)], "figures", [1])
                + "</details>"
            )
        if bd is None and st is None:
            block.append('<p class="note">recorded, but not in a form this torchmem reads</p>')
        parts.append("\n".join(block))
    if not parts:
        return '<p class="none">No stats reading was recorded.</p>'
    return "\n".join(parts)


def _rate(b: float) -> str:
    return ("+" if b >= 0 else "-") + fmt_bytes(int(abs(b))) + "/step"


def _leaks(cap: Capture, leak: LeakReport | None) -> str:
    if leak is not None and leak.unit == "s":
        return _leaks_per_second(cap, leak)
    return _leaks_of(cap, leak)


def _leaks_per_second(cap: Capture, leak: LeakReport) -> str:
    """A timeline verdict (no repeating step): its figures are per second, over seconds of the run."""
    rate = fmt_rate(leak.bytes_per_step, "s")
    if leak.leaking:
        head = (
            f'<p class="verdict bad">Leak on {_e(leak.device)}: {_e(rate)} over {leak.steps} s of the '
            "timeline</p>"
        )
    else:
        head = f'<p class="verdict">No leak over {leak.steps} s of the timeline: {_e(leak.reason)}</p>'
    out = [head]
    fc = cap.forecasts[-1].as_forecast() if cap.forecasts and leak.leaking else None
    if fc is not None:
        out.append(f'<p class="verdict bad" id="forecast">When it runs out: {_e(str(fc))}</p>')
    for c in leak.culprits:
        out.append(f"<pre>{_e(chr(10).join(c.lines(unit='s')))}</pre>")
    out += [f'<p class="note">{_e(n)}</p>' for n in leak.notes]
    return "\n".join(out)


def _leaks_of(cap: Capture, leak: LeakReport | None) -> str:
    if leak is None:
        return (
            '<p class="none">No leak verdict was recorded.</p>'
            if not cap.leaks
            else ('<p class="none">A leak verdict was recorded, but not in a form this torchmem reads.</p>')
        )
    if leak.leaking:
        head = (
            f'<p class="verdict bad">Leak on {_e(leak.device)}: {_e(_rate(leak.bytes_per_step))} over '
            f"{leak.steps} steps (confidence {leak.confidence:.2f}, found at step {_e(leak.detected_at)})</p>"
        )
    elif leak.verdict == "inner_growth":
        head = (
            f'<p class="verdict bad">The peak grows inside each call over {leak.steps} steps: '
            f"{_e(leak.reason)}</p>"
        )
    elif leak.stopped_at is not None:
        head = (
            f'<p class="verdict">Growth seen at step {_e(leak.detected_at)} stopped at step '
            f"{_e(leak.stopped_at)} ({leak.steps} steps).</p>"
        )
    elif leak.verdict == "gathered":
        head = f'<p class="verdict">Results gathered over {leak.steps} steps: {_e(leak.reason)}</p>'
    elif leak.verdict == "below_threshold":
        head = (
            f'<p class="verdict">Growth below the leak threshold over {leak.steps} steps: '
            f"{_e(leak.reason)}</p>"
        )
    elif leak.verdict in ("too_few", "no_steps", "noisy"):
        head = f'<p class="verdict">No verdict over {leak.steps} steps: {_e(leak.reason)}</p>'
    else:
        head = f'<p class="verdict good">No leak over {leak.steps} steps: {_e(leak.reason)}</p>'
    out = [head]
    fc = cap.forecasts[-1].as_forecast() if cap.forecasts and leak.leaking else None
    if fc is not None:
        out.append(f'<p class="verdict bad" id="forecast">When it runs out: {_e(str(fc))}</p>')
    if leak.leaking and leak.reason:
        out.append(f"<p>{_e(leak.reason)}</p>")
    if leak.culprits:
        rows = []
        for c in leak.culprits:
            sites = "<br>".join(f"<code>{_e(s)}</code> {_e(_rate(b))}" for s, b in c.sites[:4]) or (
                f"<code>{_e(c.site or 'unknown')}</code>"
            )
            rows.append(
                [
                    _e(c.kind.replace("_", " ")),
                    sites,
                    f'<code class="holder">{_e(c.holder or "no path found")}</code>',
                    _e(_rate(c.bytes_per_step))
                    + (f"<br><small>graph {_e(_rate(c.graph_bytes))}</small>" if c.graph_bytes else ""),
                    _e(c.fix),
                ]
            )
        out.append(_table(["kind", "allocated at", "held by", "growth", "fix"], rows, "culprits", [3]))
    elif leak.leaking:
        out.append(
            '<p class="note">No allocation site was attributed (yet) when this verdict was written.</p>'
        )
    out += [f'<p class="note">{_e(n)}</p>' for n in leak.notes]
    return "\n".join(out)


def _ooms(cap: Capture) -> str:
    if not cap.ooms:
        return '<p class="none">The run did not run out of memory.</p>'
    out = []
    for o in cap.ooms:
        at = f" at step {o.step}" if o.step is not None else ""
        d = o.as_diagnosis()
        out.append(f"<h3>Out of memory{_e(at)}, {o.t:.2f} s into the run</h3>")
        if d is None:
            out.append('<p class="note">diagnosis recorded, but not in a form this torchmem reads</p>')
            continue
        p = d.parsed
        if p is not None:
            bits = []
            if p.requested is not None:
                bits.append(f"requested {fmt_bytes(p.requested)}")
            if p.source:
                bits.append(f"raised by {p.source}")
            if p.device_index is not None:
                bits.append(f"GPU {p.device_index}")
            if bits:
                out.append(f"<p>{_e(', '.join(bits))}</p>")
            if p.text:
                out.append(f'<pre class="message">{_e(p.text)}</pre>')
        if d.causes:
            out.append('<ol class="causes">')
            for c in d.causes:
                ev = "".join(f"<li>{_e(e)}</li>" for e in c.evidence)
                out.append(
                    f'<li><span class="conf {_e(c.confidence)}">{_e(c.confidence)}</span> '
                    f"<b>{_e(c.kind.replace('_', ' '))}</b>: {_e(c.summary)}"
                    + (f"<ul>{ev}</ul>" if ev else "")
                    + "</li>"
                )
            out.append("</ol>")
        if d.holders is not None:
            out.append(f'<pre class="holders">{_e(chr(10).join(d.holders.lines()))}</pre>')
        if d.fixes:
            out.append('<h4>Fixes</h4><ul class="fixes">')
            for f in d.fixes:
                setting = f"<pre>{_e(f.setting)}</pre>" if f.setting else ""
                out.append(f"<li>{_e(f.text)}{setting}</li>")
            out.append("</ul>")
        out += [f'<p class="note">{_e(n)}</p>' for n in d.notes]
    return "\n".join(out)


def _modules(cap: Capture) -> str:
    rows, notes = module_rows(cap)
    if not rows:
        return '<p class="none">No per-module profile was recorded (<code>torchmem run --modules</code>).</p>'
    body = []
    for r in rows:
        body.append(
            [f"<code>{_e(r.get('module', '?'))}</code>"]
            + [_e(fmt_bytes(_i(r.get(k)))) for k, _ in MODULE_LABELS]
            + [_e(fmt_bytes(row_total(r)))]
        )
    head = ["module"] + [label for _, label in MODULE_LABELS] + ["held (params+grads+state+act.)"]
    out = [_table(head, body, "modules", range(1, len(head)))]
    out += [f'<p class="note">{_e(n)}</p>' for n in notes]
    return "\n".join(out)


_CSS = """
:root{--fg:#1d2330;--muted:#5b6473;--line:#d9dee7;--bg:#fff;--panel:#f6f8fb;--blue:#2f6fb3;
--orange:#e8894a;--red:#c0392b;--purple:#8e44ad;--green:#23804a}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
color:var(--fg);background:var(--bg)}
main{max-width:1100px;margin:0 auto;padding:20px 24px 60px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;padding-bottom:4px;
border-bottom:1px solid var(--line)}h3{font-size:14px;margin:16px 0 6px}h4{margin:10px 0 4px}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--panel);padding:8px 10px;border-radius:4px;white-space:pre-wrap;word-break:break-word}
.sub{color:var(--muted);margin:0 0 12px}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:12px 0}
.facts dt{color:var(--muted)}.facts dd{margin:0;word-break:break-word}
.badges span{display:inline-block;padding:2px 9px;border-radius:10px;margin-right:6px;font-size:12px;
font-weight:600;color:#fff}
.b-leak,.b-oom,.b-killed{background:var(--red)}.b-ok{background:var(--green)}.b-info{background:var(--muted)}
.warning{background:#fff4e5;border:1px solid #f0b46a;padding:8px 12px;border-radius:4px;margin:12px 0}
table{border-collapse:collapse;width:100%;margin:6px 0 10px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:var(--panel);font-weight:600}.num{text-align:right;white-space:nowrap}
table.reconcile td:first-child,table.figures td:first-child{white-space:nowrap}
code.holder{overflow-wrap:anywhere}
table.culprits{table-layout:fixed}table.culprits th:nth-child(1){width:10%}
table.culprits th:nth-child(2){width:20%}table.culprits th:nth-child(3){width:32%}
table.culprits th:nth-child(4){width:12%}table.culprits td{overflow-wrap:anywhere}
table.culprits td.num{white-space:normal}
.verdict{font-weight:600}.bad{color:var(--red)}.good{color:var(--green)}
.note,.none{color:var(--muted)}
.conf{display:inline-block;min-width:4.5em;text-align:center;border-radius:3px;font-size:12px;
background:var(--panel);border:1px solid var(--line)}
.conf.high{border-color:var(--red);color:var(--red)}
.legend span{margin-right:16px;font-size:13px}.legend i{display:inline-block;width:18px;height:3px;
vertical-align:middle;margin-right:5px}
#readout{font:12.5px ui-monospace,Menlo,Consolas,monospace;color:var(--muted);min-height:1.4em}
svg .plot-bg{fill:#fbfcfe;stroke:var(--line)}svg .grid{stroke:#e9edf3}
svg .tick{font-size:11px;fill:var(--muted)}
svg .axis{font-size:12px;fill:var(--muted)}svg .axisline{stroke:var(--muted)}
svg .step{stroke:#dde2ea;stroke-width:1}
svg .series{fill:none;stroke-width:1.8;stroke-linejoin:round}
svg .allocated{stroke:var(--blue)}svg .reserved{stroke:var(--orange)}
svg .peak{stroke:#888;stroke-dasharray:5 4;stroke-width:1.1}
svg .leak-mark{stroke:var(--purple);stroke-dasharray:3 3;stroke-width:1.5}
svg .leak-label{fill:var(--purple);font-size:11px}
svg .oom-mark{stroke:var(--red);stroke-width:2}svg .oom-label{fill:var(--red);font-size:12px;font-weight:700}
svg .cut-mark{stroke:var(--red);stroke-dasharray:6 3}svg .cut-label{fill:var(--red);font-size:11px}
svg .cursor{stroke:#333;stroke-width:.8}
footer{margin-top:40px;color:var(--muted);font-size:12px}
"""

_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var svg = document.getElementById("timeline");
  var out = document.getElementById("readout");
  var cursor = document.getElementById("cursor");
  if (!svg || !out || !cursor || !data.t.length) { return; }
  function fmt(b) {
    if (b === null) { return "n/a"; }
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i += 1; }
    return (i === 0 ? String(b) : b.toFixed(2)) + " " + u[i];
  }
  svg.addEventListener("mousemove", function (ev) {
    var box = svg.getBoundingClientRect();
    var vx = (ev.clientX - box.left) * data.width / box.width;
    var t = (vx - data.left) / data.plotWidth * data.tEnd;
    var lo = 0, hi = data.t.length - 1;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (data.t[mid] < t) { lo = mid + 1; } else { hi = mid; } }
    if (lo > 0 && Math.abs(data.t[lo - 1] - t) < Math.abs(data.t[lo] - t)) { lo -= 1; }
    var x = data.left + data.t[lo] / data.tEnd * data.plotWidth;
    cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
    cursor.setAttribute("visibility", "visible");
    out.textContent = data.t[lo].toFixed(3) + " s" +
      (data.step[lo] === null ? "" : "  step " + data.step[lo]) +
      "  allocated " + fmt(data.allocated[lo]) + "  reserved " + fmt(data.reserved[lo]);
  });
  svg.addEventListener("mouseleave", function () { cursor.setAttribute("visibility", "hidden"); });
})();
"""


def _script_json(obj: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _timeline_data(cap: Capture, width: int = 960) -> dict[str, Any]:
    left, right = 64, 16
    t_end = _t_end(cap)
    idx = range(len(cap.samples))
    if len(cap.samples) > 5000:
        stride = len(cap.samples) // 5000 + 1
        idx = range(0, len(cap.samples), stride)
    ss = [cap.samples[i] for i in idx]
    return {
        "width": width,
        "left": left,
        "plotWidth": width - left - right,
        "tEnd": t_end,
        "t": [round(s.t, 4) for s in ss],
        "step": [s.step for s in ss],
        "allocated": [s.allocated for s in ss],
        "reserved": [s.reserved for s in ss],
    }


def render_html(cap: Capture) -> str:
    """The whole report as one HTML document (no external resources).

    Example:
        >>> page = render_html(read_capture("run.jsonl"))  # doctest: +SKIP
    """
    from torchmem._version import __version__

    f = run_facts(cap)
    leak = final_leak(cap)
    name = os.path.basename(cap.path)
    badges = []
    if leak is not None and leak.leaking:
        badges.append('<span class="b-leak">LEAK</span>')
    elif leak is not None:
        badges.append('<span class="b-ok">no leak</span>')
    if cap.ooms:
        badges.append('<span class="b-oom">OOM</span>')
    if not cap.finished:
        badges.append('<span class="b-killed">not finished</span>')
    elif cap.end is not None and cap.end.reason != "oom":
        code = "" if cap.end.exit_code is None else f" {cap.end.exit_code}"
        badges.append(
            f'<span class="b-info">{_e(end_words(cap.end.reason, cap.end.exit_code) + code)}</span>'
        )

    warning = ""
    if cap.truncated:
        warning = (
            f'<div class="warning" id="truncated"><b>Incomplete file:</b> {_e(cap.truncated)}. This report '
            "shows everything recorded before that point.</div>"
        )
    facts = [
        ("program", f"<code>{_e(f.program)}</code>"),
        ("device", _e(f.device)),
        ("figures from", _e(source_words(f.source))),
        ("started", _e(f.started)),
        ("duration", _e(fmt_seconds(f.seconds))),
        ("steps", _e("n/a" if f.steps is None else f.steps)),
        ("ended", _e(f.ended)),
        ("peak allocated", _e(fmt_bytes(cap.peak_allocated))),
        ("peak reserved", _e(fmt_bytes(cap.peak_reserved))),
        ("recorded", _e(f"{len(cap.samples)} samples, {len(cap.steps)} step markers")),
        ("versions", _e(f.versions)),
    ]
    legend = (
        '<div class="legend"><span><i style="background:#2f6fb3"></i>allocated</span>'
        '<span><i style="background:#e8894a"></i>reserved</span>'
        '<span><i style="background:#888"></i>peak allocated</span>'
        '<span><i style="background:#dde2ea"></i>step</span>'
        '<span><i style="background:#8e44ad"></i>leak found</span>'
        '<span><i style="background:#c0392b"></i>OOM</span></div>'
    )
    notes = "".join(f"<li>{n.t:.2f} s: {_e(n.text)}</li>" for n in cap.notes)
    if cap.unknown:
        kinds = ", ".join(sorted({str(u.get("type")) for u in cap.unknown}))
        notes += f"<li>{len(cap.unknown)} record(s) of types this torchmem does not know: {_e(kinds)}</li>"
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="torchmem {_e(__version__)}">
<title>torchmem report: {_e(name)}</title>
<style>{_CSS}</style>
</head>
<body>
<main>
<h1>torchmem report</h1>
<p class="sub">{_e(name)} &middot; <span class="badges">{"".join(badges)}</span></p>
{warning}
<dl class="facts">{"".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)}</dl>
<section id="timeline-section">
<h2>Timeline</h2>
{legend}
{timeline_svg(cap)}
{_timeline_forecast(cap)}
<div id="readout">Move the pointer over the timeline to read the figures.</div>
</section>
<section id="leaks">
<h2>Leaks</h2>
{_leaks(cap, leak)}
</section>
<section id="oom">
<h2>Out of memory</h2>
{_ooms(cap)}
</section>
{_gpus(cap)}
<section id="reconciliation">
<h2>Where the memory goes (nvidia-smi reconciliation)</h2>
{_reconciliation(cap)}
</section>
<section id="modules">
<h2>Per-module memory</h2>
{_modules(cap)}
</section>
{f'<section id="notes"><h2>Notes</h2><ul>{notes}</ul></section>' if notes else ""}
<footer>Generated by torchmem {_e(__version__)} from {_e(cap.path)}. Self-contained: no network
needed.</footer>
</main>
<script type="application/json" id="timeline-data">{_script_json(_timeline_data(cap))}</script>
<script>{_JS}</script>
</body>
</html>
"""


def write_html(cap: Capture, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the self-contained HTML report of ``cap`` at ``path`` (whole or not at all).

    Args:
        cap: A capture from :func:`torchmem.capture.file.read_capture`.
        path: The HTML file to create.
        force: Replace an existing HTML report that torchmem wrote (never any other file).

    Returns:
        The absolute path written.

    Raises:
        OutputError: the path cannot be written (missing folder, a folder, no permission).

    Example:
        >>> write_html(read_capture("run.jsonl"), "report.html")  # doctest: +SKIP
    """
    page = render_html(cap).encode("utf-8")

    def write(f: IO[bytes]) -> None:
        f.write(page)

    return write_atomic(path, write, what="HTML report", kind="html", force=force)


__all__ = ["render_html", "timeline_svg", "write_html"]
