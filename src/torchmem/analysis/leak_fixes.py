"""The fix a leak's culprit is printed with: one line per culprit kind, naming the holder.

The kinds (:data:`KINDS`) are decided by :func:`torchmem.analysis.culprits.attribute` from the step kinds of
the holder paths; this module only words them: the rate per step (or per second of a timeline), CPU or
device memory, and the code to write instead. Re-exported by :mod:`torchmem.analysis.leaks`.
"""

from __future__ import annotations

from collections.abc import Sequence

# Culprit kinds, each with the one-line fix printed for it.
RETAINED_GRAPH = "retained_graph"
GRAPH_CHAIN = "graph_chain"
EXCEPTION = "exception"
CYCLE = "cycle"
HOOK = "hook"
GROWING_TENSOR = "growing_tensor"
GLOBAL = "global_registry"
CACHE = "cache"
ACCUMULATION = "device_accumulation"
KEPT_OPTIMIZER = "kept_optimizer"
METRIC_STATE = "metric_state"
UNKNOWN = "unknown"

# One kept tensor above this many bytes is no scalar (a 0-d tensor, or the smallest block a device allocator
# gives it): ``.item()`` cannot be kept of it.
SCALAR_BYTES = 512

KINDS = (
    RETAINED_GRAPH,
    GRAPH_CHAIN,
    EXCEPTION,
    CYCLE,
    HOOK,
    GROWING_TENSOR,
    GLOBAL,
    CACHE,
    ACCUMULATION,
    KEPT_OPTIMIZER,
    METRIC_STATE,
    UNKNOWN,
)


def cycle_fix() -> str:
    """The fix of a cycle through autograd (a ``.grad`` whose graph keeps its tensor)."""
    from torchmem.analysis.holders.cycles import grad_cycle_fix

    return grad_cycle_fix()


def _mib(b: float) -> str:
    if b >= 1 << 20:
        return f"{b / (1 << 20):.1f} MiB"
    if b >= 1 << 10:
        return f"{b / (1 << 10):.1f} KiB"
    return f"{b:.0f} B"


def grad_graph_fix(owner: str, per_step: float, unit: str = "step") -> str:
    """The fix where ``owner`` holds a gradient made with ``create_graph=True`` in ``.grad``, with the graph
    of every earlier step."""
    return (
        f"`{owner}` holds a gradient made with create_graph=True, with the graph of every earlier step "
        f"(+{_mib(per_step)}/{unit}): set `.grad = None` each step "
        "(`optimizer.zero_grad(set_to_none=True)`), or take second-order gradients with "
        "`torch.autograd.grad(..., create_graph=True)` instead of "
        "storing them in `.grad`"
    )


def metric_state_fix(
    owner: str, state: str | Sequence[str], reset: str, per_step: float, unit: str = "step"
) -> str:
    """The fix where a metric-like object ``owner`` (its class computes a result from what it collects, and
    can empty it with ``reset``) keeps every call's tensors in ``state`` (one attribute, or several).

    Example:
        >>> print(metric_state_fix("auroc", "auroc.target", "reset", 2**19))
        `auroc` collects every call's tensors in `auroc.target` (+512.0 KiB/step) and is not reset: call ...
    """
    states = [state] if isinstance(state, str) else list(state)
    where = " and ".join(f"`{x}`" for x in states)
    return (
        f"`{owner}` collects every call's tensors in {where} (+{_mib(per_step)}/{unit}) and is not "
        f"reset: call `{owner}.{reset}()` after each `compute()` (or give it a fixed-size state)"
    )


def _on_cpu(device: str | None) -> bool:
    return bool(device) and str(device).split(":")[0] == "cpu"


def fix_for(
    kind: str,
    name: str,
    per_step: float,
    cycle_types: Sequence[str] = (),
    *,
    unit: str = "step",
    device: str | None = None,
    backward: bool | None = None,
    state: bool = False,
    entry_bytes: float | None = None,
    nodes: bool = False,
) -> str:
    """The one-line fix for a culprit kind, naming the holder.

    ``unit`` is ``"step"``, or ``"s"`` for a rate per second of a timeline (no repeating step): the rate is
    written with it and no fix speaks of steps then. ``device`` is the watched device: on the CPU the fix
    speaks of CPU tensors and memory, and never suggests ``.cpu()`` copies (they would be the same tensors).
    ``backward``: whether the program ran a backward (``False``: a graph carried from step to step needs
    only ``torch.no_grad()``; ``None``: not known). ``state``: the holder is a structure the loop hands
    from one iteration to the next (``past`` of a decode loop), not a running total. ``entry_bytes``: the size
    of one kept tensor where known (above :data:`SCALAR_BYTES` no ``.item()`` can be kept of it); ``nodes``:
    the kept tensors still have a ``grad_fn`` (a backward freed what it saved; its nodes stay).

    Example:
        >>> fix_for("device_accumulation", "keep", 2**20, unit="s", device="cpu")
        '`keep` accumulates CPU tensors (+1.0 MiB/s): keep numbers (`.item()`) or a running sum instead'
    """
    size = _mib(per_step)
    rate = f"+{size}/{unit}"
    per_step_unit = unit == "step"
    cpu = _on_cpu(device)
    tensors = "CPU tensors" if cpu else "device tensors"
    if kind == RETAINED_GRAPH:
        # (not "one graph per step": a validation pass every N steps keeps several graphs at once)
        kept = f"autograd graphs ({rate})"
        if backward is False:
            return (
                f"`{name}` keeps {kept} and no backward() ran: run the loop under `torch.no_grad()` (or "
                "`torch.inference_mode()`), or `.detach()` what you keep"
            )
        return f"`{name}` keeps {kept}: store `loss.item()` for logging, " + (
            "or `.detach()` what you keep" if cpu else "or `.detach()` (`.cpu()`) what you keep"
        )
    if kind == GRAPH_CHAIN:
        carries = "from step to step" if per_step_unit else "from one iteration to the next"
        if backward is False:
            other = (
                f"detach what it carries over (`{name} = {name}.detach()`)"
                if state
                else f"accumulate a number (`{name} += loss.item()`)"
            )
            return (
                f"`{name}` carries its autograd graph {carries} ({rate}) and no backward() ran: run the "
                f"loop under `torch.no_grad()` (or `torch.inference_mode()`), or {other}"
            )
        if state:
            return (
                f"`{name}` carries its autograd graph {carries} ({rate}): detach the state it carries over "
                f"(`{name} = {name}.detach()`, each tensor of it), or run the loop under `torch.no_grad()` "
                "if no gradient is needed"
            )
        return (
            f"`{name}` carries its autograd graph {carries} ({rate}): accumulate a number "
            f"(`{name} += loss.item()`) or detach the state you carry over (`{name} = {name}.detach()`)"
        )
    if kind == EXCEPTION:
        return (
            f"`{name}` keeps exceptions whose tracebacks hold the frames' tensors ({rate}): store "
            "`repr(e)` / `traceback.format_exc()`, or call `traceback.clear_frames(e.__traceback__)`"
        )
    if kind == CYCLE:
        kinds = ", ".join(cycle_types[:3]) or "objects"
        return (
            f"a reference cycle ({kinds}) keeps {tensors} until the garbage collector runs "
            f"({rate}): break it (a `weakref`, or drop the back-reference when done)"
        )
    if kind == HOOK:
        copies = "`.detach()` copies" if cpu else "`.detach().cpu()` copies"
        return (
            f"a hook's closure `{name}` keeps tensors ({rate}): keep {copies} or a "
            "bounded number, and call `handle.remove()` when done"
        )
    if kind == GROWING_TENSOR:
        larger = "re-allocated larger every step" if per_step_unit else "re-allocated larger again and again"
        return (
            f"`{name}` is {larger} ({rate}, e.g. `torch.cat` onto it): bound it "
            "(a sliding window, a preallocated buffer) or reset it per sequence"
        )
    if kind == GLOBAL:
        keep = "evict entries, or hold them" if cpu else "evict entries, store `.cpu()` copies, or hold them"
        return f"the module-level `{name}` collects {tensors} ({rate}): {keep} through `weakref`"
    if kind == CACHE:
        return f"the cache `{name}` never evicts ({rate}): bound it (LRU with a maximum size) or clear it"
    if kind == KEPT_OPTIMIZER:
        return (
            f"`{name}` keeps optimizers, each with the state its `step()` made (moment buffers the size of "
            f"the model; {rate}): keep the numbers you need (`scheduler.get_last_lr()`, `.item()`), not "
            "the optimizer or scheduler, or reuse one optimizer"
        )
    if kind == ACCUMULATION:
        every = " every step" if per_step_unit else ""
        graph = "; each keeps its autograd graph's nodes too: `.detach()` what you keep" if nodes else ""
        if entry_bytes is not None and entry_bytes > SCALAR_BYTES:
            instead = (
                "keep only what you need of each (a reduction, `.argmax(-1)`, a metric's running state)"
                + ("" if cpu else ", `.cpu()` copies")
                + " or a bounded number (`collections.deque(maxlen=...)`)"
            )
            return f"`{name}` accumulates {tensors}{every} ({rate}): {instead}{graph}"
        instead = (
            "keep numbers (`.item()`) or a running sum"
            if cpu
            else ("keep numbers (`.item()`), `.cpu()` copies, or a running sum")
        )
        return f"`{name}` accumulates {tensors}{every} ({rate}): {instead} instead{graph}"
    memory = "memory" if cpu else "device memory"
    return f"{memory} born here is never freed ({rate}): find who keeps it with torchmem.holders()"


__all__ = [
    "ACCUMULATION",
    "CACHE",
    "CYCLE",
    "EXCEPTION",
    "GLOBAL",
    "GRAPH_CHAIN",
    "GROWING_TENSOR",
    "HOOK",
    "KEPT_OPTIMIZER",
    "KINDS",
    "METRIC_STATE",
    "RETAINED_GRAPH",
    "UNKNOWN",
    "cycle_fix",
    "fix_for",
    "grad_graph_fix",
    "metric_state_fix",
]
