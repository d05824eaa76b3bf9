"""The run's policy on the host verdict (``run/verdicts._host_policy``): host growth below 256 KiB/step is a
leak only when the report names what keeps it (a holder, an autograd chain, a state of the process); a line
that tracemalloc saw allocate what stays, with no holder, is said in the reason, not claimed as a leak. The
whole run of both sides is checked by the scenario programs (`control_predicted_labels` quiet,
`host_numpy_rows` a leak held by `loss_rows`). On a GPU, a loop that ran no backward gathers its results on
the host: growth only containers of detached data keep (or nothing named) is said, not called a leak."""

from __future__ import annotations

import dataclasses

import torch

from torchmem.results.leaks import Culprit, LeakReport
from torchmem.run.verdicts import _host_policy, host_verdict

KiB = 1024


def _host(per_step: float, *culprits: Culprit) -> LeakReport:
    series = tuple((s, 100 * 1024 * KiB + int(per_step) * s) for s in range(4, 30, 2))
    return LeakReport(
        "host", "heap", "light", 29, 3, True, per_step, 1.0, 15, None, "the floor rose", culprits, series
    )


def _line(site: str, per_step: float) -> Culprit:
    return Culprit("python_objects", site, ((site, per_step),), None, int(per_step * 2), per_step, 0.0, "...")


def test_a_line_without_a_holder_is_not_a_leak_below_a_device_leak_s_rate() -> None:
    r = _host_policy(_host(4.4 * KiB, _line("predict.py:15", 1.3 * KiB)))
    assert not r.leaking and r.verdict == "below_threshold" and r.culprits == ()
    assert r.detected_at is None and "`predict.py:15`" in r.reason and "no container or chain" in r.reason


def test_a_holder_or_a_chain_keeps_the_leak() -> None:
    rows = Culprit(
        "python_objects",
        "train.py:26",
        (("train.py:26", 128 * KiB),),
        "__main__.loss_rows[21]",
        0,
        128 * KiB,
        0.0,
        "...",
    )
    r = _host_policy(_host(128 * KiB, rows))
    assert r.leaking and r.culprits == (rows,)
    chain = Culprit("autograd_chain", "ema.py:21", (), None, 0, 4 * KiB, 0.0, "...")
    assert _host_policy(_host(5 * KiB, chain)).leaking
    # a line alone at a device leak's rate stays a leak too
    assert _host_policy(_host(300 * KiB, _line("predict.py:15", 300 * KiB))).leaking


MiB = 1024 * KiB
GPU = torch.device("cuda", 0)  # a device object only: nothing here touches CUDA


def _kept(kind: str, holder: str | None = "__main__.predictions[341]") -> Culprit:
    return Culprit(kind, None, (), holder, 0, 1 * MiB, 0.0, "...")


PREDS = "__main__.predictions[341]"


def test_an_inference_loop_gathering_its_outputs_on_the_host_is_not_a_leak() -> None:
    r = host_verdict(_host(1 * MiB, _kept("python_objects")), None, GPU, backward=False, data={PREDS})
    assert not r.leaking and r.verdict == "gathered" and r.detected_at is None
    assert r.culprits and r.culprits[0].holder == PREDS  # still said where
    assert "ran no backward" in r.reason and f"`{PREDS}` keeps it" in r.reason
    assert str(r).startswith("no leak on host, results gathered")


def test_training_graphs_states_hooks_unnamed_growth_and_the_cpu_keep_the_host_leak() -> None:
    rows = _host(1 * MiB, _kept("python_objects"))
    data = {PREDS}
    assert host_verdict(rows, None, GPU, backward=True, data=data).leaking  # training keeps per-step data
    assert host_verdict(rows, None, GPU, backward=None, data=data).leaking  # not known: no claim either way
    assert host_verdict(rows, None, GPU, backward=False, graphs=True, data=data).leaking  # nodes rose
    assert host_verdict(rows, None, GPU, backward=False).leaking  # not a container of plain data (a hook's)
    unnamed = _host(1 * MiB)
    assert host_verdict(unnamed, None, GPU, backward=False, data=data).leaking  # nothing named: C-level
    graph = _host(1 * MiB, _kept("retained_graph", "__main__.calibrated[136]"))
    assert host_verdict(graph, None, GPU, backward=False, data=data).leaking  # outputs kept with their graph
    state = _host(1 * MiB, _kept("profiler_running", "__main__.prof"))
    assert host_verdict(state, None, GPU, backward=False, data=data).leaking
    assert host_verdict(rows, None, torch.device("cpu"), backward=False, data=data).leaking  # the CPU's rules


SAMPLES = "__main__.samples[0].grad_fn -> saved tensor of MmBackward0"


def _device_leak(*culprits: Culprit) -> LeakReport:
    series = tuple((s, 1024 * MiB + 10 * MiB * s) for s in range(4, 30, 2))
    return LeakReport(
        "cuda:0", "allocated", "light", 29, 3, True, 10 * MiB, 1.0, 12, None, "grew", culprits, series
    )


def test_host_growth_held_through_the_graphs_the_device_names_is_that_leak_said_once() -> None:
    """A GPU inference loop keeping every 10th output with its graph: the device names `samples` (retained
    graph); the host saw Python objects grow, held through a kept graph (the loop's `logits` variable,
    `.grad_fn -> saved tensor ...`) — the same leak: not a second one whose fix speaks of `.item()`."""
    device = _device_leak(
        _kept("retained_graph", "__main__.samples[0].grad_fn -> saved tensor of MmBackward0")
    )
    objects = _kept("python_objects", "__main__.logits.grad_fn -> saved tensor of EmbeddingBackward0")
    r = host_verdict(_host(1.5 * KiB, objects), device, GPU, backward=False)
    assert not r.leaking and r.verdict == "device_graphs" and r.culprits == (), r
    assert "`__main__.samples[0]`" in r.reason and "autograd graphs" in r.reason, r.reason
    assert str(r).startswith("no other leak on host over 29 steps: host memory grew by 1.50 KiB/step"), str(r)
    # a kept graph the host names itself (session 21's Trainer) beside a device graph leak: the same
    graph = _kept("retained_graph", "__main__.samples[42]")
    assert host_verdict(_host(50 * KiB, graph), device, GPU, backward=True).verdict == "device_graphs"


def test_host_growth_with_a_holder_of_its_own_stays_a_leak_beside_a_device_graph_leak() -> None:
    device = _device_leak(
        _kept("retained_graph", "__main__.samples[0].grad_fn -> saved tensor of MmBackward0")
    )
    rows = _kept("python_objects", "__main__.loss_rows[21]")  # no graph: a container of its own
    assert host_verdict(_host(128 * KiB, rows), device, GPU, backward=True).leaking
    # a device leak that keeps no graph does not account for host graphs
    plain = _device_leak(_kept("device_accumulation", "__main__.outs[3]"))
    graph = _kept("retained_graph", "__main__.samples[42]")
    assert host_verdict(_host(50 * KiB, graph), plain, GPU, backward=True).leaking
    # nor does a device report that is no leak
    quiet = dataclasses.replace(device, leaking=False, verdict="flat")
    assert host_verdict(_host(50 * KiB, graph), quiet, GPU, backward=True).leaking
