"""Writing report files whole or not at all: a temporary file beside the target, then a rename."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from torchmem._outputs import OutputError, check_output


def _error(path: Path, what: str, exc: OSError | None = None) -> OutputError:
    parent = path.parent
    if not parent.is_dir():
        return OutputError(
            f"cannot write the {what} {str(path)!r}: the folder {str(parent)!r} does not exist.",
            "create the folder first, or choose another path.",
        )
    if path.is_dir():
        return OutputError(
            f"cannot write the {what} {str(path)!r}: it is a folder.",
            "give a file name, such as report.html.",
        )
    if exc is not None and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return OutputError(
            f"cannot write the {what} {str(path)!r}: permission denied ({exc.strerror}).",
            "choose a path in a folder you can write to.",
        )
    reason = "" if exc is None else f": {exc.strerror or exc}"
    return OutputError(f"cannot write the {what} {str(path)!r}{reason}.", "choose another path.")


def check_writable(
    path: str | os.PathLike[str],
    what: str,
    *,
    kind: str = "html",
    force: bool = False,
    protect: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Fail early, before any work, unless ``path`` can be written without destroying anything."""
    return check_output(path, kind, force=force, what=what, protect=protect)


def write_atomic(
    path: str | os.PathLike[str],
    write: Callable[[IO[bytes]], None],
    *,
    what: str = "report",
    kind: str = "html",
    force: bool = False,
) -> Path:
    """Create ``path`` from what ``write`` writes to a binary file; ``path`` is never left half-written.

    An existing file is replaced only when torchmem wrote it and ``force`` is true (see
    :func:`torchmem._outputs.check_output`).

    Raises:
        OutputExistsError: the path holds a file that is not torchmem's, or ``force`` is false.
        OutputError: the folder is missing, the path is a folder, or it cannot be written.
    """
    p = check_output(path, kind, force=force, what=what)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        raise _error(p, what, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _error(p, what, exc) from None
        raise
    return p


__all__ = ["OutputError", "check_writable", "write_atomic"]
