"""Who held the memory at an out-of-memory error: :class:`OOMHolders`, its :class:`MemoryHolder` s and the
named :class:`Situation` s that explain them (a training graph kept during evaluation, the previous batch's
outputs kept, an optimizer of a deleted model, a failed attempt's frames in a retry inside ``except``, a
cycle through autograd), each with the fixes its holders call for.

Frozen data with ``to_dict()``/``from_dict()`` and plain text; :mod:`torchmem.analysis.oom.holders` builds it
from the live objects, :func:`torchmem.analysis.oom.diagnose` turns its situations into causes, and
:class:`~torchmem.results.oom.OOMDiagnosis` carries it (``diagnosis.holders``). Nothing here touches torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchmem._format import count, fmt_bytes
from torchmem.results._dicts import from_mapping

#: Every kind of situation, in the order the documentation lists them. Each is also a cause kind.
SITUATION_KINDS = (
    "training_graph",
    "previous_outputs",
    "orphaned_optimizer",
    "retry_in_except",
    "autograd_cycle",
)

#: A holder's kind: what holds the memory.
HOLDER_KINDS = ("variable", "container", "graph", "module", "optimizer", "exception", "cycle", "other")


@dataclass(frozen=True)
class HolderFix:
    """One fix a situation calls for (the diagnosis turns it into a :class:`~torchmem.results.oom.Fix`).

    Attributes:
        text: What to do and why, in a sentence.
        setting: The exact code (``del out, loss``), when there is one.
    """

    text: str
    setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "setting": self.setting}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HolderFix:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class MemoryHolder:
    """One holder of the memory at the OOM: each live storage is counted in one holder only.

    Attributes:
        label: Who, as holder paths name it: ``main() in train.py, local 'out'``, ``__main__.model``,
            ``__main__.opt``, ``sys.exc_info()[1].__traceback__ -> frame train.py:9 in attempt(), local 'h'``.
        kind: ``"variable"`` (a variable's own tensors), ``"container"`` (a list, dict or object of many),
            ``"graph"`` (what a tensor's autograd graph saved for backward, reached through a variable),
            ``"module"`` (a model's parameters, gradients and buffers), ``"optimizer"`` (its state, and the
            parameters no live model names), ``"exception"`` (frames an exception's traceback keeps),
            ``"cycle"`` (a cycle through autograd nothing else holds) or ``"other"``.
        bytes: The bytes of its storages.
        tensors: How many storages.
        categories: Bytes per tensor category (``parameter``, ``gradient``, ``optimizer state``, ``buffer``,
            ``saved for backward``, ``other``) of the storages it holds itself, not through an autograd graph.
        type: The holder's type (``GPT2LMHeadModel``, ``AdamW``, ``list``), when known.
        path: One full holder path of its largest storage.
        graph: Bytes it holds through the autograd graphs of its tensors (``.grad_fn -> saved tensor ...``):
            what they saved for backward.
    """

    label: str
    kind: str
    bytes: int
    tensors: int
    categories: dict[str, int] = field(default_factory=dict)
    type: str = ""
    path: str | None = None
    graph: int = 0

    def line(self) -> str:
        """``74.00 GiB  main() in train.py, local 'out': 413 tensors (its autograd graph 73.99 GiB, ...)``."""
        parts = [f"its autograd graph {fmt_bytes(self.graph)}"] if self.graph else []
        cats = sorted(self.categories.items(), key=lambda kv: -kv[1])
        parts += [f"{c} {fmt_bytes(b)}" for c, b in cats if b]
        kind = f" ({self.type})" if self.type and self.type not in ("Tensor", "cycle") else ""
        return f"{fmt_bytes(self.bytes):>12}  {self.label}{kind}: {count(self.tensors, 'tensor')}" + (
            f" ({', '.join(parts)})" if parts else ""
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "kind": self.kind,
            "bytes": self.bytes,
            "tensors": self.tensors,
            "categories": dict(self.categories),
            "type": self.type,
            "path": self.path,
            "graph": self.graph,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryHolder:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return self.line().strip()


@dataclass(frozen=True)
class Situation:
    """A named situation that explains holders of the memory at the OOM, with the fixes they call for.

    Attributes:
        kind: ``"training_graph"`` (a training step's graph still alive while evaluation runs without
            autograd), ``"previous_outputs"`` (a loop's variables still hold the previous batch's outputs
            while the next batch is computed), ``"orphaned_optimizer"`` (an optimizer holds the parameters,
            gradients and state of a model that was deleted), ``"retry_in_except"`` (a retry inside
            ``except``: the failed attempt's frames, kept by the exception's traceback) or
            ``"autograd_cycle"`` (tensors kept by a cycle through autograd).
        summary: One sentence naming the holders.
        bytes: What they hold (each storage once).
        names: The variables or holders it names (``("out", "loss")``, ``("opt",)``).
        evidence: The figures behind it, one per line.
        fixes: The fixes, specific to these holders.
        share: ``bytes`` as a share of what was allocated at the OOM (``None``: unknown).
    """

    kind: str
    summary: str
    bytes: int
    names: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    fixes: tuple[HolderFix, ...] = ()
    share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "bytes": self.bytes,
            "names": list(self.names),
            "evidence": list(self.evidence),
            "fixes": [f.to_dict() for f in self.fixes],
            "share": self.share,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Situation:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return self.summary


@dataclass(frozen=True)
class OOMHolders:
    """Who held the memory of the OOM's device when it was explained: the largest holders, summing with
    ``unnamed`` and ``unaccounted`` to what was allocated, and the situations that explain them.

    Attributes:
        device: The OOM's device (``"cuda:0"``, ``"cpu"``).
        allocated: What was allocated at the OOM: the allocator's figure, or on the CPU torchmem's ledger
            (``None``: unknown).
        total: The bytes of the live storages found (memory several storages share counted once).
        holders: Every holder, most bytes first.
        unnamed: Bytes of storages whose holder the search did not find (its limits, or only C++ holds them).
        unaccounted: ``allocated - total``: memory no live Python tensor explains (tensors only C++ holds,
            temporaries of the failed operation freed since, allocator rounding, library workspaces);
            ``None`` when ``allocated`` is unknown. Never negative.
        situations: The named situations, most bytes first.
        rest: Bytes per tensor category of the storages no situation explains (what the working set's
            fixes are chosen by); what autograd graphs saved counts as ``saved for backward``.
        grad_enabled: Whether autograd was recording at the OOM (``None``: unknown).
        training: Whether a live model was in training mode (``False``: every one was in ``eval()`` mode;
            ``None``: no model).
        seconds: How long finding the holders took.
        visited: Objects the holder search explored.
        complete: The search ran to its end (``False``: it stopped at a limit; ``not_searched`` says which).
        not_searched: What was not searched and why, in words.
        when: When the holders were read: ``"at the OOM"`` (where the error reached the program: the
            ``except`` that caught it, a ``with`` block it left) or ``"when the OOM was explained"``
            (``explain_oom`` with the exception, later).
        notes: What else could not be known.
    """

    device: str
    allocated: int | None
    total: int
    holders: tuple[MemoryHolder, ...] = ()
    unnamed: int = 0
    unaccounted: int | None = None
    situations: tuple[Situation, ...] = ()
    rest: dict[str, int] = field(default_factory=dict)
    grad_enabled: bool | None = None
    training: bool | None = None
    seconds: float = 0.0
    visited: int = 0
    complete: bool = True
    not_searched: str | None = None
    when: str = "at the OOM"
    notes: tuple[str, ...] = ()

    def named(self) -> int:
        """Bytes of the storages whose holder is named."""
        return sum(h.bytes for h in self.holders)

    def lines(self, top: int = 8) -> list[str]:
        """The holders as the diagnosis prints them: the ``top`` largest, the rest summed, what has no
        holder, what no live tensor explains, and what was not searched."""
        alloc = f" ({fmt_bytes(self.allocated)} allocated)" if self.allocated is not None else ""
        out = [f"Who holds the memory on {self.device} {self.when}{alloc}:"]
        out += [f"  {h.line()}" for h in self.holders[:top]]
        rest = self.holders[top:]
        if rest:
            out.append(
                f"  {fmt_bytes(sum(h.bytes for h in rest)):>12}  ... {count(len(rest), 'more holder')}"
            )
        if self.unnamed:
            why = "the search stopped before finding it" if not self.complete else "only C++ holds it"
            out.append(f"  {fmt_bytes(self.unnamed):>12}  no holder named ({why})")
        if self.unaccounted:
            out.append(
                f"  {fmt_bytes(self.unaccounted):>12}  not a live Python tensor (tensors only C++ holds, the "
                "failed operation's temporaries, allocator rounding, library workspaces)"
            )
        if self.not_searched:
            out.append(f"  not searched: {self.not_searched}")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "allocated": self.allocated,
            "total": self.total,
            "holders": [h.to_dict() for h in self.holders],
            "unnamed": self.unnamed,
            "unaccounted": self.unaccounted,
            "situations": [s.to_dict() for s in self.situations],
            "rest": dict(self.rest),
            "grad_enabled": self.grad_enabled,
            "training": self.training,
            "seconds": self.seconds,
            "visited": self.visited,
            "complete": self.complete,
            "not_searched": self.not_searched,
            "when": self.when,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMHolders:
        return from_mapping(cls, d)


__all__ = [
    "HOLDER_KINDS",
    "SITUATION_KINDS",
    "HolderFix",
    "MemoryHolder",
    "OOMHolders",
    "Situation",
]
