"""The host machine's memory: total RAM, a container's memory limit (cgroup v2 or v1) and what is available.

This is what a CPU out-of-memory is measured against: the CPU allocator's message gives only the size of
the request. Everything is read from the OS when asked (nothing at import); a figure that cannot be read is
``None`` and says so, it is never a guess.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from torchmem.devices._cpu import physical_memory

MEMINFO = "/proc/meminfo"
CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"

# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages); v2 as "max".
_UNLIMITED = 1 << 62


class HostMemory(NamedTuple):
    """The host's memory, in bytes, and where each figure was read: the raw reading. Which figure is the
    ceiling (the cgroup limit where it binds, else the RAM) is :class:`torchmem.results.oom.MachineMemory`'s
    rule, the one place it is decided.

    Attributes:
        physical: Total RAM of the machine (``MemTotal``), ``None`` when it cannot be read.
        physical_source: Where ``physical`` came from (``"MemTotal in /proc/meminfo"``, or
            ``"sysconf(SC_PHYS_PAGES) x sysconf(SC_PAGE_SIZE)"`` where there is no ``/proc``).
        cgroup_limit: The tightest memory limit of this process's cgroup and its ancestors, ``None`` when
            none is set (or there are no cgroups).
        cgroup_source: The file ``cgroup_limit`` was read from.
        available: ``MemAvailable`` now (``None`` where there is no ``/proc/meminfo``).
    """

    physical: int | None
    physical_source: str | None
    cgroup_limit: int | None = None
    cgroup_source: str | None = None
    available: int | None = None


def meminfo(path: str = MEMINFO) -> dict[str, int]:
    """``/proc/meminfo`` as bytes by field name (``{}`` where it cannot be read).

    Example:
        >>> info = meminfo()
        >>> info.get("MemTotal", 1) > 0
        True
    """
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if not parts:
                    continue
                try:
                    value = int(parts[0])
                except ValueError:
                    continue
                unit = parts[1].lower() if len(parts) > 1 else ""
                out[name.strip()] = value * 1024 if unit == "kb" else value
    except (OSError, UnicodeDecodeError):
        return {}
    return out


def _read_limit(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _UNLIMITED else None


def _candidates(base: str, path: str) -> list[str]:
    """The cgroup directory of this process under ``base`` and its ancestors up to ``base``.

    Without a cgroup namespace, ``/proc/self/cgroup`` may name a path that this mount does not show (a
    container sees its own cgroup as the mount's root): then only ``base`` itself is read.
    """
    rel = path.strip().strip("/")
    if not rel:
        return [base]
    here = os.path.join(base, rel)
    if not os.path.isdir(here):
        return [base]
    out = []
    parts = rel.split("/")
    for i in range(len(parts), -1, -1):
        out.append(os.path.join(base, *parts[:i]))
    return out


def cgroup_memory_limit(root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> tuple[int, str] | None:
    """The tightest memory limit on this process from its cgroup and their ancestors, with the file it
    came from: ``memory.max`` (cgroup v2) or ``memory.limit_in_bytes`` (cgroup v1). ``None``: no limit set,
    or no cgroups (not Linux).

    Example:
        >>> found = cgroup_memory_limit()
        >>> found is None or found[0] > 0
        True
    """
    try:
        with open(self_cgroup, encoding="ascii") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    files: list[str] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hier, controllers, path = fields
        if hier == "0" and controllers == "":  # cgroup v2 (unified)
            for base in (root, os.path.join(root, "unified")):
                if os.path.exists(os.path.join(base, "cgroup.controllers")):
                    files += [os.path.join(d, "memory.max") for d in _candidates(base, path)]
                    break
        elif "memory" in controllers.split(","):  # cgroup v1
            base = os.path.join(root, controllers)
            if not os.path.isdir(base):
                base = os.path.join(root, "memory")
            files += [os.path.join(d, "memory.limit_in_bytes") for d in _candidates(base, path)]
    best: tuple[int, str] | None = None
    for name in files:
        value = _read_limit(name)
        if value is not None and (best is None or value < best[0]):
            best = (value, name)
    return best


def host_memory(
    meminfo_path: str = MEMINFO, cgroup_root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP
) -> HostMemory:
    """Read the host's memory now: total RAM, the cgroup limit (if one is set) and what is available.

    Example:
        >>> h = host_memory()
        >>> h.physical is None or h.physical > 0
        True
    """
    info = meminfo(meminfo_path)
    physical: int | None = info.get("MemTotal")
    source: str | None = f"MemTotal in {meminfo_path}" if physical else None
    if not physical:
        physical = physical_memory()
        source = "sysconf(SC_PHYS_PAGES) x sysconf(SC_PAGE_SIZE)" if physical else None
    cg = cgroup_memory_limit(cgroup_root, self_cgroup)
    return HostMemory(
        physical=physical or None,
        physical_source=source,
        cgroup_limit=None if cg is None else cg[0],
        cgroup_source=None if cg is None else cg[1],
        available=info.get("MemAvailable"),
    )


# -- this process's host memory, cheap enough to read at every step -----------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm: dict[str, int | None] = {}  # "fd": an open /proc/self/statm (per pid), None where there is none
_mallinfo: list[Any] = []  # [function or None], resolved on first use


def process_rss() -> int | None:
    """This process's resident set size in bytes (``/proc/self/statm``, ~1 µs; psutil elsewhere).

    ``None`` when it cannot be read. The file is kept open (re-opened after a fork).
    """
    pid = os.getpid()
    if _statm.get("pid") != pid:
        _statm.clear()
        _statm["pid"] = pid
        try:
            _statm["fd"] = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            _statm["fd"] = None
    fd = _statm.get("fd")
    if fd is not None:
        try:
            return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            pass
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def heap_in_use() -> int | None:
    """Bytes the C heap has handed out and not taken back (glibc ``mallinfo2()``: ``uordblks + hblkhd``).

    This is what tensor storages on the CPU, autograd nodes and other C/C++ objects occupy, without the page
    cache noise of the RSS: a freed tensor lowers it at once. ~1 µs. ``None`` where the C library has no
    ``mallinfo2`` (not glibc >= 2.33): use :func:`process_rss` there.
    """
    if not _mallinfo:
        _mallinfo.append(_load_mallinfo2())
    fn = _mallinfo[0]
    if fn is None:
        return None
    try:
        m = fn()
        return int(m.uordblks) + int(m.hblkhd)
    except Exception:
        return None


def _load_mallinfo2() -> Any:
    try:
        import ctypes

        fields = [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]

        class _MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in fields]

        fn = ctypes.CDLL(None).mallinfo2
        fn.restype = _MallInfo2
        fn.argtypes = []
        fn()
        return fn
    except Exception:  # not glibc, or glibc < 2.33
        return None


__all__ = ["HostMemory", "cgroup_memory_limit", "heap_in_use", "host_memory", "meminfo", "process_rss"]


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    """The parent's PID of ``pid`` (``/proc/<pid>/stat``), ``None`` where it cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses, the last ')' ends it.
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def process_comm(pid: int, proc: str = "/proc") -> str | None:
    """The process's name (``/proc/<pid>/comm``: ``python3``, ``pt_data_worker``), if readable."""
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def relation_to(pid: int, me: int | None = None, proc: str = "/proc") -> tuple[str, int | None]:
    """How process ``pid`` relates to this one: ``("child", ppid)``, ``("descendant", ppid)``,
    ``("orphan", ppid)`` (its parent exited: it was re-parented to init or a subreaper) or ``("", ppid)``;
    ``("", None)`` where ``/proc`` cannot tell (another PID namespace, not Linux)."""
    me = os.getpid() if me is None else me
    ppid = parent_pid(pid, proc)
    if ppid is None:
        return "", None
    if ppid == me:
        return "child", ppid
    p: int | None = ppid
    seen = 0
    while p is not None and p > 1 and seen < 64:
        if p == me:
            return "descendant", ppid
        p = parent_pid(p, proc)
        seen += 1
    if ppid == 1 or _is_subreaper_orphan(pid, ppid, proc):
        return "orphan", ppid
    return "", ppid


def _is_subreaper_orphan(pid: int, ppid: int, proc: str) -> bool:
    # A worker whose trainer died is re-parented to the nearest subreaper (systemd --user, a container's
    # init such as tini or dumb-init) rather than PID 1.
    name = process_comm(ppid, proc) or ""
    return name in ("systemd", "tini", "dumb-init", "docker-init", "init") and (
        process_comm(pid, proc) or ""
    ).startswith(("python", "pt_data_worker", "pt_main_thread"))


def process_uss(pid: int, proc: str = "/proc") -> int | None:
    """Process ``pid``'s unique set size (memory no other process shares, in bytes): psutil's
    ``memory_full_info().uss``, else the sum of ``Private_*`` lines of ``/proc/<pid>/smaps_rollup``; ``None``
    where neither can be read (the process is gone, another user's)."""
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        return int(psutil.Process(pid).memory_full_info().uss)
    except ImportError:
        pass
    except Exception:
        return None
    try:
        with open(f"{proc}/{pid}/smaps_rollup") as f:
            kib = sum(
                int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:"))
            )
        return kib * 1024
    except (OSError, ValueError, IndexError):
        return None


def process_cmdline(pid: int, proc: str = "/proc") -> list[str] | None:
    """The process's command line (``/proc/<pid>/cmdline``), ``None`` where it cannot be read."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
    return parts or None
