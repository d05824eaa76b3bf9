"""The rule pages ``torchmem lint --explain CODE`` prints (docs/lint/TMnnn.md holds the same text; a test
keeps them equal). Kept in the package as strings so that ``--explain`` works from an installed wheel."""

from __future__ import annotations

PAGES: dict[str, str] = {
    "TM001": """# TM001 graph-accumulated

A tensor that carries its autograd graph is kept across the iterations of a training loop: added to a
running total (`total += loss`, `total = total + loss`, `h = torch.cat([h, loss[None]])`), appended to a
list (`losses.append(loss)`), stored under a changing key (`history[step] = out`), in a container reached
through a subscript or an attribute (`metrics["loss"].append(loss)`, a `defaultdict`, `self.losses`,
`stats.setdefault("loss", [])`), or by a helper of the same file that the loop calls (`accumulate(loss)`
whose body does `nonlocal total; total = total + value`, a method that does `self.running += value`, a
`self.training_step(batch)` that runs backward and keeps its own loss in `self.losses`).

## Why

`loss` is not a number: it is the root of the graph that produced it. What keeping it costs depends on
whether a backward ran through that graph, and the message says which shape it found:

- **after `backward()`** (the usual case: the loss, or an output whose loss was backwarded): backward
  frees the graph's saved activations, so the device memory of the step is released. What stays is the
  graph's autograd nodes on the host (tens of KB per step; `total += loss` chains every step's nodes to
  the last) plus the kept tensor itself (a scalar for a loss; for a model output, its size on the device,
  every step). Host memory creeps up over a long run, and the device tensors grow with the outputs kept.
- **no backward through it** (a forward whose result never reaches a backward): each kept value holds
  its forward's whole graph with every saved activation on the device, a forward's activation memory per
  step: out of memory within an epoch (the evaluation form of this is TM010).

This is the first entry of the PyTorch FAQ on memory.

## Wrong

```python
total = 0.0
losses = []
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss            # TM001
    losses.append(loss)      # TM001
```

## Right

```python
total = 0.0
losses = []
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss.item()             # a Python float
    losses.append(loss.detach())     # a tensor without the graph
```

## When it does not fire

The value is `.item()`, `.detach()`, `.tolist()`, `float(...)`, `.cpu().numpy()` or made under
`torch.no_grad()`; it comes from a function of the same file that runs under `@torch.no_grad()` or returns
numbers (`train_step(...)` returning `loss.item()`), or from a model made from a class of the same file whose
`forward` returns only numbers or arrays (`np.argmax(...)`); the container or total is reset inside the loop
(`total = 0`, `losses.clear()`); the value is stored on one iteration only (under `if (i + 1) == n:` or `if i
== 0:`, a test of the loop's counter for equality); an entry is replaced by its own conversion (`out[k] =
out[k].float()` in `for k in out:`, every loop keeping the container changing the key: nothing is added); the
accumulated value is itself what `.backward()` runs on (gradient accumulation); the loop has no `.backward()`
and no optimizer `.step()`; the value's origin is unknown to the local data flow (a call to a function of
another file that is not a model or a loss, a class call, `get_model(...)`, `compute_loss_scale(...)`: names
that make or describe, not compute, are not taken for a forward or a loss; of `a, b, c = criterion(...)` only
the first element is taken for the loss; a field read from what a loss function returned,
`losses.intermediate_losses`, is no tensor's attribute: its type is unknown; a name rebound after its
`.backward()` to what an unknown call returns is no longer that tensor); the file imports another framework
(MXNet, TensorFlow, JAX, ...) and nothing of torch's world (its `autograd` and `backward()` are that
framework's); the receiver of `.add(...)`/`.append(...)` is a name an import binds (`from labml import
tracker`: `tracker.add({"loss": loss})` is that package's logging API, not a container).

Shown by default: the "backward-ran" form, and the "output-kept" form when the container outlives an
optimizer step. Outputs kept by a list made afresh for each step (its micro-batches, "output-in-step"),
a loss total made afresh by the loop that steps the optimizer and added to over that step's micro-batches,
or made afresh by each call of a function that steps no optimizer and that a loop of the file calling it
steps after each call ("backward-in-step": one step's autograd nodes, released at the next step), a list
or total made afresh before a loop whose iterations each step their own optimizer (the members of an
ensemble, `for critic, opt in zip(critics, optimizers):`, or `opts[i].step()` with `i` the loop's target)
and neither returned nor stored by the function (one value per member, for one call: "output-in-step" or
"backward-in-step") and graphs no backward is seen to run through ("no-backward") are reported by
`torchmem lint --all`.

Suppress one line with `# noqa: TM001`.
""",
    "TM002": """# TM002 eval-without-no-grad

An evaluation loop (in a function named like `evaluate`, `validate`, `test`, `predict`, `generate`,
`inference`, or after `model.eval()`) calls the model with autograd recording.

## Why

`model.eval()` changes how dropout and batch norm behave; it does not turn autograd off. Without
`torch.no_grad()` (or `torch.inference_mode()`) every forward records its graph and keeps the activations
a backward would need until its output is dropped: each evaluation step peaks at about training's
activation memory, several times what the same forward needs under `no_grad`, and runs slower. Nothing
grows from step to step unless the outputs are kept (`preds.append(out)`: TM010, which then holds every
batch's activations).

## Wrong

```python
import torch

def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:          # TM002
        out = model(x)
        correct += (out.argmax(1) == y).sum().item()
    return correct
```

## Right

```python
import torch

@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        out = model(x)
        correct += (out.argmax(1) == y).sum().item()
    return correct
```

(`with torch.no_grad():` or `with torch.inference_mode():` around the loop works as well.)

A loop that also runs an adversarial attack (`adversary.perturb(x, y)`, `attack.generate(x)`, a
`torchattacks` attack called on the batch, or such a call one level down in a method of the same class
that the loop calls, in a file that imports an attack library: advertorch, torchattacks, foolbox, ART,
cleverhans, autoattack, DeepRobust) needs autograd for the attack, which backwards a loss to
its input: the finding says so, and its fix is `no_grad` around the model's calls inside the loop instead.

## When it does not fire

The function (or a caller in the same file) uses `torch.no_grad()`, `torch.inference_mode()` or
`torch.set_grad_enabled(...)`; the function calls `.backward()` or an optimizer step (it trains, e.g.
test-time adaptation) or takes `torch.autograd.grad` of what it computes (influence functions; a bare
`grad(...)` imported from `torch.autograd` counts), or hands the model an input it made require grad
(`x.requires_grad_()`, `requires_grad=True`: a force field's forward takes the forces as `-dE/dx`, a
saliency map); the loop is in a module's `forward` or in a method of its
class that `forward` runs (part of a forward pass, whose graph the caller's loss uses); the model is not
called inside a loop; the loop calls something other than the model put in eval mode (a
function of the same file such as a `@torch.no_grad()` `validate_network(...)`, a parameterless helper
module, `get_model(...)` or `accelerator.prepare_model(...)`, which make or wrap a model); the call
picks a branch of the model's `forward` that runs under `no_grad` (`model(data, mode="inference")` on a
class imported from the project, whose `forward` has `if mode == "inference": with torch.no_grad(): ...`:
the class's file is read from beside the checked file or a folder above it); only a part of the
model is put in eval() mode (`model.module.patch_embed.eval()` to freeze a stem's BatchNorm; the model a
wrapper holds, `model.module.eval()`, is the model); the loop trains through a loss scaler
(`loss_scaler(loss, optimizer, ...)`); the loop is under a context that may turn autograd off
(`with torch.no_grad() if not requires_grad else nullcontext():`); the file
imports nothing of torch's world (torch, lightning, transformers, accelerate, ...); another file of the
project imports the function (for a method, its class) and calls it under `no_grad` (a `@torch.no_grad()`
entry point: smoothquant's `get_act_scales`, ipex-llm's `PPL.perplexity`); framework hooks such
as Lightning's `validation_step` (run under no_grad by the framework); test functions (`test*`) in test
files (`test_*.py`, `*_test.py`), in both forms. When the loop also keeps its outputs, TM010 is reported
instead (the outputs' activations grow).

Suppress with `# noqa: TM002` on the loop's line.
""",
    "TM003": """# TM003 empty-cache-in-loop

`torch.cuda.empty_cache()` runs on every step of a training loop.

## Why

`empty_cache()` frees nothing your program holds. It returns the caching allocator's *unused* blocks to
the driver, and the next step, which needs the same amount of memory, has to get them back with
`cudaMalloc`, which is slow and synchronises the device. The loop becomes slower and its peak memory does
not change. A real leak (a tensor kept by a list, a graph kept by a total) is untouched by it. Its one
use is to give memory back to *other* processes, or to reduce fragmentation after an out-of-memory error.

## Wrong

```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.empty_cache()     # TM003
```

## Right

```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
torch.cuda.empty_cache()         # once, if another process needs the memory now
```

If memory grows step after step, find what holds it (`torchmem run train.py`) instead.

## When it does not fire

Outside a loop, in a loop that does not train itself (once per epoch), under an `if` inside the loop (a
periodic call), or in an `except` handler (recovery after an out-of-memory error). It does fire, outside
any loop, in the `training_step` of a class derived from a framework's (an HF `Trainer`, a
`LightningModule`): the framework calls it on every step, as a loop would (not under an `if` or in an
`except` there either). Shown by default (the
"optimizer-step" form) when the loop steps an optimizer and neither the model it calls nor that optimizer is
built inside it; a loop over a zoo of models (each of another size), a sweep that makes a model and its
optimizer per configuration, or one with only a backward is reported by `torchmem lint --all`.

Suppress with `# noqa: TM003`.
""",
    "TM004": """# TM004 retain-graph-in-loop

`backward(retain_graph=True)` is the last backward of a loop iteration.

## Why

`retain_graph=True` keeps the graph's saved tensors after the backward. That is needed when a *second*
backward in the same step runs through the same graph (two losses sharing a trunk). On the last backward
of the step it only keeps the step's activations alive longer, and it is most often added to silence
"Trying to backward through the graph a second time", which means the graph reaches into the previous
iteration (an RNN hidden state that is not detached). Then every iteration's graph stays alive and memory
grows until out-of-memory.

## Wrong

```python
hidden = model.init_hidden(batch_size)
for x, y in loader:
    out, hidden = model(x, hidden)
    loss = criterion(out, y)
    loss.backward(retain_graph=True)     # TM004
    optimizer.step()
```

## Right

```python
hidden = model.init_hidden(batch_size)
for x, y in loader:
    hidden = hidden.detach()             # truncate the graph at the step boundary
    out, hidden = model(x, hidden)
    loss = criterion(out, y)
    loss.backward()
    optimizer.step()
```

## When it does not fire

A later backward in the same iteration runs without `retain_graph=True` (the graph is freed there);
`create_graph=True` (higher-order gradients, done on purpose); the flag is a variable; no loop; nothing
carried from one iteration to the next reaches what the backward runs on (a loop's own target rebound in
place, `output = output.reshape(-1)`, is bound afresh each iteration: a Jacobian built row by row with
`retain_graph=True` over one graph is not flagged; state an inner loop updates from a value bound afresh at
the top of the iteration, `hidden = features` then `for w in weights: hidden = f(hidden, w)`, is the inner
loop's, not carried by the loop around it; a state whose update is a NumPy call, `r = np.float32(r + dr)`, is
an array and carries no graph; `h = h` carries nothing new; a name bound afresh earlier in the same `if` arm,
`buf = buffer.get_data(n)` then `buf = buf.long()`, is this iteration's value); the only carried name is one
the loop calls as a model (`model = DDP(model)` in the epoch loop: a module, whose parameters are leaves); the
file imports another framework (MXNet, TensorFlow, JAX, ...) and nothing of torch's world.

Suppress with `# noqa: TM004`.
""",
    "TM005": """# TM005 cuda-in-data-worker

A `Dataset.__getitem__` (or `__iter__`), a `collate_fn` or a `worker_init_fn` moves data to CUDA
(`.cuda()`, `.to('cuda')`, `device='cuda'`, or a module-level `device` that is CUDA).

## Why

With `num_workers > 0` these functions run in DataLoader worker processes. Workers are forked on Linux by
default, and CUDA cannot be initialised in a forked child: the first CUDA call fails with "Cannot
re-initialize CUDA in forked subprocess". With the spawn start method each worker creates its own CUDA
context (hundreds of MiB of device memory per worker) and hands tensors back through CUDA IPC, which keeps
them alive in the worker until the main process frees them. With `num_workers=0` it works, but the copy
happens synchronously, one sample at a time.

## Wrong

```python
class Images(torch.utils.data.Dataset):
    def __getitem__(self, i):
        x = load_image(self.files[i])
        return x.cuda()                  # TM005

def collate(batch):
    return torch.stack(batch).to("cuda") # TM005
```

## Right

```python
class Images(torch.utils.data.Dataset):
    def __getitem__(self, i):
        return load_image(self.files[i])  # a CPU tensor

loader = DataLoader(Images(files), batch_size=64, num_workers=8, pin_memory=True)
for x in loader:
    x = x.to(device, non_blocking=True)   # one copy per batch, in the main process
```

## When it does not fire

The device is a variable the linter cannot resolve (`self.device`), the class's bases do not end in
`Dataset`, or the function is not passed as `collate_fn=`/`worker_init_fn=` and not named like one.

Suppress with `# noqa: TM005`.
""",
    "TM006": """# TM006 load-without-map-location

`torch.load(...)` without `map_location` in a file that sets a device per rank (`LOCAL_RANK`,
`torch.cuda.set_device`, `init_process_group`).

## Why

`torch.load` puts each tensor back on the device it was saved from. A checkpoint saved by rank 0 holds
`cuda:0` tensors, so without `map_location` *every* rank loads the full checkpoint onto GPU 0: GPU 0 runs
out of memory (or carries N copies) while the other ranks' GPUs stay empty, and the memory stays
allocated in the caching allocator until the process ends.

## Wrong

```python
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
state = torch.load("checkpoint.pt")                           # TM006
model.load_state_dict(state["model"])
```

## Right

```python
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
state = torch.load("checkpoint.pt", map_location="cpu")       # or f"cuda:{local_rank}"
model.load_state_dict(state["model"])
```

## When it does not fire

`map_location` is given (by keyword, as the second argument, or through `**kwargs`), or the file has no
sign of per-rank devices.

Suppress with `# noqa: TM006`.
""",
    "TM007": """# TM007 tensor-logged

Inside a training loop, a tensor that carries its autograd graph is given to a meter that keeps a
running sum: `meter.update(loss)` where the meter's class in the same file adds what it is given into an
attribute (`self.sum += val * n`), or, when its class is not in the file, a receiver named like a meter
(`loss_meter`, `avg_loss`, `AverageMeter()` instances).

## Why

The classic `AverageMeter` does `self.sum += val * n`, so `meter.update(loss)` makes `meter.sum` a graph
that chains every step's graph to the last (TM001's shape, inside the meter). After `backward()` the
saved activations are freed, but the autograd nodes (tens of KB per step) stay on the host for the
whole epoch, and the meter's `avg` is a tensor with a graph instead of a number.

## Wrong

```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    losses_meter.update(loss, x.size(0))       # TM007
```

## Right

```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    losses_meter.update(loss.item(), x.size(0))
```

## When it does not fire

Trackers that convert what they are given at once keep no graph and are not flagged: `wandb.log`,
`accelerator.log` (accelerate's trackers run `listify`, which does `.detach().cpu()`),
`SummaryWriter.add_scalar(s)` (`make_np`), `mlflow.log_metric` (`float(...)`), a logger's
`log_metrics`, Lightning's `self.log(...)`; `print` and `logging`. Also: a meter class of the same file
whose `update` keeps nothing of its argument; values that are `.item()`, `.detach()`, `float(...)`, from
a `@torch.no_grad()` function of the file (nanoGPT's `estimate_loss`), or of unknown origin (among them
a loss rebound after its `.backward()` to what a helper of another file returns: `[loss] =
reduce_to_floats([loss])`); calls outside a training loop or under `no_grad`.

Suppress with `# noqa: TM007`.
""",
    "TM008": """# TM008 zero-grad-keeps-buffers

`optimizer.zero_grad(set_to_none=False)` (or `model.zero_grad(set_to_none=False)`).

## Why

Setting gradients to `None` frees the gradient buffers between the optimizer step and the next backward,
so the forward pass (where activation memory peaks) runs without a full copy of the parameters' size
held in `.grad`. `set_to_none=False` keeps them allocated and also spends a kernel per parameter
writing zeros. Since torch 2.0 `set_to_none=True` is the default.

## Wrong

```python
optimizer.zero_grad(set_to_none=False)   # TM008
```

## Right

```python
optimizer.zero_grad()                    # set_to_none=True by default
```

## When it does not fire

The file captures CUDA graphs (`torch.cuda.graph`, `CUDAGraph`, `make_graphed_callables`: captured
kernels need the gradient buffers to stay at the same address) or adds into `.grad` in place
(`p.grad += g`, `p.grad.add_(...)`), which needs the buffers to exist.

Suppress with `# noqa: TM008`.
""",
    "TM009": """# TM009 fork-with-cuda-dataset

A `DataLoader` with `num_workers > 0` and the 'fork' start method (set with `set_start_method('fork')`,
`multiprocessing_context='fork'`, or the default on Linux) is given a dataset that holds CUDA tensors
(`TensorDataset(x.cuda(), ...)`, or a dataset class whose `__init__` moves data to CUDA).

## Why

The workers are forked from a process that has initialised CUDA, and indexing the dataset in a worker
touches those CUDA tensors: the worker fails with "Cannot re-initialize CUDA in forked subprocess". With
the spawn start method it works but every worker creates a CUDA context of its own (hundreds of MiB of
device memory each) to read tensors that were on the GPU already.

A parent that has initialised CUDA but whose workers only read CPU data is fine, which is why this rule
looks at the dataset and not only at the order of the calls (the runtime check of `torchmem run` watches
the workers themselves).

## Wrong

```python
x = torch.randn(10_000, 128).cuda()
y = torch.randint(0, 10, (10_000,)).cuda()
loader = DataLoader(TensorDataset(x, y), batch_size=64, num_workers=4)   # TM009
```

## Right

```python
x = torch.randn(10_000, 128)
y = torch.randint(0, 10, (10_000,))
loader = DataLoader(TensorDataset(x, y), batch_size=64, num_workers=4, pin_memory=True)
for xb, yb in loader:
    xb, yb = xb.to("cuda", non_blocking=True), yb.to("cuda", non_blocking=True)
```

(Or, when the data fits on the GPU already, index it directly with `num_workers=0`.)

## When it does not fire

`num_workers` is absent or 0, the start method is not fork (`set_start_method('spawn')`,
`multiprocessing_context='spawn'`), or the dataset's origin is unknown to the local data flow.

Suppress with `# noqa: TM009`.
""",
    "TM010": """# TM010 eval-outputs-kept

A loop runs the model with autograd on, never calls backward, and keeps what it computes across its
iterations (`preds.append(model(x))`, `total += criterion(model(x), y)`, `results[i] = out`): an
evaluation or prediction loop without `torch.no_grad()`, wherever it is written: in a function named like
`evaluate`, after `model.eval()`, or in the same function or script as the training loop.

## Why

Without `no_grad` every forward records its graph, and the graph keeps every activation a backward would
need. A kept output keeps its graph, so each batch's activations stay on the device: memory grows by a
forward's activation memory per batch (tens of MiB to GiB), and evaluation runs out of memory partway
through the validation set, often with a batch size that training handled. This is the device-scale leak;
a kept training loss after `backward()` (TM001) keeps only host-side autograd nodes.

## Wrong

```python
import torch

def evaluate(model, loader):
    model.eval()
    preds = []
    for x, _ in loader:
        preds.append(model(x))      # TM010
    return torch.cat(preds)
```

## Right

```python
import torch

@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    preds = []
    for x, _ in loader:
        preds.append(model(x))
    return torch.cat(preds)
```

(`with torch.no_grad():` or `torch.inference_mode()` around the loop, or keeping `out.detach()`, works
as well.)

## When it does not fire

The loop trains (a backward or an optimizer step in it: TM001's business); it runs under `no_grad`,
`inference_mode` or `set_grad_enabled(<a variable>)`, or in a function a caller of the file runs under
`no_grad`; the kept values reach a backward or `torch.autograd.grad` later in the function (their gradients
are used); the function is a module's `forward` (its caller backwards what it returns); the loop carries state
through the model (`out, h = model(x, h)`, or a state read in the iteration before it is rebound from the
step's output: a step-by-step decode, one forward spread over steps, whose kept outputs add nothing the
carried state does not keep); the key of `results[key] = out` is the same on every iteration (one slot,
overwritten); an entry is replaced by its own conversion (`out[k] = out[k].float()` in
`for k in out.keys():`, or by torch's function of itself, `pred[ix] = torch.clamp(pred[ix], min=0.0)` in
`for ix, ... in enumerate(...)`, every loop that keeps the container changing the key: one step's output
converted in place, nothing added); the model is made from a class of the same file whose `forward` returns
only numbers or arrays
(`return np.argmax(pred)`: no graph leaves the call); there is no sign that the loop evaluates (no `.eval()`,
no training in the same function, not named like evaluation; a `test_*` function of a pytest file is a test);
framework hooks (`validation_step`).

Shown by default when the loop (or a loop around it that does not train) calls a model whose last
`train()`/`eval()` before the call is `eval()` (the "eval-mode" form), or a model whose outputs a backward
of the same function or script runs through (the "trained-model" form: its parameters require grad);
when only the function's name says it evaluates, or the model is trained nowhere in sight (a teacher, a
pretrained encoder), it is reported by `torchmem lint --all`.

Suppress with `# noqa: TM010`.
""",
    "TM011": """# TM011 exception-kept

An exception caught inside a loop is kept in a container that outlives the iteration
(`errors.append(e)`, `failures.append((i, e))`, `failed[i] = e`, `problems.append(sys.exc_info())`).

## Why

An exception object holds its `__traceback__`, the traceback holds the frames the exception passed
through, and each frame holds its local variables: the batch, the activations of a half-finished forward,
a partial autograd graph. Keeping the exception keeps all of it, for every failed iteration. An
out-of-memory error caught and stored this way keeps exactly the tensors that filled the device, so the
next iteration fails too.

## Wrong

```python
import torch

errors = []
for x, y in loader:
    try:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    except torch.cuda.OutOfMemoryError as e:
        errors.append(e)             # TM011
```

## Right

```python
import torch

errors = []
for x, y in loader:
    try:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    except torch.cuda.OutOfMemoryError as e:
        errors.append(str(e))        # the text, not the frames
```

(`traceback.format_exc()` keeps the whole traceback as text.)

## When it does not fire

What is kept is text (`str(e)`, `repr(e)`, `traceback.format_exc()`); the exception is only bound to a
name (`last_error = e`: one exception at a time); the container is reset inside the loop; the code is not
inside a loop; the file imports nothing of torch's world.

Shown by default (the "model-frames" form) when the `try` runs a model forward or a backward, whose
frames hold the batch and the activations; an exception of a comparison or a parse is reported by
`torchmem lint --all`.

Suppress with `# noqa: TM011`.
""",
    "TM012": """# TM012 hook-in-loop

A module hook (`register_forward_hook`, `register_forward_pre_hook`, `register_full_backward_hook`,
`register_module_forward_hook`, ...) is registered on every iteration of a loop that trains or calls the
model, and no handle is ever removed.

## Why

Each call adds one more hook to the module; the earlier ones stay until their handle is removed. After
N steps every forward runs N hooks: each step is slower than the last, and whatever the hooks keep (the
outputs a closure appends, the tensors it captures) grows with them, often with the graph attached.

## Wrong

```python
last = {}

def keep_last(module, inputs, output):
    last["layer4"] = output.detach()

for x, y in loader:
    model.layer4.register_forward_hook(keep_last)     # TM012
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
```

## Right

```python
last = {}

def keep_last(module, inputs, output):
    last["layer4"] = output.detach()

model.layer4.register_forward_hook(keep_last)         # once
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
```

(Or keep the handle and call `handle.remove()` when the step is done with it.)

## When it does not fire

The registration is under an `if` or an `except` inside the loop (once, or now and then); the function
removes a handle somewhere (`handle.remove()`); the loop only walks modules (`for m in model.modules():`)
and neither trains nor calls the model; tensor hooks (`t.register_hook`), which die with their tensor.

Suppress with `# noqa: TM012`.
""",
    "TM013": """# TM013 forward-keeps-tensors

A module's `forward` adds a tensor it computed to an attribute of the module on every call:
`self.history.append(out)`, `self.outputs[name] = x`, `self.total = self.total + x.mean()`. The same holds
for the per-step methods a training framework calls with autograd on, in a class with a base: Lightning's
and HF Trainer's `training_step`, HF Trainer's `compute_loss` (`self.kept_logits.append(outputs.logits)`);
not `validation_step`, which Lightning runs under `no_grad`.

## Why

`forward` runs once per step. What it appends to `self` stays as long as the module, and a tensor
computed in `forward` carries the step's graph: its saved activations on the device until a backward runs
through it, its autograd nodes on the host after. The module grows every step, in training and in
evaluation, and nothing in the training loop shows it.

## Wrong

```python
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
        self.outputs = []

    def forward(self, x):
        out = self.fc(x)
        self.outputs.append(out)      # TM013
        return out
```

## Right

```python
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
        self.last_output = None

    def forward(self, x):
        out = self.fc(x)
        self.last_output = out.detach()   # one tensor, no graph
        return out
```

## When it does not fire

The value is detached or computed under `no_grad`; a method of the class other than `__init__` resets or
clears the attribute (`self.outputs = []`, `self.cache.clear()`, or resets a tensor in place:
`self.count.zero_()`, `.fill_(0)`, `.copy_(...)`; the class manages its own buffer, a KV cache reset per
sequence, a metric's counters); the attribute is rebound, not added to (`self.last = out`: one step's graph at
a time), or written at a key that is the same on every call (`self.heads[self.index - 1] = out`: one
slot: `--all`) or into a slice of a tensor (`self.cache_v[:b, pos : pos + n] = v`: a copy into a
preallocated KV cache, never reported); the file imports nothing of torch's world.

Shown by default (the "grows" form) only when the class has a base (a module), the value is computed in
`forward` (a submodule's output, a tensor op; not an input kept or `.clone()`d as it came), the store grows
on every call (`append`, `+=`, a key made from `len(...)`; not a slice written in place) and no code of
the file empties the attribute (`model.attn.maps.clear()` in the training loop); the other shapes are
reported by `torchmem lint --all`.

Suppress with `# noqa: TM013`.
""",
}
