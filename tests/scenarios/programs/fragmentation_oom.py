"""CUDA only: a serving loop keeps per-request buffers of 2 MiB and frees every other one as requests finish,
leaving the cache full of 2 MiB holes; a long request then needs one large buffer, which no hole can hold and
the (deliberately small) memory budget cannot add: a fragmentation out-of-memory error. The program catches
it and retries in chunks that fit the holes.

Expected: an OOM diagnosed as fragmentation, caught, raised at the large allocation.
"""

import sys

import torch

if not torch.cuda.is_available():
    print("this scenario needs CUDA: the CPU has no caching allocator to fragment")
    sys.exit(0)

device = torch.device("cuda")
total = torch.cuda.get_device_properties(device).total_memory
torch.cuda.set_per_process_memory_fraction((1 << 30) / total)  # a 1 GiB slice of the GPU

MiB = 1 << 20
active = {}
for request in range(480):
    active[request] = torch.empty(2 * MiB // 4, device=device)  # 2 MiB of state per request
for request in range(0, 480, 2):
    del active[request]  # finished requests: every other buffer is freed

try:
    long_prompt = torch.empty(96 * MiB // 4, device=device)  # SITE
except torch.OutOfMemoryError as err:
    print("long request:", str(err).split(". ")[0][:100], "- retrying in chunks")
    torch.cuda.empty_cache()
    long_prompt = [torch.empty(2 * MiB // 4, device=device) for _ in range(48)]  # chunks fit the holes
    print("long request served in", len(long_prompt), "chunks")
print("active requests:", len(active))
