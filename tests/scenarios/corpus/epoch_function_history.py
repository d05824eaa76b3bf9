"""K-means written as an epoch function: each call assigns points to centroids and updates them, and
returns the new centroids together with the full distance matrix "for plotting"; the driver keeps every
epoch's result. Only tensor code runs (no nn.Module, no optimizer): the steps are the function's calls.

Expected: leak on the timeline (per second), held by `history`.
"""

import time

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
points = torch.randn(4096, 16, device=device)


def kmeans_epoch(centroids: torch.Tensor) -> dict:
    dists = torch.cdist(points, centroids)  # SITE
    assign = dists.argmin(1)
    new = torch.stack([points[assign == k].mean(0) for k in range(centroids.shape[0])])
    return {"centroids": new, "dists": dists}


history = []
centroids = points[:64].clone()
start = time.perf_counter()
while time.perf_counter() - start < 2.0:
    result = kmeans_epoch(centroids)
    centroids = result["centroids"].nan_to_num()
    history.append(result)
    time.sleep(0.02)
print(len(history), "epochs")
