"""TM005: CUDA used where DataLoader workers run the code (a Dataset's ``__getitem__``, a collate_fn, a
worker_init_fn), unless every DataLoader of the file that runs it has no workers. Pure standard library: no
torch import."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchmem.lint._syntax import DATASET_METHODS, is_const, is_dataset_class, keyword_arg, last_name
from torchmem.lint._walk import Scope

if TYPE_CHECKING:
    from torchmem.lint._flow import DataFlow
    from torchmem.lint._walk import ModuleFacts, Walker


def _without_workers(loader: ast.Call) -> bool:
    """Whether a ``DataLoader(...)`` call runs without worker processes (no ``num_workers``, or ``None``
    or 0)."""
    workers = keyword_arg(loader, "num_workers")
    if workers is None:
        return True
    value = workers.value
    return is_const(value, None) or (isinstance(value, ast.Constant) and value.value == 0)


class WorkerChecks:
    """TM005; mixed into :class:`torchmem.lint._checker.Rules` (which gives ``w``, ``facts``, ``flow`` and
    ``add``)."""

    w: Walker
    facts: ModuleFacts
    flow: DataFlow

    if TYPE_CHECKING:  # Rules defines it; declared here for the type checker only

        def add(self, node: ast.AST, code: str, message: str, form: str = "") -> None: ...

    def _tm005(self, scope: Scope) -> None:
        role = self._worker_role(scope)
        if role is None:
            return
        if (
            scope.cls is not None
            and role.startswith(f"`{scope.cls.name}.")
            and self._no_workers(scope.cls.name)
        ):
            return  # every DataLoader of this file over the dataset loads in the main process
        if "collate_fn" in role and self._collated_without_workers():
            return  # every DataLoader of this file given a collate_fn collates in the main process
        for kind, node, _ctx, _extra in scope.events:
            if kind == "cuda" and isinstance(node, ast.Call) and self.flow.is_cuda_call(node):
                self.add(
                    node,
                    "TM005",
                    f"{role} moves data to CUDA; it runs in DataLoader worker processes, where CUDA cannot "
                    "be initialised after a fork (and each worker would create its own CUDA context)",
                )
                return

    def _collated_without_workers(self) -> bool:
        """Whether this file gives collate functions to DataLoaders, all without workers (petastorm's
        DataLoader has none: it collates in the main process)."""
        found = False
        for scope in self.w.scopes:
            for kind, node, _ctx, _extra in scope.events:
                if kind != "dataloader" or not isinstance(node, ast.Call):
                    continue
                if keyword_arg(node, "collate_fn") is None:
                    continue
                found = True
                if not _without_workers(node):
                    return False
        return found

    def _no_workers(self, cls_name: str) -> bool:
        """Whether this file gives instances of ``cls_name`` to DataLoaders, all without workers."""
        found = False
        for scope in self.w.scopes:
            for kind, node, _ctx, _extra in scope.events:
                if kind != "dataloader" or not isinstance(node, ast.Call):
                    continue
                ds_kw = keyword_arg(node, "dataset")
                ds = ds_kw.value if ds_kw is not None else (node.args[0] if node.args else None)
                if isinstance(ds, ast.Name):
                    bound = [b.value for b in scope.bindings.get(ds.id, ()) if b.line <= node.lineno]
                    ds = bound[-1] if bound else None
                if not (isinstance(ds, ast.Call) and last_name(ds.func) == cls_name):
                    continue
                found = True
                if not _without_workers(node):
                    return False
        return found

    def _worker_role(self, scope: Scope) -> str | None:
        if scope.kind == "lambda":
            return "this collate_fn/worker_init_fn lambda" if scope.name == "<lambda-worker>" else None
        if scope.kind != "function":
            return None
        name = scope.name
        cls = scope.cls
        if cls is not None and name in DATASET_METHODS and is_dataset_class(cls):
            return f"`{cls.name}.{name}`"
        if cls is not None and name == "__call__" and "collat" in cls.name.lower():
            return f"`{cls.name}.__call__` (a collate function)"
        low = name.lower()
        facts = self.facts
        named = "collate" in low and not low.startswith("test") and name not in facts.collate_elsewhere
        if name in facts.collate_names or named:  # (a function given only to another API's `collate_fn=`)
            return f"`{name}` (a collate_fn)"
        if name in self.facts.worker_names or "worker_init" in low:
            return f"`{name}` (a worker_init_fn)"
        return None
