"""Distributed runs: who this process is in its job, one capture per rank, and the cross-rank OOM flag.

Everything here reads the launcher's environment (torchrun, SLURM, Open MPI) or the local file system:
no collective, no process-group call, nothing on the training loop's path. Three pieces:

* :func:`rank_info`: this process's rank, local rank, world size and node, from the environment.
* :func:`rank_path`: ``run.jsonl`` -> ``run.rank1.jsonl`` (``{rank}`` in a path is replaced instead), so
  two ranks never write one file.
* :class:`OOMFlag`: a flag file next to the captures. The rank that runs out of memory creates it (one
  ``open(O_EXCL)``, no collective: the failure path never waits on other ranks); every rank's sampler
  thread looks for it (one ``stat`` per sample) and, the first time it appears, writes a ``rank_state``
  record: what that rank held at that moment.

Child processes the program starts (``torch.multiprocessing.spawn``, ``multiprocessing.Process``) are
followed by :class:`FollowedTarget`: the child's target is wrapped before it starts, and the child records
its own capture (``<capture>.proc<k>.jsonl``) with its own session.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

# (world size, rank, local rank, local world size, node) variables of each launcher, in order of trust.
_LAUNCHERS: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("torchrun", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    ("slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"),
    (
        "mpi",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_NODE_RANK",
    ),
)

JOB_ENV = "TORCHMEM_JOB"
"""Set by ``torchmem run --nproc``: the job's key, shared by its ranks (flag files, capture names)."""
STAMP_ENV = "TORCHMEM_STAMP"
"""Set by ``torchmem run --nproc``: the time stamp every rank's default capture name uses."""
CHILD_ENV = "TORCHMEM_CHILD"
"""Set in a followed child process: ``<capture>|<index>`` (the child's own capture is derived from it)."""


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a distributed job, as its launcher's environment says.

    Attributes:
        rank: Global rank (0 ... world_size - 1).
        world_size: Processes in the job.
        local_rank: Rank on this node (usually the GPU index), ``None`` when the launcher does not say.
        local_world_size: Processes on this node, ``None`` when unknown.
        node: The node's index (torchrun's ``GROUP_RANK``), ``None`` when unknown.
        launcher: ``"torchrun"``, ``"slurm"``, ``"mpi"`` or ``"spawn"`` (a child process torchmem follows).
        host: This machine's host name.
        job: A key shared by the job's ranks (for the OOM flag file), ``""`` when there is none.
    """

    rank: int
    world_size: int
    local_rank: int | None = None
    local_world_size: int | None = None
    node: int | None = None
    launcher: str = ""
    host: str = ""
    job: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _job_key(launcher: str, env: Mapping[str, str], single_node: bool) -> str:
    if env.get(JOB_ENV):
        return env[JOB_ENV]
    if launcher == "torchrun":
        parts = [
            env.get("TORCHELASTIC_RUN_ID", ""),
            env.get("MASTER_ADDR", ""),
            env.get("MASTER_PORT", ""),
            env.get("TORCHELASTIC_RESTART_COUNT", ""),
        ]
        if single_node:  # the local ranks share their agent: a key unique to this launch
            parts.append(str(os.getppid()))
    elif launcher == "slurm":
        parts = [env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "")]
    else:
        parts = [env.get("OMPI_MCA_orte_hnp_uri", ""), env.get("PMIX_NAMESPACE", ""), str(os.getppid())]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def rank_info(env: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's rank in a launched job (torchrun, SLURM, Open MPI), else ``None``.

    A job of one process (``torchrun --nproc_per_node=1``) is a job too: ``RankInfo(rank=0, world_size=1)``.
    Reads environment variables only.

    Example:
        >>> rank_info({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}).rank
        1
    """
    env = os.environ if env is None else env
    child = env.get(CHILD_ENV)
    if child:  # a child process torchmem follows (it may inherit its parent's launcher variables)
        _, _, index = child.rpartition("|")
        try:
            k = int(index)
        except ValueError:
            k = 0
        return RankInfo(rank=k, world_size=0, launcher="spawn", host=_host(), job=env.get(JOB_ENV, ""))
    for launcher, world_v, rank_v, local_v, local_world_v, node_v in _LAUNCHERS:
        world, rank = _int_env(env, world_v), _int_env(env, rank_v)
        if world is None or rank is None or world < 1:
            continue
        local_world = _int_env(env, local_world_v)
        single = local_world is not None and local_world == world
        return RankInfo(
            rank=rank,
            world_size=world,
            local_rank=_int_env(env, local_v),
            local_world_size=local_world,
            node=_int_env(env, node_v),
            launcher=launcher,
            host=_host(),
            job=_job_key(launcher, env, single),
        )
    return None


def _host() -> str:
    try:
        return socket.gethostname()
    except Exception:
        return ""


def rank_path(path: str, rank: int, *, tag: str = "rank") -> str:
    """The capture path of rank ``rank`` for a path the user gave: ``{rank}`` in it is replaced, else
    ``.rank<k>`` goes before the suffix (``run.jsonl`` -> ``run.rank1.jsonl``; ``run`` -> ``run.rank1``).

    Example:
        >>> rank_path("out/run.jsonl", 3)
        'out/run.rank3.jsonl'
        >>> rank_path("run-{rank}.jsonl", 3)
        'run-3.jsonl'
    """
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    folder, name = os.path.split(path)
    stem, dot, suffix = name.rpartition(".")
    new = f"{stem}.{tag}{rank}.{suffix}" if dot and stem else f"{name}.{tag}{rank}"
    return os.path.join(folder, new) if folder else new


# ---------------------------------------------------------------------------------------------------------
# the cross-rank OOM flag


class OOMFlag:
    """A flag file shared by the ranks of one job: raised by the first rank that runs out of memory.

    ``raise_()`` is one exclusive ``open`` and a write of a few bytes (safe on the failure path, no
    collective); ``check()`` is one ``stat`` until the flag appears, then one read. A flag older than
    ``since - 60 s`` (an earlier job with the same key) is ignored.
    """

    def __init__(self, folder: str, job: str, since: float | None = None) -> None:
        self.path = os.path.join(folder or ".", f".torchmem-oom-{job}")
        self.since = time.time() if since is None else since
        self.seen: dict[str, Any] | None = None

    def raise_(self, rank: int | None, **fields: Any) -> bool:
        """Create the flag (``True``), or find it already raised by another rank (``False``)."""
        body = {"rank": rank, "pid": os.getpid(), "wall": time.time()} | fields
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if self._stale():
                try:
                    os.unlink(self.path)
                except OSError:
                    return False
                return self.raise_(rank, **fields)
            return False
        except OSError:
            return False
        try:
            os.write(fd, json.dumps(body, default=str).encode())
        finally:
            os.close(fd)
        return True

    def _stale(self) -> bool:
        try:
            return os.stat(self.path).st_mtime < self.since - 60.0
        except OSError:
            return False

    def check(self) -> dict[str, Any] | None:
        """The flag's content the first time it is seen raised (then ``None`` again: it is seen once)."""
        if self.seen is not None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        if st.st_mtime < self.since - 60.0:
            return None
        body: dict[str, Any] = {}
        for _ in range(5):  # the raiser writes right after creating: a read may see it empty
            try:
                with open(self.path, encoding="utf-8") as f:
                    text = f.read()
                if text:
                    loaded = json.loads(text)
                    body = loaded if isinstance(loaded, dict) else {}
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.002)
        self.seen = body
        return body

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


def rank_device_index(info: RankInfo | None, device_count: int) -> int | None:
    """The GPU a launched rank is meant to use when the program does not say: its local rank (modulo the
    visible devices, so a launcher that gives each rank one visible GPU gets index 0). ``None`` outside a
    launcher, for a followed child process, or with fewer than two visible GPUs.

    Example:
        >>> rank_device_index(RankInfo(rank=3, world_size=4, local_rank=1), 2)
        1
    """
    if info is None or info.launcher == "spawn" or info.local_rank is None or device_count < 2:
        return None
    return info.local_rank % device_count


# ---------------------------------------------------------------------------------------------------------
# what torch.distributed says (read at the end of a run; never a collective)


def process_group_facts() -> dict[str, Any] | None:
    """Rank, world size and backend of the default process group when one is initialised, and the NCCL
    communicators' count (``None`` outside torch.distributed). No collective."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        backend = str(dist.get_backend())
        facts: dict[str, Any] = {
            "rank": int(dist.get_rank()),
            "world_size": int(dist.get_world_size()),
            "backend": backend,
        }
    except Exception:
        return None
    facts["nccl_communicators"] = nccl_communicators() if "nccl" in backend.lower() else 0
    return facts


# the torch.distributed calls inside which an NCCL communicator can be created: its first collective on a
# group (lazy creation), or init_process_group / new_group with a device bound (eager creation)
_COLLECTIVES = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "reduce", "gather", "scatter",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "all_gather_object", "broadcast_object_list",
    "monitored_barrier",
)  # fmt: skip


def _uses_nccl(c10d: Any, group: Any = None) -> bool:
    try:
        backend = c10d.get_backend(group) if group is not None else c10d.get_backend()
        return "nccl" in str(backend).lower()
    except Exception:
        return False


def watch_process_groups(before_destroy: Callable[[], Any] | None = None) -> Callable[[], None]:
    """Measure NCCL's device memory (:mod:`torchmem.devices._nccl`) by wrapping, in ``torch.distributed``:

    * ``init_process_group``: the baseline just before the first group; each group created with NCCL
      (here and in ``new_group``) has its communicator still to be seen;
    * the calls inside which a communicator is created — the collectives, ``init_process_group`` and
      ``new_group`` (eager, with a device bound), the parameter-shape check of ``DistributedDataParallel``'s
      constructor (its first collective) — as measured windows while a communicator is still to be seen;
    * ``destroy_process_group``: ``before_destroy`` runs while the communicators still exist.

    Returns the undo. An error in a wrapper never reaches the program; a function the program replaced in
    the meantime is left alone."""
    from torchmem.devices import _nccl

    dist = sys.modules.get("torch.distributed")
    if dist is None or not getattr(dist, "is_available", lambda: False)():
        return lambda: None
    try:
        from torch.distributed import distributed_c10d as c10d
    except Exception:
        return lambda: None
    init = getattr(c10d, "init_process_group", None)
    if init is None or getattr(init, "__torchmem_wrapped__", None) is not None:
        return lambda: None
    _nccl.reset()

    def quiet(call: Callable[..., Any], *args: Any) -> None:
        try:
            call(*args)
        except Exception:
            pass

    def measured(
        fn: Any, before: Callable[[], None] | None = None, after: Any = None, always: bool = False
    ) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                quiet(before)
            # once every group showed its communicator, a call costs this one test
            with _nccl.window(always) if _nccl.watching() else contextlib.nullcontext():
                result = fn(*args, **kwargs)
                if after is not None:  # inside the window: a group created here waits for its communicator
                    quiet(after, result)
            return result

        wrapper.__torchmem_wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def inited(_result: Any) -> None:
        if _uses_nccl(c10d):
            _nccl.group_created()

    def grouped(result: Any) -> None:
        if result is not None and _uses_nccl(c10d, result):
            _nccl.group_created()

    wrappers: list[tuple[Any, str, Any, Any]] = []
    for name in ("init_process_group", "new_group", *_COLLECTIVES):
        fn = getattr(c10d, name, None)
        if fn is None or not callable(fn):
            continue
        if name == "init_process_group":
            new = measured(fn, before=_nccl.take_baseline, after=inited, always=True)
        elif name == "new_group":
            new = measured(fn, after=grouped, always=True)
        else:
            new = measured(fn)
        wrappers += [(m, name, fn, new) for m in (dist, c10d) if getattr(m, name, None) is fn]
    destroy = getattr(c10d, "destroy_process_group", None)
    if before_destroy is not None and destroy is not None:

        @functools.wraps(destroy)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            quiet(before_destroy)
            return destroy(*args, **kwargs)

        destroy_process_group.__torchmem_wrapped__ = destroy  # type: ignore[attr-defined]
        wrappers += [
            (m, "destroy_process_group", destroy, destroy_process_group)
            for m in (dist, c10d)
            if getattr(m, "destroy_process_group", None) is destroy
        ]
    try:  # DDP's constructor: its first collective checks the parameters' shapes across the ranks
        ddp_module: Any = sys.modules.get("torch.nn.parallel.distributed")
        if ddp_module is None:
            import torch.nn.parallel.distributed as ddp_module
        check = getattr(ddp_module, "_verify_param_shape_across_processes", None)
        if callable(check):  # the narrowest window: the shape check alone (torch >= 2.0)
            wrappers.append((ddp_module, "_verify_param_shape_across_processes", check, measured(check)))
        else:  # pragma: no cover - older torch: the whole constructor
            ddp = ddp_module.DistributedDataParallel
            wrappers.append((ddp, "__init__", ddp.__init__, measured(ddp.__init__)))
    except Exception:
        pass
    for owner, name, _, new in wrappers:
        setattr(owner, name, new)

    def undo() -> None:
        for owner, name, old, new in wrappers:
            if owner.__dict__.get(name) is new:
                setattr(owner, name, old)

    return undo


def nccl_communicators() -> int:
    """Process groups using NCCL in this process (each holds a communicator once it ran a collective);
    guarded private read, with the default group alone as the fallback."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return 0
    try:
        from torch.distributed import distributed_c10d as c10d

        pg_map = c10d._world.pg_map
        return sum(1 for pg in pg_map if "nccl" in str(c10d.get_backend(pg)).lower())
    except Exception:
        try:
            return 1 if "nccl" in str(dist.get_backend()).lower() else 0
        except Exception:
            return 0


# ---------------------------------------------------------------------------------------------------------
# child processes


def child_capture(parent_capture: str, index: int) -> str:
    """The capture of the parent's ``index``-th followed child: ``run.jsonl`` -> ``run.proc<k>.jsonl``."""
    return rank_path(parent_capture, index, tag="proc")


# The options of the parent's session a child's session takes over (set by the parent before start).
_child_options: dict[str, Any] = {}


class FollowedTarget:
    """A child process's target, wrapped so that the child records its own capture.

    Picklable (for the ``spawn`` start method) when the wrapped target is. In the child, a
    :class:`~torchmem.capture.session.Session` runs around the target; the capture is
    ``<parent capture>.proc<k>.jsonl``. An error in torchmem's own part is printed once and the target runs
    unmonitored; the target's own errors and exit code are the child's, untouched.
    """

    def __init__(
        self,
        target: Callable[..., Any],
        capture: str,
        index: int,
        options: Mapping[str, Any],
        session_type: Callable[..., Any],
    ) -> None:
        self.target = target
        self.capture = capture
        self.index = index
        self.options = dict(options)
        self.session_type = session_type  # capture.session.Session (pickled by reference)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        session = None
        options = dict(self.options)
        job = str(options.pop("job", "") or "")
        os.environ[CHILD_ENV] = f"{self.capture}|{self.index}"
        if job:
            os.environ[JOB_ENV] = job
        try:
            argv = [*sys.argv[:1], f"<child process {self.index}>"]
            session = self.session_type(self.capture, status=False, argv=argv, **options).start()
        except Exception as exc:
            print(
                f"torchmem: child process {self.index} is not monitored ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
            session = None
        if session is None:
            return self.target(*args, **kwargs)
        guard = _finish_on_signal(session, self.index)
        code: int | None = 0
        reason, error = "exit", cast("BaseException | None", None)
        try:
            return self.target(*args, **kwargs)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            raise
        except KeyboardInterrupt as e:
            code, reason, error = 130, "keyboard_interrupt", e
            raise
        except BaseException as e:
            code, reason, error = 1, "exception", e
            raise
        finally:
            with guard.holding():  # a SIGTERM now (p.terminate()) waits for the capture to be closed
                try:
                    session.finish(code, reason, error)
                except Exception as exc:
                    print(
                        f"torchmem: child {self.index}'s capture could not be closed ({exc})", file=sys.stderr
                    )
            guard.remove()


def _finish_on_signal(session: Any, index: int) -> Any:
    """A followed child stopped with SIGTERM (``p.terminate()``) or SIGHUP closes its capture (end record
    "signal", exit code -N), then dies of the signal as it would have (:mod:`torchmem.capture.signals`)."""
    from torchmem.capture.signals import SignalGuard

    def on_signal(signum: int) -> None:
        session.finish(-signum, "signal", None)

    return SignalGuard(on_signal).install()


_SKIP_TARGET_MODULES = (
    "torch.utils.data._utils.worker",
    "multiprocessing.pool",
    "multiprocessing.managers",
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "concurrent.futures.process",
)


def should_follow(target: Any) -> bool:
    """Whether a child process with this target trains (is followed): not DataLoader, pool or manager
    workers, and not a process without a target."""
    if target is None or isinstance(target, FollowedTarget):
        return False
    module = str(getattr(target, "__module__", "") or "")
    return not module.startswith(_SKIP_TARGET_MODULES)


def spawn_index(proc: Any) -> int | None:
    """The process index ``torch.multiprocessing.spawn`` gives a child (its first argument), else ``None``."""
    target = getattr(proc, "_target", None)
    if (
        getattr(target, "__module__", "") == "torch.multiprocessing.spawn"
        and getattr(target, "__name__", "") == "_wrap"
    ):
        args = getattr(proc, "_args", ())
        if args and isinstance(args[1] if len(args) > 1 else None, int):
            return int(args[1])
    return None


__all__ = [
    "CHILD_ENV",
    "JOB_ENV",
    "STAMP_ENV",
    "FollowedTarget",
    "OOMFlag",
    "RankInfo",
    "child_capture",
    "nccl_communicators",
    "process_group_facts",
    "rank_device_index",
    "rank_info",
    "rank_path",
    "should_follow",
    "spawn_index",
    "watch_process_groups",
]
