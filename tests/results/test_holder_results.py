"""Holder paths as results: typed steps, byte-identical text, ``to_dict()``/``from_dict()`` round trips on
paths that real searches found (real modules, closures, optimizers, autograd graphs, exceptions)."""

from __future__ import annotations

import json
import sys
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from torchmem.analysis.holders import find_holders, holders
from torchmem.results._dicts import ResultFormatError
from torchmem.results.holders import HolderPath, HolderPaths, HolderSearch, HolderStep, StepKind

K = StepKind
THIS = sys.modules[__name__]


@pytest.fixture
def put(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Any], None]:
    def put(name: str, value: Any) -> None:
        monkeypatch.setattr(THIS, name, value, raising=False)

    return put


def _recorder(m: torch.nn.Module) -> None:
    acts: list[torch.Tensor] = []
    m.register_forward_hook(lambda mod, i, o: acts.append(o.detach()))


def _fail(errors: list[BaseException]) -> None:
    act = torch.ones(3)
    try:
        raise ValueError(str(act.shape))
    except ValueError as e:
        errors.append(e)


def _real_paths(put: Callable[[str, Any], None]) -> list[HolderPath]:
    """Paths of many kinds, found by real searches."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    _recorder(model[0])
    model(torch.randn(2, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    w = torch.randn(4, 4, requires_grad=True)
    put("LOSSES", [(torch.randn(4, 4) @ w).sum()])
    put("CACHE", {"k": torch.zeros(2), 7: [torch.zeros(1)]})
    errors: list[BaseException] = []
    _fail(errors)
    finalized = torch.zeros(5)
    weakref.finalize(model, print, finalized)
    tb = errors[0].__traceback__
    assert tb is not None
    saved = THIS.LOSSES[0].grad_fn.next_functions[0][0]._saved_self
    search = find_holders(
        [
            next(iter(model[0]._forward_hooks.values())).__closure__[0].cell_contents[0],
            opt.state[model[0].weight]["exp_avg"],
            saved,
            THIS.CACHE["k"],
            THIS.CACHE[7][0],
            tb.tb_frame.f_locals["act"],
            finalized,
            model[0].weight,
        ]
    )
    del tb, saved
    return [p for ps in search.paths for p in ps]


def test_typed_steps_render_the_same_text_and_name_what_they_follow(put: Callable[[str, Any], None]) -> None:
    paths = _real_paths(put)
    by_text = {str(p): p for p in paths}
    for p in paths:
        assert str(p) == "".join(p.steps) == "".join(s.text for s in p.typed_steps)
        assert p.kinds[0] is K.ROOT and len(p.typed_steps) == len(p.steps)
    mod = __name__
    saved = by_text[f"{mod}.LOSSES[0].grad_fn -> saved tensor of MmBackward0 (_saved_self)"]
    assert saved.kinds == (K.ROOT, K.MODULE_GLOBAL, K.ITEM, K.GRAD_FN, K.SAVED_TENSOR)
    assert [s.name for s in saved.typed_steps[1:]] == ["LOSSES", "0", "SumBackward0", "_saved_self"]
    assert saved.typed_steps[4].holder_type == "MmBackward0"
    keyed = by_text[f"{mod}.CACHE['k']"]
    assert keyed.typed_steps[2] == HolderStep(K.ITEM, "['k']", "'k'", "dict", "str")
    assert by_text[f"{mod}.CACHE[7][0]"].kinds[2:] == (K.ITEM, K.ITEM)
    hook = next(p for p in paths if "-> closure 'acts'[0]" in str(p))
    assert hook.kinds[-4:] == (K.ATTRIBUTE, K.HOOK, K.CLOSURE_CELL, K.ITEM)
    state = next(p for p in paths if str(p).endswith("['exp_avg']"))
    assert state.typed_steps[-2].kind is K.ITEM and state.typed_steps[-2].key_type == "Parameter"
    exc = next(p for p in paths if "__traceback__" in str(p))
    assert exc.kinds[-3:] == (K.TRACEBACK, K.TRACEBACK, K.FRAME_LOCAL)
    assert exc.typed_steps[-1].name == "act"
    assert any(K.WEAKREF in p.kinds for p in paths if "finalize" in str(p))


def test_paths_round_trip_through_dicts_and_json(put: Callable[[str, Any], None]) -> None:
    paths = _real_paths(put)
    assert len(paths) >= 8
    for p in paths:
        again = HolderPath.from_dict(json.loads(json.dumps(p.to_dict())))
        assert again == p and str(again) == str(p) and again.kinds == p.kinds
        assert [HolderStep.from_dict(s.to_dict()) for s in p.typed_steps] == list(p.typed_steps)
    t = torch.zeros(3)
    search = find_holders([t, 3.5j])
    assert HolderSearch.from_dict(json.loads(json.dumps(search.to_dict()))) == search
    assert str(HolderSearch.from_dict(search.to_dict())) == str(search)


def test_records_without_typed_steps_and_unknown_kinds_still_read() -> None:
    old = {"root": "module", "path": "__main__.x['k']", "steps": ["__main__", ".x", "['k']"], "depth": 2}
    p = HolderPath.from_dict(old)
    assert str(p) == "__main__.x['k']" and p.kinds == (K.ROOT, K.OTHER, K.OTHER)
    assert p == HolderPath("module", ("__main__", ".x", "['k']"), 2)
    newer = HolderStep.from_dict({"kind": "a_kind_from_a_later_version", "text": ".x", "name": "x"})
    assert newer.kind is K.OTHER and newer.text == ".x"


def test_bad_records_and_mismatched_steps_are_refused() -> None:
    with pytest.raises(ResultFormatError):
        HolderPath.from_dict({"root": "module", "steps": "not a list", "depth": 1})
    with pytest.raises(ResultFormatError):
        HolderStep.from_dict({"kind": 3, "text": ".x"})
    with pytest.raises(ValueError, match="same fragments"):
        HolderPath("module", ("__main__", ".x"), 1, (HolderStep(K.ROOT, "__main__"),))


def test_holder_paths_print_one_path_a_line(put: Callable[[str, Any], None]) -> None:
    put("KEPT", [torch.zeros(2)])
    paths = holders(THIS.KEPT[0])
    assert isinstance(paths, HolderPaths)
    assert str(paths) == f"{__name__}.KEPT[0]" and repr(paths) == f"[{__name__}.KEPT[0]]"
    assert str(HolderPaths()) == "no holders found"
