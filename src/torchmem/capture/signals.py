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

A signal arrives in Python only between two bytecodes of the main thread: while the main thread is blocked
inside a C call (a collective that never returns), the handler waits, and the launcher's SIGKILL ends the
process without an end record.
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


def terminating_signals() -> tuple[int, ...]:
    """The signals a launcher or a terminal ends a process with, that exist here: SIGTERM, SIGHUP."""
    return tuple(int(getattr(signal, n)) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _die(signum: int) -> None:
    """End the process by ``signum``'s default action, as if no handler had ever been installed."""
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread: the callers here always are
        pass
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
        return self

    def remove(self) -> None:
        """Give the signals back to ``SIG_DFL`` where our handler is still the one installed."""
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
        if self._busy:  # another signal while one is handled: the first one ends the process
            return
        self._busy = True
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


__all__ = ["DEFAULT_TIMEOUT", "SignalGuard", "signal_name", "terminating_signals"]
