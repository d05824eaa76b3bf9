"""Three multiprocessing workers (the spawn start method) that train; worker 2 is killed mid-run. Then a
fourth (forked: no second start-up) that trains until the program stops it with ``terminate()`` (SIGTERM)."""

import os
import signal
import sys
import time

import torch
import torch.multiprocessing as mp


def work(index: int) -> None:
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(15):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        if index == 2 and i == 5:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def endless(trained) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(100_000):
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        if i == 5:
            trained.set()
        time.sleep(0.005)


if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1] if len(sys.argv) > 1 else "spawn")
    procs = [ctx.Process(target=work, args=(k,)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    print("exit codes", [p.exitcode for p in procs])
    fork = mp.get_context("fork")
    trained = fork.Event()
    last = fork.Process(target=endless, args=(trained,))
    last.start()
    trained.wait(60)
    last.terminate()
    last.join()
    print("terminated", last.exitcode)
