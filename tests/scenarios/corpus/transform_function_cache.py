"""A data-transform function called for every sample: it normalises an image batch and, "for debugging",
appends each normalised batch to a module-level list it never clears. Nothing else runs: no model, no
optimizer, so there is no step boundary, only the function called again and again.

Expected: leak on the timeline (per second), held by `_debug_batches`.
"""

import time

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
MEAN = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
_debug_batches = []


def normalize(images: torch.Tensor) -> torch.Tensor:
    out = (images.float() / 255 - MEAN) / STD  # SITE
    _debug_batches.append(out)  # meant to be inspected once, never cleared
    return out


checksum = 0.0
start = time.perf_counter()
while time.perf_counter() - start < 2.0:
    raw = torch.randint(0, 256, (8, 3, 64, 64), dtype=torch.uint8, device=device)
    checksum += normalize(raw).mean().item()
    time.sleep(0.02)
print("checksum", round(checksum, 3))
