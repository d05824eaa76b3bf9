"""The windows :class:`torchmem.capture.host.HostWatcher` opens between the last two scans of a sequence: a
function mode that records the user's line of each op that makes an autograd node (the line that extends a
chain), and a module hook that records the convolutions' shapes where ``cudnn.benchmark`` is on
(:class:`torchmem.capture.process_state.ShapeWindow`). :class:`HostInstruments` opens and closes them."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from torchmem.capture.host_trace import HostNotes, HostTracer
from torchmem.capture.host_walk import seq
from torchmem.capture.process_state import ShapeWindow
from torchmem.devices._ledger import Site, birth_site

_MAX_SITES = 200_000


def _pop_mode(mode: Any) -> bool:
    """Pop ``mode`` off the torch function mode stack if it is on top; ``False`` when it is not (another mode
    is above it, or this runs inside its own handler, which takes it off the stack meanwhile)."""
    ours = True
    try:
        n = torch._C._len_torch_function_stack()
        ours = n > 0 and torch._C._get_function_stack_at(n - 1) is mode
    except Exception:  # private reads: if they fail, trust the order
        pass
    if ours:
        mode.__exit__(None, None, None)
    return ours


def _inside_backward() -> bool:
    """This call runs inside ``Tensor.backward`` or ``torch.autograd.backward`` (a backward step boundary)."""
    torch_dir = os.path.dirname(torch.__file__)
    f: Any = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "backward" and code.co_filename.startswith(torch_dir):
            return True
        f = f.f_back
    return False


def compiled_program() -> bool:
    """torch.compile has compiled frames in this process (a function mode would make them recompile)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return int(utils.counters["frames"]["total"]) > 0
    except Exception:
        return True  # cannot tell: do not risk a recompilation


try:  # public since torch 1.13
    from torch.overrides import TorchFunctionMode as _TorchFunctionMode
except ImportError:  # pragma: no cover - a torch without it: no sites, the rest works
    _TorchFunctionMode = None  # type: ignore[assignment,misc]


class HostSiteWindow:
    """A few steps during which the user's line of every op that makes an autograd node is recorded, by the
    node's sequence number (a function mode: it sees the op above autograd, with its ``grad_fn`` set)."""

    def __init__(self) -> None:
        self.by_seq: dict[int, int] = {}  # node sequence number -> index in sites
        self.index: dict[Site, int] = {}
        self.sites: list[Site] = []
        self.active = True
        self.mode: Any = None
        self.error: BaseException | None = None

    def note(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            g = out.grad_fn
        elif isinstance(out, (tuple, list)):
            g = next((o.grad_fn for o in out if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
        else:
            return
        if g is None:
            return
        s = seq(g)
        if s in self.by_seq:
            return
        if len(self.by_seq) >= _MAX_SITES:
            self.active = False
            return
        site = birth_site(2)
        if site is None:
            return
        i = self.index.get(site)
        if i is None:
            i = self.index[site] = len(self.sites)
            self.sites.append(site)
        self.by_seq[s] = i

    def site_of(self, seqs: Sequence[int]) -> Site | None:
        for s in seqs:
            i = self.by_seq.get(s)
            if i is not None:
                return self.sites[i]
        return None


if _TorchFunctionMode is not None:

    class _SiteMode(_TorchFunctionMode):
        def __init__(self, window: HostSiteWindow) -> None:
            super().__init__()
            self._window = window

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            w = self._window
            if w.active:
                try:
                    w.note(out)
                except Exception as exc:  # never break the user's op
                    w.error = exc
                    w.active = False
            return out


class HostInstruments:
    """The site window and the shape window of a scan sequence, and torchmem's function modes that could
    not be popped when their window closed (removed at the first step boundary where they can be)."""

    def __init__(self, notes: HostNotes, tracer: HostTracer) -> None:
        self._notes = notes
        self._tracer = tracer
        self.window: HostSiteWindow | None = None
        self.shapes: ShapeWindow | None = None
        self._stale_modes: list[Any] = []  # torchmem's function modes left on the stack, inactive

    @property
    def active(self) -> bool:
        """Whether a site window (a function mode that sees every op) is on now."""
        w = self.window
        return w is not None and w.active

    @property
    def open(self) -> bool:
        """Whether a window of either kind is open (the steps are not the program's alone)."""
        return self.window is not None or self.shapes is not None

    @property
    def stale(self) -> bool:
        return bool(self._stale_modes)

    def mark(self) -> None:
        """A step boundary, for the shape window."""
        shapes = self.shapes
        if shapes is not None:
            shapes.mark()

    def open_window(self) -> None:
        if _TorchFunctionMode is None or self.window is not None:
            return
        if compiled_program():
            self._notes.add(
                "the line that extends an autograd chain is not recorded in a program that uses "
                "torch.compile (a function mode would make its compiled code recompile)"
            )
            return
        if _inside_backward():
            # The steps end inside Tensor.backward(): with a function mode on, that call runs in the mode's
            # handler, which takes the mode off the stack meanwhile, so no step boundary could remove it.
            self._notes.add(
                "the line that extends an autograd chain is not recorded when the steps end inside "
                "backward() (a function mode could not be removed at a step boundary)"
            )
            return
        w = HostSiteWindow()
        w.mode = _SiteMode(w)
        w.mode.__enter__()
        self.window = w

    def close_window(self, *, on_thread: bool) -> HostSiteWindow | None:
        """Close the site window (``on_thread``: this runs on the thread that opened it); the window closed,
        with what it recorded."""
        w, self.window = self.window, None
        if w is None or w.mode is None:
            return w
        w.active = False
        mode: Any = w.mode
        w.mode = None
        if not on_thread:
            self._notes.add("a site window stayed on the program's thread (stopped from another thread)")
            return w
        if not _pop_mode(mode):
            # The program pushed a mode of its own and has not popped it yet (or this step ends inside a
            # torch call): ours stays, inactive, and is removed at the first step boundary where it can be.
            self._stale_modes.append(mode)
            self._notes.add(
                "a function mode of the program was above torchmem's when its window closed: torchmem's "
                "stayed, inactive, until it could be removed"
            )
        return w

    def pop_stale_modes(self) -> None:
        """Remove torchmem's inactive function modes that could not be removed before (newest first)."""
        while self._stale_modes and _pop_mode(self._stale_modes[-1]):
            self._stale_modes.pop()

    def release_window(self, window: HostSiteWindow) -> None:
        """Free what a site window recorded, leaving it out of the figures' offsets (it grew during the
        program's steps, where the offsets did not see it)."""
        h0 = self._tracer.figures()
        window.by_seq.clear()
        window.index.clear()
        window.sites.clear()
        self._tracer.exclude(h0)

    def watch_shapes(self, cudnn_benchmark: bool) -> None:
        """After the first scan, where ``cudnn.benchmark`` is on in a CUDA process: watch the convolutions'
        shapes until the third."""
        if not cudnn_benchmark or compiled_program():
            return
        shapes = ShapeWindow()
        try:
            if shapes.open():
                self.shapes = shapes
        except Exception as exc:
            self._notes.error("shape window", exc)

    def close_shapes(self) -> tuple[int, int, int] | None:
        shapes, self.shapes = self.shapes, None
        if shapes is None:
            return None
        shapes.close()
        if shapes.error is not None:
            self._notes.error("shape window", shapes.error)
        return shapes.result()
