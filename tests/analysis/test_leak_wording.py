"""One wording per fact in leak reports (issue 25): a timeline verdict speaks per second, never of steps; a
fix speaks of CPU tensors on the CPU and never suggests `.cpu()` copies there; the line for a run with 0 steps
never denies the verdict printed above it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import torchmem
from torchmem.analysis.holders import find_holders
from torchmem.analysis.leaks import (
    KINDS,
    attribute,
    fix_for,
    timeline_growth,
    timeline_report,
)
from torchmem.results.leaks import LeakReport, SiteGrowth, no_steps_text

MiB = 1 << 20


def _points(rate_per_s: float, seconds: float = 3.0, start: int = 92 * MiB) -> list[tuple[float, int]]:
    """A sampled timeline every 125 ms (exact in binary), growing by ``rate_per_s``."""
    n = int(seconds / 0.125) + 1
    return [(0.25 + 0.125 * i, start + int(rate_per_s * 0.125 * i)) for i in range(n)]


def _timeline_leak(keep: list[torch.Tensor]) -> LeakReport:
    pts = _points(45 * MiB)
    g = timeline_growth(pts)
    assert g is not None and g.leaking
    paths = find_holders([keep[0]]).paths[0]
    fact = SiteGrowth(None, g.bytes_per_step, 4 * MiB, len(keep), 1.0, paths)
    culprits = attribute([fact], unit="s", device="cpu")
    return timeline_report(pts, g, device="cpu", source="heap", culprits=culprits, notes=("per second",))


def test_a_timeline_verdict_speaks_per_second_of_cpu_tensors() -> None:
    keep = [torch.ones(256, 1024) for _ in range(4)]
    r = _timeline_leak(keep)
    text = str(r)
    lines = text.splitlines()
    assert lines[0].startswith("LEAK on cpu: +45.00 MiB/s over 3 s of the timeline"), lines[0]
    assert lines[1] == "  heap figure: 92.00 MiB at 0 s -> 227.00 MiB at 3 s of the sampled timeline", lines[
        1
    ]
    (c,) = r.culprits
    assert c.kind == "device_accumulation" and "keep" in (c.holder or "")
    assert c.fix.startswith("`keep` accumulates CPU tensors (+45.0 MiB/s): keep numbers")
    # Nothing about steps, warm-up or devices: the verdict is per second, of CPU memory.
    for wrong in ("/step", "at step", "warm-up", "every step", "device tensors", ".cpu()"):
        assert wrong not in text, (wrong, text)
    assert LeakReport.from_dict(r.to_dict()) == r and str(LeakReport.from_dict(r.to_dict())) == text


def test_a_step_verdict_keeps_its_step_words_and_the_device_wording_off_the_cpu() -> None:
    history = [torch.zeros(1) for _ in range(6)]
    (c,) = attribute([SiteGrowth("t.py:3", float(MiB), 6 * MiB, 6, 1.0, find_holders([history[5]]).paths[0])])
    r = LeakReport(
        "cuda:0",
        "allocator",
        "light",
        20,
        3,
        True,
        float(MiB),
        1.0,
        8,
        None,
        "grew",
        (c,),
        ((1, 0), (20, MiB)),
    )
    text = str(r)
    assert "LEAK on cuda:0: +1.00 MiB/step over 20 steps" in text
    assert "allocator figure: 0 B at step 1 -> 1.00 MiB at step 20 (warm-up 3 steps, light mode)" in text
    assert c.fix.startswith("`history` accumulates device tensors every step (+1.0 MiB/step)")
    assert "`.cpu()` copies" in c.fix and "/s)" not in text


def test_fixes_follow_the_device_and_the_unit() -> None:
    for k in KINDS:
        cpu = fix_for(k, "x", MiB, ("Node",), device="cpu")
        assert ".cpu()" not in cpu and "device tensors" not in cpu and "device memory" not in cpu, (k, cpu)
        per_s = fix_for(k, "x", MiB, ("Node",), unit="s", device="cpu")
        assert "+1.0 MiB/s" in per_s and "/step" not in per_s and " step" not in per_s.split(":")[0], (
            k,
            per_s,
        )
        gpu = fix_for(k, "x", MiB, ("Node",), device="cuda:0")
        assert gpu == fix_for(k, "x", MiB, ("Node",))
        assert "+1.0 MiB/step" in gpu or "(1.0 MiB each)" in gpu, (k, gpu)
    assert "device tensors" in fix_for("device_accumulation", "x", MiB, device="cuda:0")
    assert "`.detach()` (`.cpu()`)" in fix_for("retained_graph", "x", MiB, device="cuda:1")
    assert fix_for("retained_graph", "x", MiB, device="cpu").endswith("or `.detach()` what you keep")


def test_a_watch_on_the_cpu_names_cpu_tensors_in_its_fix() -> None:
    model = torch.nn.Linear(64, 64)
    kept = []
    w = torchmem.watch(range(12), device="cpu", warn=False, min_bytes_per_step=16 * 1024)
    for _ in w:
        kept.append(model(torch.randn(128, 64)).detach())  # 32 KiB per step, kept
    r = w.report()
    assert r.leaking and r.culprits, str(r)
    fix = r.culprits[0].fix
    assert "CPU tensors" in fix and ".cpu()" not in fix and "device" not in fix, fix


def test_timeline_reasons_other_than_a_leak_speak_per_second() -> None:
    flat = timeline_growth(_points(0.0))
    slow = timeline_growth(_points(512 * 1024))  # below the 1 MiB/s threshold, 1.5 MiB in all: not large
    falling = timeline_growth(_points(-8 * MiB, start=400 * MiB))
    assert flat is not None and slow is not None and falling is not None
    assert (flat.verdict, slow.verdict, falling.verdict) == ("flat", "below_threshold", "shrinking")
    assert slow.reason.startswith(
        "the figure grows by 512.00 KiB/s over the last 3 s of the sampled timeline"
    )
    assert "below the timeline's leak threshold of 1.00 MiB/s" in slow.reason
    assert "falls by 8.00 MiB/s" in falling.reason
    for g in (flat, slow, falling):
        assert not g.leaking and "step" not in g.reason and "min_bytes_per_step" not in g.reason, g.reason
    assert timeline_growth(_points(45 * MiB)[:7]) is None  # too few readings: no timeline verdict


def test_the_zero_steps_line_never_denies_the_verdict_above_it() -> None:
    why = "no repeating step was found"
    leak = _timeline_leak([torch.ones(256, 1024)])
    assert no_steps_text(leak, why) == f"0 steps: {why}"
    assert "no leak verdict" not in no_steps_text(leak, why)
    flat_g = timeline_growth(_points(0.0))
    assert flat_g is not None
    flat = timeline_report(_points(0.0), flat_g, device="cpu", source="heap")
    first, second = no_steps_text(flat, why).splitlines()
    assert first.startswith("no leak on cpu over 3 s of the timeline: flat") and second == f"0 steps: {why}"
    # Without a timeline verdict (too short a run, or steps counted by --step-marker), there is none.
    assert no_steps_text(None, why) == f"no leak verdict: 0 steps: {why}"
    steps = LeakReport(
        "cpu", "heap", "light", 0, 3, False, 0.0, 0.0, None, None, "none", (), (), verdict="no_steps"
    )
    assert no_steps_text(steps, why) == f"no leak verdict: 0 steps: {why}"


def test_each_site_line_shows_its_own_share_and_the_total_is_labelled() -> None:
    kept = []
    w = torchmem.watch(range(14), device="cpu", warn=False, min_bytes_per_step=64 * 1024)
    for _ in w:
        a = torch.ones(256, 256)  # 256 KiB per step
        b = torch.ones(128, 256)  # 128 KiB per step
        kept.append((a, b))
    r = w.report()
    (c,) = r.culprits
    assert [(s.rsplit(":", 1)[0].endswith("test_leak_wording.py"), per) for s, per in c.sites] == [
        (True, 256.0 * 1024),
        (True, 128.0 * 1024),
    ]
    text = str(r)
    (first,) = [line for line in text.splitlines() if line.startswith("  [1] ")]
    assert (
        first
        == f"  [1] device_accumulation: +384.00 KiB/step in all; +256.00 KiB/step born at {c.sites[0][0]}"
    )
    assert f"      also born at {c.sites[1][0]}: +128.00 KiB/step" in text.splitlines()
    assert f"+384.00 KiB/step born at {c.sites[0][0]}" not in text  # the total is never a site's share
    d = c.to_dict()
    assert [s["bytes_per_step"] for s in d["sites"]] == [256.0 * 1024, 128.0 * 1024]


def test_a_single_site_line_is_the_culprits_own_rate() -> None:
    from torchmem.results.leaks import Culprit

    one = Culprit(
        "cache", "t.py:12", (("t.py:12", float(MiB)),), "__main__.cache['k3']", MiB, float(MiB), 0.0, "f"
    )
    assert one.lines()[0] == "cache: +1.00 MiB/step born at t.py:12"
    none = Culprit("cache", None, (), None, MiB, float(MiB), 0.0, "f")  # stored before sites were recorded
    assert none.lines()[0] == "cache: +1.00 MiB/step born at an unknown site"
    many = Culprit(
        "cache",
        "a.py:1",
        tuple((f"a.py:{i}", float(MiB)) for i in range(1, 7)),
        None,
        MiB,
        6.0 * MiB,
        0.0,
        "f",
    )
    lines = many.lines("s")
    assert lines[0] == "cache: +6.00 MiB/s in all; +1.00 MiB/s born at a.py:1"
    assert lines[1:5] == [
        "  also born at a.py:2: +1.00 MiB/s",
        "  also born at a.py:3: +1.00 MiB/s",
        "  also born at a.py:4: +1.00 MiB/s",
        "  also born at 2 more sites: +2.00 MiB/s",
    ]


def test_the_leak_warning_on_the_cpu_speaks_of_memory_not_device_memory() -> None:
    from torchmem.capture.watch import LeakWarning

    kept = []
    with pytest.warns(LeakWarning) as caught:
        for _ in torchmem.watch(range(12), device="cpu", min_bytes_per_step=64 * 1024):
            kept.append(torch.ones(256, 256))
    (msg,) = [str(w.message) for w in caught if issubclass(w.category, LeakWarning)]
    # (the CPU's default figure, the C heap: the tensors' 256 KiB and what malloc and the list add)
    assert re.match(r"torchmem: memory grows by 25[6-9]\.\d\d KiB/step on cpu", msg), msg
    assert "device memory" not in msg


def _validate(model: torch.nn.Module) -> LeakReport:
    val_losses = []  # the holder: a local of this function
    w = torchmem.watch(device="cpu", optimizer_steps=True, warn=False, min_bytes_per_step=64 * 1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with w:
        for _ in range(12):
            val_losses.append(model(torch.randn(128, 128)).square().mean())  # kept with its graph
            opt.step()  # the step ends here: the frame is at this line when the holders are searched
    return w.report()


def test_a_local_holder_is_named_by_its_function_and_variable_not_the_frames_current_line() -> None:
    r = _validate(torch.nn.Linear(128, 128))
    assert r.leaking and r.culprits, str(r)
    holder = r.culprits[0].holder or ""
    assert holder.startswith("_validate() in test_leak_wording.py, local 'val_losses'["), holder
    code = _validate.__code__
    lines = Path(code.co_filename).read_text().splitlines()[code.co_firstlineno - 1 :]
    step_line = next(code.co_firstlineno + i for i, line in enumerate(lines) if "opt.step()" in line)
    assert f":{step_line}" not in holder and "test_leak_wording.py:" not in holder


def test_timeline_growth_that_began_late_is_judged_on_the_second_half() -> None:
    """A program whose loop starts after 1.5 s of imports and set-up (a plateau first), then keeps 200 MiB/s:
    the whole timeline reads 'no sustained growth' (the plateau's quarter does not rise), its second half is
    a leak. Growth that stopped, or noise, stays quiet."""
    from torchmem.analysis.leaks import timeline_growth

    mib = 1 << 20
    plateau = [(0.05 * i, 100 * mib + (i % 3) * mib // 4) for i in range(30)]
    rising = [(1.5 + 0.05 * i, 100 * mib + int(10 * mib * i * (1 + 0.1 * (i % 2)))) for i in range(24)]
    late = plateau + rising
    g = timeline_growth(late)
    assert g is not None and g.leaking and "it began late" in g.reason, g
    assert abs(g.bytes_per_step - 200 * mib) < 40 * mib
    stopped = [(0.05 * i, 100 * mib + 10 * mib * min(i, 30)) for i in range(60)]
    s = timeline_growth(stopped)
    assert s is not None and not s.leaking and "began late" not in s.reason
    wobble = [(0.05 * i, 100 * mib + (i * 7919 % 13) * 4 * mib) for i in range(60)]
    w = timeline_growth(wobble)
    assert w is not None and not w.leaking
