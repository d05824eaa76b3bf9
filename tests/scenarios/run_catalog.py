"""Issue 12's scenario suite: whole programs run with ``torchmem run prog.py`` and no flag, and what each must
be reported with.

Every program in ``programs/`` is plain PyTorch written the way people write these loops (it imports
torchmem only where the scenario is "the program uses torchmem itself", or to cap the CPU in the OOM
scenario), runs on CUDA when there is one and on the CPU otherwise, and marks the line that allocates what
leaks with a ``# SITE`` comment. An :class:`Expected` states the verdict, the step boundary where it
matters, the holder (a name a person would use) and, for an OOM, the diagnosis and whether the program
caught it. :func:`check` reads the capture and lists every way it differs from the expectation.

Verdicts:

- ``leak``: the final ``leak`` record is leaking; its top culprit was born at the ``# SITE`` line (its
  ``site`` or one of its ``sites``) and its holder contains ``holder``; the boundary matches.
- ``host_leak``: the final ``host_leak`` record is leaking with a culprit whose holder contains ``holder``
  (of kind ``kind`` when given; when that culprit names sites, the ``# SITE`` line is one of them); the
  device's own ``leak`` record is not leaking (device memory is flat).
- ``oom``: an ``oom`` record with diagnosis ``oom_kind`` (the top cause), ``caught`` as stated and
  ``site`` the ``# SITE`` line.
- ``survivors``: the ``survivors`` record is leaking, with an accumulating group at the ``# SITE`` line whose
  holder contains ``holder``.
- ``quiet``: no record claims a problem (no leaking or detected ``leak``/``host_leak``, no leaking
  ``survivors``, no ``oom``).
- ``no_loop``: quiet, and the capture says that no repeating step was found (not a silent 0 steps).
- ``inner_growth``: the final ``leak`` record is not leaking and its verdict is ``inner_growth`` (the peak
  grows inside each call and falls back when it returns); no other record claims a problem.

An ``oom`` expectation with a ``holder`` also needs the diagnosis's situation of kind ``oom_kind`` to name it.

Always: the capture is complete (an ``end`` record with the program's exit code) and holds no note of an
internal error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROGRAMS = Path(__file__).resolve().parent / "programs"
SRC = str(Path(__file__).resolve().parents[2] / "src")

VERDICTS = ("leak", "host_leak", "oom", "survivors", "quiet", "no_loop", "inner_growth")
BOUNDARIES = ("optimizer", "backward", "module", "dataloader", "generate", "marker", "timeline")


@dataclass(frozen=True)
class Expected:
    """What ``torchmem run programs/<file>`` must report.

    Attributes:
        name: The scenario's name (the test id).
        file: The program, in ``programs/``.
        verdict: One of :data:`VERDICTS`.
        boundary: The step boundary the run must choose (one of :data:`BOUNDARIES`), ``None``: not checked.
        holder: A substring of the culprit's holder path.
        kind: The culprit kind (``"autograd_chain"``, ...), ``None``: not checked.
        oom_kind: For ``oom``: the diagnosis (top cause kind).
        caught: For ``oom``: whether the program caught the error.
        exit_code: The program's exit code.
        devices: Where it runs: ``"cpu"`` (CI) and/or ``"cuda"`` (the GPU machine).
        about: One line: what the scenario is.
        fix: A substring of the top culprit's fix, ``None``: not checked.
        folder: The folder ``file`` is in (``programs/`` unless stated).
    """

    name: str
    file: str
    verdict: str
    boundary: str | None = None
    holder: str | None = None
    kind: str | None = None
    oom_kind: str | None = None
    caught: bool | None = None
    exit_code: int = 0
    devices: tuple[str, ...] = ("cpu", "cuda")
    about: str = ""
    fix: str | None = None
    folder: Path = PROGRAMS

    def __post_init__(self) -> None:
        assert self.verdict in VERDICTS, self.verdict
        assert self.boundary is None or self.boundary in BOUNDARIES, self.boundary
        if self.verdict in ("leak", "host_leak", "survivors"):
            assert self.holder, f"{self.name}: a {self.verdict} needs a holder"
        if self.verdict == "oom":
            assert self.oom_kind and self.caught is not None, f"{self.name}: an oom needs its kind and caught"

    @property
    def path(self) -> Path:
        return self.folder / self.file

    @property
    def site(self) -> str | None:
        """``"prog.py:LINE"`` of the ``# SITE`` marker (``None`` for programs without one)."""
        lines = self.path.read_text().splitlines()
        marked = [i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# SITE")]
        assert len(marked) <= 1, f"{self.file} has {len(marked)} # SITE markers"
        return f"{self.file}:{marked[0]}" if marked else None


E = Expected
SCENARIOS: tuple[Expected, ...] = (
    # -- leaks without an optimizer (issue 12's list) --------------------------------------------------
    E("eval_running_sum", "eval_running_sum.py", "leak", "module", "total_loss",
      about="validation without no_grad(): total_loss += loss"),
    E("eval_average_meter", "eval_average_meter.py", "leak", "module", "loss_meter",
      about="AverageMeter.update(loss) with the tensor"),
    E("autoregressive_hidden", "autoregressive_hidden.py", "leak", "module", "hidden",
      about="autoregressive decoding without no_grad(), hidden state fed back"),
    E("generate_kept_outputs", "generate_kept_outputs.py", "leak", "generate", "outputs",
      about="a generate() serving loop keeping every output and its KV cache"),
    E("metric_list_state", "metric_list_state.py", "leak", "module", "val_accuracy",
      about="a torchmetrics-style metric with list states, never reset"),
    E("hook_activations", "hook_activations.py", "leak", "module", "activations",
      about="a forward hook appending activations (with their graph) to a list"),
    E("stored_exceptions", "stored_exceptions.py", "leak", "module", "errors",
      about="exceptions stored per batch: each traceback pins its frame's tensors"),
    E("create_graph_accumulation", "create_graph_accumulation.py", "leak", "backward", ".grad",
      about="backward(create_graph=True) accumulating graphs into .grad",
      fix="set `.grad = None` each step"),
    E("dataloader_eval", "dataloader_eval.py", "leak", "dataloader", "all_preds",
      about="a from-scratch model over a DataLoader, predictions kept with their graphs"),
    E("per_batch_grads", "per_batch_grads.py", "leak", "backward", "batch_grads",
      about="one backward() per batch, each flattened gradient kept on the device"),
    E("timeline_simulation", "timeline_simulation.py", "leak", "timeline", "trajectory",
      about="no repeating step at all: a simulation keeping every frame, judged per second"),
    # -- leaks with an optimizer ---------------------------------------------------------------------
    E("val_loss_tensors_logged", "val_loss_tensors_logged.py", "leak", "optimizer", "val_losses",
      about="validation losses logged as tensors instead of floats"),
    E("lightning_step_outputs", "lightning_step_outputs.py", "leak", "optimizer", "training_step_outputs",
      about="Lightning-style training_step_outputs never cleared"),
    # -- host memory, short loops, out-of-memory errors -----------------------------------------------
    E("ema_host_chain", "ema_host_chain.py", "host_leak", "optimizer", "shadow", kind="autograd_chain",
      about="EMA update without no_grad(): an autograd chain grows on the host, the device is flat"),
    # 6 steps of +1 MiB each: the short-run verdict (issue 26) calls it a leak, named from the survivors
    E("short_loop_leak", "short_loop_leak.py", "leak", "optimizer", "snapshots",
      about="a leak in a 6-iteration loop"),
    E("oom_retry_in_except", "oom_retry_in_except.py", "oom", oom_kind="pinned_by_exception", caught=True,
      about="an OOM retried inside except while the failed attempt's frames are alive"),
    E("fragmentation_oom", "fragmentation_oom.py", "oom", oom_kind="fragmentation", caught=True,
      devices=("cuda",), about="a fragmentation OOM caught and retried in chunks (CUDA only)"),
    # -- controls: must stay quiet ---------------------------------------------------------------------
    E("control_lru_cache", "control_lru_cache.py", "quiet", "module",
      about="functools.lru_cache(maxsize=4) of embeddings"),
    E("control_frees_what_it_makes", "control_frees_what_it_makes.py", "quiet", "module",
      about="temporaries made and freed every step"),
    E("control_warmup_growth", "control_warmup_growth.py", "quiet", "optimizer",
      about="a buffer that grows for 3 steps then stays, AdamW state"),
    E("control_outputs_to_cpu", "control_outputs_to_cpu.py", "quiet", "module", devices=("cuda",),
      about="no_grad() inference, outputs moved to the host and kept (CUDA only)"),
    E("control_predicted_labels", "control_predicted_labels.py", "quiet", "module",
      about="no_grad() inference keeping the predicted labels on the host"),
    E("control_training_item_logging", "control_training_item_logging.py", "quiet", "optimizer",
      about="a normal training loop logging loss.item()"),
    # -- bad input and safety --------------------------------------------------------------------------
    E("no_loop", "no_loop.py", "no_loop", about="no loop at all"),
    E("dataloader_workers_fork", "dataloader_workers_fork.py", "quiet", "optimizer",
      about="DataLoader with 2 worker processes (default start method)"),
    E("dataloader_workers_spawn", "dataloader_workers_spawn.py", "quiet", "optimizer",
      about="DataLoader with 2 spawned worker processes"),
    E("uses_torchmem_watch", "uses_torchmem_watch.py", "leak", "optimizer", "val_losses",
      about="the program calls torchmem.watch() itself around its loop"),
    E("own_profile_and_trace", "own_profile_and_trace.py", "leak", "optimizer", "val_losses",
      about="the program installs its own sys.setprofile and sys.settrace"),
    E("recursive_forward", "recursive_forward.py", "leak", "module", "outputs",
      about="a module calling itself recursively in forward()"),
    E("tiny_nested_calls", "tiny_nested_calls.py", "quiet", "module",
      about="thousands of tiny nested module calls per second"),
)  # fmt: skip

BY_NAME = {s.name: s for s in SCENARIOS}


def for_device(device: str) -> list[Expected]:
    """The scenarios that run on ``device`` (``"cpu"`` or ``"cuda"``)."""
    return [s for s in SCENARIOS if device in s.devices]


# ---------------------------------------------------------------------------------------------------------
# running


@dataclass(frozen=True)
class Run:
    """One ``torchmem run`` (or plain ``python``) of a program."""

    returncode: int
    stdout: str
    stderr: str
    capture: Path | None
    seconds: float
    cpu_seconds: float | None = None


def run_program(
    s: Expected,
    workdir: Path,
    *,
    plain: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> Run:
    """Run ``s``'s program with ``torchmem run -o <workdir>/<name>.jsonl prog.py`` in a subprocess (no other
    option), or with plain ``python prog.py`` when ``plain``; ``workdir`` is the current folder."""
    capture = workdir / f"{s.name}.jsonl"
    if plain:
        cmd = [sys.executable, str(s.path)]
    else:
        if capture.exists():
            capture.unlink()
        cmd = [sys.executable, "-m", "torchmem", "run", "-o", str(capture), str(s.path)]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = SRC + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    full_env.update(env or {})
    t0 = time.perf_counter()
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=full_env, cwd=workdir, timeout=timeout, check=False
    )
    return Run(out.returncode, out.stdout, out.stderr, None if plain else capture, time.perf_counter() - t0)


# A fork server: an interpreter that has imported torch and torchmem's CLI once, with the modules
# ``torchmem run`` loads before the program starts (what ``python -m torchmem run`` does before it runs the
# program; nothing the program itself imports, such as torch._dynamo, which decides the ledger's mode), and
# forks a fresh child per run. The child redirects its stdin, stdout
# and stderr, moves to the run's folder, sets ``sys.argv`` as ``python -m torchmem`` would and falls through
# to the end of the script, where torchmem's console entry point runs. The child then ends as the
# interpreter's shutdown begins (the exit status as Python derives it from SystemExit or an uncaught
# exception, non-daemon threads joined, atexit handlers run, buffered output flushed) and leaves by
# os._exit, without tearing down its modules: that teardown, with torch imported, costs about 0.6 CPU-s per
# run (it touches every page the fork shares; 68 runs in the suite) and decides nothing these captures are
# checked for. What a real interpreter exit does after a run (exit codes, a complete capture, stderr exactly
# as python's) is tested on ``python -m torchmem run`` in tests/cli.
# The server runs one child at a time and never starts a thread, so each fork copies one thread.
_FORK_SERVER = r"""
import json, os, signal, sys, time
import torch  # noqa: F401  (imported once: what every run starts with)
import torch._dynamo  # noqa: F401  (torch imports it at a program's first optimizer: ~1.5-2.4 s a run)
from torchmem.cli import run as entry_point  # what python -m torchmem calls
# The modules every run loads before the program starts (importing torchmem.cli.run rebinds the name
# torchmem.cli.run to that module: the entry point is taken above).
import torchmem.capture.current, torchmem.cli.run, torchmem.run.session  # noqa: E401
import torchmem.capture.boundaries, torchmem.capture.file, torchmem.capture.host  # noqa: E401
import torchmem.capture.oom, torchmem.capture.ranks, torchmem.capture.survivors  # noqa: E401
import torchmem.capture.snapshot, torchmem.capture.workers  # noqa: E401
reply = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    req = json.loads(line)
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        break
    deadline = t0 + req["timeout"]
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.01)
    cpu = usage.ru_utime + usage.ru_stime  # the child's and its reaped children's
    reply.write(json.dumps({"returncode": code, "seconds": time.perf_counter() - t0, "cpu": cpu}) + "\n")
    reply.flush()
else:
    os._exit(0)  # stdin closed: the server is done (nothing of its own to flush or tear down)
reply.close()
write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["stdout"], write), (2, req["stderr"], write)):
    new = os.open(path, flags, 0o644)
    os.dup2(new, fd)
    os.close(new)
sys.stdin = open(0, closefd=False)
os.chdir(req["cwd"])
sys.path[0] = os.getcwd()  # as python -m sets it
sys.argv = [os.path.join(os.path.dirname(torchmem.__file__), "__main__.py"), *req["args"]]
try:
    entry_point()
    code = 0
except SystemExit as exc:  # as Python's own handling of SystemExit at the top level
    if exc.code is None:
        code = 0
    elif isinstance(exc.code, int):
        code = exc.code & 0xFF
    else:
        print(exc.code, file=sys.stderr)
        code = 1
except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
import atexit, threading  # noqa: E401
threading._shutdown()  # what Py_Finalize does first: join the non-daemon threads, then the atexit handlers
atexit._run_exitfuncs()
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        pass
os._exit(code)
"""


class _ForkServer:
    """One fork-server process (see ``_FORK_SERVER``); :meth:`run`: one ``torchmem run`` in a new child."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self._log = open(log, "w")  # noqa: SIM115  (the server's own errors, closed in close())
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=dict(env),
        )
        self.log = log

    def run(self, s: Expected, workdir: Path, timeout: float) -> Run:
        capture = workdir / f"{s.name}.jsonl"
        if capture.exists():
            capture.unlink()
        out, err = workdir.parent / f"{workdir.name}.stdout", workdir.parent / f"{workdir.name}.stderr"
        req = {
            "args": ["run", "-o", str(capture), str(s.path)],
            "cwd": str(workdir),
            "stdout": str(out),
            "stderr": str(err),
            "timeout": timeout,
        }
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        assert line, f"the fork server died: {self.log.read_text()[-3000:]}"
        rep = json.loads(line)
        return Run(rep["returncode"], out.read_text(), err.read_text(), capture, rep["seconds"], rep["cpu"])

    def close(self) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._proc.stdout.close()
        self._log.close()


def fixture_workers() -> int:
    """Programs a module's fixture runs at a time: 3 when the suite runs in one process, 2 in a worker of
    ``-n`` (the other workers use the other cores: 3 at a time there made the host programs' own readings
    late enough that their host growth was found too late to be named)."""
    return 2 if os.environ.get("PYTEST_XDIST_WORKER") else 3


def run_all(
    scenarios: Sequence[Expected],
    tmp_path_factory: Any,
    *,
    workers: int,
    env: Mapping[str, str] | None = None,
    fork_server: bool = False,
    timeout: float = 300,
) -> dict[str, Run]:
    """Run every scenario once, ``workers`` at a time, each in its own temporary folder; by name.

    Each run is mostly interpreter and torch start-up: with ``fork_server``, each worker starts one
    interpreter that imports torch and torchmem once and forks a child per run, which runs torchmem's
    command line (``python -m torchmem run -o <capture> prog.py``) from there."""
    from concurrent.futures import ThreadPoolExecutor
    from queue import Queue

    dirs = {s.name: tmp_path_factory.mktemp(s.name) for s in scenarios}  # mktemp is not thread-safe
    servers: Queue[_ForkServer] = Queue()
    if fork_server:
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = SRC + (
            os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else ""
        )
        full_env.update(env or {})
        logs = tmp_path_factory.mktemp("fork_servers")
        for k in range(workers):
            servers.put(_ForkServer(full_env, logs / f"server{k}.log"))

    def one(s: Expected) -> tuple[str, Run]:
        if not fork_server:
            return s.name, run_program(s, dirs[s.name], env=env, timeout=timeout)
        server = servers.get()
        try:
            return s.name, server.run(s, dirs[s.name], timeout)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return dict(pool.map(one, scenarios))
    finally:
        while not servers.empty():
            servers.get().close()


def safety_failures(s: Expected, r: Run) -> list[str]:
    """The program's exit code came through and torchmem printed no traceback of its own."""
    failures = []
    if r.returncode != s.exit_code:
        failures.append(f"exit code {r.returncode}, expected {s.exit_code}")
    if "Traceback (most recent call last)" in r.stderr:
        failures.append("a traceback on stderr")
    if failures:
        failures.append(f"stderr (last 3000 characters):\n{r.stderr[-3000:]}")
    return failures


# ---------------------------------------------------------------------------------------------------------
# checking


def records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The capture's records as stored (the header left out), up to the first partial or corrupt line."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            break
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _of(recs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [r for r in recs if r.get("type") == kind]


def _report(rec: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The report a ``leak``/``host_leak``/``survivors`` record carries (under ``report``, or the record)."""
    if rec is None:
        return None
    inner = rec.get("report")
    return inner if isinstance(inner, Mapping) else rec


def _final(recs: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The final report of ``kind``: the last record marked ``final``, else the last one."""
    of = _of(recs, kind)
    finals = [r for r in of if r.get("final")]
    return _report((finals or of or [None])[-1])


def _brief(d: Mapping[str, Any] | None, limit: int = 2500) -> str:
    """A record or report for a failure message: without the long series, cut at ``limit`` characters."""
    if d is None:
        return "none"
    short = {k: v for k, v in d.items() if k not in ("series", "state")}
    text = json.dumps(short, default=str)
    return text if len(text) <= limit else text[:limit] + " ..."


_BOUNDARY_TEXT = (  # the report's words for one step, most specific first (a model may be named BackwardNet)
    ("top-level", "module"),
    ("return of", "marker"),
    ("generate()", "generate"),
    ("optimizer step", "optimizer"),
    ("backward()", "backward"),
    ("dataloader", "dataloader"),
    ("second", "timeline"),
)


def boundary_kind(recs: Sequence[Mapping[str, Any]], report: Mapping[str, Any] | None = None) -> str | None:
    """The kind of step the verdict was judged over: from the report's ``boundary`` text ("optimizer step",
    "top-level Model() call", "second", ...) when it has one, else from the last ``boundary`` record."""
    text = str((report or {}).get("boundary") or "")
    if report is not None and report.get("unit") == "s":
        return "timeline"
    if text:
        low = text.lower()
        for needle, kind in _BOUNDARY_TEXT:
            if needle in low:
                return kind
        return text
    bounds = _of(recs, "boundary")
    return str(bounds[-1].get("kind")) if bounds else None


def _culprit_sites(c: Mapping[str, Any]) -> list[str]:
    sites = [c.get("site")] + [s.get("site") if isinstance(s, Mapping) else s for s in c.get("sites") or ()]
    return [str(x) for x in sites if x]


def _claims(recs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every record that claims a problem."""
    claims = []
    for kind in ("leak", "host_leak"):
        rep = _final(recs, kind)
        if rep is not None and rep.get("verdict") == "gathered" and not rep.get("leaking"):
            continue  # "no leak: results gathered" names its holders without claiming a problem
        if rep is not None and (
            rep.get("leaking") or rep.get("detected_at") is not None or rep.get("culprits")
        ):
            claims.append(f"the final {kind} report claims growth: {_brief(rep)}")
    surv = _report((_of(recs, "survivors") or [None])[-1])
    if surv is not None and surv.get("leaking"):
        claims.append(f"the survivors report is leaking: {_brief(surv)}")
    for r in _of(recs, "oom"):
        claims.append(f"an oom record: {_oom_brief(r)}")
    return claims


def _oom_brief(r: Mapping[str, Any]) -> str:
    diag = r.get("diagnosis") or {}
    kinds = [c.get("kind") for c in diag.get("causes") or ()]
    return f"step={r.get('step')} caught={r.get('caught')} site={r.get('site')} causes={kinds}"


#: Host culprit kinds whose memory the program's own line made: their site must be named (Python 3.12+:
#: before it tracemalloc cannot find a tensor object's trace).
_SITED = ("python_objects", "retained_graph", "autograd_chain", "graph_chain")

_INTERNAL_ERROR = re.compile(r"\b(?!OutOfMemoryError|MemoryError)\w*(Error|Exception): ")


def check(capture_path: str | os.PathLike[str], expected: Expected) -> list[str]:
    """Every way the capture of ``expected``'s run differs from what it must report; ``[]`` when it is
    right. Each failure names the records it looked at."""
    s = expected
    try:
        from torchmem.capture.file import read_capture

        read_capture(capture_path)
    except Exception as exc:
        return [f"the capture cannot be read: {type(exc).__name__}: {exc}"]
    recs = records(capture_path)
    failures: list[str] = []

    ends = _of(recs, "end")
    if not ends:
        failures.append("the capture has no end record")
    elif ends[-1].get("exit_code") != s.exit_code:
        failures.append(f"the end record says exit code {ends[-1].get('exit_code')}, expected {s.exit_code}")
    for n in _of(recs, "note"):
        if _INTERNAL_ERROR.search(str(n.get("text", ""))):
            failures.append(f"a note reports an internal error: {n.get('text')}")

    site = s.site
    if s.verdict in ("leak", "host_leak", "survivors", "oom"):
        assert site is not None, f"{s.file} has no # SITE marker"

    if s.verdict == "leak":
        rep = _final(recs, "leak")
        if rep is None:
            failures.append("no leak record")
        elif not rep.get("leaking"):
            failures.append(f"the final leak report is not leaking: {_brief(rep)}")
        elif not rep.get("culprits"):
            failures.append(f"the final leak report names no culprit: {_brief(rep)}")
        else:
            top = rep["culprits"][0]
            # Per second of the timeline there is no step to open an attribution window in: the site is
            # unknown by design (documented in docs/report.md); the holder must still be named.
            timeline = rep.get("unit") == "s"
            if timeline and top.get("site") is not None and site not in _culprit_sites(top):
                failures.append(f"the timeline culprit names a wrong site {top.get('site')}, not {site}")
            elif not timeline and site not in _culprit_sites(top):
                failures.append(f"the top culprit's sites {_culprit_sites(top)} miss {site}: {_brief(rep)}")
            if s.holder not in str(top.get("holder") or ""):
                failures.append(
                    f"the top culprit's holder {top.get('holder')!r} lacks {s.holder!r}: {_brief(rep)}"
                )
            if s.kind is not None and top.get("kind") != s.kind:
                failures.append(f"the top culprit's kind is {top.get('kind')!r}, expected {s.kind!r}")
            if s.fix is not None and s.fix not in str(top.get("fix") or ""):
                failures.append(f"the top culprit's fix {top.get('fix')!r} lacks {s.fix!r}")
        if s.boundary is not None:
            got = boundary_kind(recs, rep)
            if got != s.boundary:
                failures.append(
                    f"boundary {got!r}, expected {s.boundary!r} (boundary records: "
                    f"{[_brief(b) for b in _of(recs, 'boundary')]})"
                )

    elif s.verdict == "host_leak":
        rep = _final(recs, "host_leak")
        if rep is None:
            failures.append(
                f"no host_leak record (record types: {sorted({str(r.get('type')) for r in recs})})"
            )
        elif not rep.get("leaking"):
            failures.append(f"the final host_leak report is not leaking: {_brief(rep)}")
        else:
            named = [c for c in rep.get("culprits") or () if s.holder in str(c.get("holder") or "")]
            if not named:
                failures.append(f"no host culprit held by {s.holder!r}: {_brief(rep)}")
            else:
                c = named[0]
                if s.kind is not None and c.get("kind") != s.kind:
                    failures.append(f"the host culprit's kind is {c.get('kind')!r}, expected {s.kind!r}")
                if _culprit_sites(c) and site not in _culprit_sites(c):
                    failures.append(
                        f"the host culprit's sites {_culprit_sites(c)} miss {site}: {_brief(rep)}"
                    )
                elif not _culprit_sites(c) and c.get("kind") in _SITED and sys.version_info >= (3, 12):
                    # what the program made (objects, tensors, chains) has a line; a process state does not
                    failures.append(f"the host culprit names no site (expected {site}): {_brief(rep)}")
        dev = _final(recs, "leak")
        if dev is not None and dev.get("leaking"):
            failures.append(f"the device leak report is leaking, but device memory is flat: {_brief(dev)}")
        if s.boundary is not None and rep is not None:
            got = boundary_kind(recs, rep)
            if got != s.boundary:
                failures.append(f"boundary {got!r}, expected {s.boundary!r}")

    elif s.verdict == "oom":
        ooms = _of(recs, "oom")
        if not ooms:
            failures.append("no oom record")
        else:
            match = [
                r
                for r in ooms
                if ((r.get("diagnosis") or {}).get("causes") or [{}])[0].get("kind") == s.oom_kind
                and r.get("caught") is s.caught
                and r.get("site") == site
            ]
            if not match:
                failures.append(
                    f"no oom record with diagnosis {s.oom_kind!r}, caught={s.caught}, site={site}; the "
                    f"records: {[_oom_brief(r) for r in ooms]}; first diagnosis: "
                    f"{_brief(ooms[0].get('diagnosis'), 1500)}"
                )
            elif s.holder is not None:
                situations = [
                    x
                    for x in ((match[0].get("diagnosis") or {}).get("holders") or {}).get("situations") or ()
                    if x.get("kind") == s.oom_kind
                ]
                names = [str(n) for x in situations for n in x.get("names") or ()]
                if not any(s.holder in n for n in names):
                    failures.append(f"the {s.oom_kind} situation names {names}, not {s.holder!r}")

    elif s.verdict == "survivors":
        surv_recs = _of(recs, "survivors")
        rep = _report(surv_recs[-1]) if surv_recs else None
        if rep is None:
            failures.append(f"no survivors record (leak report: {_brief(_final(recs, 'leak'))})")
        elif not rep.get("leaking"):
            failures.append(f"the survivors report is not leaking: {_brief(rep)}")
        else:
            groups = [g for g in rep.get("groups") or () if g.get("site") == site]
            if not groups:
                failures.append(f"no survivor group at {site}: {_brief(rep)}")
            else:
                g = groups[0]
                holders = [str(g.get("holder") or "")] + [
                    str(h.get("path", "")) for h in g.get("holders") or ()
                ]
                if g.get("verdict") != "accumulates":
                    failures.append(f"the group at {site} does not accumulate: {_brief(g)}")
                if not any(s.holder in h for h in holders):
                    failures.append(f"the group at {site} is not held by {s.holder!r}: {_brief(g)}")
            if s.boundary is not None:
                got = boundary_kind(recs, rep)
                if got != s.boundary:
                    failures.append(f"boundary {got!r}, expected {s.boundary!r}")

    elif s.verdict == "inner_growth":
        rep = _final(recs, "leak")
        if rep is None or rep.get("verdict") != "inner_growth" or rep.get("leaking"):
            failures.append(f"the final leak report is not an inner_growth verdict: {_brief(rep)}")
        failures += [c for c in _claims(recs) if not c.startswith("the final leak report")]

    elif s.verdict in ("quiet", "no_loop"):
        failures += _claims(recs)
        if s.verdict == "quiet" and s.boundary is not None:
            got = boundary_kind(recs, _final(recs, "leak"))
            if got != s.boundary:
                failures.append(f"boundary {got!r}, expected {s.boundary!r}")
        if s.verdict == "no_loop":
            texts = [str(n.get("text", "")) for n in _of(recs, "note")]
            for kind in ("leak", "host_leak", "survivors"):
                rep = _final(recs, kind)
                if rep is not None:
                    texts += [str(rep.get("reason", ""))] + [str(x) for x in rep.get("notes") or ()]
            texts += [str(b.get("label", "")) for b in _of(recs, "boundary")]
            if not any("no repeating step" in t.lower() for t in texts):
                failures.append(f"no 'no repeating step found' note; the texts: {texts}")
    return failures


__all__ = [
    "BY_NAME",
    "SCENARIOS",
    "Expected",
    "Run",
    "check",
    "for_device",
    "records",
    "run_program",
]
