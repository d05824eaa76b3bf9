"""Of the holders that keep the same autograd chain, the variable the program's loop carries from iteration to
iteration is named (issue 26): in ``logits, hidden = model(tokens, hidden)`` both ``logits`` and ``hidden``
reach every step's saved tensors, and the fix is ``hidden``'s. Real modules, real graphs, real holder
searches; the carried names are what ``capture.loop_calls.carried_names`` reads from the loop's code."""

from __future__ import annotations

from typing import Any

import torch

from torchmem.analysis.culprits import attribute
from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.results.leaks import SiteGrowth

MiB = 1 << 20

torch.manual_seed(0)
cell = torch.nn.GRUCell(32, 32)
head = torch.nn.Linear(32, 16)
kept: list[torch.Tensor] = []  # filled by _decode: the hidden states of every step
logits = torch.zeros(0)
hidden = torch.zeros(4, 32)
outputs: list[torch.Tensor] = []


def _decode(steps: int, keep_outputs: bool) -> list[Any]:
    """The decode loop at module level's names: ``hidden`` carried, ``logits`` the step's output."""
    global logits, hidden
    hidden = torch.zeros(4, 32)
    outputs.clear()
    states = []
    x = torch.randn(4, 32)
    for _ in range(steps):
        hidden = cell(x, hidden)
        logits = head(hidden)
        if keep_outputs:
            outputs.append(logits)
        states.append(hidden.untyped_storage())
    return states[:-1]  # the earlier steps' states: saved in the graph, no variable holds them directly


def _paths(storages: list[Any]) -> list[Any]:
    """The holder paths of the storages (4 a storage, as a run samples them), searched once: a later search
    also finds the paths an earlier one's results keep alive."""
    found = holder_paths_of_storages(storages, max_paths=4)
    return [p for ps in found for p in ps]


def _culprit(paths: list[Any], carried: frozenset[str], *, drop_one: str = "") -> Any:
    """The culprit of the storages' growth; ``drop_one``: one sampled path of that holder left out (the run
    samples a few paths per storage: the step's output reached the newest storage first, 5 samples to 4)."""
    paths = list(paths)
    if drop_one:
        paths.remove(next(p for p in paths if str(p).startswith(f"{__name__}.{drop_one}")))
    growth = SiteGrowth("decode.py:9", float(MiB), 5 * MiB, 5, 1.0, tuple(paths))
    (c,) = attribute([growth], device="cpu", carried=carried)
    return c


def test_the_carried_state_is_named_over_the_step_s_output() -> None:
    paths = _paths(_decode(6, keep_outputs=False))
    n = {k: sum(str(p).startswith(f"{__name__}.{k}") for p in paths) for k in ("hidden", "logits")}
    assert n["hidden"] > 0 and n["logits"] > 0, n  # both reach the chain
    # the output ahead by one sample or two (as a run samples them), or behind
    for drop in ("hidden", "logits", ""):
        c = _culprit(paths, frozenset({"hidden", "x"}), drop_one=drop)
        assert c.kind == "graph_chain", c
        assert c.holder.startswith(f"{__name__}.hidden.grad_fn"), (drop, c.holder)
        assert "`hidden = hidden.detach()`" in c.fix, c.fix


def test_without_the_loop_s_code_the_holder_most_samples_reach_stays() -> None:
    paths = _paths(_decode(6, keep_outputs=False))
    # make `logits` lead by one sample at least: drop hidden's samples until it does
    trimmed = list(paths)
    while sum(str(p).startswith(f"{__name__}.hidden") for p in trimmed) >= sum(
        str(p).startswith(f"{__name__}.logits") for p in trimmed
    ):
        trimmed.remove(next(p for p in trimmed if str(p).startswith(f"{__name__}.hidden")))
    c = _culprit(trimmed, frozenset())
    assert c.holder.startswith(f"{__name__}.logits.grad_fn"), c.holder
    # a carried variable that holds no graph changes nothing: the loop carries `x` only
    c = _culprit(trimmed, frozenset({"x"}))
    assert c.holder.startswith(f"{__name__}.logits.grad_fn"), c.holder
    # and with `hidden` carried, it is named again while it is near (within a quarter of the samples)
    c = _culprit(trimmed, frozenset({"hidden"}))
    assert c.holder.startswith(f"{__name__}.hidden.grad_fn"), c.holder


def test_a_list_that_keeps_every_output_is_named_even_with_a_carried_state() -> None:
    c = _culprit(_paths(_decode(6, keep_outputs=True)), frozenset({"hidden", "x"}))
    assert c.holder.startswith(f"{__name__}.outputs["), c.holder


class _Cache:
    """A KV cache as Hugging Face's: a list of layers, each with keys and values re-made by ``torch.cat``."""

    def __init__(self) -> None:
        self.layers: list[dict[str, torch.Tensor]] = []


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


proj = torch.nn.Linear(32, 64)
past: Any = None
history: list[torch.Tensor] = []


def _decode_with_cache(tokens: int) -> list[Any]:
    """A decode loop without no_grad carrying a structured cache: ``past`` is read by the step, and the
    step's new cache is bound to it."""
    global past
    past = None
    born = []
    x = torch.randn(4, 32)
    for _ in range(tokens):
        kv = proj(x)
        new = _Cache()
        for i in range(2):
            k, v = kv[:, :32], kv[:, 32:]
            if past is not None:
                k = torch.cat([past.layers[i].keys, k]) * 1.0
                v = torch.cat([past.layers[i].values, v]) * 1.0
            new.layers.append(_Layer(k, v))  # type: ignore[arg-type]
        past = new
        born.append(x.untyped_storage())  # saved by the projection's graph, which the cache's keys carry
        x = torch.tanh(past.layers[1].keys[-4:])
    return born[:-1]


def test_a_structured_state_the_loop_carries_is_a_graph_chain_named_by_its_variable() -> None:
    paths = _paths(_decode_with_cache(8))
    carried = frozenset({"past", "x"})
    c = _culprit(paths, carried)
    assert c.kind == "graph_chain", c
    assert c.holder.startswith(f"{__name__}.past.layers["), c.holder
    assert c.fix.startswith("`past` carries its autograd graph from step to step"), c.fix
    assert "`past = past.detach()`" in c.fix and "loss.item()" not in c.fix, c.fix
    # where the program ran no backward, the fix is no_grad first
    growth = SiteGrowth("decode.py:9", float(MiB), 5 * MiB, 5, 1.0, tuple(paths))
    (c,) = attribute([growth], device="cpu", carried=carried, backward=False)
    assert "and no backward() ran: run the loop under `torch.no_grad()`" in c.fix, c.fix
    (c,) = attribute([growth], device="cpu", carried=carried, backward=True)
    assert "no backward() ran" not in c.fix, c.fix
    # without knowing the loop carries it, the structure's items are a container that keeps graphs
    assert _culprit(paths, frozenset({"x"})).kind == "retained_graph"


def test_a_list_the_loop_rebinds_to_itself_plus_one_is_not_a_carried_state() -> None:
    global history
    history = []
    born = []
    for _ in range(6):
        h = proj(torch.randn(4, 32))
        loss = (h**2).mean()  # saves h
        history = history + [loss]  # noqa: RUF005 - carried (read, then bound), a list that grows
        born.append(h.untyped_storage())
    paths = [p for p in _paths(born) if str(p).startswith(f"{__name__}.history[")]
    assert len({str(p).split("]")[0] for p in paths}) > 1, paths  # several of its items sampled
    growth = SiteGrowth("train.py:9", float(MiB), 5 * MiB, 5, 1.0, tuple(paths))
    (c,) = attribute([growth], device="cpu", carried=frozenset({"history"}), backward=False)
    assert c.kind == "retained_graph", c
    assert "no backward() ran" in c.fix and "`history`" in c.fix, c.fix
