"""Finishing a capture when the process is told to terminate (SIGTERM, SIGHUP).

Launchers stop a process with a signal: torchrun's agent sends SIGTERM to every other rank when one rank
fails, SLURM and Kubernetes send SIGTERM before SIGKILL, a closed terminal sends SIGHUP. A Python program that
leaves these signals at their default dies at once, and its capture would have no end record.

:class:`SignalGuard` handles those of the signals the program leaves at the default (``SIG_DFL``): on one, it
calls a callback (``torchmem run`` finishes its session: the end record, the summary line), then restores the
default and sends the signal again. The process dies of the signal exactly as it would have without torchmem:
the same exit status (``-15`` for SIGTERM), no Python exception raised into the program, none of its
``finally`` blocks run where they would not have.

* A handler the program installs later wins: the guard never installs itself again. When the program's
  handler calls the one it replaced (ours), the guard does nothing: as for ``SIG_DFL``, which has no call.
* The callback runs on a helper thread, at most ``timeout`` seconds (the main thread may be frozen inside a
  section the callback also needs): past that, or on an error, the signal is sent again anyway.
* :meth:`SignalGuard.holding`: while the caller finishes the capture itself (the program has ended), a signal
  that arrives waits for the end of the block (at most ``timeout`` seconds), then ends the process.
* A forked child that inherited the handler dies of the signal as with ``SIG_DFL``: it never finishes its
  parent's capture.

A signal reaches a Python handler only between two bytecodes of the main thread: while the main thread is
blocked inside a C call (a rank waiting in a collective its failed peer never joins, a ``.item()`` behind
it), the handler cannot run. The guard also sets Python's *wake-up fd* (``signal.set_wakeup_fd``: the C-level
handler writes the signal's number there whatever the main thread does) and reads it on a helper thread:
when the Python handler has not started within :data:`GRACE` seconds, the helper finishes the capture and
ends the process by the signal itself. Where the program uses the wake-up fd (asyncio's signal handlers),
the guard leaves it to the program. A forked child gives the inherited fd up at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from torchmem.results.ranks import signal_name

DEFAULT_TIMEOUT = 10.0
"""Seconds the capture may take to finish once a signal came (torchrun waits 30 s before SIGKILL)."""
GRACE = 1.0
"""Seconds the main thread has to start the Python handler before the wake-up helper takes the signal."""


def terminating_signals() -> tuple[int, ...]:
    """The signals a launcher or a terminal ends a process with, that exist here: SIGTERM, SIGHUP."""
    return tuple(int(getattr(signal, n)) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _die(signum: int) -> None:
    """End the process by ``signum``'s default action, as if no handler had ever been installed."""
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread: the wake-up helper
        _default_in_c(signum)
    try:
        signal.raise_signal(signum)  # this thread: the default action ends the process now
    except Exception:
        pass
    try:
        os.kill(os.getpid(), signum)  # the signal is blocked in this thread: another one takes it
        time.sleep(1.0)
    except Exception:
        pass
    os._exit(128 + signum)  # blocked everywhere: the exit status a shell shows for it


def _default_in_c(signum: int) -> None:
    """Give ``signum`` its default action from any thread (Python lets only the main thread change a
    disposition: the C library's ``signal`` does it for the wake-up helper)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signum, None)  # SIG_DFL
    except Exception:
        pass


_fork_hook = {"registered": False}
_active: list[SignalGuard] = []  # the guards whose wake-up fd is set (one at most)


def _after_fork_in_child() -> None:
    """A forked child must not write its signals into its parent's wake-up pipe: the parent's helper would
    take them for its own."""
    for guard in list(_active):
        guard._drop_wakeup(child=True)
    _active.clear()


class SignalGuard:
    """Finish the capture when a terminating signal comes, then die of it as the program would have.

    Args:
        on_signal: Called with the signal's number (on a helper thread, the main thread waiting for it).
        signals: The signals to handle (default: SIGTERM and SIGHUP); only those at ``SIG_DFL`` are taken.
        timeout: Seconds ``on_signal`` (or a :meth:`holding` block) may take before the signal goes on.

    Example:
        >>> guard = SignalGuard(lambda signum: session.finish(-signum, "signal")).install()  # doctest: +SKIP
        >>> try:
        ...     run_the_program()
        ... finally:
        ...     with guard.holding():
        ...         session.finish(0, "exit")
        ...     guard.remove()  # doctest: +SKIP
    """

    def __init__(
        self,
        on_signal: Callable[[int], Any],
        signals: Iterable[int] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.on_signal = on_signal
        self.signals = tuple(terminating_signals() if signals is None else signals)
        self.timeout = float(timeout)
        self._installed: list[int] = []
        self._pid = os.getpid()
        self._handler = self._handle  # one bound method: ``getsignal`` returns this very object
        self._busy = False
        self._holding = False
        self._pending: int | None = None
        self._watchdog: threading.Timer | None = None
        self._claim_lock = threading.Lock()
        self._wake: tuple[int, int] | None = None  # (read, write) ends of the wake-up pipe

    @property
    def installed(self) -> tuple[int, ...]:
        """The signals this guard handles now (the program has not replaced its handler)."""
        return tuple(s for s in self._installed if self._is_ours(s))

    def _is_ours(self, signum: int) -> bool:
        try:
            return signal.getsignal(signum) is self._handler
        except (ValueError, OSError):
            return False

    def install(self) -> SignalGuard:
        """Handle the signals the program leaves at ``SIG_DFL`` (only on the main thread; else nothing)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        self._pid = os.getpid()
        for s in self.signals:
            try:
                current = signal.getsignal(s)
                owner = getattr(current, "__self__", None)
                inherited = isinstance(owner, SignalGuard) and owner._pid != self._pid  # a forked parent's
                if current is signal.SIG_DFL or inherited:
                    signal.signal(s, self._handler)
                    self._installed.append(s)
            except (ValueError, OSError, TypeError):
                continue
        if self._installed:
            self._set_wakeup()
        return self

    # -- the wake-up fd: a main thread blocked in C -----------------------------------------------
    def _set_wakeup(self) -> None:
        if self._wake is not None or not hasattr(signal, "set_wakeup_fd"):
            return
        try:
            r, w = os.pipe()
        except OSError:
            return
        try:
            os.set_blocking(w, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return
        if old != -1:  # the program's (asyncio's): it stays the program's
            try:
                signal.set_wakeup_fd(old)
            except (ValueError, OSError):
                pass
            os.close(r)
            os.close(w)
            return
        self._wake = (r, w)
        _active.append(self)
        if not _fork_hook["registered"]:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook["registered"] = True
        threading.Thread(
            target=self._wake_loop, args=(r,), name="torchmem-signal-wakeup", daemon=True
        ).start()

    def _drop_wakeup(self, child: bool = False) -> None:
        wake, self._wake = self._wake, None
        if wake is None:
            return
        if self in _active:
            _active.remove(self)
        r, w = wake
        try:
            prev = signal.set_wakeup_fd(-1)
            if prev not in (w, -1):  # the program set its own since (asyncio's signal handlers): it stays
                signal.set_wakeup_fd(prev)
        except (ValueError, OSError):
            pass
        try:
            os.close(w)  # the helper reads the end of the pipe and stops (in a child: there is none)
        except OSError:
            pass
        if child:
            try:
                os.close(r)
            except OSError:
                pass

    def _wake_loop(self, r: int) -> None:
        try:
            while True:
                data = os.read(r, 64)
                if not data:
                    return
                for signum in data:
                    if signum in self._installed:
                        self._take_over(signum)
        except OSError:
            return
        finally:
            try:
                os.close(r)
            except OSError:
                pass

    def _take_over(self, signum: int) -> None:
        """The signal came: give the main thread :data:`GRACE` seconds to run the handler, else finish the
        capture here and end the process by the signal."""
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline:
            if self._busy or self._holding or os.getpid() != self._pid:
                return
            time.sleep(0.02)
        if self._holding or os.getpid() != self._pid or not self._is_ours(signum) or not self._claim():
            return
        try:
            self._finish(signum)
        except BaseException:
            pass
        _die(signum)

    def _claim(self) -> bool:
        """Whether this caller (the main thread's handler or the helper) handles the signal: one does."""
        with self._claim_lock:
            if self._busy:
                return False
            self._busy = True
            return True

    def remove(self) -> None:
        """Give the signals back to ``SIG_DFL`` where our handler is still the one installed."""
        self._drop_wakeup()
        for s in self._installed:
            if self._is_ours(s):
                try:
                    signal.signal(s, signal.SIG_DFL)
                except (ValueError, OSError):
                    pass
        self._installed.clear()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """A block in which the caller finishes the capture itself: a signal that arrives meanwhile is held
        until the block ends (at most ``timeout`` seconds), then ends the process."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            timer, self._watchdog = self._watchdog, None
            if timer is not None:
                timer.cancel()
            pending, self._pending = self._pending, None
            if pending is not None:
                self.remove()
                _die(pending)

    # -- the handler -----------------------------------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child inherited the handler: the default action
            _die(signum)
        if not self._is_ours(signum):  # the program's own handler calls the one it replaced: as SIG_DFL
            return
        if not self._claim():  # another signal while one is handled (or the helper took it): that one ends it
            return
        if self._holding:
            self._pending = signum
            try:
                signal.signal(signum, signal.SIG_DFL)  # the same signal again ends the process at once
                self._watchdog = threading.Timer(self.timeout, os.kill, (os.getpid(), signum))
                self._watchdog.daemon = True
                self._watchdog.start()
            except Exception:
                pass
            return
        try:
            self._finish(signum)
        except BaseException:
            pass
        finally:
            _die(signum)

    def _finish(self, signum: int) -> None:
        failed: list[BaseException] = []

        def call() -> None:
            try:
                self.on_signal(signum)
            except BaseException as exc:
                failed.append(exc)

        worker = threading.Thread(target=call, name="torchmem-signal", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            _say(
                f"torchmem: the capture could not be finished within {self.timeout:g} s of "
                f"{signal_name(signum)}; it has no end record"
            )
        elif failed:
            exc = failed[0]
            _say(
                f"torchmem: the capture could not be finished on {signal_name(signum)} "
                f"({type(exc).__name__}: {exc})"
            )


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except Exception:
        pass


__all__ = ["DEFAULT_TIMEOUT", "GRACE", "SignalGuard", "signal_name", "terminating_signals"]
