"""The capture file: the contract between recording (``torchmem run``) and reporting (``torchmem report``).

A capture is JSON Lines in UTF-8 (every line pure ASCII: non-ASCII characters are ``\\u`` escaped). Line 1
is a header naming the format and its version; every later line is one record with a ``"type"`` and
``"t"`` (seconds since the run started). The writer appends whole lines, flushes each one, and forces
them to disk at most about once a second and at close, so a run killed with SIGKILL leaves every line but
maybe a partial last one. The reader keeps everything up to a partial or corrupt line and says where the
file stops. See docs/report.md for every record type and the compatibility rules.

Nothing here touches a device: the writer takes figures (or report objects with ``to_dict()``) from the
caller, and the reader returns plain frozen data. Both go through the one table of record kinds,
:data:`torchmem.results.capture.RECORDS`: the writer writes only its kinds, the reader reads every line of
them with its type's ``from_dict()``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchmem._errors import TorchmemError
from torchmem._outputs import OutputError, OutputExistsError, check_output, describe
from torchmem._warn import emit_warning
from torchmem.results._dicts import ResultFormatError
from torchmem.results.capture import (
    END_REASONS,
    FORMAT,
    MODULE_COLUMNS,
    RECORD_TYPES,
    RECORDS,
    VERSION,
    Capture,
    End,
    LeakRecord,
    ModulesRecord,
    Note,
    OOMRecord,
    Sample,
    StatsRecord,
    StepMark,
)
from torchmem.results.capture_records import _float

_FSYNC_EVERY = 1.0  # seconds between forced writes to disk


class CaptureError(TorchmemError):
    """A capture file cannot be written or read (base of the capture errors)."""

    exit_code = 3


class CaptureWriteError(CaptureError):
    """The capture file cannot be created: its folder is missing, not writable, or the path is a folder."""


class CaptureFormatError(CaptureError):
    """The file is not a torchmem capture (empty, another format, or a damaged header)."""


class CaptureVersionError(CaptureFormatError):
    """The file is a torchmem capture of a version this torchmem does not read."""


# ---------------------------------------------------------------------------------------------------------
# writer


def _jsonable(v: Any) -> Any:
    """``v`` with NaN/inf turned into ``None``, tuples into lists, report objects into their dicts."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    to_dict = getattr(v, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict())
    return str(v)


def _dumps(obj: Mapping[str, Any]) -> bytes:
    try:
        text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = json.dumps(_jsonable(obj), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.encode("ascii") + b"\n"


def _open_error(path: Path, exc: OSError) -> CaptureWriteError:
    parent = path.parent if str(path.parent) else Path(".")
    if exc.errno == errno.ENOENT and not parent.is_dir():
        return CaptureWriteError(
            f"cannot write the capture file {str(path)!r}: the folder {str(parent)!r} does not exist.",
            "create the folder first, or choose another path (--output / -o).",
        )
    if exc.errno == errno.EISDIR or path.is_dir():
        return CaptureWriteError(
            f"cannot write the capture file {str(path)!r}: it is a folder.",
            "give a file name, such as run.tmcap.",
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CaptureWriteError(
            f"cannot write the capture file {str(path)!r}: permission denied ({exc.strerror}).",
            "choose a path in a folder you can write to.",
        )
    return CaptureWriteError(
        f"cannot write the capture file {str(path)!r}: {exc.strerror or exc}.",
        "choose another path.",
    )


class CaptureWriter:
    """Writes a capture file line by line, crash-safe; never raises into the program after it opened.

    The file is created and the header written (and forced to disk) in the constructor, so an unusable
    path fails there, before the program under watch starts. After that, a write error (disk full, the
    file removed under it) is reported once as a warning, ``error`` says what happened, and recording
    stops; the program goes on. Methods are safe to call from several threads.

    Args:
        path: The capture file to create. An existing capture is replaced only with ``force``; any other
            existing file is refused.
        device: ``"cuda:0"``, ``"cpu"``...: the device the figures are of.
        device_name: The product name of the device, if known.
        source: ``"allocator"`` (caching-allocator figures) or ``"ledger"`` (torchmem's exact accounting).
        argv: The command line of the program (default ``sys.argv``).
        force: Replace an existing capture file (torchmem never replaces any other file).
        protect: Paths that must never be the capture (the program being run).
        **header: Further header fields (JSON-able); they must not reuse the names above.

    Raises:
        CaptureWriteError: the file cannot be created (missing folder, permission, a folder at the path).
        OutputExistsError: the path holds a file that is not a capture, the program, or a capture and
            ``force`` is false.

    Example:
        >>> with CaptureWriter("run.tmcap", device="cpu", source="ledger") as w:  # doctest: +SKIP
        ...     w.sample(step=0, allocated=1024)
        ...     w.step(1, allocated=2048)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        device_name: str | None = None,
        source: str = "ledger",
        argv: Sequence[str] | None = None,
        force: bool = False,
        protect: Sequence[str | os.PathLike[str]] = (),
        **header: Any,
    ) -> None:
        self.path = Path(path)
        self.error: str | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._last_sync = 0.0
        self._max_step: int | None = None
        self._refused: set[str] = set()
        self._t0 = time.monotonic()
        started = time.time()
        try:
            check_output(self.path, "capture", force=force, protect=protect, streams_ok=True)
        except OutputExistsError:
            raise
        except OutputError as exc:  # folder missing, a folder, permission: the capture's own error type
            raise CaptureWriteError(exc.message, exc.hint) from None
        # O_EXCL unless replacing a capture on purpose: two processes (ranks) never share one file.
        mode = os.O_TRUNC if force else os.O_EXCL
        if self.path.exists() and not self.path.is_file():  # /dev/null, a FIFO: written in place
            mode = 0
        try:
            self._fd: int | None = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | mode | getattr(os, "O_CLOEXEC", 0), 0o644
            )
        except FileExistsError:
            check_output(self.path, "capture", force=force, protect=protect)
            raise  # pragma: no cover - check_output raised for the file that appeared
        except OSError as exc:
            raise _open_error(self.path, exc) from None
        torch_mod = sys.modules.get("torch")
        if torch_mod is None:
            try:
                import torch as torch_mod
            except Exception:  # pragma: no cover - torch is a dependency
                torch_mod = None
        from torchmem._version import __version__

        head: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "torchmem": __version__,
            "torch": getattr(torch_mod, "__version__", None),
            "python": sys.version.split()[0],
            "device": device,
            "device_name": device_name,
            "argv": list(sys.argv if argv is None else argv),
            "pid": os.getpid(),
            "started": started,
            "source": source,
        }
        for k, v in header.items():
            if k in head:
                os.close(self._fd)
                raise TypeError(f"header field {k!r} is set by CaptureWriter itself")
            head[k] = v
        self.header: Mapping[str, Any] = head
        try:
            self._write_raw(_dumps(head))
            os.fsync(self._fd)
        except OSError as exc:
            os.close(self._fd)
            raise _open_error(self.path, exc) from None
        self._last_sync = time.monotonic()

    # -- plumbing ------------------------------------------------------------------------------------
    def _write_raw(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _fail(self, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        msg = (
            f"torchmem: writing the capture file {str(self.path)!r} failed ({self.error}); recording stopped"
        )
        emit_warning(msg, stacklevel=4)
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _refuse(self, kind: str) -> None:
        with self._lock:
            if kind in self._refused:
                return
            self._refused.add(kind)
        emit_warning(
            f"torchmem: a capture record of type {kind!r} was not written to {str(self.path)!r}: the capture "
            f"format has no such record (its types: {', '.join(RECORDS)})",
            stacklevel=4,
        )

    @property
    def recording(self) -> bool:
        """Lines are still being written (not closed, no write error)."""
        return self._fd is not None and not self._closed

    def elapsed(self) -> float:
        """Seconds since the writer opened (the ``t`` of a record written now)."""
        return time.monotonic() - self._t0

    def record(self, type: str, *, t: float | None = None, **fields: Any) -> None:
        """Append one record of ``type`` with ``fields`` (report objects are stored as their ``to_dict()``).

        Only the kinds of :data:`~torchmem.results.capture.RECORDS` are written: a record of any other type
        is dropped and said once per type (a warning; the program under watch goes on), since no reader of
        this version could read it.

        Args:
            type: The record type, a key of :data:`~torchmem.results.capture.RECORDS`.
            t: Seconds since the start (default: now).
            **fields: The record's fields.

        Example:
            >>> w.record("note", text="warm-up done")  # doctest: +SKIP
        """
        if not self.recording:
            return
        if type not in RECORDS:
            self._refuse(type)
            return
        try:
            line: dict[str, Any] = {"type": type, "t": round(self.elapsed() if t is None else float(t), 6)}
            line.update(fields)
            data = _dumps(line)
            with self._lock:
                if self._fd is None or self._closed:
                    return
                self._write_raw(data)
                now = time.monotonic()
                if now - self._last_sync >= _FSYNC_EVERY:
                    os.fsync(self._fd)
                    self._last_sync = now
        except Exception as exc:
            with self._lock:
                if self._fd is not None:
                    self._fail(exc)

    # -- typed records -------------------------------------------------------------------------------
    def sample(
        self,
        *,
        step: int | None = None,
        allocated: int | None = None,
        reserved: int | None = None,
        peak_allocated: int | None = None,
        peak_reserved: int | None = None,
        t: float | None = None,
    ) -> None:
        """One timeline reading. Unknown figures stay ``None``."""
        self.record(
            "sample",
            t=t,
            step=step,
            allocated=allocated,
            reserved=reserved,
            peak_allocated=peak_allocated,
            peak_reserved=peak_reserved,
        )

    def step(self, step: int, *, allocated: int | None = None, t: float | None = None) -> None:
        """A step marker: step ``step`` ended, with ``allocated`` bytes then."""
        if self._max_step is None or step > self._max_step:
            self._max_step = step
        self.record("step", t=t, step=step, allocated=allocated)

    def stats(self, when: str, stats: Any, breakdown: Any = None, *, t: float | None = None) -> None:
        """A full stats reading: a ``MemoryStats`` (or its dict) and its ``Breakdown`` (or ``None``).

        ``when`` is ``"start"`` or ``"end"``.
        """
        self.record("stats", t=t, when=when, stats=stats, breakdown=breakdown)

    def leak(self, report: Any, *, t: float | None = None) -> None:
        """A leak verdict: a ``LeakReport`` (or its dict)."""
        self.record("leak", t=t, report=report)

    def oom(self, diagnosis: Any, *, step: int | None = None, t: float | None = None) -> None:
        """An OOM and its diagnosis: an ``OOMDiagnosis`` (or its dict)."""
        self.record("oom", t=t, diagnosis=diagnosis, step=step)

    def modules(
        self, rows: Sequence[Mapping[str, Any]], notes: Sequence[str] = (), *, t: float | None = None
    ) -> None:
        """The per-module profile: rows with ``module`` and the byte columns of :data:`MODULE_COLUMNS`."""
        self.record("modules", t=t, rows=list(rows), notes=list(notes))

    def note(self, text: str, *, t: float | None = None) -> None:
        """A note for the reader of the report."""
        self.record("note", t=t, text=text)

    def close(
        self,
        *,
        exit_code: int | None = 0,
        reason: str = "exit",
        steps: int | None = None,
        seconds: float | None = None,
    ) -> None:
        """Write the end record, force the file to disk and close it. A second call does nothing.

        Args:
            exit_code: The program's exit code (``None`` if it has none, such as after a signal).
            reason: ``"exit"``, ``"exception"``, ``"keyboard_interrupt"``, ``"oom"`` or ``"signal"``.
            steps: Steps the program made (default: the highest step marker written, else 0).
            seconds: Seconds the program ran (default: since the writer opened).
        """
        if self._closed:
            return
        if steps is None:
            steps = self._max_step if self._max_step is not None else 0
        self.record(
            "end",
            exit_code=exit_code,
            reason=reason,
            steps=steps,
            seconds=round(self.elapsed() if seconds is None else seconds, 6),
        )
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.fsync(fd)
            except OSError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close(exit_code=0, reason="exit")
        elif isinstance(exc, SystemExit):
            code = exc.code
            self.close(exit_code=code if isinstance(code, int) else (0 if code is None else 1), reason="exit")
        elif isinstance(exc, KeyboardInterrupt):
            self.close(exit_code=130, reason="keyboard_interrupt")
        else:
            oom_type = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
            is_oom = isinstance(exc, MemoryError) or (
                isinstance(oom_type, type) and isinstance(exc, oom_type)
            )
            self.close(exit_code=1, reason="oom" if is_oom else "exception")

    def __del__(self) -> None:  # a writer dropped without close(): do not leak the descriptor
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------------------
# reader


class _Bad(Exception):
    pass


def _parse_header(line: bytes, path: str) -> dict[str, Any]:
    what = describe(line)
    try:
        head = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CaptureFormatError(
            f"{path!r} is not a torchmem capture file: it contains {what}.",
            "pass a file written by `torchmem run` (it starts with a JSON header naming "
            f'"format": "{FORMAT}").',
        ) from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        if isinstance(head, dict):
            found = (
                f"JSON with format {head['format']!r}"
                if "format" in head
                else ("a JSON object with keys " + ", ".join(repr(k) for k in list(head)[:6]))
            )
        else:
            found = f"JSON {type(head).__name__}"
        raise CaptureFormatError(
            f'{path!r} is not a torchmem capture file: its first line is {found}, not a "{FORMAT}" header.',
            "pass a file written by `torchmem run`.",
        )
    version = head.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CaptureVersionError(
            f"{path!r} is a torchmem capture with an unknown version {version!r}; this torchmem reads "
            f"version {VERSION}.",
            "the header is damaged; record the run again.",
        )
    if version > VERSION:
        writer = head.get("torchmem")
        by = f" by torchmem {writer}" if writer else ""
        from torchmem._version import __version__

        raise CaptureVersionError(
            f"{path!r} is a torchmem capture of version {version} (written{by}); torchmem {__version__} "
            f"reads version {VERSION} and older.",
            "upgrade torchmem (pip install -U torchmem) to read it.",
        )
    return head


def _stops(lineno: int, offset: int) -> str:
    return f"the file stops at line {lineno} (byte {offset}): the run was killed or the file is truncated"


def read_capture(path: str | os.PathLike[str]) -> Capture:
    """Read a capture file: everything up to the first partial or corrupt line.

    Args:
        path: A file written by :class:`CaptureWriter` (``torchmem run``).

    Returns:
        A frozen :class:`Capture`. ``truncated`` says where the readable part stops when the file ends in
        a partial line (a killed run) or holds a corrupt one; ``end`` is ``None`` when the run did not
        write its end record.

    Raises:
        CaptureError: the file cannot be opened.
        CaptureFormatError: the file is empty or not a capture (a subclass, :class:`CaptureVersionError`,
            when it is a capture of a newer or unknown version).

    Example:
        >>> cap = read_capture("run.tmcap")  # doctest: +SKIP
        >>> cap.peak_allocated, cap.finished  # doctest: +SKIP
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CaptureError(
            f"no capture file at {name!r}.", "check the path; `torchmem run` prints where it wrote one."
        ) from None
    except IsADirectoryError:
        raise CaptureError(f"{name!r} is a folder, not a capture file.", "pass the capture file.") from None
    except OSError as exc:
        raise CaptureError(
            f"cannot read {name!r}: {exc.strerror or exc}.", "check the permissions."
        ) from None
    if not data.strip():
        raise CaptureFormatError(
            f"{name!r} is empty: it is not a torchmem capture file (or the run was killed before it "
            "wrote anything).",
            "record the run again with `torchmem run`.",
        )
    first_end = data.find(b"\n")
    header_line = data if first_end < 0 else data[:first_end]
    head = _parse_header(header_line, name)
    if first_end < 0:
        return Capture(
            path=name,
            header=head,
            truncated=_stops(2, len(data)),
            lines=1,
        )

    records: list[Any] = []
    unknown: list[Mapping[str, Any]] = []
    truncated: str | None = None
    offset = first_end + 1
    lineno = 1
    while offset < len(data):
        lineno += 1
        nl = data.find(b"\n", offset)
        raw = data[offset:] if nl < 0 else data[offset:nl]
        try:
            if nl < 0:
                raise _Bad("partial line")
            if raw.strip():
                rec = _parse_record(raw)
                (unknown if isinstance(rec, dict) else records).append(rec)
        except _Bad:
            truncated = _stops(lineno, offset)
            break
        offset = nl + 1

    return Capture.from_records(
        name, head, records, unknown=unknown, truncated=truncated, lines=lineno - (1 if truncated else 0)
    )


def _parse_record(raw: bytes) -> Any:
    """One record line, read through :data:`~torchmem.results.capture.RECORDS`: an instance of its kind's
    record type, or the line's dict for a kind this version does not know (kept, otherwise ignored).

    Raises:
        _Bad: the line is not a record (not JSON, no ``type``, no ``t``), or a record of a known kind that
            cannot be read (:meth:`~torchmem.results.capture._Record.from_dict`).
    """
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _Bad("not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise _Bad("not a record")
    if _float(obj.get("t")) is None:
        raise _Bad("no time")
    kind = RECORDS.get(obj["type"])
    if kind is None:
        return obj  # a type this version does not know: kept, otherwise ignored
    try:
        return kind.type.from_dict(obj)
    except ResultFormatError:
        raise _Bad(f"malformed {kind.kind} record") from None


__all__ = [
    "END_REASONS",
    "FORMAT",
    "MODULE_COLUMNS",
    "RECORDS",
    "RECORD_TYPES",
    "VERSION",
    "Capture",
    "CaptureError",
    "CaptureFormatError",
    "CaptureVersionError",
    "CaptureWriteError",
    "CaptureWriter",
    "End",
    "LeakRecord",
    "ModulesRecord",
    "Note",
    "OOMRecord",
    "Sample",
    "StatsRecord",
    "StepMark",
    "read_capture",
]
