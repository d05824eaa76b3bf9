"""``torchmem.release()``: free what objects hold on the device — for real — and prove it."""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem._exceptions import clear_frames
from torchmem._format import count
from torchmem.analysis.holders.survivors import holders_of_storages
from torchmem.analysis.release_plan import (
    BUFFER,
    EXCEPTION_LOCAL,
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    TENSOR,
    PlannedTensor,
    ReleasePlan,
    plan_release,
    storage_bytes,
)
from torchmem.capture.snapshot import process_usage
from torchmem.devices import DeviceLike, backend, resolve
from torchmem.devices import _ops as ops
from torchmem.results.release import DeviceFigures, ReleaseReport, Remaining


class ReleasedError(TorchmemError):
    """A module or optimizer was used after :func:`torchmem.release` emptied it (``release()`` itself
    worked; compare :class:`ReleaseFailedError`).

    Also raised by the ``step()`` of an optimizer that was not passed to ``release()`` but trains parameters
    it emptied: such a step would otherwise silently skip them.
    """


class ReleaseFailedError(TorchmemError):
    """:func:`torchmem.release` could not start (nothing was changed): the ``offload`` copies failed.

    Not to be confused with :class:`ReleasedError`, which is raised when something release() emptied is
    used after it.
    """


_RELEASED_ATTR = "_torchmem_released"


def _raise_released(what: str, message: str | None = None, hint: str | None = None) -> Callable[..., Any]:
    text = message or f"{what} was emptied by torchmem.release(); its tensors are gone."
    advice = hint or "Rebuild or reload it, or release with offload=True to keep it usable on the CPU."

    def hook(*_args: Any, **_kwargs: Any) -> Any:
        raise ReleasedError(text, advice)

    return hook


@dataclass
class _Bystander:
    """An optimizer that was *not* passed to ``release()`` but trains parameters that it empties (or moves).

    Left alone, its next ``step()`` would silently skip those parameters (their gradients are gone) while
    its state for them kept the old tensors alive. Its state for them is released with the rest, and its
    ``step()`` raises :class:`ReleasedError` (with ``offload``, it keeps working on the new device).
    """

    opt: torch.optim.Optimizer
    name: str  # its holder path, e.g. "__main__.opt" (or "AdamW at 0x..." when no path is found)
    params: list[PlannedTensor]  # the released parameters it refers to
    state: list[PlannedTensor]  # its state tensors for them, released with the rest


def _bystander_optimizers(
    plan: ReleasePlan, work: list[PlannedTensor], target: torch.device | None, off_dev: torch.device | None
) -> list[_Bystander]:
    """Optimizers not in the release set whose ``param_groups`` hold a parameter about to be released.

    One pass over the gc-tracked objects, only when parameters are released; a holder search names each
    optimizer found (at most 1 s).
    """
    params = {id(pt.tensor): pt for pt in work if pt.role == PARAMETER}
    if not params:
        return []
    mine = {id(o) for _, o in plan.optimizers}
    # Every optimizer class there is, so that the heap pass is one set lookup an object. type() rather than
    # isinstance(): some objects warn or raise when __class__ is read.
    kinds: set[type] = {torch.optim.Optimizer}
    todo: list[type] = [torch.optim.Optimizer]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in kinds:
                kinds.add(sub)
                todo.append(sub)
    opts = [o for o in gc.get_objects() if type(o) in kinds and id(o) not in mine]
    found: list[_Bystander] = []
    seen: set[int] = set()
    for o in opts:
        held: list[PlannedTensor] = []
        for group in o.param_groups:
            held.extend(params[id(p)] for p in group.get("params", ()) if id(p) in params)
        if not held:
            continue
        state: list[PlannedTensor] = []
        for pt in held:
            entry = o.state.get(pt.tensor)  # .get: the state is a defaultdict, do not add entries
            if not isinstance(entry, dict):
                continue
            for k, v in list(entry.items()):
                if (
                    isinstance(v, torch.Tensor)
                    and id(v) not in plan.tensors
                    and id(v) not in seen
                    and v.layout == torch.strided
                    and v.device.type != "meta"
                    and (target is None or v.device == target)
                    and not (off_dev is not None and v.device == off_dev)
                ):
                    seen.add(id(v))
                    state.append(
                        PlannedTensor(v, OPTIMIZER_STATE, f"state[{pt.name}][{k!r}]", o, (pt.tensor, k))
                    )
        found.append(_Bystander(o, "", held, state))
    opts.clear()
    if found:
        _name_bystanders(found)
    return found


def _name_bystanders(found: list[_Bystander]) -> None:
    from torchmem.analysis.holders import find_holders

    targets = [b.opt for b in found]
    try:
        # 3 s, as for budget()'s working set: 1 s ran out on a loaded or slower host (Python 3.12 device run)
        search = find_holders(targets, max_paths=1, time_limit=3.0, exclude=[found, targets])
        paths: list[tuple[Any, ...]] = list(search.paths)
    except Exception:  # naming is a nicety: never let it stop a release
        paths = [() for _ in found]
    targets.clear()
    for b, ps in zip(found, paths):
        b.name = str(ps[0]) if ps else f"{type(b.opt).__name__} at {id(b.opt):#x}"
        for st in b.state:
            st.name = f"{b.name}.{st.name}"


def _name_in(scopes: list[dict[str, Any]], obj: Any) -> str | None:
    for scope in scopes:
        for k, v in scope.items():
            if v is obj and not k.startswith("_"):
                return str(k)
    return None


def _caller_names(frame: types.FrameType | None, objs: tuple[Any, ...]) -> list[str]:
    names: list[str] = []
    scopes: list[dict[str, Any]] = []
    snapshot: Any = None
    if frame is not None:
        loc = frame.f_locals
        if loc is not frame.f_globals:
            scopes.append(loc)
            if sys.version_info < (3, 13):
                snapshot = loc
        scopes.append(frame.f_globals)
        del loc
    for i, o in enumerate(objs):
        names.append(_name_in(scopes, o) or f"arg{i}")
    scopes.clear()
    # Before 3.13, reading f_locals leaves a snapshot dict on the frame that keeps every local alive after
    # a later `del`. Empty it when nobody else holds it and no tracer could write it back (the next read of
    # f_locals refills it).
    if snapshot is not None and sys.gettrace() is None and sys.getrefcount(snapshot) <= 3:
        snapshot.clear()
    return names


def _figures(devices: Iterable[torch.device]) -> dict[str, tuple[int | None, int | None, int | None]]:
    out: dict[str, tuple[int | None, int | None, int | None]] = {}
    for d in devices:
        be = backend(d)
        hot = be.hot()
        out[be.label] = (hot.allocated, hot.reserved, process_usage(be))
    return out


def _settled(
    before: dict[str, tuple[int | None, int | None, int | None]],
    after: dict[str, tuple[int | None, int | None, int | None]],
    devices: list[torch.device],
    timeout: float = 1.0,
) -> dict[str, tuple[int | None, int | None, int | None]]:
    """Re-read until the driver's per-process figure reflects memory the allocator gave back.

    NVML updates a process's usage lazily: read right after ``empty_cache()`` it can still show the old
    figure. Poll (at most ``timeout`` seconds) until it has dropped by at least half of what ``reserved``
    dropped.
    """
    deadline = time.perf_counter() + timeout
    while True:
        pending = False
        for label, (_, res0, proc0) in before.items():
            _, res1, proc1 = after[label]
            if None in (res0, res1, proc0, proc1):
                continue
            returned = res0 - res1  # type: ignore[operator]
            if returned > (2 << 20) and proc0 - proc1 < returned // 2:  # type: ignore[operator]
                pending = True
        if not pending or time.perf_counter() > deadline:
            return after
        time.sleep(0.02)
        after = _figures(devices)


def _shared_with_live_modules(plan: ReleasePlan) -> dict[int, str]:
    """Parameters/buffers that a module *not* being released also holds (tied or shared weights).

    At most two heap scans: one ``gc.get_referrers`` over every parameter, buffer and submodule, and, only
    when a dict outside the release set looks like a module's ``_parameters``/``_buffers``/``_modules``
    (every value a tensor, or every value a module), one more to find that dict's owner.
    """
    params = [pt.tensor for pt in plan.tensors.values() if pt.role in (PARAMETER, BUFFER)]
    subs = [m for _, m in plan.modules]
    if not params and not subs:
        return {}
    wanted = {id(t) for t in params}
    me = sys._getframe()
    tensor_dicts: list[dict[str, Any]] = []
    module_dicts: list[dict[str, Any]] = []
    for r in gc.get_referrers(*params, *subs):
        if id(r) in plan.visited or r is me or not isinstance(r, dict) or not r:
            continue
        values = list(r.values())
        if all(v is None or isinstance(v, torch.Tensor) for v in values):
            tensor_dicts.append(r)
        elif all(v is None or isinstance(v, torch.nn.Module) for v in values):
            module_dicts.append(r)
        del values
    protected: dict[int, str] = {}
    candidates = [*tensor_dicts, *module_dicts]
    shared_subs: list[torch.nn.Module] = []
    for owner in gc.get_referrers(*candidates) if candidates else ():
        if isinstance(owner, torch.nn.Module):
            # Python 3.13+ keeps an instance's attributes inline, without a __dict__ until one is asked
            # for: the referrer of a module's `_parameters` is then the module itself, not its dict
            if id(owner) in plan.visited:
                continue
            owner = vars(owner)
        elif not isinstance(owner, dict) or id(owner) in plan.visited:
            continue
        for slot in ("_parameters", "_buffers"):
            d = owner.get(slot)
            if isinstance(d, dict) and any(d is o for o in tensor_dicts):
                for v in d.values():
                    if v is not None and id(v) in wanted:
                        protected[id(v)] = "shared with an nn.Module that was not released (tied weights)"
        # A submodule that an unreleased module also holds (a shared block): keep all of it.
        mods = owner.get("_modules")
        if isinstance(mods, dict) and any(mods is o for o in module_dicts):
            shared_subs.extend(m for m in mods.values() if m is not None and id(m) in plan.visited)
    for sub in shared_subs:
        object.__setattr__(sub, "_torchmem_shared", True)
        for t in [*sub.parameters(), *sub.buffers()]:
            if id(t) in wanted:
                protected[id(t)] = "in a submodule an nn.Module that was not released also holds"
    del me
    return protected


def release(*objs: Any, offload: bool | DeviceLike = False, device: DeviceLike = None) -> ReleaseReport:
    """Free what ``objs`` hold on the device, clear the known traps, and report what was and was not freed.

    Accepts modules (parameters, gradients, buffers, tensors in attributes and hooks' closures),
    optimizers (state, parameters and their gradients), LR schedulers and any object with tensor
    attributes (a Trainer-like object, a dataclass), tensors, containers at any depth, exceptions and
    tracebacks (the locals of their frames). ``None``, numbers and strings are skipped (listed in the report).

    The objects are emptied **in place**, so the caller's own references see the result:

    - without ``offload``, each tensor becomes a 0-element tensor of the same dtype and device (identity,
      ``requires_grad`` and parameter registration are kept); a released module raises
      :class:`ReleasedError` on its next forward, a released optimizer on its next ``step()``, and the
      optimizer's state is cleared;
    - with ``offload=True`` (or a device, default ``"cpu"``), each tensor's exact values move to that
      device (identity, dtype and ``requires_grad`` kept; gradients and optimizer state move too), and the
      objects keep working there.

    An optimizer you did not pass that trains parameters being emptied (``release(model)`` while ``opt``
    still refers to ``model``'s parameters) has its state for those parameters released too, and its next
    ``step()`` raises :class:`ReleasedError` instead of silently skipping them (with ``offload``, that state
    moves with the parameters and it keeps working); the report names it by its holder path.

    A parameter or buffer that an ``nn.Module`` you did not pass also holds (tied or shared weights) is left
    untouched and listed in ``remaining``. Then the traps are cleared — ``sys.last_traceback`` /
    ``last_value`` / ``last_exc`` and the current exception's frames if they hold tensors on the released
    devices, IPython output history entries that hold them, ``torch.compile`` caches when a released module
    was compiled, CUDA graphs found in the objects, cuBLAS workspaces — followed by one ``gc.collect()``,
    a synchronize and ``empty_cache()``. Every storage the objects used that is still alive afterwards is
    reported with the paths of whoever holds it.

    Args:
        *objs: What to release.
        offload: ``False``; ``True`` for the CPU; or a device to move the tensors to.
        device: Release only tensors on this device (others are left and listed as skipped).

    Returns:
        A :class:`ReleaseReport`.

    Raises:
        ReleaseFailedError: ``offload`` copies failed (for example out of host memory); nothing was changed.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Linear(1024, 1024)
        >>> opt = torch.optim.AdamW(model.parameters())
        >>> model(torch.ones(8, 1024)).sum().backward(); opt.step()
        >>> report = torchmem.release(model, opt)
        >>> report.freed_bytes            # weights, bias, their grads, AdamW's two moments and steps
        16793608
        >>> model.weight.shape
        torch.Size([0])
    """
    t0 = time.perf_counter()
    target_dev = resolve(device) if device is not None else None
    off_dev: torch.device | None = None
    if offload is not False and offload is not None:
        off_dev = torch.device("cpu") if offload is True else resolve(offload)  # type: ignore[arg-type]
    frame = sys._getframe(1)
    names = _caller_names(frame, objs)
    del frame
    plan = plan_release(objs, target_dev, names)
    actions: list[str] = []
    errors: list[str] = []
    skipped = list(plan.skipped)
    pt: PlannedTensor | None = None
    for pt in plan.skipped_other_device:
        skipped.append(f"{pt.name}: on {pt.tensor.device}, not {target_dev}")
    if plan.truncated:
        errors.append("the object walk stopped at 2,000,000 objects; some tensors may not have been released")

    devices = sorted({pt.tensor.device for pt in plan.tensors.values()}, key=str)
    if target_dev is not None and target_dev not in devices:
        devices.append(target_dev)
    if off_dev is not None and off_dev in devices:
        devices.remove(off_dev)  # tensors already there are left as they are
    before = _figures(devices)

    protected = _shared_with_live_modules(plan)
    for pt in plan.tensors.values():  # a kept parameter keeps its gradient
        if pt.role == GRADIENT and id(pt.owner) in protected:
            protected[id(pt.tensor)] = protected[id(pt.owner)]
    work = [
        pt
        for pt in plan.tensors.values()
        if id(pt.tensor) not in protected and not (off_dev is not None and pt.tensor.device == off_dev)
    ]
    # Optimizers the caller did not pass that train parameters about to be released: release their state
    # for those parameters too, so that a later step() cannot silently skip them (see _Bystander).
    bystanders = _bystander_optimizers(plan, work, target_dev, off_dev)
    work.extend(st for b in bystanders for st in b.state)
    # Exception-frame tensors are freed by clearing the frames, never emptied: others may still use them.
    frame_only = [pt for pt in work if pt.role == EXCEPTION_LOCAL]
    work = [pt for pt in work if pt.role != EXCEPTION_LOCAL]
    # Old storages, to prove they died: storage id -> (weakref, bytes, device, name)
    old: dict[int, tuple[weakref.ref[Any], int, str, str]] = {}
    for pt in [*work, *frame_only]:
        s = pt.tensor.untyped_storage()
        if s._cdata not in old and s.nbytes() > 0:
            old[s._cdata] = (weakref.ref(s), s.nbytes(), str(pt.tensor.device), pt.name)
        del s
    kept = [pt for pt in plan.tensors.values() if id(pt.tensor) in protected]

    # 1. Offload copies first, all of them, so a failure changes nothing.
    copies: dict[int, torch.Tensor] = {}
    offloaded = 0
    if off_dev is not None:
        try:
            for pt in work:
                copies[id(pt.tensor)] = pt.tensor.detach().to(off_dev, copy=True)
                offloaded += pt.tensor.nbytes
        except Exception as exc:
            copies.clear()
            raise ReleaseFailedError(
                f"Copying to {off_dev} failed after {offloaded} bytes ({type(exc).__name__}: {exc}); "
                "nothing was released.",
                "Free host memory, or release without offload.",
            ) from exc

    # 2. Empty (or move) every tensor in place.
    progress = [0]
    try:
        _apply(plan, work, copies, off_dev, actions, progress, bystanders)
    except Exception as exc:  # report exactly what was done; never leave the caller guessing
        errors.append(f"stopped after {progress[0]} tensors: {type(exc).__name__}: {exc}")
    released = progress[0]
    # Drop the plan's own references to exception-frame tensors, or they outlive the cleared frames.
    for key in [id(f.tensor) for f in frame_only]:
        plan.tensors.pop(key, None)
    frame_only.clear()
    pt = None  # the loops above must not keep their last tensor alive past the cleared frames
    copies.clear()
    bystanders.clear()

    # 3. Traps that pin device memory outside the objects.
    released_devices = {str(d) for d in devices}
    _clear_traps(plan, released_devices, actions, errors)

    # 4. Collect once (cycles included), then give the cache back.
    give_back(devices, actions, errors, blas=True)
    after = _settled(before, _figures(devices), devices)

    # 5. Prove it: which old storages died, and who holds the ones that did not.
    freed = 0
    survivors: list[tuple[Any, int, str, str]] = []
    for ref, nbytes, dev, name in old.values():
        alive = ref()
        if alive is None or alive.nbytes() == 0:
            freed += nbytes
        else:
            survivors.append((alive, nbytes, dev, name))
        del alive
    remaining = _remaining(survivors, kept)
    survivors.clear()

    figures = tuple(
        DeviceFigures(label, b[0], after[label][0], b[1], after[label][1], b[2], after[label][2])
        for label, b in before.items()
    )
    return ReleaseReport(
        freed_bytes=freed,
        released_tensors=released,
        offloaded_bytes=offloaded,
        devices=figures,
        actions=tuple(actions),
        remaining=tuple(remaining),
        skipped=tuple(skipped),
        errors=tuple(errors),
        seconds=time.perf_counter() - t0,
    )


def give_back(devices: Iterable[torch.device], actions: list[str], errors: list[str], *, blas: bool) -> None:
    """One ``gc.collect()``, then per device: synchronise, (cuBLAS workspaces,) ``empty_cache()``.

    What was done goes to ``actions``, what failed to ``errors``; nothing raises.
    """
    actions.append(f"gc.collect(): {gc.collect()} unreachable objects")
    for d in devices:
        try:
            ops.synchronize(d)
            if blas and ops.clear_blas_workspaces(d):
                actions.append(f"cleared cuBLAS workspaces on {d}")
            if ops.empty_cache(d):
                actions.append(f"empty_cache({d})")
        except Exception as exc:
            errors.append(f"emptying the cache of {d}: {type(exc).__name__}: {exc}")


def _shell(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device)


def _apply(
    plan: ReleasePlan,
    work: list[PlannedTensor],
    copies: dict[int, torch.Tensor],
    off_dev: torch.device | None,
    actions: list[str],
    progress: list[int],
    bystanders: Sequence[_Bystander] = (),
) -> None:
    by_role: dict[str, int] = {}
    try:
        _empty(work, copies, by_role, progress)
    finally:
        for role in (PARAMETER, GRADIENT, BUFFER, OPTIMIZER_STATE, TENSOR):
            if by_role.get(role):
                what = count(by_role[role], _ROLE_NOUN[role])
                actions.append(f"moved {what} to {off_dev}" if off_dev is not None else f"emptied {what}")
    _mark_released(plan, off_dev, actions, work)
    _mark_bystanders(bystanders, off_dev, actions)


# How the report counts each role: "emptied 1 parameter", "emptied 3 optimizer state tensors".
_ROLE_NOUN = {
    PARAMETER: "parameter",
    GRADIENT: "gradient",
    BUFFER: "buffer",
    OPTIMIZER_STATE: "optimizer state tensor",
    TENSOR: "tensor",
}


def _mark_bystanders(
    bystanders: Sequence[_Bystander], off_dev: torch.device | None, actions: list[str]
) -> None:
    """Say what happened to the optimizers nobody passed; without ``offload``, make their step() raise."""
    for b in bystanders:
        kind = type(b.opt).__name__
        names = ", ".join(pt.name for pt in b.params[:4]) + (", ..." if len(b.params) > 4 else "")
        params = count(len(b.params), "parameter")
        state = count(len(b.state), "tensor")
        if off_dev is not None:
            moved = f"moved its state for them to {off_dev} too ({state}); " if b.state else ""
            actions.append(
                f"optimizer {b.name} ({kind}) was not passed but refers to {params} moved here ({names}): "
                f"{moved}it keeps working there"
            )
            continue
        for pt in b.params:
            b.opt.state.pop(pt.tensor, None)
        freed = f"released its state for them ({state})" if b.state else "it held no state for them"
        actions.append(
            f"optimizer {b.name} ({kind}) was not passed but refers to {params} emptied here ({names}): "
            f"{freed}; its step() now raises ReleasedError instead of silently skipping them"
        )
        if not getattr(b.opt, _RELEASED_ATTR, False) and hasattr(b.opt, "register_step_pre_hook"):
            b.opt.register_step_pre_hook(
                _raise_released(
                    f"Optimizer {b.name!r}",
                    f"Optimizer {b.name} ({kind}) trains {params} that torchmem.release() emptied ({names}); "
                    "a step would silently skip them, so it raises instead (its state for them was "
                    "released).",
                    "Pass the optimizer to torchmem.release() together with the model, or build a new "
                    "optimizer over the parameters you still train.",
                )
            )
            setattr(b.opt, _RELEASED_ATTR, True)


def _empty(
    work: list[PlannedTensor], copies: dict[int, torch.Tensor], by_role: dict[str, int], progress: list[int]
) -> None:
    # Drop autograd graphs hanging off non-leaf tensors first: they keep saved activations alive.
    for pt in work:
        t = pt.tensor
        if t.grad_fn is not None and pt.role == TENSOR:
            # A view cannot be detached in place (RuntimeError); its graph is reported if it survives.
            with contextlib.suppress(RuntimeError):
                t.detach_()
    # Parameters, buffers and plain tensors first, gradients after (a grad must match its param's device).
    ordered = sorted(work, key=lambda pt: pt.role == GRADIENT)
    with torch.no_grad():
        for pt in ordered:
            t = pt.tensor
            new = copies.get(id(t))
            if pt.role == GRADIENT:
                param = pt.owner
                if new is not None:
                    t.data = new  # in place after its parameter moved: the same grad object, now there
                else:
                    t.data = _shell(t)  # frees the storage even where the grad object is still referenced
                    if param is not None and getattr(param, "grad", None) is t:
                        param.grad = None
            else:  # parameters, buffers, optimizer state, plain tensors: in place, identity kept
                t.data = new if new is not None else _shell(t)
            progress[0] += 1
            by_role[pt.role] = by_role.get(pt.role, 0) + 1


def _mark_released(
    plan: ReleasePlan, off_dev: torch.device | None, actions: list[str], emptied: list[PlannedTensor]
) -> None:
    """Make the emptied modules and optimizers raise ``ReleasedError`` on their next use.

    Only those that had a tensor emptied: a module or optimizer whose tensors were all skipped (on another
    device than ``device=``, meta tensors, shared with an unreleased model) holds everything it had and
    keeps working.
    """
    if off_dev is not None:
        return
    gone = {id(pt.tensor) for pt in emptied}
    owners = {id(pt.owner) for pt in emptied if pt.owner is not None}
    # "model.fc.weight" was emptied: "model" and "model.fc" had a tensor emptied.
    prefixes = {pt.name[:i] for pt in emptied for i, ch in enumerate(pt.name) if ch in ".["}
    for name, m in plan.modules:
        if getattr(m, "_torchmem_shared", False):
            object.__delattr__(m, "_torchmem_shared")
            continue
        if name not in prefixes and not any(id(t) in gone for t in [*m.parameters(), *m.buffers()]):
            continue
        if not getattr(m, _RELEASED_ATTR, False):
            m.register_forward_pre_hook(_raise_released(f"Module {name!r} ({type(m).__name__})"))
            object.__setattr__(m, _RELEASED_ATTR, True)
    cleared = 0
    for name, opt in plan.optimizers:
        params = (p for g in opt.param_groups for p in g["params"])
        if id(opt) not in owners and not any(id(p) in gone for p in params):
            continue
        opt.state.clear()
        cleared += 1
        if not getattr(opt, _RELEASED_ATTR, False) and hasattr(opt, "register_step_pre_hook"):
            opt.register_step_pre_hook(_raise_released(f"Optimizer {name!r} ({type(opt).__name__})"))
            setattr(opt, _RELEASED_ATTR, True)
    if cleared:
        actions.append(f"cleared the state of {count(cleared, 'optimizer')}")


def _holds_tensor_on(obj: Any, devices: set[str], depth: int = 3) -> bool:
    if isinstance(obj, torch.Tensor):
        return str(obj.device) in devices
    if depth == 0:
        return False
    if isinstance(obj, dict):
        return any(_holds_tensor_on(v, devices, depth - 1) for v in list(obj.values())[:1000])
    if isinstance(obj, (list, tuple)):
        return any(_holds_tensor_on(v, devices, depth - 1) for v in obj[:1000])
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict) and not isinstance(obj, (type, types.ModuleType)):
        return any(_holds_tensor_on(v, devices, depth - 1) for v in list(d.values())[:1000])
    return False


def _tb_holds(tb: types.TracebackType | None, devices: set[str]) -> bool:
    while tb is not None:
        try:
            local_values = list(tb.tb_frame.f_locals.values())
        except Exception:
            local_values = []
        if any(_holds_tensor_on(v, devices) for v in local_values):
            return True
        tb = tb.tb_next
    return False


def _clear_traps(plan: ReleasePlan, devices: set[str], actions: list[str], errors: list[str]) -> None:
    try:
        # The interpreter's record of the last uncaught exception (what a notebook or REPL keeps).
        last_tb = getattr(sys, "last_traceback", None)
        if last_tb is not None and _tb_holds(last_tb, devices):
            clear_frames(last_tb)
            for attr in ("last_traceback", "last_value", "last_type", "last_exc"):
                if hasattr(sys, attr):
                    setattr(sys, attr, None)
            actions.append("cleared sys.last_traceback / last_value / last_exc (their frames held tensors)")
        # The exception being handled right now, if release() runs in an except block.
        current = sys.exc_info()[1]
        if current is not None and _tb_holds(current.__traceback__, devices):
            clear_frames(current.__traceback__)
            actions.append("cleared the locals of the current exception's finished frames")
        for exc in plan.exceptions:
            if exc.__traceback__ is not None:
                clear_frames(exc.__traceback__)
        for tb in plan.tracebacks:
            clear_frames(tb)
        if plan.exceptions or plan.tracebacks:
            actions.append(
                f"cleared the frames of {count(len(plan.exceptions) or len(plan.tracebacks), 'exception')}"
            )
        _clear_ipython(devices, actions)
        compiled = any(
            hasattr(m, "_orig_mod") or "OptimizedModule" in type(m).__name__ for _, m in plan.modules
        )
        if compiled and ops.reset_compile_caches():
            actions.append("reset torch.compile caches (torch._dynamo.reset())")
        for g in plan.graphs:
            g.reset()
        if plan.graphs:
            actions.append(f"reset {count(len(plan.graphs), 'CUDA graph')}")
    except Exception as exc:
        errors.append(f"clearing traps: {type(exc).__name__}: {exc}")


def _clear_ipython(devices: set[str], actions: list[str]) -> None:
    ipy = sys.modules.get("IPython")
    if ipy is None:
        return
    get = getattr(ipy, "get_ipython", None)
    shell = get() if get is not None else None
    if shell is None:
        return
    ns = shell.user_ns
    out = ns.get("Out")
    cleared: list[str] = []
    if isinstance(out, dict):
        for k in [k for k, v in out.items() if _holds_tensor_on(v, devices)]:
            del out[k]
            cleared.append(f"Out[{k}]")
            ns.pop(f"_{k}", None)
    # The displayhook writes _, __, ___ and _N into user_ns and into user_ns_hidden (for %who).
    for space in (ns, getattr(shell, "user_ns_hidden", None)):
        if not isinstance(space, dict):
            continue
        for name in [k for k in space if isinstance(k, str) and k[:1] == "_" and k[1:].isdigit()]:
            if _holds_tensor_on(space.get(name), devices):
                del space[name]
                if name not in cleared:
                    cleared.append(name)
        for name in ("_", "__", "___"):
            if _holds_tensor_on(space.get(name), devices):
                space[name] = None
                if name not in cleared:
                    cleared.append(name)
    last = getattr(shell, "last_execution_result", None)
    if last is not None and _holds_tensor_on(getattr(last, "result", None), devices):
        last.result = None
        cleared.append("the last cell's result")
    hist = getattr(shell, "displayhook", None)
    for name in ("_", "__", "___"):
        if hist is not None and _holds_tensor_on(getattr(hist, name, None), devices):
            setattr(hist, name, None)
    if cleared:
        actions.append("cleared IPython output history: " + ", ".join(cleared))


def _remaining(survivors: list[tuple[Any, int, str, str]], kept: list[PlannedTensor]) -> list[Remaining]:
    """Each storage still alive, with whoever holds it."""
    storages: list[Any] = []
    meta: list[tuple[str, str, int, str]] = []
    for pt in kept:
        storages.append(pt.tensor.untyped_storage())
        meta.append(
            (
                pt.name,
                str(pt.tensor.device),
                storage_bytes(pt.tensor),
                "shared with an nn.Module that was not released",
            )
        )
    for storage, nbytes, dev, name in survivors:
        storages.append(storage)
        meta.append((name, dev, nbytes, "still referenced after release"))
    paths = holders_of_storages(storages)
    storages.clear()
    return [Remaining(name, dev, nbytes, reason, p) for (name, dev, nbytes, reason), p in zip(meta, paths)]
