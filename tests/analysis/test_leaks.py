"""The pure leak analysis: growth detection on series, holder names, per-site growth, culprit kinds."""

from __future__ import annotations

import random

import pytest

from torchmem.analysis.leaks import (
    KINDS,
    LeakReport,
    SiteGrowth,
    attribute,
    detect_growth,
    fix_for,
    holder_name,
    holder_pattern,
    site_growth,
    suggested_threshold,
)

MiB = 1 << 20


def _steps(n: int) -> list[int]:
    return list(range(4, 4 + n))


def test_a_steady_leak_is_found_in_five_readings() -> None:
    ys = [10 * MiB + i * MiB for i in range(5)]
    g = detect_growth(_steps(5), ys)
    assert g.leaking and g.method == "steady" and g.bytes_per_step == MiB and g.confidence == 1.0
    assert not detect_growth(_steps(4), ys[:4]).leaking  # four readings are not enough


def test_a_steady_leak_read_every_other_step_is_per_step() -> None:
    steps = list(range(4, 14, 2))
    g = detect_growth(steps, [i * 2 * MiB for i in range(5)])
    assert g.leaking and g.bytes_per_step == MiB


@pytest.mark.parametrize(
    "ys",
    [
        [MiB] * 12,  # flat
        [MiB, 40 * MiB] + [40 * MiB] * 10,  # one-time jump (optimizer state)
        [i * MiB for i in range(4)] + [4 * MiB] * 12,  # a bounded cache that filled up
        [MiB if i % 4 else 30 * MiB for i in range(24)],  # periodic spikes
        [MiB * (i % 5) for i in range(24)],  # sawtooth, no trend
        [MiB * 100 - i * MiB for i in range(12)],  # shrinking
    ],
)
def test_controls_are_not_leaks(ys: list[int]) -> None:
    assert not detect_growth(_steps(len(ys)), ys).leaking


def test_noise_never_fires_over_many_random_series() -> None:
    rng = random.Random(1)
    fired = 0
    for _ in range(300):
        ys = [50 * MiB + rng.randint(0, 8 * MiB) for _ in range(32)]
        for k in range(5, 33):
            fired += detect_growth(_steps(k), ys[:k]).leaking
    assert fired == 0


def test_a_noisy_leak_is_found_by_the_robust_test() -> None:
    rng = random.Random(2)
    ys = [50 * MiB + i * MiB + rng.randint(0, 6 * MiB) for i in range(32)]
    g = detect_growth(_steps(32), ys)
    assert g.leaking and g.method == "robust"
    assert 0.5 * MiB < g.bytes_per_step < 1.5 * MiB


def test_below_the_threshold_is_not_a_leak() -> None:
    ys = [i * 1024 for i in range(10)]
    assert not detect_growth(_steps(10), ys).leaking
    assert detect_growth(_steps(10), ys, min_bytes_per_step=512).leaking


def test_steady_growth_below_the_threshold_is_said_with_the_threshold_that_reports_it() -> None:
    ys = [10 * MiB + i * 64 * 1024 for i in range(12)]
    g = detect_growth(_steps(12), ys)
    assert not g.leaking and g.bytes_per_step == 0
    assert g.verdict == "below_threshold" and g.trend_per_step == 64 * 1024
    assert g.reason == (
        "memory grows by 64.00 KiB/step, below the reporting threshold of 256.00 KiB/step "
        "(min_bytes_per_step=262144): pass min_bytes_per_step=32768 to report it as a leak and name its "
        "allocation site and holder"
    )
    again = detect_growth(_steps(12), ys, min_bytes_per_step=suggested_threshold(g.trend_per_step))
    assert again.leaking and again.bytes_per_step == 64 * 1024


def test_noisy_growth_below_the_threshold_is_found_by_the_robust_test() -> None:
    rng = random.Random(3)
    ys = [50 * MiB + i * 64 * 1024 + rng.randint(0, 256 * 1024) for i in range(32)]
    g = detect_growth(_steps(32), ys)
    assert not g.leaking and g.verdict == "below_threshold"
    assert 48 * 1024 < g.trend_per_step < 80 * 1024


@pytest.mark.parametrize(
    ("ys", "verdict", "words"),
    [
        ([MiB] * 12, "flat", "flat: the figure stayed within 0 B"),
        ([MiB, 40 * MiB] + [40 * MiB] * 10, "flat", "after a one-time rise of 39.00 MiB"),
        ([i * MiB for i in range(4)] + [4 * MiB] * 12, "flat", "flat for the last 12 readings"),
        ([MiB if i % 4 else 30 * MiB for i in range(24)], "noisy", "no sustained growth"),
        ([MiB * (i % 5) for i in range(9)], "noisy", "the noise-robust test needs 16 readings, there were 9"),
        ([MiB * 100 - i * MiB for i in range(12)], "shrinking", "1.00 MiB/step"),
        ([MiB, 2 * MiB, 3 * MiB], "too_few", "only 3 readings: steady growth is judged on 5"),
    ],
)
def test_every_no_leak_verdict_says_why(ys: list[int], verdict: str, words: str) -> None:
    g = detect_growth(_steps(len(ys)), ys)
    assert not g.leaking
    assert g.verdict == verdict and words in g.reason, g.reason


def test_noise_is_never_called_growth_below_the_threshold() -> None:
    rng = random.Random(1)
    for amp in (8 * MiB, MiB, 256 * 1024):
        for _ in range(100):
            ys = [50 * MiB + rng.randint(0, amp) for _ in range(32)]
            for k in range(5, 33):
                g = detect_growth(_steps(k), ys[:k])
                assert g.verdict in ("flat", "noisy"), (amp, k, g.reason)


def test_without_explain_only_the_verdict_is_computed() -> None:
    g = detect_growth(_steps(12), [i * 64 * 1024 for i in range(12)], explain=False)
    assert not g.leaking and g.verdict == "" and g.trend_per_step == 0


def test_suggested_threshold_leaves_a_margin() -> None:
    assert suggested_threshold(64 * 1024) == 32 * 1024
    assert suggested_threshold(100_000) == 32 * 1024
    assert suggested_threshold(3) == 1 and suggested_threshold(0.5) == 1


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(ValueError):
        detect_growth([1, 2, 3], [1, 2])


def test_site_growth_keeps_only_rising_sites() -> None:
    maps = [
        {"leak": (i * MiB, i), "flat": (MiB, 1), "temp": ((i % 2) * MiB, i % 2), "grow": (i * MiB, 1)}
        for i in range(5)
    ]
    g = site_growth(maps)
    assert set(g) == {"leak", "grow"}
    assert g["leak"] == (MiB, 1.0)
    assert g["grow"] == (MiB, 0.0)
    assert site_growth(maps[:1]) == {}


@pytest.mark.parametrize(
    ("path", "pattern", "name"),
    [
        (
            "__main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)",
            "__main__.losses[*]",
            "losses",
        ),
        ("train.py:40 in run(), local 'cache'['k3']", "train.py:40 in run(), local 'cache'[*]", "cache"),
        ("x.py:9 in f(), local 'trainer'.seen[4]", "x.py:9 in f(), local 'trainer'.seen[*]", "trainer.seen"),
        (
            "__main__.model._forward_hooks[0] -> closure 'acts'[3]",
            "__main__.model._forward_hooks[*] -> closure 'acts'[*]",
            "acts",
        ),
        (
            "x.py:3 in g(), local 'h'.grad_fn -> saved tensor of TanhBackward0 (_saved_result)",
            "x.py:3 in g(), local 'h'",
            "h",
        ),
        ("pytest.REGISTRY['a']", "pytest.REGISTRY[*]", "REGISTRY"),
    ],
)
def test_holder_pattern_and_name(path: str, pattern: str, name: str) -> None:
    assert holder_pattern(path) == pattern
    assert holder_name(path) == name


def _g(paths: tuple[str, ...], **kw: object) -> SiteGrowth:
    base: dict[str, object] = {
        "site": "train.py:12",
        "bytes_per_step": float(MiB),
        "live_bytes": 8 * MiB,
        "storages": 8,
        "storages_per_step": 1.0,
        "paths": paths,
    }
    base.update(kw)
    return SiteGrowth(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("growth", "kind"),
    [
        (
            _g(("x.py:3 in f(), local 'losses'[2].grad_fn -> saved tensor of MulBackward0 (_saved_self)",)),
            "retained_graph",
        ),
        (
            _g(("x.py:3 in f(), local 'total'.grad_fn -> saved tensor of MulBackward0 (_saved_self)",)),
            "graph_chain",
        ),
        (
            _g(("x.py:3 in f(), local 'errors'[2].__traceback__ -> frame x.py:9 in g() local 'act'",)),
            "exception",
        ),
        (_g((), in_cycle=True, cycle_types=("Node",)), "cycle"),
        (_g(("__main__.model._forward_hooks[0] -> closure 'acts'[3]",)), "hook"),
        (_g(("x.py:3 in f(), local 'cache'",), storages_per_step=0.0), "growing_tensor"),
        (_g(("pytest.REGISTRY['a']",)), "global_registry"),
        (_g(("__main__.kept[3]",)), "device_accumulation"),  # a script's variable, not a registry
        (_g(("x.py:3 in f(), local 'trainer'.cache['b1']",)), "cache"),
        (_g(("x.py:3 in f(), local 'history'[5]",)), "device_accumulation"),
        (_g(("x.py:3 in f(), local 'w'",)), "unknown"),
    ],
)
def test_culprit_kinds_and_fixes(growth: SiteGrowth, kind: str) -> None:
    (c,) = attribute([growth])
    assert c.kind == kind
    assert c.fix and "1.0 MiB" in c.fix
    assert c.site == "train.py:12"


def test_sites_of_one_holder_are_one_culprit_and_small_ones_are_dropped() -> None:
    a = _g(("x.py:3 in f(), local 'losses'[2].grad_fn -> saved tensor of A (_saved_self)",), site="m.py:1")
    b = _g(("x.py:3 in f(), local 'losses'[5]",), site="m.py:2", bytes_per_step=4.0)
    c = _g(("x.py:3 in f(), local 'other'[5]",), site="m.py:3", bytes_per_step=10.0)
    out = attribute([a, b, c], min_bytes_per_step=8)
    assert len(out) == 2
    assert out[0].sites == (("m.py:1", float(MiB)),) or out[0].site == "m.py:1"
    assert [x.kind for x in out] == ["retained_graph", "device_accumulation"]


def test_every_kind_has_a_fix() -> None:
    for k in KINDS:
        assert fix_for(k, "x", MiB)


def test_report_renders_and_serialises() -> None:
    (c,) = attribute([_g(("x.py:3 in f(), local 'history'[5]",))])
    r = LeakReport(
        "cpu", "ledger", "light", 20, 3, True, float(MiB), 1.0, 8, None, "grew", (c,), ((1, 0), (2, MiB))
    )
    text = str(r)
    assert "LEAK on cpu: +1.00 MiB/step" in text and "history" in text and "fix:" in text
    d = r.to_dict()
    assert d["culprits"][0]["sites"][0]["site"] == "train.py:12"
