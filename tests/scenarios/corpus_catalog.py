"""Issue 26's corpus: leak, OOM and control programs in ``corpus/``, each run with ``torchmem run prog.py``
and no flag, with what a person reading the program would say about it
(:class:`~scenarios.run_catalog.Expected`, checked by :func:`~scenarios.run_catalog.check`).

The programs are written as users write them (varied shapes: short loops, growth inside each call, loops
with no step torchmem recognises, memory born inside a library call or on another thread, host growth of
every kind, OOMs whose holders matter, classic leaks written differently from ``programs/``), run on CUDA
when there is one and on the CPU otherwise, and mark the line that allocates what leaks with ``# SITE``.

Where the CPU and a GPU differ in what the program *is* (CPU tensors are device memory on the CPU and host
memory on a GPU), the program has one entry per device. Where torchmem is known to say something else, the
entry stays what a person would say and :data:`KNOWN_WRONG` gives what torchmem says instead (the tests mark
those ``xfail(strict=True)``).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from scenarios.run_catalog import Expected

CORPUS = Path(__file__).resolve().parent / "corpus"


def _e(
    name: str, verdict: str, boundary: str | None = None, holder: str | None = None, **kw: object
) -> Expected:
    return Expected(name, f"{name}.py", verdict, boundary, holder, folder=CORPUS, **kw)  # type: ignore[arg-type]


def _cpu(e: Expected) -> Expected:
    return replace(e, devices=("cpu",))


def _cuda(e: Expected, **kw: object) -> Expected:
    return replace(e, name=e.name + "_cuda", devices=("cuda",), **kw)  # type: ignore[arg-type]


_cpu_graphs = _e(
    "cpu_graphs_kept",
    "leak",
    "module",
    "calibrated",
    about="a CPU calibration layer with autograd on, its outputs kept with their CPU graph",
)
_cpu_dict = _e(
    "cpu_tensor_dict_per_step",
    "leak",
    "optimizer",
    "weight_snapshots",
    about="per-step .cpu() weight snapshots kept in a dict",
)

CORPUS_SCENARIOS: tuple[Expected, ...] = (
    # -- short loops with overwhelming growth ----------------------------------------------------------
    _e("short_stored_exceptions", "leak", "module", "failures", kind="exception", fix="`failures`",
       about="8 shards, every one rejected: the stored exceptions' tracebacks keep each frame's tensors"),
    _e("short_hook_dict", "leak", "module", "activations",
       about="forward hooks keep every layer's output (with its graph) in a defaultdict, 7 batches"),
    _e("short_hf_generate_kept", "leak", "generate", "results",
       about="6 GPT-2 generate() calls (built from a config), each output kept with its KV cache"),
    # -- growth inside each call ------------------------------------------------------------------------
    _e("decode_inner_growth", "inner_growth",
       about="GRU decoding without no_grad(): the hidden state's graph grows token to token, freed per call"),
    # -- no step boundary torchmem recognises -----------------------------------------------------------
    _e("metric_torchmetrics_never_reset", "leak", None, "auroc", kind="metric_state", fix="`auroc.reset()`",
       about="torchmetrics BinaryAUROC (list states) update() in a loop, never reset"),
    _e("metric_handwritten_never_reset", "leak", None, "recall.sims",
       about="a hand-written recall@k metric keeping similarity rows, never reset"),
    _e("transform_function_cache", "leak", None, "_debug_batches",
       about="a data-transform function keeping every normalised batch in a module list"),
    _e("epoch_function_history", "leak", None, "history",
       about="k-means epoch function returning its distance matrix; every epoch's result kept"),
    # -- memory born inside a library call or on another thread ----------------------------------------
    _e("optimizer_per_epoch", "leak", "optimizer", "schedules", kind="kept_optimizer",
       fix="`schedules` keeps optimizers",
       about="a fresh AdamW + LR scheduler every epoch, the old ones kept (state made inside step())"),
    _e("producer_thread_queue", "leak", "optimizer", "prefetch",
       about="a producer thread filling a queue nobody drains"),
    # -- host growth -------------------------------------------------------------------------------------
    _e("host_numpy_rows", "host_leak", "backward", "loss_rows", kind="python_objects",
       about="a numpy array of per-sample losses kept per step"),
    _e("host_log_dicts", "host_leak", "backward", "records", kind="python_objects",
       about="per-step Python dicts (ids, a text note) kept in a list"),
    _e("host_profiler_left_on", "host_leak", "backward", "profiler", kind="profiler_running",
       about="a torch.profiler started and never stopped during the loop"),
    _e("host_anomaly_mode_losses", "host_leak", "backward", "loss_history", kind="anomaly_mode",
       about="anomaly mode left on, losses kept as tensors"),
    _cpu(_cpu_graphs),
    _cuda(_cpu_graphs, verdict="host_leak"),
    _cpu(_cpu_dict),
    _cuda(_cpu_dict, verdict="host_leak"),
    # -- out-of-memory errors whose holders matter ------------------------------------------------------
    _e("oom_eval_keeps_train_graph", "oom", holder="train_loss", oom_kind="training_graph", caught=True,
       about="evaluation runs out while the full-train-set loss keeps its graph"),
    _e("oom_retry_smaller_in_except", "oom", oom_kind="pinned_by_exception", caught=True,
       about="a recursive halve-and-retry inside except: the failed attempt's frames pin the memory"),
    _e("oom_previous_outputs", "oom", holder="scores", oom_kind="previous_outputs", caught=True,
       about="scoring without no_grad(): the previous batch's outputs alive during the next forward"),
    _e("oom_orphaned_optimizer", "oom", holder="optimizer", oom_kind="orphaned_optimizer", caught=True,
       about="a deleted model's Adam still alive when the next candidate is built"),
    # -- a cycle through autograd ------------------------------------------------------------------------
    _e("grad_assign_create_graph", "leak", "backward", ".grad", fix="set `.grad = None`",
       about="w.grad = w.grad + autograd.grad(..., create_graph=True) every step"),
    # -- classic shapes written differently --------------------------------------------------------------
    _e("dict_of_lists_history", "leak", "optimizer", "history", fix="`history`",
       about="a Keras-style history dict of lists, validation logits kept with their graphs"),
    _e("defaultdict_by_class", "leak", "module", "by_class",
       about="embeddings grouped by predicted class in a defaultdict(list), with their graph"),
    # backward() frees the saved tensors of each map's graph: what stays is the maps themselves
    _e("self_history_in_forward", "leak", "optimizer", "history", kind="device_accumulation",
       about="a module appending its attention maps to self.history inside forward()"),
    _e("closure_collector", "leak", "module", "seen",
       about="a collector function appending logits to a list in its closure"),
    _e("nonlocal_running_total", "leak", "module", "total", kind="graph_chain", fix=".item()",
       about="a nested function adding each loss tensor to a nonlocal total"),
    _e("global_feature_bank", "leak", "module", "FEATURE_BANK",
       about="a module-level dict of features by sample id, with their graph"),
    _e("ema_center_no_grad_missing", "leak", "optimizer", "center", kind="graph_chain",
       about="a DINO-style EMA centre updated without no_grad()"),
    _e("memory_bank_cat", "leak", "optimizer", "bank", kind="growing_tensor",
       about="a memory bank grown with torch.cat and never truncated"),
    _e("string_key_cache", "leak", "module", "response_cache", kind="cache",
       about="a response cache keyed by an 'epoch-batch' string that never repeats"),
    # -- controls: must stay quiet -----------------------------------------------------------------------
    _e("control_capped_dict_cache", "quiet", "module", about="a dict cache capped at 8, evicting the oldest"),
    _e("control_lru_positional", "quiet", "module", about="positional encodings in lru_cache(maxsize=4)"),
    _e("control_deque_recent", "quiet", "optimizer", about="the last 5 detached outputs, deque(maxlen=5)"),
    _e("control_bucketed_shapes", "quiet", "optimizer", about="lengths padded to 3 buckets: a cache plateau"),
    _e("control_grad_accumulation", "quiet", "optimizer", about="4 micro-batches per AdamW step"),
    _e("control_running_sums", "quiet", "module", about="running sums with .item(), a detached EMA"),
    _e("control_predictions_as_numbers", "quiet", "module", about="predictions kept as .tolist() numbers"),
    _e("control_metric_reset_each_epoch", "quiet", "module",
       about="torchmetrics MulticlassAccuracy reset after every epoch"),
    _e("control_warmup_once", "quiet", "optimizer", about="a lazily built table and AdamW state, once"),
    _e("control_replay_buffer", "quiet", "optimizer", about="a replay buffer: fills to 10, overwrites"),
    _e("control_inference_mode_decode", "quiet", about="decoding under inference_mode(), token ids kept"),
)  # fmt: skip

BY_NAME = {s.name: s for s in CORPUS_SCENARIOS}

#: What torchmem says instead, per (scenario name, device): the tests mark these xfail(strict=True). Filled
#: from real runs (the CPU column measured; the CUDA column is filled after a GPU run).
KNOWN_WRONG: dict[tuple[str, str], str] = {
    # Other threads' births are counted from Python 3.12 (threading.setprofile_all_threads); before it the
    # run names the queue but not the producer's line.
    **(
        {
            ("producer_thread_queue", "cpu"): (
                "Python < 3.12: the leak and holder are found (device_accumulation, "
                "`__main__.prefetch.queue[2]`) but the site is unknown (site None, sites ['?']): a running "
                "thread cannot be followed"
            )
        }
        if sys.version_info < (3, 12)
        else {}
    ),
}


#: Verdicts that come out right on some runs and wrong on others of the same code (non-strict xfails on
#: that device). Empty since the host watcher of a GPU run keeps the readings a short run's verdict needs
#: (session 14): `host_log_dicts`, `host_anomaly_mode_losses` and `host_profiler_left_on`, found too late on
#: some H100 runs before, were right on the two H100 corpus runs after it.
FLAKY: dict[tuple[str, str], str] = {}


def for_device(device: str) -> list[Expected]:
    """The corpus entries that run on ``device`` (``"cpu"`` or ``"cuda"``)."""
    return [s for s in CORPUS_SCENARIOS if device in s.devices]


def leaks(device: str) -> list[Expected]:
    """The entries that must be reported as a problem (leaks of every kind and OOMs)."""
    return [s for s in for_device(device) if s.verdict not in ("quiet", "no_loop", "inner_growth")]


__all__ = ["BY_NAME", "CORPUS", "CORPUS_SCENARIOS", "FLAKY", "KNOWN_WRONG", "for_device", "leaks"]
