"""Reports asked for by the program itself while it runs: :func:`survivors`.

Under ``torchmem run`` the run's own session answers; in a program of its own, the active
``torchmem.watch()`` that records what is needed.
"""

from __future__ import annotations

from torchmem.capture.current import current_session
from torchmem.capture.watch import WatchError, active_watchers
from torchmem.results.survivors import SurvivorReport


def survivors(time_limit: float = 2.0) -> SurvivorReport:
    """What the running program's loop allocated and is still alive, now: by allocation site and holder.

    Under ``torchmem run`` it is the run's own record (the loop's steps are found automatically); in a
    program of your own, the active ``torchmem.watch(..., survivors=True)``. A site whose storages are
    alive from (nearly) every recorded step *accumulates*: a leak, named even in a loop of a few steps.
    The same report is printed at the end of ``torchmem run``.

    Args:
        time_limit: Seconds the holder search may take (0: none).

    Raises:
        WatchError: nothing records the loop: not under ``torchmem run``, and no active watcher was made
            with ``survivors=True``.

    Example:
        >>> import torch, torchmem
        >>> model, outs = torch.nn.Linear(256, 256), []
        >>> with torchmem.watch(device="cpu", survivors=True, warn=False) as w:
        ...     for _ in range(4):
        ...         outs.append(model(torch.randn(64, 256)))  # each output keeps its graph
        ...         w.step()
        ...     print(torchmem.survivors())  # doctest: +ELLIPSIS
        allocated in the loop and still alive: ...; LEAK: 1 site accumulating
        ...
    """
    session = current_session()
    if session is not None:
        rep = session.survivors_now(time_limit)
        if rep is not None:
            return rep  # type: ignore[no-any-return]
    for w in active_watchers():
        if w._survivors is not None:
            return w.survivors(time_limit)
    raise WatchError(
        "Nothing records the loop's survivors here.",
        "Run the program with `torchmem run script.py`, or wrap the loop in "
        "`torchmem.watch(..., survivors=True)` (then `w.survivors()` or `torchmem.survivors()`).",
    )


__all__ = ["survivors"]
