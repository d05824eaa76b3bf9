"""``torchmem.holders()``: who keeps an object alive, as referrer paths a person can read.

A holder path starts at a root a person knows and follows references down to the target::

    __main__.trainer.optimizer.state[<Parameter 'fc1.weight' (4096, 1024) float32>]['exp_avg']
    train.py:42 in step(), local 'batch'
    sys.last_traceback -> frame train.py:42 in f(), local 'x'
    __main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)
    Out[7]

Each step of a path has a kind (:class:`~torchmem.results.holders.StepKind`: attribute, item, closure cell,
hook, grad_fn, saved tensor, frame local, module global, traceback, ...), so that code can ask what a path
goes through without reading its text. The package, by idea:

- :mod:`.find`: ``holders()`` and ``find_holders()``, their argument checks;
- :mod:`.roots`: where paths start (module globals, live frames of every thread, exceptions, IPython's
  output history, classes; ``gc-orphan`` and ``cycle`` where nothing nameable holds an object);
- :mod:`.index`: one sorted snapshot of every gc-visible reference, to find referrers fast;
- :mod:`.autograd`: references gc cannot see (``.grad``, ``._base``, tensors saved for backward);
- :mod:`.search`: the backward search from the targets up to the roots and the ranking of the paths;
- :mod:`.naming`: each reference named as a typed step (``.cache``, ``['k3']``, `` -> closure 'acts'``);
- :mod:`.survivors`: the holder paths of tensor storages (what survives a release, what a leak keeps).

The result types (:class:`HolderPath`, :class:`HolderPaths`, :class:`HolderSearch`, :class:`HolderStep`,
:class:`StepKind`) live in :mod:`torchmem.results.holders` and are re-exported here.

Cost: about 0.45 s at a million live gc-tracked objects (2 cores), plus ~30 bytes of temporary memory per
reference while the search runs; the garbage collector is paused meanwhile and restored after. Python's
own tools run untouched: the caller's torch function and dispatch modes do not see the search's tensors.

Limits: objects frozen with ``gc.freeze()`` are not in the snapshot (only the root namespaces' references
are added back); holders that keep an object only on a C stack or in C state show as ``gc-orphan``;
reading autograd's saved tensors runs any ``saved_tensors_hooks`` unpack hook.
"""

from __future__ import annotations

from torchmem.analysis.holders.find import HoldersTargetError, find_holders, holders
from torchmem.analysis.holders.survivors import holder_paths_of_storages, holders_of_storages
from torchmem.results.holders import HolderPath, HolderPaths, HolderSearch, HolderStep, StepKind

__all__ = [
    "HolderPath",
    "HolderPaths",
    "HolderSearch",
    "HolderStep",
    "HoldersTargetError",
    "StepKind",
    "find_holders",
    "holder_paths_of_storages",
    "holders",
    "holders_of_storages",
]
