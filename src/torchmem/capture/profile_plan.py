"""The module profiler's table (:mod:`~torchmem.capture.profile`): one row per module of the model (by its
qualified name as the user wrote it, under a ``torch.compile`` wrapper too), the modules that get hooks and
those measured by their parameters only (compiled in place, TorchScript, inside a compiled module).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torchmem.analysis.profile import RawModule

ORIG = "_orig_mod"


def is_compiled_wrapper(m: torch.nn.Module) -> bool:
    return type(m).__name__ == "OptimizedModule" and isinstance(getattr(m, ORIG, None), torch.nn.Module)


def clean_name(name: str) -> str | None:
    """The user's name of a module under a ``torch.compile`` wrapper; ``None`` for the wrapped module."""
    parts = name.split(".") if name else []
    if parts and parts[-1] == ORIG:
        return None
    return ".".join(p for p in parts if p != ORIG)


class ModulePlan(NamedTuple):
    """What :func:`plan_modules` found: the rows, each module's row, the modules to hook and the parameters
    (the parameter table: each module's row names its parameters by their index here)."""

    rows: list[RawModule]
    row_of: dict[int, int]  # id(module) -> row (alive for the block: the model holds them)
    hooked: list[torch.nn.Module]
    params: list[torch.nn.Parameter]


def plan_modules(model: torch.nn.Module) -> ModulePlan:
    """Rows, the modules to hook and the parameter table."""
    rows: list[RawModule] = []
    row_of: dict[int, int] = {}
    hooked: list[torch.nn.Module] = []
    skip_under: list[str] = []  # prefixes (raw names) whose modules get no hooks
    params = list(model.parameters())
    pidx = {id(p): i for i, p in enumerate(params)}
    names_seen: dict[int, str] = {}
    for raw, m in model.named_modules(remove_duplicate=False):
        if id(m) in names_seen:
            first = clean_name(names_seen[id(m)])
            alias = clean_name(raw)
            if first is not None and alias is not None and first != alias and id(m) in row_of:
                rec = rows[row_of[id(m)]]
                note = f"also reachable as '{alias}' (one module: counted once)"
                if note not in rec.notes:
                    rec.notes.append(note)
            continue
        names_seen[id(m)] = raw
        name = clean_name(raw)
        if name is None:  # the module inside a compile wrapper: the wrapper's row stands for it
            continue
        row = len(rows)
        sub = tuple(sorted({pidx[id(p)] for p in m.parameters() if id(p) in pidx}))
        rows.append(RawModule(name=name, type=type(m).__name__, params=sub))
        row_of[id(m)] = row
        inside = any(raw == s or raw.startswith(s + ".") for s in skip_under)
        if inside:
            rows[row].activations = None
            rows[row].notes.append("inside a compiled module: only its parameters are measured")
            continue
        if getattr(m, "_compiled_call_impl", None) is not None:  # module.compile() in place
            skip_under.append(raw)
            rows[row].activations = None
            rows[row].notes.append(
                "compiled in place (module.compile()): hooks would run inside the compiled code, so "
                "only its parameters are measured; profile it before compiling, or use torch.compile(m)"
            )
            continue
        if isinstance(m, torch.jit.ScriptModule):
            skip_under.append(raw)
            rows[row].activations = None
            rows[row].notes.append("TorchScript module: hooks are not supported; parameters only")
            continue
        if is_compiled_wrapper(m):
            skip_under.append(f"{raw}.{ORIG}" if raw else ORIG)
            rows[row].notes.append(
                "torch.compile'd: measured as one block (hooks inside compiled code break the graph)"
            )
        hooked.append(m)
    return ModulePlan(rows, row_of, hooked, params)


__all__ = ["ORIG", "ModulePlan", "clean_name", "is_compiled_wrapper", "plan_modules"]
