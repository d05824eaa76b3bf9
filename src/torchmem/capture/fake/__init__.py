"""Device-free estimates: the model runs under fake tensors and a byte ledger counts every tensor it makes.

``torchmem.estimate(..., target="H100-80GB")`` lands here (:func:`estimate_fake`). The model is built (a
factory is called) or mirrored (a real model's parameters become fake tensors of the same shapes and
dtypes, without copying a byte) under ``FakeTensorMode``, and a training step (forward + loss, backward,
optimizer step) and an inference forward run on it. Nothing is allocated: each op computes only its
outputs' shapes. A dispatch mode above the fake mode counts each new storage once, at the caching
allocator's block size for CUDA (512-byte multiples), and uncounts it when it dies, so the figures per
phase are the live tensor bytes a real device would hold — parameters, gradients, optimizer state,
activations saved for backward and the temporaries of each op. The fake run is a CPU run; for a GPU
target it takes that GPU's kernel choices where they hold different tensors (fused attention, fused
dropout, the transformer fast paths' temporaries, cuDNN's recurrent layers, composite ops' temporaries
under ``inference_mode``, foreach optimizers). What the tensors do not show (the CUDA context and
libraries, the cuBLAS workspaces, fragmentation, NCCL, sharding) comes from
:mod:`torchmem.analysis.targets`.

Where ``FakeTensorMode`` (a private torch API) cannot be imported, the same run happens on the ``meta``
device, which computes shapes the same way.

Cost: no device and no tensor data; a 7B-parameter decoder at sequence 512 takes about a second per fake
training step on a laptop CPU. An op without a fake (meta) kernel or with a data-dependent output
(``nonzero``, ``.item()``) stops the run with :class:`FakeTensorError`, which names the op and the
alternative: the measured :func:`torchmem.estimate` on a device.

The package, by idea:

- :mod:`.options`: ``estimate()``'s parameters, written once (:class:`EstimateArgs`), for the measured and
  the device-free path;
- :mod:`.step`: what both paths share: a model called on a batch, :func:`default_loss`, the optimizer;
- :mod:`.ledger`: the fake mode, the byte ledger and the counting mode, bytes saved for backward,
  :class:`FakeTensorError`;
- :mod:`.plan`: a fake run's settings and results, the model's fake twin, its repeated blocks,
  checkpointing;
- :mod:`.kernels`: the target GPU's kernel choices (attention, dropout, fused transformer paths, cuDNN's
  recurrent layers, foreach optimizers), stood in while a GPU target's fake run is on;
- :mod:`.sharding`: FSDP2 on a fake process group, and the figures for one rank of any sharding;
- :mod:`.run`: the fake run itself: inference (and a generate call's KV cache), then training steps;
- :mod:`.suggest`: what would make it fit, and the largest batch size that does;
- :mod:`.estimate`: :func:`estimate_fake`, from the arguments to the verdict.
"""

from __future__ import annotations

from torchmem.capture.fake.estimate import estimate_fake
from torchmem.capture.fake.ledger import FakeTensorError
from torchmem.capture.fake.options import EstimateArgs
from torchmem.capture.fake.step import default_loss

__all__ = ["EstimateArgs", "FakeTensorError", "default_loss", "estimate_fake"]
