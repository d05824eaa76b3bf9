"""Why a run counted no step, and what to do next (the end summary's advice)."""

from __future__ import annotations

import os
from typing import Any


def why_no_steps(
    capture: str,
    followed: tuple[str, ...],
    children: tuple[str, ...],
    step_marker: str | None,
    optimizer_steps: int,
    boundaries: Any,
) -> str:
    """Why no step was counted, and what to do next.

    ``followed``: the captures of the child processes that recorded their own; ``children``: the processes
    the program started; ``optimizer_steps``: the optimizer steps that ran (on the main thread);
    ``boundaries``: the session's ``capture.boundaries.StepBoundaries`` (``None`` if it had none).
    """
    if followed:
        n = len(followed)
        return (
            f"the program's work ran in {n} child process{'es' if n > 1 else ''} it started; each "
            f"recorded its own capture ({', '.join(followed[:3])}{', ...' if n > 3 else ''}). "
            f"Merge them: torchmem report {_glob_of(capture)} (inside a worker, torchmem.watch() "
            "watches one loop)"
        )
    if children:
        n = len(children)
        return (
            f"the program's work ran in {n} child process{'es' if n > 1 else ''} it started "
            f"({', '.join(children[:3])}{', ...' if n > 3 else ''}); torchmem run measures this "
            "process only. Use torchmem.watch() inside the worker function, or launch the workers "
            "with torchrun and run each under torchmem (torchrun ... -m torchmem run train.py)."
        )
    if step_marker:
        name = step_marker
        dotted = (
            f" The marker is a bare function name: use {name.rsplit('.', 1)[-1]!r}, not {name!r}."
            if "." in name
            else ""
        )
        also = (
            f" ({optimizer_steps} optimizer steps did run: drop --step-marker to count those.)"
            if optimizer_steps
            else ""
        )
        return (
            f"no function named {name!r} returned in this process, so --step-marker counted no step."
            + dotted
            + also
            + " Check the spelling against the def of the function one iteration of the loop calls."
        )
    b = boundaries
    other = b.other_thread["optimizer"] if b is not None else 0
    if other:
        return (
            f"{other} optimizer steps ran in other threads; torchmem run counts the steps of the main "
            "thread. Wrap the training loop in torchmem.watch() in its thread."
        )
    seen = b.describe() if b is not None else "none"
    return (
        "no repeating step was found: no optimizer step, backward() call, model call, DataLoader batch "
        f"or generate() call repeated on the main thread (seen: {seen}). The leak verdict comes from the "
        "sampled timeline (bytes per second). If the program has a loop, name the function one iteration "
        "calls: --step-marker FUNCTION, or wrap the loop: for batch in torchmem.watch(loader)."
    )


def _glob_of(capture: str) -> str:
    """The shell pattern of a capture and its children's: ``run.jsonl`` -> ``run*.jsonl``."""
    import shlex

    folder, name = os.path.split(capture)
    stem, dot, suffix = name.rpartition(".")
    if not (dot and stem):
        stem, suffix = name, ""
    # the literal part quoted, the star not: `'my runs/run'*.jsonl` can be pasted into a shell
    return shlex.quote(os.path.join(folder, stem)) + "*" + (f".{shlex.quote(suffix)}" if suffix else "")
