"""The sampled timeline of a run, and its verdict when no repeating step was found: growth per second, and
who holds the tensors born during the run that are still alive (there is no allocation site without a step).
"""

from __future__ import annotations

from typing import Any

import torch

from torchmem.results.leaks import LeakReport


class Timeline:
    """The (seconds, bytes) readings of the sampler, for a verdict without steps: every reading up to 4096,
    then every 2nd, 4th, ... (bounded)."""

    def __init__(self) -> None:
        self._points: list[tuple[float, int]] = []
        self._every = 1
        self._n = 0

    def keep(self, t: float, value: int) -> None:
        self._n += 1
        if self._n % self._every:
            return
        self._points.append((t, value))
        if len(self._points) >= 4096:
            self._points = self._points[::2]
            self._every *= 2

    def clear(self) -> None:
        """Forget the readings (the session watches another device now)."""
        self._points.clear()

    def points(self) -> list[tuple[float, int]]:
        return list(self._points)

    def __bool__(self) -> bool:
        return bool(self._points)


def timeline_report(
    points: list[tuple[float, int]], device: torch.device, source: str, born_before: set[int]
) -> LeakReport | None:
    """With no repeating step, growth decided on the sampled timeline, per second."""
    from torchmem.analysis.leaks import timeline_growth
    from torchmem.analysis.leaks import timeline_report as report

    g = timeline_growth(points)
    if g is None:
        return None
    culprits: tuple[Any, ...] = ()
    notes = ["no repeating step was found: the verdict is per second of the sampled timeline"]
    if g.leaking:
        try:
            culprits, more = timeline_culprits(device, born_before, g.bytes_per_step)
            notes += more
        except Exception as exc:
            notes.append(f"what grows could not be named ({type(exc).__name__}: {exc})")
    return report(points, g, device=str(device), source=source, culprits=culprits, notes=notes)


def timeline_culprits(
    device: torch.device,
    born_before: set[int],
    rate: float,
    unit: str = "s",
    backward: bool | None = None,
    grown: float | None = None,
) -> tuple[tuple[Any, ...], list[str]]:
    """Who holds what grew, without steps: the tensors born during the run (not in ``born_before``) and still
    alive, their holders named (there is no allocation site: the exact ledger never ran without a step).
    ``backward``: whether the program ran a backward (words the fix of a kept graph; ``None``: not known);
    ``grown``: the bytes the growth added over the run (``None``: not known; see :func:`growth_samples`)."""
    import gc

    from torchmem.analysis.holders.survivors import holder_paths_of_storages
    from torchmem.analysis.leaks import attribute
    from torchmem.results.leaks import SiteGrowth

    objects = gc.get_objects()  # one walk of the heap serves both reads
    try:
        born = [(k, s) for k, s in live_storages(device, objects).items() if k not in born_before]
        state = model_state_keys(device, objects) if born else set()
    finally:
        objects.clear()
    if not born:
        return (), ["no tensor born during the run is alive: what grew is not a tensor storage"]
    samples, live = growth_samples(born, state, grown)
    born.clear()
    info: dict[str, Any] = {}
    paths = holder_paths_of_storages(samples, max_paths=2, time_limit=3.0, info=info)
    samples.clear()
    flat = tuple(p for ps in paths for p in ps)
    fact = SiteGrowth(None, rate, live, len(paths), 1.0, flat)
    culprits = attribute([fact], min_bytes_per_step=0.0, unit=unit, device=str(device), backward=backward)
    return culprits, [
        "per second: without a step the allocation site is unknown; what holds the tensors born "
        "during the run is named (name the loop's function with --step-marker for the site)"
    ]


def growth_samples(
    born: list[tuple[int, Any]], state: set[int], grown: float | None, most: int = 6
) -> tuple[list[Any], int]:
    """The storages (at most ``most``) that stand for what grew, among ``born`` (``(key, storage)``: born
    during the run and still alive), and the live bytes of the sizes they were taken from.

    Not the model's state (``state``: the keys of parameters, gradients, buffers and optimizer state): one
    per parameter, made again at each step by ``zero_grad(set_to_none=True)`` and alive at the end however
    large — a 1024x1000 layer's gradient and Adam moments (4 MB each) outweighed the 1 MB outputs a loop
    kept 16 at a time, and were named as the leak. Unless what is left is less than a quarter of ``grown``
    (optimizers made anew and kept: then the state is what grew; a quarter, as ``grown`` is the rate times
    the run's steps and growth that began late is less). Then by byte size, the size whose live
    storages weigh most first: what a loop keeps is many storages of one size, where the batch it holds now
    is one."""
    rest = [ks for ks in born if ks[0] not in state]
    rest_bytes = sum(_nbytes(s) for _, s in rest)
    pool = rest if rest and (grown is None or rest_bytes >= grown / 4) else born
    sizes: dict[int, list[Any]] = {}
    for _, st in pool:
        sizes.setdefault(_nbytes(st), []).append(st)
    samples: list[Any] = []
    live = 0
    for size, members in sorted(sizes.items(), key=lambda kv: -kv[0] * len(kv[1])):
        if len(samples) >= most:
            break
        samples.extend(members[: most - len(samples)])
        live += size * len(members)
    return samples, live


def model_state_keys(device: torch.device, objects: list[Any] | None = None) -> set[int]:
    """The storage keys (as :func:`live_storages`) of every live module's parameters, gradients and buffers
    and every live optimizer's parameters, gradients and state tensors on ``device`` (``objects``: the heap
    as ``gc.get_objects()`` lists it, read now when ``None``)."""
    import gc

    tensors: list[Any] = []
    module_t, opt_t = torch.nn.Module, torch.optim.Optimizer
    for o in gc.get_objects() if objects is None else objects:
        kind = type(o)  # not isinstance: a proxy's __class__ would run its code
        try:
            if issubclass(kind, module_t):
                for p in o.parameters(recurse=False):
                    tensors += (p, p.grad)
                tensors.extend(o.buffers(recurse=False))
            elif issubclass(kind, opt_t):
                for group in o.param_groups:
                    for p in group.get("params", ()):
                        tensors += (p, getattr(p, "grad", None))
                for st in list(o.state.values()):
                    if isinstance(st, dict):
                        tensors.extend(list(st.values()))
        except Exception:  # a module or optimizer of the program's own make that cannot be read: not state
            continue
    out: set[int] = set()
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = _storage_on(t, device)
            if st is not None:
                out.add(st._cdata)
    tensors.clear()
    return out


def live_storages(device: torch.device, objects: list[Any] | None = None) -> dict[int, Any]:
    """The storages of the live tensors on ``device`` (gc; ``objects``: the heap as ``gc.get_objects()``
    lists it, read now when ``None``), by key. Strong references: drop soon."""
    import gc

    out: dict[int, Any] = {}
    tensor_t = torch.Tensor
    for o in gc.get_objects() if objects is None else objects:
        if issubclass(type(o), tensor_t):
            st = _storage_on(o, device)
            if st is not None:
                out.setdefault(st._cdata, st)
    return out


def _storage_on(t: torch.Tensor, device: torch.device) -> Any:
    """The untyped storage of ``t`` when it lives on ``device`` (any index where ``device`` names none), else
    ``None`` (also for sparse, nested, meta and other storage-less layouts)."""
    try:
        if t.device.type != device.type or (device.index is not None and t.device.index != device.index):
            return None
        return t.untyped_storage()
    except Exception:
        return None


def live_storage_keys(device: torch.device) -> set[int]:
    """The keys of :func:`live_storages` (empty when they cannot be read)."""
    try:
        return set(live_storages(device))
    except Exception:
        return set()


def _nbytes(storage: Any) -> int:
    try:
        return int(storage.nbytes())
    except Exception:
        return 0
