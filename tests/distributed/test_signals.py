"""The signal guard of ``torchmem run``: on SIGTERM the capture is finished, then the process dies of the
signal as plain python would (same exit status, the program's ``finally`` not run); the program's own
handler wins.

A ``torchmem run`` process that torchrun stops with SIGTERM is tested in test_ranks.py (its killed-rank job);
here, the guard's paths run in small processes without torch, and the program's own handler in-process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchmem.capture.file import read_capture
from torchmem.capture.signals import SignalGuard, signal_name

PROGRAM = Path(__file__).parent / "programs" / "own_handler.py"
SIGTERM = int(signal.SIGTERM)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHMEM_")}
    env.pop("PYTHONUNBUFFERED", None)  # the program's unflushed output is lost as plain python loses it
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_the_program_s_own_handler_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchmem.run.launcher import run_session

    saved = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code, result = run_session(
            str(PROGRAM), [str(PROGRAM)], capture=str(tmp_path / "own.jsonl"), status=False, quiet=True
        )
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and getattr(handler, "__name__", "") == "stop"  # the program's stays
        assert capsys.readouterr().out == "started\nown handler 15\nfinally\n"
        assert (code, result.reason) == (3, "exit")
        cap = read_capture(tmp_path / "own.jsonl")
        assert cap.end is not None and (cap.end.reason, cap.end.exit_code) == ("exit", 3)
    finally:
        signal.signal(signal.SIGTERM, saved)


def _script(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    head = "import os, signal, sys, time\nfrom torchmem.capture.signals import SignalGuard\n"
    return subprocess.run(
        [sys.executable, "-c", head + textwrap.dedent(body)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_guard_s_paths_in_small_processes(tmp_path: Path) -> None:
    # the callback finishes, then the signal goes on
    r = _script(
        """
        g = SignalGuard(lambda s: print("finished on", s, flush=True)).install()
        os.kill(os.getpid(), signal.SIGTERM)
        print("not reached", flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (-SIGTERM, f"finished on {SIGTERM}\n"), r.stderr
    # while the caller finishes the capture itself, the signal waits for the block's end
    r = _script(
        """
        g = SignalGuard(lambda s: print("callback", flush=True)).install()
        with g.holding():
            os.kill(os.getpid(), signal.SIGTERM)
            print("block ends", flush=True)
        print("not reached", flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (-SIGTERM, "block ends\n"), r.stderr
    # a block (or a callback) that does not end in time: the signal goes on all the same
    r = _script(
        """
        import threading
        lock = threading.Lock()
        g = SignalGuard(lambda s: lock.acquire(), timeout=0.2).install()
        with g.holding():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(20)
        """,
        tmp_path,
    )
    assert r.returncode == -SIGTERM and r.stdout == ""
    r = _script(
        """
        import threading
        lock = threading.Lock()
        g = SignalGuard(lambda s: lock.acquire(), timeout=0.2).install()
        with lock:  # the main thread holds what the callback needs
            os.kill(os.getpid(), signal.SIGTERM)
        """,
        tmp_path,
    )
    assert r.returncode == -SIGTERM and "could not be finished within 0.2 s of SIGTERM" in r.stderr
    # a forked child that inherited the handler dies of the signal without the parent's callback
    r = _script(
        """
        g = SignalGuard(lambda s: print("callback in", os.getpid(), flush=True)).install()
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (0, f"child {-SIGTERM}\n"), r.stderr


def test_a_main_thread_that_cannot_run_the_handler_is_finished_by_the_wakeup_helper(tmp_path: Path) -> None:
    """A rank blocked in one C call (a collective its dead peer never joins) never runs a Python handler;
    here the main thread blocks the signal and sleeps, which is the same for Python. The C-level handler
    still writes the signal to the wake-up fd: the helper finishes the capture after the grace period and
    the process dies of the signal, long before the sleep would end."""
    r = _script(
        """
        import threading
        g = SignalGuard(lambda s: print("finished on", threading.current_thread().name, flush=True)).install()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20)
        print("not reached", flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (-SIGTERM, "finished on torchmem-signal\n"), r.stderr
    # the program's own wake-up fd (asyncio's signal handlers) stays the program's: no helper
    r = _script(
        """
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        g = SignalGuard(lambda s: None).install()
        print(signal.set_wakeup_fd(-1) == w, g._wake is None, signal.SIGTERM in g.installed, flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (0, "True True True\n"), r.stderr
    # a wake-up fd the program sets after the guard (asyncio's add_signal_handler) is left to it by remove()
    r = _script(
        """
        g = SignalGuard(lambda s: None).install()
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        g.remove()
        print(signal.set_wakeup_fd(-1) == w, flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (0, "True\n"), r.stderr
    # a forked child gives the inherited wake-up fd up, and remove() gives it back in the parent
    r = _script(
        """
        g = SignalGuard(lambda s: None).install()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if signal.set_wakeup_fd(-1) == -1 else 1)
        _, status = os.waitpid(pid, 0)
        mine = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(mine)
        g.remove()
        print(os.waitstatus_to_exitcode(status), mine != -1, signal.set_wakeup_fd(-1), flush=True)
        """,
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (0, "0 True -1\n"), r.stderr


def test_only_signals_at_their_default_are_taken_and_the_program_s_handler_stays() -> None:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    calls: list[int] = []
    seen: list[int] = []
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # ignored (nohup): left alone
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        guard = SignalGuard(calls.append).install()
        assert guard.installed == (SIGTERM,)
        ours = signal.getsignal(signal.SIGTERM)

        def own(signum: int, frame: object) -> None:
            seen.append(signum)
            assert callable(ours)
            ours(signum, None)  # it calls the handler it replaced: ours does nothing, as SIG_DFL would

        signal.signal(signal.SIGTERM, own)
        assert guard.installed == ()
        signal.raise_signal(signal.SIGTERM)
        assert seen == [SIGTERM] and calls == []
        guard.remove()
        assert signal.getsignal(signal.SIGTERM) is own  # the program's handler stays
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal_name(SIGTERM) == "SIGTERM" and signal_name(999) == "signal 999"
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        again = SignalGuard(calls.append).install()
        assert again.installed == (SIGTERM,)
        again.remove()  # ours still installed: the default is back
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and again.installed == ()
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
