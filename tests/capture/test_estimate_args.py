"""``estimate()``'s parameters are written once (``EstimateArgs``): both entry points show that signature, and
the measured path refuses what only the device-free path uses."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import torchmem
from torchmem.capture.fake import EstimateArgs, estimate_fake


def test_both_entry_points_have_the_one_parameter_list() -> None:
    names = [f.name for f in dataclasses.fields(EstimateArgs)]
    for fn in (torchmem.estimate, estimate_fake):
        params = list(inspect.signature(fn).parameters)
        assert params == names, (fn, params)
    for f in dataclasses.fields(EstimateArgs):
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for fn in (torchmem.estimate, estimate_fake):
            assert inspect.signature(fn).parameters[f.name].default == want, (fn, f.name)
    assert {f.name: f.default for f in dataclasses.fields(EstimateArgs)}["target"] is None


def test_the_measured_path_refuses_device_free_options() -> None:
    model = torch.nn.Linear(8, 8)
    with pytest.raises(torchmem.FitArgumentError) as e:
        torchmem.estimate(model, torch.randn(2, 8), fragmentation=0.1)
    assert "fragmentation" in str(e.value)
    with pytest.raises(TypeError, match="no_such_option"):
        torchmem.estimate(model, torch.randn(2, 8), no_such_option=1)  # type: ignore[call-arg]
