"""Kept outputs: what a list of a model's outputs keeps decides the culprit and its fix.

A newcomer's inference loop without ``no_grad`` that keeps every 10th batch's logits keeps each one's
autograd graph with its activations, yet the holder path ends at the tensor (``samples[33]``: no
``.grad_fn ->`` hop) — it was called a ``device_accumulation`` with the fix "keep numbers (``.item()``)".
The holder search now says what the held tensor's graph still keeps (:attr:`HolderPath.graph`): a graph
with its saved tensors is a retained graph (fix: ``torch.no_grad()`` / ``.detach()``); outputs kept after
their backward keep only the nodes (an accumulation, whose fix says ``.detach()`` them); a fix suggests
``.item()`` only for scalars.
"""

from __future__ import annotations

import torch
from torch import nn

from torchmem.analysis.holders.autograd import graph_state
from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.analysis.leaks import attribute
from torchmem.results.holders import GRAPH_NODES, GRAPH_SAVED, HolderPath
from torchmem.results.leaks import SiteGrowth

KiB = 1 << 10


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 100))


def _paths(storages: list[torch.UntypedStorage]) -> tuple[HolderPath, ...]:
    """The holder paths of the storages of the oldest kept tensors, as the leak attribution finds them."""
    found = holder_paths_of_storages(storages, max_paths=4)
    return tuple(p for ps in found for p in ps)


def _oldest(kept: list[torch.Tensor]) -> list[torch.UntypedStorage]:
    return [t.untyped_storage() for t in kept[:3]]


def _culprit(paths: tuple[HolderPath, ...], backward: bool | None, per_storage: float) -> tuple[str, str]:
    fact = SiteGrowth("loop.py:7", per_storage, int(per_storage) * 6, 6, 1.0, paths)
    (c,) = attribute([fact], min_bytes_per_step=0.0, device="cpu", backward=backward)
    return c.kind, c.fix


def test_graph_state_tells_saved_from_freed_from_none() -> None:
    model = _model()
    x = torch.randn(8, 32)
    out = model(x)
    assert graph_state([out]) == GRAPH_SAVED
    assert graph_state([out.detach()]) == ""
    with torch.no_grad():
        assert graph_state([model(x)]) == ""
    out.square().mean().backward()
    assert graph_state([out]) == GRAPH_NODES
    # a graph that saved nothing near its output still has nodes: not "saved"
    w = torch.randn(4, requires_grad=True)
    assert graph_state([w + 1]) == GRAPH_NODES


def test_outputs_kept_with_their_graph_are_a_retained_graph_with_the_no_grad_fix() -> None:
    """Must say: the path ends at the kept logits (no ``.grad_fn`` hop), their graph holds activations."""
    model = _model()
    samples = [model(torch.randn(8, 32)) for _ in range(6)]
    paths = _paths(_oldest(samples))
    assert paths and all(p.graph == GRAPH_SAVED for p in paths), paths
    assert all(
        str(p).endswith(("local 'samples'[0]", "local 'samples'[1]", "local 'samples'[2]")) for p in paths
    )
    kind, fix = _culprit(paths, backward=False, per_storage=8 * 100 * 4)
    assert kind == "retained_graph", (kind, fix)
    assert "torch.no_grad()" in fix and ".detach()" in fix and ".item()" not in fix, fix
    # the record keeps the fact; the text of the path does not change
    p = paths[0]
    assert (
        HolderPath.from_dict(p.to_dict()) == p and "saved" not in str(p) and p.to_dict()["graph"] == "saved"
    )


def test_outputs_kept_after_their_backward_are_an_accumulation_whose_fix_detaches_them() -> None:
    """Must not say retained graph: the backward freed what the graph saved; the nodes stay (detach)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for _ in range(6):
        out = model(torch.randn(8, 32))
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
        kept.append(out)
    paths = _paths(_oldest(kept))
    assert paths and all(p.graph == GRAPH_NODES for p in paths), paths
    kind, fix = _culprit(paths, backward=True, per_storage=8 * 100 * 4)
    assert kind == "device_accumulation", (kind, fix)
    assert "`.detach()` what you keep" in fix and "autograd graph's nodes" in fix, fix
    # 3.1 KiB per entry: no scalar, so no `.item()` to keep
    assert ".item()" not in fix and "a reduction" in fix and "deque(maxlen" in fix, fix


def test_scalars_kept_detached_keep_the_item_fix_and_no_graph_words() -> None:
    """Must not: a list of detached per-step scalars keeps no graph; `.item()` is the right fix for it."""
    model = _model()
    losses = [model(torch.randn(8, 32)).square().mean().detach() for _ in range(6)]
    paths = _paths(_oldest(losses))
    assert paths and all(p.graph == "" for p in paths), paths
    kind, fix = _culprit(paths, backward=True, per_storage=4)
    assert kind == "device_accumulation", (kind, fix)
    assert "keep numbers (`.item()`)" in fix and "graph" not in fix and "detach" not in fix, fix


def test_large_entries_kept_without_graph_get_no_item_advice() -> None:
    embeddings = [torch.randn(64, 64) for _ in range(6)]
    kind, fix = _culprit(_paths(_oldest(embeddings)), backward=False, per_storage=64 * 64 * 4)
    assert kind == "device_accumulation", (kind, fix)
    assert ".item()" not in fix and "bounded number" in fix and "detach" not in fix, fix
    assert "KiB/step" in fix and fix.startswith("`embeddings` accumulates CPU tensors every step"), fix


def test_kind_from_graph_field_alone() -> None:
    """The rule on the typed paths alone (a record read back): the same path, graph saved or not."""
    kept = [torch.ones(4, 4) for _ in range(3)]
    base = _paths(_oldest(kept))[0]
    plain = SiteGrowth("a.py:1", 64 * KiB, 640 * KiB, 10, 1.0, (base,))
    assert attribute([plain], min_bytes_per_step=0.0)[0].kind == "device_accumulation"
    with_graph = HolderPath(base.root, base.steps, base.depth, base.typed_steps, GRAPH_SAVED)
    fact = SiteGrowth("a.py:1", 64 * KiB, 640 * KiB, 10, 1.0, (with_graph,))
    assert attribute([fact], min_bytes_per_step=0.0)[0].kind == "retained_graph"


def test_the_run_names_kept_outputs_from_the_tensors_born_during_the_run() -> None:
    """The path ``torchmem run`` takes when the exact ledger missed the steps that kept them (growth found
    late: "born at an unknown site"): the largest tensors born during the run are the kept outputs
    themselves, held by ``samples[i]`` with no hop into their graph — still a retained graph."""
    from torchmem.run.timeline import live_storages, timeline_culprits

    cpu = torch.device("cpu")
    model = _model()
    born_before = set(live_storages(cpu))
    samples = [model(torch.randn(64, 32)) for _ in range(6)]
    culprits, _ = timeline_culprits(cpu, born_before, 40 * KiB, "step", backward=False)
    assert culprits and culprits[0].kind == "retained_graph", culprits
    assert "torch.no_grad()" in culprits[0].fix and ".item()" not in culprits[0].fix, culprits[0].fix
    assert "samples" in (culprits[0].holder or ""), culprits[0].holder
    # must not: the same outputs detached are kept tensors, fixed without a word of graphs
    detached = [s.detach() for s in samples]
    samples.clear()
    assert len(detached) == 6
    culprits, _ = timeline_culprits(cpu, born_before, 40 * KiB, "step", backward=False)
    assert culprits and culprits[0].kind == "device_accumulation", culprits
    assert "graph" not in culprits[0].fix and "detached" in (culprits[0].holder or ""), culprits[0]


def test_the_model_state_remade_each_step_is_not_named_for_what_a_loop_kept() -> None:
    """The same path with a model whose gradients and Adam moments (a 256x1000 layer: 1 MB each, remade by
    ``zero_grad(set_to_none=True)`` and alive at the end) outweigh each kept output (64x1000: 256 KB): what
    grew is the many outputs of one size that ``val_outputs`` keeps. It named the gradient
    (``loss.grad_fn -> graph leaf (AccumulateGrad.variable).grad``, "`loss` carries its autograd graph")."""
    from torchmem.run.timeline import live_storages, timeline_culprits

    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1000))
    opt = torch.optim.Adam(model.parameters())
    born_before = set(live_storages(cpu))
    val_outputs = []
    for _ in range(4):
        for _ in range(3):
            loss = model(torch.randn(8, 256)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            val_outputs += [model(torch.randn(64, 256)) for _ in range(4)]
    grown = 16 * 64 * 1000 * 4
    culprits, _ = timeline_culprits(cpu, born_before, grown / 12, "step", backward=True, grown=grown)
    assert culprits and culprits[0].kind == "device_accumulation", culprits
    assert "val_outputs" in (culprits[0].holder or ""), culprits[0].holder
    assert "AccumulateGrad" not in (culprits[0].holder or "") and ".state[" not in (culprits[0].holder or "")
    # must not: where the optimizers' state is what grew (an optimizer made anew and kept per epoch), it is
    # named: what else is alive (the kept outputs, dropped here) is less than half the growth
    val_outputs.clear()
    opts = [opt]
    for _ in range(3):
        opts.append(torch.optim.Adam(model.parameters()))
        model(torch.randn(8, 256)).square().mean().backward()
        opts[-1].step()
    grown = 3 * 2 * (256 * 256 + 256 + 256 * 1000 + 1000) * 4
    culprits, _ = timeline_culprits(cpu, born_before, grown / 3, "step", backward=True, grown=grown)
    assert culprits and "opts" in (culprits[0].holder or ""), culprits
