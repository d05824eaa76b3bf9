"""``torchmem.oom_guard()`` and ``torchmem.install()``: on an out-of-memory error, explain it and free what
the failed call's frames held — without allocating device memory while doing so.

Recovery, step by step (the same in the guard, the ``sys.excepthook`` and the IPython hook):

1. the OOM is found by type in the exception's ``__cause__``/``__context__`` chain;
2. the diagnosis is taken while the frames still hold the step's tensors (``explain_oom``);
3. the finished frames of every traceback in the chain are cleared (a frame still running — the function
   that contains the ``with`` — holds the program's own variables and is left alone);
4. one ``gc.collect()``, then each device's cache is emptied;
5. the bytes that came back are measured: storages the cleared frames referenced that died.

Nothing in this path creates a tensor, so it cannot itself run out of device memory.
"""

from __future__ import annotations

import contextlib
import sys
import time
import types
import weakref
from collections.abc import Callable
from typing import IO, Any, TypeVar

import torch

from torchmem._decorate import ContextDecorator
from torchmem._exceptions import clear_frames, exception_chain
from torchmem._warn import print_safely
from torchmem.results.oom import OOMRecovery

F = TypeVar("F", bound=Callable[..., Any])


def find_oom(exc: BaseException | None) -> BaseException | None:
    """The out-of-memory error in ``exc`` or its ``__cause__``/``__context__`` chain, if any.

    By type (``torch.OutOfMemoryError``) first; also the memory errors torch raises as a plain
    ``RuntimeError`` (old torch, ROCm, the driver), by their text
    (:func:`torchmem.analysis.oom.oom_exception`).
    """
    if exc is None:
        return None
    from torchmem.analysis.oom import oom_exception

    return oom_exception(exc)


# -- the result ---------------------------------------------------------------------------------------
# -- recovery ---------------------------------------------------------------------------------------------
def _devices_of(oom: BaseException) -> list[torch.device]:
    """The devices to recover: the CPU for a torchmem CPU limit, else every initialised accelerator."""
    from torchmem.devices import visible_devices

    text = str(oom)
    if text.startswith("CPU out of memory"):
        return [torch.device("cpu")]
    devs = [d for d in visible_devices() if d.type != "cpu"]
    return devs or [torch.device("cpu")]


def _diagnose(oom: BaseException, exc: BaseException, errors: list[str]) -> Any:
    explain: Any = None
    for mod in ("torchmem.capture.oom", "torchmem.analysis.oom"):
        with contextlib.suppress(ImportError):
            explain = getattr(__import__(mod, fromlist=["explain_oom"]), "explain_oom", None)
        if explain is not None:
            break
    if explain is None:
        return None
    try:
        return explain(exc)
    except Exception as e:  # a diagnosis that fails must not stop the recovery
        errors.append(f"diagnosis: {type(e).__name__}: {e}")
        return None


def _frame_storages(
    tbs: list[types.TracebackType], graphs: bool = False
) -> dict[int, tuple[weakref.ref[Any], int, str]]:
    """Storages that finished frames reference directly or in a plain container (weakly, with sizes), and
    with ``graphs`` those the autograd graphs of their tensors saved for backward (the activations of a
    forward that failed: reached only through the output's ``grad_fn``).

    ``graphs`` is for the CPU only: reading a saved tensor runs its unpack hook, which may copy it back to a
    device (``save_on_cpu``) — an allocation, where the handler must make none. On a device the allocator's
    figures before and after say what came back.
    """
    running: set[int] = set()
    f: types.FrameType | None = sys._getframe()
    while f is not None:
        running.add(id(f))
        f = f.f_back
    out: dict[int, tuple[weakref.ref[Any], int, str]] = {}
    roots: list[torch.Tensor] = []

    def note(x: torch.Tensor) -> None:
        if x.layout != torch.strided:
            return
        try:
            st = x.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st._cdata not in out and st.nbytes() > 0:
            out[st._cdata] = (weakref.ref(st), st.nbytes(), str(x.device))

    for tb in tbs:
        cur: types.TracebackType | None = tb
        while cur is not None:
            frame = cur.tb_frame
            cur = cur.tb_next
            if id(frame) in running:
                continue
            try:
                values = list(frame.f_locals.values())
            except Exception:
                continue
            for v in values:
                items: list[Any] = [v]
                if isinstance(v, (list, tuple)):
                    items = list(v[:10000])
                elif isinstance(v, dict):
                    items = list(v.values())[:10000]
                for x in items:
                    if isinstance(x, torch.Tensor):
                        note(x)
                        if graphs and x.grad_fn is not None:
                            roots.append(x)
                del items
            values.clear()
            del frame
    if roots:
        from torchmem.analysis.live import graph_tensors

        try:
            for _, x in graph_tensors(roots):
                note(x)
        except Exception:  # a node that refuses to be read: what was found so far is still exact
            pass
        roots.clear()
    return out


def _hot(dev: torch.device) -> tuple[int | None, int | None]:
    from torchmem.devices import backend

    h = backend(dev).hot()
    return h.allocated, h.reserved


def recover(
    exc: BaseException,
    *,
    reraised: bool,
    ipython: Any = None,
    diagnose: bool = True,
) -> OOMRecovery:
    """Explain ``exc``'s OOM and free what its finished frames hold. Never raises; never allocates.

    Args:
        exc: The exception (its chain holds the OOM).
        reraised: Recorded in the result.
        ipython: An IPython shell whose output history is also cleared of tensors on the OOM's devices.
        diagnose: Make the diagnosis (``explain_oom``) before freeing.
    """
    t0 = time.perf_counter()
    errors: list[str] = []
    actions: list[str] = []
    oom = find_oom(exc) or exc
    first = str(oom).strip().splitlines()[0] if str(oom).strip() else ""
    error = f"{type(oom).__name__}: {first}"
    devices: list[torch.device] = []
    try:
        devices = _devices_of(oom)
    except Exception as e:
        errors.append(f"devices: {type(e).__name__}: {e}")
    before: tuple[int | None, int | None] = (None, None)
    with contextlib.suppress(Exception):
        before = _hot(devices[0]) if devices else (None, None)
    diagnosis = _diagnose(oom, exc, errors) if diagnose else None

    tbs = [e.__traceback__ for e in exception_chain(exc) if e.__traceback__ is not None]
    frames = 0
    storages: dict[int, tuple[weakref.ref[Any], int, str]] = {}
    try:
        storages = _frame_storages(tbs, graphs=bool(devices) and all(d.type == "cpu" for d in devices))
        for tb in tbs:
            frames += _count_finished(tb)
            clear_frames(tb)
        actions.append(f"cleared {frames} finished frame{'' if frames == 1 else 's'} of the exception")
    except Exception as e:
        errors.append(f"clearing frames: {type(e).__name__}: {e}")
    tbs.clear()
    if ipython is not None:
        try:
            from torchmem.actions.release import _clear_ipython

            _clear_ipython({str(d) for d in devices}, actions)
        except Exception as e:
            errors.append(f"IPython history: {type(e).__name__}: {e}")
    from torchmem.actions.release import give_back

    give_back(devices, actions, errors, blas=False)
    freed = 0
    for ref, nbytes, _ in storages.values():
        alive = ref()
        if alive is None or alive.nbytes() == 0:
            freed += nbytes
        del alive
    storages.clear()
    after: tuple[int | None, int | None] = (None, None)
    with contextlib.suppress(Exception):
        after = _hot(devices[0]) if devices else (None, None)
    return OOMRecovery(
        error=error,
        devices=tuple(str(d) for d in devices),
        diagnosis=diagnosis,
        freed_bytes=freed,
        allocated_before=before[0],
        allocated_after=after[0],
        reserved_before=before[1],
        reserved_after=after[1],
        frames_cleared=frames,
        actions=tuple(actions),
        errors=tuple(errors),
        reraised=reraised,
        seconds=time.perf_counter() - t0,
    )


def _count_finished(tb: types.TracebackType | None) -> int:
    running: set[int] = set()
    f: types.FrameType | None = sys._getframe()
    while f is not None:
        running.add(id(f))
        f = f.f_back
    n = 0
    while tb is not None:
        # torch's and torchmem's frames (dispatch plumbing, a CPU cap's check that raised the OOM) are cleared
        # too, but not counted: the program's frames are what it knows, and what held its tensors.
        top = str(tb.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
        if id(tb.tb_frame) not in running and top not in ("torch", "torchmem"):
            n += 1
        tb = tb.tb_next
    return n


# -- the guard ------------------------------------------------------------------------------------------
class OOMGuard(ContextDecorator):
    """Context manager and decorator returned by :func:`oom_guard`.

    Attributes:
        oom: The :class:`OOMRecovery` of the last OOM handled (``None`` if the block did not run out).
    """

    def __init__(self, *, reraise: bool, file: IO[str] | None, quiet: bool, diagnose: bool) -> None:
        self.reraise = reraise
        self.file = file
        self.quiet = quiet
        self.diagnose = diagnose
        self.oom: OOMRecovery | None = None

    def __enter__(self) -> OOMGuard:
        self.oom = None
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: types.TracebackType | None
    ) -> bool:
        del tb
        if ev is None or not isinstance(ev, Exception):
            return False  # no exception, or not an Exception (KeyboardInterrupt...): untouched
        oom = find_oom(ev)
        if oom is None:
            return False  # not an OOM: untouched
        # Only the OOM itself is swallowed: another error raised while handling one (a failed cleanup,
        # a wrapper's ValueError) is a failure of its own and still propagates, its memory freed.
        swallow = not self.reraise and oom is ev
        result = recover(ev, reraised=not swallow, diagnose=self.diagnose)
        self.oom = result
        if not self.quiet:
            print_safely(str(result), self.file, sys.stderr)
        return swallow


def oom_guard(
    *, reraise: bool = True, file: IO[str] | None = None, quiet: bool = False, diagnose: bool = True
) -> OOMGuard:
    """Recover from an out-of-memory error raised in a block: explain it, then free what it pinned.

    On an OOM (``torch.OutOfMemoryError`` anywhere in the exception's cause/context chain) the guard
    prints the diagnosis (:func:`torchmem.explain_oom`), clears the *finished* frames of the traceback —
    the locals of the functions the error passed through, which hold the step's activations — collects,
    empties the cache, and measures what came back. The handler creates no tensor, so it cannot itself run
    out of memory. Any other exception passes through untouched.

    By default the OOM is then **re-raised**: code after the block never runs on a half-done step, but the
    exception that propagates no longer pins the memory (a notebook's ``sys.last_traceback`` included).
    With ``reraise=False`` it is swallowed and ``guard.oom`` says what happened — only an OOM itself: an
    exception of another type whose cause or context is an OOM (a wrapper's error, a cleanup that failed
    while handling the OOM) is recovered from but still raised.

    What cannot be freed: variables of the function that contains the ``with`` (it is still running — put
    the work in a function, or use the decorator form), tensors that other live objects hold (a model, an
    optimizer, a list you keep), and memory outside PyTorch's allocator.

    Args:
        reraise: Re-raise the OOM after recovering (default) or swallow it.
        file: Where to print (default ``sys.stderr``).
        quiet: Print nothing (the result is still in ``guard.oom``).
        diagnose: Make the diagnosis; ``False`` skips it (recovery only).

    Returns:
        An :class:`OOMGuard`, usable as ``with`` block or decorator (a swallowed OOM returns ``None``).

    Example:
        >>> import torch, torchmem
        >>> def step():
        ...     activations = torch.ones(1 << 20)
        ...     return torch.ones(1 << 22)            # over the 8 MiB cap below
        >>> with torchmem.cpu_tracking() as cpu, torchmem.limit(8 << 20, "cpu"):
        ...     with torchmem.oom_guard(reraise=False, quiet=True) as guard:
        ...         step()
        ...     guard.oom.freed_bytes, cpu.allocated
        (4194304, 0)
    """
    return OOMGuard(reraise=reraise, file=file, quiet=quiet, diagnose=diagnose)
