"""Output files torchmem writes: never over a file that is not its own, never over the program it runs.

One policy for every file torchmem creates (capture, HTML report, PNG plot, memory_viz snapshot):

* a path that does not exist is created;
* an existing file that torchmem wrote (recognised by its content: the capture header, the HTML
  ``generator`` tag, the PNG ``Software`` text, the snapshot's pickle keys) or an empty file is replaced
  only with ``force=True`` (``--force``); without it the error says how to replace it;
* any other existing file is refused, ``--force`` or not: torchmem never destroys a file it did not write;
* the program being run (and any path in ``protect``) is never an output.

Checks read at most a few KiB of an existing file; nothing here touches a device.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from torchmem._errors import TorchmemError

KINDS = ("capture", "html", "png", "pickle")


class OutputError(TorchmemError):
    """An output cannot be written where asked (missing folder, a folder at the path, no permission)."""

    exit_code = 3


class OutputExistsError(OutputError):
    """The output path holds a file torchmem will not replace (not its own, or no ``--force``)."""


_WHAT = {"capture": "capture file", "html": "HTML report", "png": "plot", "pickle": "memory_viz snapshot"}


def describe(head: bytes) -> str:
    """A short description of what a file starts with (for messages)."""
    signatures = {
        b"\x89PNG": "a PNG image",
        b"%PDF": "a PDF document",
        b"PK\x03\x04": "a ZIP archive (a torch.save file or a wheel?)",
        b"\x80": "a Python pickle",
        b"\x1f\x8b": "gzip-compressed data",
        b"GIF8": "a GIF image",
        b"\xff\xd8\xff": "a JPEG image",
    }
    for sig, what in signatures.items():
        if head.startswith(sig):
            return what
    if head.lstrip()[:1] == b"<":
        return "an HTML or XML document"
    if b"\x00" in head[:512]:
        return "binary data"
    lines = head[:60].decode("utf-8", "replace").splitlines()
    return f"text starting with {lines[0]!r}" if lines and lines[0].strip() else "text"


def _head(path: Path, n: int = 65536) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


_CAPTURE_HEAD = re.compile(rb'^\s*\{[^\n]*"format"\s*:\s*"torchmem-capture"')


def is_torchmem_output(path: str | os.PathLike[str], kind: str) -> bool:
    """Whether the existing file at ``path`` is a ``kind`` file torchmem wrote (by its content)."""
    try:
        head = _head(Path(path))
    except OSError:
        return False
    if kind == "capture":
        return bool(_CAPTURE_HEAD.match(head))
    if kind == "html":
        return b'<meta name="generator" content="torchmem' in head
    if kind == "png":
        return head.startswith(b"\x89PNG") and b"Software\x00torchmem" in head
    if kind == "pickle":
        return head.startswith(b"\x80") and b"segments" in head and b"device_traces" in head
    raise ValueError(f"unknown output kind {kind!r}; expected one of {KINDS}")


def _same_file(a: Path, b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(os.fspath(b))


def _probe_folder(p: Path, what: str) -> None:
    """Create and remove a file in the folder: the only test that holds for root and read-only mounts."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=p.parent)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise OutputError(
                f"cannot write the {what} {str(p)!r}: permission denied in {str(p.parent)!r} "
                f"({exc.strerror}).",
                "choose a path in a folder you can write to.",
            ) from None
        raise OutputError(
            f"cannot write the {what} {str(p)!r}: {exc.strerror or exc}.", "choose another path."
        ) from None
    os.close(fd)
    os.unlink(tmp)


def check_output(
    path: str | os.PathLike[str],
    kind: str,
    *,
    force: bool = False,
    protect: Iterable[str | os.PathLike[str]] = (),
    what: str | None = None,
    streams_ok: bool = False,
) -> Path:
    """Fail now, before any work, unless ``path`` can be written without destroying anything.

    Args:
        path: The output file.
        kind: ``"capture"``, ``"html"``, ``"png"`` or ``"pickle"``: what will be written there.
        force: Replace an existing file of the same kind that torchmem wrote (never any other file).
        protect: Paths that must never be outputs (the program being run).
        what: How messages name the file (default from ``kind``).
        streams_ok: Accept an existing device or pipe (``/dev/null``, a FIFO): writing to it destroys
            nothing. Only for outputs written in place (the capture), never for atomic renames.

    Returns:
        The absolute path.

    Raises:
        OutputExistsError: the path holds a file torchmem will not replace.
        OutputError: the folder is missing or not writable, or the path is a folder.
    """
    what = what or _WHAT[kind]
    p = Path(os.path.abspath(os.fspath(path)))
    for q in protect:
        if _same_file(p, q):
            raise OutputExistsError(
                f"the {what} {str(path)!r} is the program being run; torchmem never writes over it.",
                "choose another output path.",
            )
    if not p.parent.is_dir():
        raise OutputError(
            f"cannot write the {what} {str(path)!r}: the folder {str(p.parent)!r} does not exist.",
            "create the folder first, or choose another path.",
        )
    if p.is_dir():
        raise OutputError(f"cannot write the {what} {str(path)!r}: it is a folder.", "give a file name.")
    if p.exists() or p.is_symlink():
        try:
            empty = p.stat().st_size == 0 and p.is_file()
        except OSError:
            empty = False
        if not p.is_file():
            if streams_ok and not p.is_dir():
                return p
            raise OutputExistsError(
                f"{str(path)!r} exists and is not a regular file; torchmem does not write there.",
                "choose another path.",
            )
        if empty or is_torchmem_output(p, kind):
            if not force:
                which = "is empty" if empty else f"is a torchmem {what} from an earlier run"
                raise OutputExistsError(
                    f"{str(path)!r} already exists ({which}).",
                    "pass --force to replace it, or choose another path.",
                )
        else:
            try:
                found = describe(_head(p, 4096))
            except OSError as exc:
                found = f"a file that cannot be read ({exc.strerror})"
            raise OutputExistsError(
                f"{str(path)!r} already exists and is not a torchmem {what} (it contains {found}); "
                "torchmem never replaces a file it did not write, even with --force.",
                "choose another path.",
            )
    _probe_folder(p, what)
    return p


def unique_name(
    stem: str, suffix: str, folder: str | os.PathLike[str] = ".", *, rank: int | None = None
) -> str:
    """A new name ``<stem>-<YYYYmmdd-HHMMSS>[-rank<k>][-<n>]<suffix>`` in ``folder`` that does not exist.

    The time makes names unique per run, the rank per process of a distributed job, the counter per
    second. The caller creates the file exclusively (``O_EXCL``) so two processes never share one.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"{stem}-{stamp}" + (f"-rank{rank}" if rank is not None else "")
    folder = os.fspath(folder)
    n = 1
    name = base + suffix
    while os.path.lexists(os.path.join(folder, name)):
        n += 1
        name = f"{base}-{n}{suffix}"
    return os.path.join(folder, name) if folder not in ("", ".") else name


def process_rank() -> int | None:
    """This process's rank in a launched distributed job (torchrun, SLURM, MPI), else ``None``."""
    for world_var, rank_var in (
        ("WORLD_SIZE", "RANK"),
        ("SLURM_NTASKS", "SLURM_PROCID"),
        ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ):
        try:
            if int(os.environ.get(world_var, "1")) > 1 and rank_var in os.environ:
                return int(os.environ[rank_var])
        except ValueError:
            continue
    return None


__all__ = [
    "OutputError",
    "OutputExistsError",
    "check_output",
    "describe",
    "is_torchmem_output",
    "process_rank",
    "unique_name",
]
