"""The pure leak analysis: growth detection on series, per-site growth, and holder patterns, names and culprit
kinds decided from the typed steps of real holder paths."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import torchmem.analysis.growth as leaks_mod
from torchmem.analysis.holders import find_holders
from torchmem.analysis.leaks import (
    KINDS,
    ROBUST_EVERY,
    GrowthStream,
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
from torchmem.results.holders import HolderPath, HolderStep, StepKind

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
        "(min_bytes_per_step=262144): pass min_bytes_per_step=32768 (`torchmem run --min-growth 32768`) "
        "to report it as a leak and name its allocation site and holder"
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


def _series_zoo(rng: random.Random) -> list[list[int]]:
    """Series of 120 readings of every shape the detector meets: steady leaks (also below the threshold),
    noisy leaks, one-time jumps, leaks that stop, noise, periodic spikes, shrinking, flat."""
    base = 50 * MiB
    zoo = [
        [base + i * MiB for i in range(120)],
        [base + i * 64 * 1024 for i in range(120)],
        [base + i * 300 * 1024 + rng.randint(0, 3 * MiB) for i in range(120)],
        [base + i * MiB + rng.randint(0, 12 * MiB) for i in range(120)],
        [base + (40 * MiB if i > 50 else 0) for i in range(120)],
        [base + min(i, 40) * MiB for i in range(120)],
        [base + rng.randint(0, 8 * MiB) for _ in range(120)],
        [base + (30 * MiB if i % 7 == 0 else 0) for i in range(120)],
        [base + 200 * MiB - i * MiB for i in range(120)],
        [base] * 120,
        [base + (i // 10) * 4 * MiB + rng.randint(0, MiB) for i in range(120)],
    ]
    # Rises of 0.85x and 1.2x the threshold in turn: a steady leak (median above it) whose every other rise
    # is below it.
    uneven = [base]
    for i in range(119):
        uneven.append(uneven[-1] + (int(0.85 * 256 * 1024) if i % 2 else int(1.2 * 256 * 1024)))
    noisy_steps = [base + rng.randint(0, 2 * MiB) + i * rng.choice((0, 256 * 1024)) for i in range(120)]
    return [*zoo, uneven, noisy_steps]


def test_the_stream_gives_detect_growths_verdict_at_every_reading() -> None:
    """With the robust test run at every reading, the stream's cheap pre-checks change no verdict."""
    rng = random.Random(7)
    for ys in _series_zoo(rng):
        for stride in (1, 3):
            xs = [10 + stride * i for i in range(len(ys))]
            s = GrowthStream(256 * 1024, robust_every=1)
            for k, (x, y) in enumerate(zip(xs, ys), start=1):
                got = s.add(x, y)
                want = detect_growth(xs[:k], ys[:k], explain=False)
                assert (got.leaking, got.method, got.bytes_per_step) == (
                    want.leaking,
                    want.method,
                    want.bytes_per_step,
                ), (ys[:3], k)
                assert s.leaking is got.leaking and s.growth is got
                assert s._min == min(s.values)  # the window's minimum, kept without a scan per reading


def test_the_streams_robust_test_is_at_most_a_few_readings_late() -> None:
    rng = random.Random(11)
    for ys in _series_zoo(rng):
        xs = list(range(len(ys)))
        s = GrowthStream(256 * 1024)
        exact = [detect_growth(xs[: k + 1], ys[: k + 1], explain=False).leaking for k in range(len(ys))]
        for k, (x, y) in enumerate(zip(xs, ys)):
            got = s.add(x, y).leaking
            if got != exact[k]:  # only a robust verdict may lag, and only by less than ROBUST_EVERY readings
                assert s.growth.method in ("robust", "none")
                assert got in exact[max(0, k - ROBUST_EVERY + 1) : k + 1], (ys[:3], k)


def test_the_stream_runs_the_slow_test_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    real = leaks_mod._robust_rate

    def counting(xs: Sequence[int], ys: Sequence[int], threshold: float) -> Any:
        calls[0] += 1
        return real(xs, ys, threshold)

    monkeypatch.setattr(leaks_mod, "_robust_rate", counting)
    rng = random.Random(5)
    s = GrowthStream(256 * 1024)
    for i in range(5000):  # noise: the O(1) pre-check rejects every reading
        s.add(i, 50 * MiB + rng.randint(0, 2 * MiB))
    assert calls[0] == 0 and not s.leaking
    found = 0
    for i in range(5000, 5400):  # a noisy leak: the test runs once every ROBUST_EVERY readings at most
        found += s.add(i, 50 * MiB + (i - 5000) * MiB + rng.randint(0, 6 * MiB)).method == "robust"
    assert found > 300
    assert 0 < calls[0] <= 400 // ROBUST_EVERY + 1


def test_a_one_time_jump_stops_at_the_robust_tests_cheap_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    called = []
    monkeypatch.setattr(leaks_mod, "_theil_sen", lambda xs, ys: called.append(1) or 0.0)
    ys = [50 * MiB] * 20 + [90 * MiB] * 12  # the last reading is far above the first quarter's floor
    assert not detect_growth(_steps(32), ys, explain=False).leaking
    assert called == []  # the floors rise in one quarter only: no O(n²) slope was computed


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


# -- holder paths: typed steps, from real objects --------------------------------------------------------
K = StepKind
REGISTRY: dict[str, torch.Tensor] = {}  # a global of an imported module (this one), not of a script


def _path(root: str, *steps: tuple[StepKind, str, str] | tuple[StepKind, str, str, str]) -> HolderPath:
    """A typed path as the search builds it: (kind, text, name[, key type]) per step."""
    typed = [HolderStep(k, text, name, "", rest[0] if rest else "") for k, text, name, *rest in steps]
    return HolderPath.of(root, typed, len(typed) - 1)


def _saved(losses: Any, node_type: str = "MmBackward0") -> torch.Tensor:
    """A tensor an autograd node of ``losses``' graph saved for backward (found through next_functions)."""
    todo = [losses.grad_fn]
    while todo:
        n = todo.pop()
        if type(n).__name__ == node_type:
            return n._saved_self  # type: ignore[no-any-return]
        todo.extend(x for x, _ in n.next_functions if x is not None)
    raise AssertionError(f"no {node_type} in the graph")


def _g(paths: Sequence[HolderPath], **kw: object) -> SiteGrowth:
    base: dict[str, object] = {
        "site": "train.py:12",
        "bytes_per_step": float(MiB),
        "live_bytes": 8 * MiB,
        "storages": 8,
        "storages_per_step": 1.0,
        "paths": tuple(paths),
    }
    base.update(kw)
    return SiteGrowth(**base)  # type: ignore[arg-type]


def _kind_of(paths: Sequence[HolderPath], **kw: object) -> str:
    (c,) = attribute([_g(paths, **kw)])
    assert c.fix and "1.0 MiB" in c.fix and c.site == "train.py:12"
    return c.kind


@pytest.mark.parametrize(
    ("path", "pattern", "name"),
    [
        (
            _path(
                "module",
                (K.ROOT, "__main__", "__main__"),
                (K.MODULE_GLOBAL, ".losses", "losses"),
                (K.ITEM, "[17]", "17", "int"),
                (K.GRAD_FN, ".grad_fn", "MeanBackward0"),
                (K.SAVED_TENSOR, " -> saved tensor of AddmmBackward0 (_saved_mat1)", "_saved_mat1"),
            ),
            "__main__.losses[*]",
            "losses",
        ),
        (
            _path(
                "frame",
                (K.ROOT, "train.py:40 in run()", "train.py:40 in run()"),
                (K.FRAME_LOCAL, ", local 'cache'", "cache"),
                (K.ITEM, "['k3']", "'k3'", "str"),
            ),
            "train.py:40 in run(), local 'cache'[*]",
            "cache",
        ),
        (
            _path(
                "frame",
                (K.ROOT, "x.py:9 in f()", "x.py:9 in f()"),
                (K.FRAME_LOCAL, ", local 'trainer'", "trainer"),
                (K.ATTRIBUTE, ".seen", "seen"),
                (K.ITEM, "[4]", "4", "int"),
            ),
            "x.py:9 in f(), local 'trainer'.seen[*]",
            "trainer.seen",
        ),
        (
            _path(
                "module",
                (K.ROOT, "__main__", "__main__"),
                (K.MODULE_GLOBAL, ".model", "model"),
                (K.ATTRIBUTE, "._forward_hooks", "_forward_hooks"),
                (K.HOOK, "[0]", "0", "int"),
                (K.CLOSURE_CELL, " -> closure 'acts'", "acts"),
                (K.ITEM, "[3]", "3", "int"),
            ),
            "__main__.model._forward_hooks[*] -> closure 'acts'[*]",
            "acts",
        ),
        (
            _path(
                "frame",
                (K.ROOT, "x.py:3 in g()", "x.py:3 in g()"),
                (K.FRAME_LOCAL, ", local 'h'", "h"),
                (K.GRAD_FN, ".grad_fn", "TanhBackward0"),
                (K.SAVED_TENSOR, " -> saved tensor of TanhBackward0 (_saved_result)", "_saved_result"),
            ),
            "x.py:3 in g(), local 'h'",
            "h",
        ),
        (
            _path(
                "module",
                (K.ROOT, "pytest", "pytest"),
                (K.MODULE_GLOBAL, ".REGISTRY", "REGISTRY"),
                (K.ITEM, "['a']", "'a'", "str"),
            ),
            "pytest.REGISTRY[*]",
            "REGISTRY",
        ),
    ],
)
def test_holder_pattern_and_name(path: HolderPath, pattern: str, name: str) -> None:
    assert holder_pattern(path) == pattern
    assert holder_name(path) == name


def test_a_list_of_losses_with_their_graphs_is_a_retained_graph() -> None:
    w = torch.randn(8, 8, requires_grad=True)
    losses = [(torch.randn(8, 8) @ w).sum() for _ in range(3)]
    paths = find_holders([_saved(losses[2])]).paths[0]
    assert [str(p).split(", ", 1)[1] for p in paths] == [
        "local 'losses'[2].grad_fn -> saved tensor of MmBackward0 (_saved_self)"
    ]
    assert paths[0].kinds[-2:] == (K.GRAD_FN, K.SAVED_TENSOR)
    assert holder_pattern(paths[0]).endswith("local 'losses'[*]") and holder_name(paths[0]) == "losses"
    assert _kind_of(paths) == "retained_graph"


def test_one_variable_whose_graph_grows_is_a_graph_chain() -> None:
    w = torch.randn(8, 8, requires_grad=True)
    total = torch.zeros(())
    for _ in range(3):
        total = total + (torch.randn(8, 8) @ w).sum()
    paths = find_holders([_saved(total)]).paths[0]
    assert [str(p).split(", ", 1)[1] for p in paths] == [
        "local 'total'.grad_fn -> saved tensor of MmBackward0 (_saved_self)"
    ]
    assert _kind_of(paths) == "graph_chain"


def _failing_step(errors: list[BaseException]) -> None:
    act = torch.ones(4)
    try:
        raise ValueError(f"bad batch {act.shape}")
    except ValueError as e:
        errors.append(e)


def test_stored_exceptions_whose_frames_keep_tensors_are_exceptions() -> None:
    errors: list[BaseException] = []
    _failing_step(errors)
    tb = errors[0].__traceback__
    assert tb is not None
    paths = find_holders([tb.tb_frame.f_locals["act"]]).paths[0]
    del tb
    texts = [str(p) for p in paths]
    assert any("local 'errors'[0].__traceback__ -> frame test_leaks.py:" in t for t in texts), texts
    assert K.TRACEBACK in paths[0].kinds
    assert _kind_of(paths) == "exception"


def test_a_cycle_is_a_cycle() -> None:
    assert _kind_of((), in_cycle=True, cycle_types=("Node",)) == "cycle"


def _attach_recorder(m: torch.nn.Module) -> None:
    acts: list[torch.Tensor] = []
    m.register_forward_hook(lambda mod, i, o: acts.append(o.detach()))


def test_a_hook_closure_is_a_hook() -> None:
    lin = torch.nn.Linear(4, 4)
    _attach_recorder(lin)
    lin(torch.randn(2, 4))
    paths = find_holders([next(iter(lin._forward_hooks.values())).__closure__[0].cell_contents[0]]).paths[0]
    (p,) = paths
    key = next(iter(lin._forward_hooks))  # the handle's id: a process-wide counter
    assert str(p).endswith(f"local 'lin'._forward_hooks[{key}] -> closure 'acts'[0]")
    assert K.HOOK in p.kinds and K.CLOSURE_CELL in p.kinds
    assert holder_name(p) == "acts"
    assert _kind_of(paths) == "hook"


def test_one_tensor_growing_is_a_growing_tensor() -> None:
    cache = torch.zeros(3)
    paths = find_holders([cache]).paths[0]
    assert _kind_of(paths, storages_per_step=0.0) == "growing_tensor"


def test_a_global_of_an_imported_module_is_a_registry() -> None:
    REGISTRY["a"] = torch.zeros(3)
    try:
        paths = find_holders([REGISTRY["a"]]).paths[0]
        assert [str(p) for p in paths] == [f"{__name__}.REGISTRY['a']"]
        assert paths[0].kinds == (K.ROOT, K.MODULE_GLOBAL, K.ITEM)
        assert holder_name(paths[0]) == "REGISTRY"
        assert _kind_of(paths) == "global_registry"
    finally:
        REGISTRY.clear()


def test_a_list_of_the_running_script_is_an_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["__main__"], "kept", [torch.zeros(1) for _ in range(4)], raising=False)
    paths = find_holders([sys.modules["__main__"].kept[3]]).paths[0]
    assert [str(p) for p in paths] == ["__main__.kept[3]"]
    assert _kind_of(paths) == "device_accumulation"  # a script's variable, not a registry


class _Trainer:
    def __init__(self) -> None:
        self.cache: dict[str, torch.Tensor] = {}
        self.history: list[torch.Tensor] = []


def test_a_dict_keyed_by_name_is_a_cache_and_a_list_an_accumulation() -> None:
    trainer = _Trainer()
    trainer.cache["b1"] = torch.zeros(2)
    trainer.history.append(torch.zeros(3))
    keyed = find_holders([trainer.cache["b1"]]).paths[0]
    listed = find_holders([trainer.history[0]]).paths[0]
    assert [str(p).split(", ", 1)[1] for p in keyed] == ["local 'trainer'.cache['b1']"]
    assert holder_name(keyed[0]) == "trainer.cache" and holder_name(listed[0]) == "trainer.history"
    assert _kind_of(keyed) == "cache"
    assert _kind_of(listed) == "device_accumulation"


class _Selector:
    def __init__(self, model: Any) -> None:
        self.model = model


class _Connector:
    def __init__(self, model: Any) -> None:
        self._selector = _Selector(model)


class UserModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []
        self._cache: list[torch.Tensor] = []


def test_an_attribute_reached_through_a_frameworks_internals_is_named_on_its_class() -> None:
    # Lightning keeps the user's module as `trainer._data_connector._datahook_selector.model`: the fix names
    # `M.validation_step_outputs`, the line the user changes; the path (printed as "held by") stays whole.
    class Trainer:
        def __init__(self, model: Any) -> None:
            self._connector = _Connector(model)

    tr = Trainer(UserModule())
    tr._connector._selector.model.outputs.append(torch.zeros(2))
    path = find_holders([tr._connector._selector.model.outputs[0]]).paths[0][0]
    assert str(path).endswith("local 'tr'._connector._selector.model.outputs[0]"), str(path)
    assert holder_name(path) == "UserModule.outputs"
    # must not: a path with no private hop, and one whose last attribute is itself private (the user's own)
    direct = UserModule()
    direct.outputs.append(torch.zeros(3))
    direct._cache.append(torch.zeros(4))
    assert holder_name(find_holders([direct.outputs[0]]).paths[0][0]) == "direct.outputs"
    assert holder_name(find_holders([direct._cache[0]]).paths[0][0]) == "direct._cache"


def test_a_list_of_optimizers_with_their_state_is_kept_optimizers() -> None:
    # A fresh AdamW per epoch kept in a list (with its scheduler): its state is made inside step(), keyed by
    # parameter and by name ('exp_avg'): not a cache to bound but optimizers to drop.
    model = torch.nn.Linear(4, 4)
    schedules = []
    for _ in range(2):
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        schedules.append((opt, torch.optim.lr_scheduler.StepLR(opt, 1)))
    state = schedules[0][0].state[model.weight]["exp_avg"]
    paths = [p for p in find_holders([state]).paths[0] if "schedules" in str(p)]
    assert paths, find_holders([state]).paths[0]
    assert _kind_of(paths) == "kept_optimizer"
    (c,) = attribute([_g(paths)])
    assert "`schedules` keeps optimizers" in c.fix and "get_last_lr()" in c.fix, c.fix
    # the optimizer in use, held by its own variable: its state is not a kept optimizer (nor is a dict of
    # per-parameter tensors that is not an optimizer's state)
    found = find_holders([opt.state[model.weight]["exp_avg"]]).paths[0]
    live = [p for p in found if "schedules" not in str(p)]
    assert live and all(_kind_of([p]) != "kept_optimizer" for p in live), live
    per_param = {"m": {model.weight: torch.zeros(2)}}
    assert _kind_of(find_holders([per_param["m"][model.weight]]).paths[0]) == "cache"


def test_a_plain_variable_is_unknown() -> None:
    w = torch.zeros(2)
    assert _kind_of(find_holders([w]).paths[0]) == "unknown"


def test_kinds_never_come_from_the_text_of_a_path() -> None:
    # Keys that read like autograd hops, hook entries or closures are just keys of a dict (issue 11: the
    # analysis read the rendered text, so such a cache was called a retained graph or a hook).
    cache = {
        ".grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)": torch.zeros(2),
        "model._forward_hooks[0] -> closure 'acts'": torch.zeros(3),
        "x.__traceback__": torch.zeros(4),
    }
    for key in cache:
        paths = find_holders([cache[key]]).paths[0]
        assert key in str(paths[0])
        assert _kind_of(paths) == "cache", str(paths[0])


def test_sites_of_one_holder_are_one_culprit_and_small_ones_are_dropped() -> None:
    w = torch.randn(8, 8, requires_grad=True)
    losses = [(torch.randn(8, 8) @ w).sum() for _ in range(3)] + [torch.zeros(1) for _ in range(3)]
    other = [torch.zeros(1) for _ in range(6)]
    a = _g(find_holders([_saved(losses[2])]).paths[0], site="m.py:1")
    b = _g(find_holders([losses[5]]).paths[0], site="m.py:2", bytes_per_step=4.0)
    c = _g(find_holders([other[5]]).paths[0], site="m.py:3", bytes_per_step=10.0)
    out = attribute([a, b, c], min_bytes_per_step=8)
    assert len(out) == 2
    assert out[0].sites == (("m.py:1", float(MiB)),) or out[0].site == "m.py:1"
    assert [x.kind for x in out] == ["retained_graph", "device_accumulation"]
    assert out[0].holder is not None and out[0].holder.endswith(
        "local 'losses'[2].grad_fn -> saved tensor of MmBackward0 (_saved_self)"
    )


def test_every_kind_has_a_fix() -> None:
    for k in KINDS:
        assert fix_for(k, "x", MiB)


def test_report_renders_and_serialises() -> None:
    history = [torch.zeros(1) for _ in range(6)]
    (c,) = attribute([_g(find_holders([history[5]]).paths[0])])
    r = LeakReport(
        "cpu", "ledger", "light", 20, 3, True, float(MiB), 1.0, 8, None, "grew", (c,), ((1, 0), (2, MiB))
    )
    text = str(r)
    assert "LEAK on cpu: +1.00 MiB/step" in text and "history" in text and "fix:" in text
    d = r.to_dict()
    assert d["culprits"][0]["sites"][0]["site"] == "train.py:12"
    assert LeakReport.from_dict(d) == r
