"""A prefetching thread fills a queue with augmented batches while the main thread trains on its own fixed
batch: the consumer side was removed in a refactor, so nothing drains the queue and every batch the
producer makes stays alive.

Expected: leak at the optimizer step, born in the producer thread's augmentation, held by `prefetch`.
"""

import queue
import threading

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
prefetch: queue.Queue = queue.Queue()
step_done = threading.Semaphore(0)
stop = threading.Event()


def producer() -> None:
    while not stop.is_set():
        if not step_done.acquire(timeout=0.1):
            continue
        batch = torch.randn(256, 1024, device=device) * 0.5 + 0.1  # SITE
        prefetch.put(batch)


threading.Thread(target=producer, daemon=True).start()
model = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(64, 1024, device=device)
for _step in range(60):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step_done.release()  # one augmented batch per step is prefetched
stop.set()
print("queued batches nobody took:", prefetch.qsize())
