"""Who holds the memory at an out-of-memory error, and the named situations that explain them.

:func:`oom_holders` takes one census of the OOM device's live storages (:func:`torchmem.analysis.live.census`:
every storage with its category and holder path, found by one holder search bounded by time and object count),
groups the storages by holder — the variable a path starts from, the autograd graph a tensor keeps (its
``grad_fn`` graph with its saved tensors), the model or optimizer that names them, the frames an exception
keeps, a cycle through autograd — and names the situations the holders show:

- ``training_graph``: autograd was off at the OOM (evaluation under ``no_grad``/``inference_mode``), or the
  model was in ``eval()`` mode, yet graphs saved for backward are alive: left from a training step, kept by
  the variables that still refer to its outputs (``out``, ``loss``). Fix: ``del out, loss`` before evaluating.
- ``previous_outputs``: a loop's variables that the loop assigns only after the failing line
  (:func:`~torchmem.analysis.oom.loops.stale_names`) still hold the previous batch's outputs while the next
  batch is computed. Fix: ``del out, loss`` at the end of each step.
- ``orphaned_optimizer``: an optimizer steps parameters no live module has any more: its model was deleted,
  and it keeps the parameters, their gradients and its state. Fix: ``del opt``.
- ``retry_in_except``: an OOM raised while an earlier one was being handled (a retry inside ``except``): the
  failed attempt's frames, kept by that exception's traceback, with what their tensors' graphs saved.
- ``autograd_cycle``: tensors only a cycle through autograd keeps (``x.grad`` from ``create_graph=True``).

A situation is named only when its holders hold a share of the memory that matters (5 % of what is allocated,
64 KiB at least, or as much as the request). The holders' bytes sum, with what has no holder named and what no
live tensor explains, to what was allocated. Reading live objects only; the device figures come in as
arguments. Cost: that of the census (~0.7 s at 430k gc objects after ``import transformers, lightning``, a
GPT-2 and its graph, on 2 cores), bounded by ``time_limit``, plus one bytecode pass per frame on the stack.
"""

from __future__ import annotations

import dis
import sys
import time
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from torchmem._exceptions import exception_chain
from torchmem._format import fmt_bytes
from torchmem._gc import items_now
from torchmem.analysis.holders.cycles import expression
from torchmem.analysis.holders.roots import CO_OPTIMIZED, FrameSnapshots
from torchmem.analysis.live import LiveCensus, Storage, census, graph_tensors, tensor_parts
from torchmem.analysis.oom.loops import stale_names
from torchmem.results.holders import HolderPath, StepKind
from torchmem.results.live import SAVED
from torchmem.results.oom_holders import HolderFix, MemoryHolder, OOMHolders, Situation

#: Seconds the holders of one OOM may take, the holder search included. Usually well under 1 s; the limit
#: is 2 s because indexing the heap alone took 0.9 s of a 1 s limit on the H100 host (2026-11-27: a CUDA
#: program's OOM named 6 MiB of its 129 MiB, "100 objects explored"), and an OOM is explained once.
TIME_LIMIT = 2.0
#: Most objects the holder search explores for one OOM.
MAX_OBJECTS = 200_000
#: Most holders listed; the smallest beyond are summed in one.
MAX_HOLDERS = 40

_NAME_STEPS = (StepKind.MODULE_GLOBAL, StepKind.FRAME_LOCAL, StepKind.CLASS_ATTRIBUTE)
_ITEM_STEPS = (StepKind.ITEM, StepKind.DICT_KEY, StepKind.SET_MEMBER)


# ---------------------------------------------------------------------------------------------------------
# frames and values


def _own(f: types.FrameType) -> bool:
    """torchmem's and torch's frames: plumbing between the program and the OOM, never its variables."""
    top = str(f.f_globals.get("__name__", "")).partition(".")[0]
    return top in ("torchmem", "torch")


def oom_frames(exc: BaseException | None) -> list[tuple[types.FrameType, int]]:
    """The program's frames around the OOM, each with the offset it was at when the OOM was raised: the
    frames of ``exc``'s traceback (the catching frame and those the error left), then their callers, which
    are still running; without an exception, the calling thread's stack. torch's and torchmem's are left out.
    """
    out: list[tuple[types.FrameType, int]] = []
    seen: set[int] = set()
    tb = exc.__traceback__ if exc is not None else None
    first: types.FrameType | None = None
    while tb is not None:
        f = tb.tb_frame
        if first is None:
            first = f
        if id(f) not in seen:
            seen.add(id(f))
            if not _own(f):
                out.append((f, tb.tb_lasti))
        tb = tb.tb_next
    f2: types.FrameType | None = first.f_back if first is not None else sys._getframe(1)
    while f2 is not None:
        if id(f2) not in seen:
            seen.add(id(f2))
            if not _own(f2):
                out.append((f2, f2.f_lasti))
        f2 = f2.f_back
    return out


def _tensors(value: Any, depth: int = 2) -> Iterator[torch.Tensor]:
    """The tensors ``value`` holds: itself, in containers (dicts, lists, tuples, sets, model outputs) and
    in a plain object's attributes, ``depth`` levels down, 1000 items per container at most."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if depth <= 0 or isinstance(value, (str, bytes, int, float, type, types.ModuleType, types.FunctionType)):
        return
    items: Iterable[Any]
    if isinstance(value, dict):
        items = list(value.values())[:1000]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)[:1000]
    elif isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
        return  # named by the census as a model or an optimizer
    else:
        try:
            d = object.__getattribute__(value, "__dict__")
        except Exception:
            return
        items = list(d.values())[:1000] if isinstance(d, dict) else ()
    for v in items:
        yield from _tensors(v, depth - 1)


def _keys_of(values: Iterable[Any], graphs: bool = True) -> set[int]:
    """Storage keys of the tensors ``values`` hold, and with ``graphs`` of what their graphs saved."""
    keys: set[int] = set()
    roots: list[torch.Tensor] = []
    for v in values:
        for t in _tensors(v):
            for _, _, k in tensor_parts(t) or ():
                keys.add(k)
            if graphs and t.grad_fn is not None:
                roots.append(t)
    if roots:
        try:
            for _, t in graph_tensors(roots):
                for _, _, k in tensor_parts(t) or ():
                    keys.add(k)
        except Exception:  # a node that refuses to be read: what was found so far
            pass
        roots.clear()
    return keys


def _has_graph(value: Any) -> bool:
    return any(t.grad_fn is not None for t in _tensors(value))


def _locals(frame: types.FrameType, snaps: FrameSnapshots) -> dict[str, Any]:
    loc = snaps.read_dict(frame)
    return dict(loc) if loc is not None else {}


# ---------------------------------------------------------------------------------------------------------
# holders


def _head(path: HolderPath) -> tuple[str, str, str]:
    """``(label, kind, type)`` of the holder a storage's path starts at: the variable (module global, frame
    local, class attribute) it goes through first, or the frame local an exception's traceback keeps."""
    steps = path.typed_steps
    if path.root in ("gc-orphan", "cycle"):
        return steps[0].text, "cycle" if path.root == "cycle" else "other", ""
    frame_at = next(
        (i for i, s in enumerate(steps) if s.kind is StepKind.TRACEBACK and s.text.startswith(" -> frame")),
        None,
    )
    if frame_at is not None or path.root in ("exception", "traceback"):
        end = frame_at if frame_at is not None else 0
        if end + 1 < len(steps) and steps[end + 1].kind is StepKind.FRAME_LOCAL:
            end += 1
        return "".join(s.text for s in steps[: end + 1]), "exception", ""
    at = next((i for i, s in enumerate(steps) if s.kind in _NAME_STEPS), None)
    if at is None:
        return "".join(s.text for s in steps[:2]), "other", ""
    label = "".join(s.text for s in steps[: at + 1])
    rest = steps[at + 1 :]
    typ = rest[0].holder_type.rsplit("<locals>.", 1)[-1] if rest else "Tensor"
    kind = "container" if rest and rest[0].kind in _ITEM_STEPS else "variable"
    return label, kind, typ


def _through_graph(s: Storage) -> bool:
    """The storage is held through an autograd graph (its path goes through a tensor's ``grad_fn``)."""
    return s.path is not None and StepKind.GRAD_FN in s.path.kinds


def _group(c: LiveCensus) -> tuple[list[MemoryHolder], int]:
    """The holders of the census's storages, most bytes first, and the bytes of those without one."""
    # label -> [kind, type, bytes, storages, categories, largest, path, through graphs]
    groups: dict[str, list[Any]] = {}
    unnamed = 0
    for s in c.storages:
        if s.cycle is not None and not c.cycles[s.cycle].held_by:
            loops = c.cycles[s.cycle].loops
            label, kind, typ = (loops[0] if loops else "autograd cycle"), "cycle", "cycle"
        elif s.owned_by is not None:
            o = c.owners[s.owned_by]
            label, kind, typ = o.label, o.kind, o.type
        elif s.path is None:
            unnamed += s.bytes
            continue
        else:
            label, kind, typ = _head(s.path)
        g = groups.setdefault(label, [kind, typ, 0, 0, {}, -1, None, 0])
        g[2] += s.bytes
        g[3] += 1
        if kind in ("variable", "container", "exception") and _through_graph(s):
            g[7] += s.bytes
        else:
            g[4][s.category] = g[4].get(s.category, 0) + s.bytes
        if s.bytes > g[5]:
            g[5], g[6] = s.bytes, None if s.path is None else str(s.path)
    out = []
    for label, (kind, typ, nbytes, n, cats, _, path, graph) in groups.items():
        if kind in ("variable", "container") and graph * 2 >= nbytes:
            kind = "graph"  # mostly what its autograd graph saved
        out.append(MemoryHolder(label, kind, nbytes, n, dict(cats), typ, path, graph))
    out.sort(key=lambda h: -h.bytes)
    if len(out) > MAX_HOLDERS:  # the smallest as one line: a diagnosis stays small, the sums still add up
        rest = out[MAX_HOLDERS - 1 :]
        merged: dict[str, int] = {}
        for h in rest:
            for k, b in h.categories.items():
                merged[k] = merged.get(k, 0) + b
        out[MAX_HOLDERS - 1 :] = [
            MemoryHolder(
                f"{len(rest)} smaller holders",
                "other",
                sum(h.bytes for h in rest),
                sum(h.tensors for h in rest),
                merged,
                graph=sum(h.graph for h in rest),
            )
        ]
    return out, unnamed


# ---------------------------------------------------------------------------------------------------------
# situations


class _Facts:
    """What the situations are judged on: the census, its storages by key, the OOM's figures."""

    def __init__(self, c: LiveCensus, allocated: int | None, requested: int | None) -> None:
        self.c = c
        self.by_key: dict[int, Storage] = {s.key: s for s in c.storages}
        self.allocated = allocated if allocated is not None else (c.report.total if c.report else None)
        self.requested = requested
        self.explained: set[int] = set()  # storage keys a situation explains

    def bytes_of(self, keys: Iterable[int]) -> int:
        return sum(self.by_key[k].bytes for k in set(keys) if k in self.by_key)

    def matters(self, nbytes: int) -> bool:
        """Whether a situation holding ``nbytes`` is worth naming."""
        if nbytes <= 0:
            return False
        if self.requested is not None and nbytes >= self.requested:
            return True
        return nbytes >= max(64 << 10, 0.05 * (self.allocated or 0))

    def share(self, nbytes: int) -> float | None:
        return nbytes / self.allocated if self.allocated else None

    def of(self, nbytes: int) -> str:
        share = self.share(nbytes)
        return f"{fmt_bytes(nbytes)}" + (f", {share:.0%} of what was allocated" if share is not None else "")


def _names(names: Sequence[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    if len(quoted) <= 1:
        return "".join(quoted)
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _verb(names: Sequence[str], one: str, more: str) -> str:
    return one if len(names) == 1 else more


def _graph_variables(frames: list[tuple[types.FrameType, int]], snaps: FrameSnapshots) -> list[str]:
    """Variables of the program's frames and of ``__main__`` that hold a tensor with an autograd graph."""
    found: dict[str, None] = {}
    spaces: list[dict[str, Any]] = [_locals(f, snaps) for f, _ in frames]
    main = sys.modules.get("__main__")
    if main is not None and isinstance(getattr(main, "__dict__", None), dict):
        spaces.append(main.__dict__)
    for ns in spaces:
        for name, v in items_now(ns):
            if not name.startswith("__") and name.isidentifier() and _has_graph(v):
                found.setdefault(name, None)
    return list(found)


def _models(c: LiveCensus) -> list[Any]:
    """The root modules with parameters or buffers on the device (a loss module's mode says nothing)."""
    owning = {s.owned_by for s in c.storages if s.owned_by is not None}
    return [
        o for i, o in enumerate(c.owners) if o.kind == "module" and o.training is not None and i in owning
    ]


def _training_graph(f: _Facts, grad_enabled: bool | None, variables: list[str]) -> Situation | None:
    c = f.c
    modules = _models(c)
    in_eval = bool(modules) and not any(o.training for o in modules)
    if grad_enabled is not False and not (grad_enabled is None and in_eval):
        return None
    saved = [
        s
        for s in c.storages
        if s.category == SAVED and s.cycle is None and _through_graph(s) and not _via_exception(s)
    ]
    nbytes = sum(s.bytes for s in saved)
    if not f.matters(nbytes):
        return None
    f.explained.update(s.key for s in saved)
    from_paths = {e.split(".")[0].split("[")[0] for e in (expression(s.path) for s in saved) if e}
    names = [v for v in variables if v in from_paths] + [v for v in variables if v not in from_paths]
    names += sorted(from_paths - set(names))
    why = (
        "autograd was off at the OOM (torch.no_grad / inference_mode): evaluation builds no graph, so every "
        "graph alive is left from before"
        if grad_enabled is False
        else "the model is in eval() mode: the graphs alive are left from training (or evaluation runs with "
        "autograd on)"
    )
    who = _names(names) if names else "variables the search could not name"
    summary = (
        f"{who} still {_verb(names, 'holds', 'hold')} the last training step's autograd graph while "
        f"evaluation runs: {len(saved)} tensors saved for backward, {f.of(nbytes)}, that nothing will "
        "ever use."
    )
    evidence = [why, f"saved for backward: {fmt_bytes(nbytes)} in {len(saved)} tensors"]
    fixes = [
        HolderFix(
            f"Drop the last training step's {who} before evaluating (or end the training step inside a "
            "function whose locals go away): nothing frees their graph while evaluation runs.",
            f"del {', '.join(names)}" if names else None,
        )
    ]
    if grad_enabled is not False:
        fixes.append(HolderFix("And evaluate without autograd.", "with torch.no_grad(): ..."))
    return Situation(
        "training_graph", summary, nbytes, tuple(names), tuple(evidence), tuple(fixes), f.share(nbytes)
    )


def _via_exception(s: Storage) -> bool:
    p = s.path
    return p is not None and (p.root in ("exception", "traceback") or StepKind.TRACEBACK in p.kinds)


def _previous_outputs(
    f: _Facts, frames: list[tuple[types.FrameType, int]], snaps: FrameSnapshots
) -> Situation | None:
    for frame, lasti in frames:
        names, line = stale_names(frame.f_code, lasti)
        if not names:
            continue
        loc = _locals(frame, snaps) if frame.f_code.co_flags & CO_OPTIMIZED else frame.f_globals
        held = [(n, loc[n]) for n in names if n in loc and any(True for _ in _tensors(loc[n]))]
        if not held:
            continue
        keys = _keys_of(v for _, v in held)
        nbytes = f.bytes_of(keys)
        if not f.matters(nbytes):
            continue
        f.explained.update(keys)
        each = [(n, f.bytes_of(_keys_of([v]))) for n, v in held]
        kept = [n for n, b in each if b]
        code = frame.f_code
        where = f"{code.co_name}() in {code.co_filename.rsplit('/', 1)[-1]}"
        at_line = _line(code, lasti)
        at = f" (line {at_line})" if at_line else ""
        summary = (
            f"{_names(kept)} still {_verb(kept, 'holds', 'hold')} the previous batch's outputs — "
            f"{f.of(nbytes)} — while the loop in {where} computes the next batch{at}: both batches are alive "
            "at the peak."
        )
        evidence = [f"`{n}`: {fmt_bytes(b)}" for n, b in each if b]
        evidence.append(
            f"the loop assigns {_names(kept)} only after the line that ran out of memory"
            + (f" (first at line {line})" if line else "")
            + f", so {_verb(kept, 'it still holds', 'they still hold')} the previous iteration's values"
        )
        fixes = (
            HolderFix(
                f"Free {_names(kept)} once the step is done with {_verb(kept, 'it', 'them')} (at the end of "
                "the loop's body, after logging numbers with `.item()`), so the next batch starts without "
                "the last one's outputs.",
                f"del {', '.join(kept)}",
            ),
        )
        return Situation(
            "previous_outputs", summary, nbytes, tuple(kept), tuple(evidence), fixes, f.share(nbytes)
        )
    return None


def _line(code: types.CodeType, lasti: int) -> int | None:
    line = None
    for start, ln in dis.findlinestarts(code):
        if start > lasti:
            break
        line = ln
    return line


def _orphaned_optimizers(f: _Facts) -> list[Situation]:
    out = []
    c = f.c
    for i, o in enumerate(c.owners):
        if o.kind != "optimizer" or not o.orphaned:
            continue
        mine = [s for s in c.storages if s.owned_by == i]
        nbytes = sum(s.bytes for s in mine)
        if not f.matters(nbytes):
            continue
        f.explained.update(s.key for s in mine)
        expr = expression(o.path)
        var = expr.split(".")[0].split("[")[0] if expr else None
        cats: dict[str, int] = {}
        for s in mine:
            cats[s.category] = cats.get(s.category, 0) + s.bytes
        what = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1]))
        who = f"`{expr}` ({o.type})" if expr else f"an optimizer ({o.type}) at {o.label}"
        summary = (
            f"{who} steps parameters that no live model has any more — the model was deleted — and keeps "
            f"them, their gradients and its state: {f.of(nbytes)}."
        )
        setting = None
        if var:
            setting = f"del {var}"
        fix_text = (
            f"Delete {who} with its model: it holds {fmt_bytes(nbytes)} of parameters, gradients and state "
            "that nothing else uses (a new model needs an optimizer of its own)."
        )
        if expr and var and expr != var:
            fix_text += f" `{var}` reaches it through `{expr}`."
        out.append(
            Situation(
                "orphaned_optimizer",
                summary,
                nbytes,
                (expr or o.label,),
                (f"{o.label}: {what}", f"parameters no live nn.Module holds: all of those {o.type} steps"),
                (HolderFix(fix_text, setting),),
                f.share(nbytes),
            )
        )
    return out


def _retry(
    f: _Facts,
    handled: BaseException,
    running: set[int],
    snaps: FrameSnapshots,
) -> Situation | None:
    """What the frames of ``handled`` (the OOM being handled when this one was raised) hold, the frames still
    running (``running``, their locals are the program's) left out, graphs included."""
    held: list[tuple[str, int]] = []
    keys: set[int] = set()
    for e in exception_chain(handled):
        tb = e.__traceback__
        while tb is not None:
            fr = tb.tb_frame
            tb = tb.tb_next
            if id(fr) in running or _own(fr) or not fr.f_code.co_flags & CO_OPTIMIZED:
                continue
            running.add(id(fr))
            for name, v in _locals(fr, snaps).items():
                k = _keys_of([v])
                b = f.bytes_of(k - keys)
                keys |= k
                if b:
                    held.append((f"{fr.f_code.co_name}() local '{name}'", b))
    nbytes = f.bytes_of(keys)
    if nbytes <= 0:
        return None
    f.explained.update(keys)
    held.sort(key=lambda nb: -nb[1])
    summary = (
        f"The failed attempt's frames, kept alive by the {type(handled).__name__} being handled, hold "
        f"{f.of(nbytes)} while the retry inside the except block runs."
    )
    evidence = tuple(f"{n}: {fmt_bytes(b)}" for n, b in held[:8])
    return Situation(
        "retry_in_except", summary, nbytes, tuple(n for n, _ in held[:8]), evidence, (), f.share(nbytes)
    )


def _cycles(f: _Facts) -> list[Situation]:
    out = []
    for info in f.c.cycles:
        if info.held_by or not f.matters(info.bytes):
            continue
        f.explained.update(info.keys)
        loop = info.loops[0] if info.loops else "a tensor's .grad and its graph"
        out.append(
            Situation(
                "autograd_cycle",
                f"A cycle through autograd nothing else holds keeps {f.of(info.bytes)}: {loop}.",
                info.bytes,
                (loop,),
                (f"{len(info.keys)} tensors kept only by the cycle (gc.collect() cannot free it)",),
                (HolderFix(info.fix[:1].upper() + info.fix[1:] + ".", "x.grad = None"),),
                f.share(info.bytes),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------
# the entry point


def oom_holders(
    device: torch.device,
    *,
    allocated: int | None = None,
    requested: int | None = None,
    grad_enabled: bool | None = None,
    exc: BaseException | None = None,
    handled: BaseException | None = None,
    only: set[int] | None = None,
    exclude: Iterable[Any] = (),
    time_limit: float | None = None,
    max_objects: int = MAX_OBJECTS,
    when: str = "at the OOM",
) -> OOMHolders:
    """Who holds the memory of ``device`` now, and the situations that explain it (see the module docstring).

    Args:
        device: The OOM's device.
        allocated: What was allocated at the OOM (the allocator's figure; on the CPU torchmem's ledger).
        requested: The request that failed.
        grad_enabled: Whether autograd was recording at the OOM (``None``: unknown; the models' ``training``
            flags are read instead).
        exc: The OOM exception, when there is one: its traceback gives the frames and the lines they were at.
        handled: An earlier OOM that was being handled when this one was raised (a retry inside ``except``).
        only: Count only these storage keys (on the CPU, the storages torchmem's ledger counts under a cap).
        exclude: Objects that are not holders (the caller's own containers).
        time_limit: Seconds it may take (``None``: :data:`TIME_LIMIT`, read at the call); the holder search
            stops there and ``not_searched`` says so.
        max_objects: Most objects the holder search explores.
        when: ``"at the OOM"`` or ``"when the OOM was explained"``, for the text.

    Example:
        >>> import torch
        >>> keep = torch.ones(1 << 20)
        >>> h = oom_holders(torch.device("cpu"), grad_enabled=True)
        >>> any(x.label.endswith(".keep") or x.label.endswith("'keep'") for x in h.holders)   # doctest: +SKIP
        True
    """
    if time_limit is None:
        time_limit = TIME_LIMIT
    started = time.perf_counter()
    snaps = FrameSnapshots()
    notes: list[str] = []
    try:
        c = census(
            device,
            allocated,
            True,
            time_limit=time_limit,
            max_objects=max_objects,
            only=only,
            exclude=exclude,
        )
        holders, unnamed = _group(c)
        report = c.report
        total = report.total if report is not None else sum(s.bytes for s in c.storages)
        f = _Facts(c, allocated, requested)
        frames = oom_frames(exc)
        situations: list[Situation] = []
        try:
            tg = _training_graph(f, grad_enabled, _graph_variables(frames, snaps))
            if tg is not None:
                situations.append(tg)
            po = _previous_outputs(f, frames, snaps)
            if po is not None:
                situations.append(po)
            situations += _orphaned_optimizers(f)
            if handled is not None:
                running = _running_ids(exc, handled)
                rt = _retry(f, handled, running, snaps)
                if rt is not None:
                    situations.append(rt)
            situations += _cycles(f)
        except Exception as e:  # a frame or an object that refused inspection: the holders still stand
            notes.append(f"The situations could not all be judged ({type(e).__name__}: {e}).")
        situations.sort(key=lambda s: -s.bytes)
        not_searched = None
        if c.truncated:
            not_searched = (
                f"the holder search stopped at its {c.reason or 'limit'} ({c.seconds:.2f} s, "
                f"{c.visited:,} objects explored; limits {time_limit:g} s and {max_objects:,} objects)"
                + (f": {fmt_bytes(unnamed)} of tensors have no holder named" if unnamed else "")
            )
        unaccounted = None if allocated is None else max(allocated - total, 0)
        modules = [o.training for o in _models(c)]
        rest: dict[str, int] = {}
        for s in c.storages:
            if s.key not in f.explained:
                rest[s.category] = rest.get(s.category, 0) + s.bytes
        return OOMHolders(
            device=str(device),
            allocated=allocated,
            total=total,
            holders=tuple(holders),
            unnamed=unnamed,
            unaccounted=unaccounted,
            situations=tuple(situations),
            rest=rest,
            grad_enabled=grad_enabled,
            training=any(modules) if modules else None,
            seconds=time.perf_counter() - started,
            visited=c.visited,
            complete=not c.truncated,
            not_searched=not_searched,
            when=when,
            notes=tuple(notes),
        )
    finally:
        snaps.release()


def _running_ids(exc: BaseException | None, handled: BaseException) -> set[int]:
    """Frames still running when ``exc`` was raised while ``handled`` was being handled: the calling stack
    and the frames ``exc`` went through that are not ``handled``'s (its finished frames are the failed
    attempt's)."""
    ids: set[int] = set()
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        ids.add(id(f))
        f = f.f_back
    earlier = {id(e) for e in exception_chain(handled)}
    for e in exception_chain(exc):
        if id(e) in earlier:
            continue
        tb = e.__traceback__
        while tb is not None:
            ids.add(id(tb.tb_frame))
            tb = tb.tb_next
    return ids


__all__ = ["MAX_HOLDERS", "MAX_OBJECTS", "TIME_LIMIT", "oom_frames", "oom_holders"]
