"""Agreement across ``torch.distributed`` ranks for the batch-size search: ``all_reduce(MIN)``.

Every trial's outcome and every next size are reduced to their minimum over the default process group, so
all ranks run the same sizes and return the same answer. Outside torch.distributed (or with
``distributed=False``) :meth:`RankAgreement.min` is the identity. Each agreement is one collective call of
a few int64 values (on the CUDA device under NCCL, else on the CPU).
"""

from __future__ import annotations

import torch

from torchmem.analysis.estimate import FitArgumentError


class RankAgreement:
    """``all_reduce(MIN)`` over the default process group, or the identity outside torch.distributed."""

    def __init__(self, enabled: bool | None, device: torch.device) -> None:
        self.world = 1
        self.rank = 0
        self.device = torch.device("cpu")  # where the agreement tensor lives
        dist = getattr(torch, "distributed", None)
        initialised = dist is not None and dist.is_available() and dist.is_initialized()
        if enabled and not initialised:
            raise FitArgumentError(
                "distributed=True but torch.distributed has no initialised process group.",
                "Call torch.distributed.init_process_group() first, or leave distributed=None.",
            )
        self.active = bool(initialised) if enabled is None else bool(enabled and initialised)
        if self.active and dist is not None:
            self.world = int(dist.get_world_size())
            self.rank = int(dist.get_rank())
            if str(dist.get_backend()).lower() == "nccl":
                self.device = device if device.type == "cuda" else torch.device("cuda", 0)

    def min(self, *values: int) -> list[int]:
        """Each value's minimum over all ranks (the values themselves outside torch.distributed)."""
        if not self.active:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        out = [int(v) for v in t.tolist()]
        del t
        return out


__all__ = ["RankAgreement"]
