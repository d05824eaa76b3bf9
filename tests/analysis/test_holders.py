"""``holders()`` / ``find_holders()``: every kind of holder, named by the exact path a person reads.

Real objects only: real modules, frames, threads, tracebacks, optimizers and autograd graphs.
"""

from __future__ import annotations

import gc
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from torchmem.analysis.holders import HolderPath, HolderSearch, find_holders, holders

MOD = __name__
THIS = sys.modules[__name__]
FILE = "test_holders.py"


def here() -> int:
    """The line number of the caller's current line."""
    return sys._getframe(1).f_lineno


def texts(paths: list[HolderPath]) -> list[str]:
    return [str(p) for p in paths]


@pytest.fixture
def put(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Any], None]:
    """Set a global of this test module for one test."""

    def put(name: str, value: Any) -> None:
        monkeypatch.setattr(THIS, name, value, raising=False)

    return put


# -- module globals, containers, attributes -------------------------------------------------------------
def test_module_global(put: Callable[[str, Any], None]) -> None:
    put("WEIGHTS", torch.zeros(3))
    paths = holders(THIS.WEIGHTS)
    assert texts(paths) == [f"{MOD}.WEIGHTS"]
    assert paths[0].root == "module"
    assert paths[0].steps == (MOD, ".WEIGHTS")
    assert paths[0].depth == 1


def test_nested_containers_and_readable_keys(put: Callable[[str, Any], None]) -> None:
    key = torch.zeros(2, 3)
    put("KEY", key)
    put("NESTED", {"a": [0, {"k": (torch.zeros(2),)}], key: torch.ones(1), 7: {torch.ones(4): "v"}})
    del key
    # (paths are computed outside `assert`: pytest keeps an assert's operands in hidden frame locals)
    deep = texts(holders(THIS.NESTED["a"][1]["k"][0]))
    by_tensor_key = texts(holders(THIS.NESTED[THIS.KEY]))
    as_key = texts(holders(next(iter(THIS.NESTED[7]))))
    assert deep == [f"{MOD}.NESTED['a'][1]['k'][0]"]
    assert by_tensor_key == [f"{MOD}.NESTED[<Tensor (2, 3) float32>]"]
    assert as_key == [f"{MOD}.NESTED[7] key <Tensor (4,) float32>"]


class Box:
    pass


class Slotted:
    __slots__ = ("__hidden", "a")

    def __init__(self, a: object, hidden: object) -> None:
        self.a = a
        self.__hidden = hidden


def test_object_attributes_and_slots(put: Callable[[str, Any], None]) -> None:
    box = Box()
    box.inner = Box()  # type: ignore[attr-defined]
    box.inner.t = torch.zeros(2)  # type: ignore[attr-defined]
    put("BOX", box)
    put("SLOTTED", Slotted(torch.zeros(3), torch.zeros(4)))
    del box
    attr = texts(holders(THIS.BOX.inner.t))
    slot = texts(holders(THIS.SLOTTED.a))
    mangled = texts(holders(THIS.SLOTTED._Slotted__hidden))
    assert attr == [f"{MOD}.BOX.inner.t"]
    assert slot == [f"{MOD}.SLOTTED.a"]
    assert mangled == [f"{MOD}.SLOTTED.__hidden"]


def test_class_attribute(put: Callable[[str, Any], None]) -> None:
    class Registry:
        cache: ClassVar[dict[str, torch.Tensor]] = {"w": torch.zeros(2)}

    paths = holders(Registry.cache["w"])
    assert f"{MOD}.test_class_attribute.<locals>.Registry.cache['w']" in texts(paths)
    assert {p.root for p in paths} == {"class"}


# -- functions: closures, defaults, generators ----------------------------------------------------------
def _make_closure(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    captured = t

    def fn() -> torch.Tensor:
        return captured

    return fn


def _with_defaults(x: torch.Tensor = torch.zeros(6), *, y: torch.Tensor = torch.zeros(7)) -> None:  # noqa: B008
    pass


def test_closure_cell(put: Callable[[str, Any], None]) -> None:
    put("FN", _make_closure(torch.zeros(5)))
    got = texts(holders(THIS.FN.__closure__[0].cell_contents))
    assert got == [f"{MOD}.FN -> closure 'captured'"]


def test_defaults_and_kwdefaults() -> None:
    positional = texts(holders(_with_defaults.__defaults__[0]))  # type: ignore[index]
    keyword_only = texts(holders(_with_defaults.__kwdefaults__["y"]))  # type: ignore[index]
    assert positional == [f"{MOD}._with_defaults -> default of 'x'"]
    assert keyword_only == [f"{MOD}._with_defaults -> default of 'y'"]


def _suspended() -> Iterator[int]:
    kept = torch.zeros(3)
    yield kept.numel()
    yield 0


def test_suspended_generator_local(put: Callable[[str, Any], None]) -> None:
    gen = _suspended()
    next(gen)
    put("GEN", gen)
    line = gen.gi_frame.f_lineno
    kept = gen.gi_frame.f_locals["kept"]
    paths = texts(holders(kept))
    del kept
    assert f"{MOD}.GEN -> suspended generator {FILE}:{line} in _suspended(), local 'kept'" in paths


# -- frames ------------------------------------------------------------------------------------------
def test_frame_local_of_this_thread() -> None:
    x = torch.zeros(3)
    box = [0, {"t": x}]
    paths, now = holders(x), here()
    # The function, its file and the variable: never the line the frame is at now (where it waits).
    assert texts(paths) == [
        f"test_frame_local_of_this_thread() in {FILE}, local 'x'",
        f"test_frame_local_of_this_thread() in {FILE}, local 'box'[1]['t']",
    ]
    assert not [p for p in texts(paths) if f":{now}" in p]
    assert {p.root for p in paths} == {"frame"}
    assert [s.name for s in paths[0].typed_steps] == [f"test_frame_local_of_this_thread() in {FILE}", "x"]
    del box


def test_frame_local_of_another_thread() -> None:
    ready, stop = threading.Event(), threading.Event()
    found: list[Any] = []

    def worker() -> None:
        batch = torch.zeros(9)
        found.append(weakref.ref(batch))
        found.append(sys._getframe().f_lineno + 2)
        ready.set()
        stop.wait()

    th = threading.Thread(target=worker, name="loader")
    th.start()
    try:
        assert ready.wait(10)
        paths = holders(found[0]())
    finally:
        stop.set()
        th.join()
    assert texts(paths) == [f"thread 'loader': worker() in {FILE}, local 'batch'"]
    assert paths[0].root == "thread"


# -- exceptions and tracebacks -------------------------------------------------------------------------
def _fail(refs: list[Any]) -> None:
    x = torch.zeros(10)
    refs.append(weakref.ref(x))
    refs.append(sys._getframe().f_lineno + 1)
    raise ValueError("boom")


@pytest.fixture
def restore_sys_last() -> Iterator[None]:
    names = ("last_type", "last_value", "last_traceback", "last_exc")
    saved = {n: getattr(sys, n) for n in names if hasattr(sys, n)}
    yield
    for n in names:
        if n in saved:
            setattr(sys, n, saved[n])
        elif hasattr(sys, n):
            delattr(sys, n)


def test_sys_last_traceback(restore_sys_last: None) -> None:
    refs: list[Any] = []
    try:
        _fail(refs)
    except ValueError as e:
        # what the interpreter does with an uncaught exception (sys.excepthook's caller)
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
        if sys.version_info >= (3, 12):
            sys.last_exc = e
    line = refs[1]
    paths = holders(refs[0]())
    frame = f"frame {FILE}:{line} in _fail(), local 'x'"
    assert paths[0].root == "traceback"
    assert str(paths[0]) == f"sys.last_traceback -> {frame}"
    assert f"sys.last_value.__traceback__ -> {frame}" in texts(paths)
    assert {p.root for p in paths} == {"traceback", "exception"}


def test_stored_exception_traceback(put: Callable[[str, Any], None]) -> None:
    refs: list[Any] = []
    try:
        _fail(refs)
    except ValueError as e:
        put("ERR", e)
    paths = holders(refs[0]())
    assert texts(paths) == [f"{MOD}.ERR.__traceback__ -> frame {FILE}:{refs[1]} in _fail(), local 'x'"]


def test_exception_being_handled() -> None:
    refs: list[Any] = []
    try:
        _fail(refs)
    except ValueError:
        paths = holders(refs[0]())
    assert texts(paths) == [
        f"sys.exc_info()[1].__traceback__ -> frame {FILE}:{refs[1]} in _fail(), local 'x'"
    ]
    assert paths[0].root == "exception"


# -- IPython output history ----------------------------------------------------------------------------
@pytest.fixture
def ipython_namespace(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A user namespace laid out the way IPython lays out ``__main__`` (IPython is not installed)."""
    mod = types.ModuleType("__ipython_user_main__")
    ns = mod.__dict__
    out: dict[int, Any] = {}
    ns.update({"In": ["", "model", "x * 2"], "Out": out, "_oh": out, "_ih": ns, "get_ipython": lambda: None})
    monkeypatch.setitem(sys.modules, "__ipython_user_main__", mod)
    return ns


def test_ipython_output_history(ipython_namespace: dict[str, Any]) -> None:
    ns = ipython_namespace
    t, older = torch.zeros(2), torch.ones(2)
    ns["Out"][7] = t
    ns["_7"] = ns["_"] = t
    ns["Out"][6] = ns["__"] = ns["_6"] = older
    ns["result"] = t
    paths = holders(t)
    got = texts(paths)
    for expected in ("Out[7]", "_", "_7", "__ipython_user_main__.result"):
        assert expected in got
    assert {p.root for p in paths if str(p) != "__ipython_user_main__.result"} >= {"ipython"}
    assert "__" in texts(holders(older))
    del t, older


# -- torch: optimizer state, module parameters, hooks, autograd -----------------------------------------
def test_optimizer_state(put: Callable[[str, Any], None]) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    put("MODEL", model)
    put("OPT", opt)
    del model, opt
    paths = texts(holders(THIS.OPT.state[THIS.MODEL[0].weight]["exp_avg"]))
    assert paths == [f"{MOD}.OPT.state[<Parameter '0.weight' (3, 4) float32>]['exp_avg']"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(4))
        self.norm = nn.BatchNorm1d(8)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()


def test_module_parameter_and_buffer_paths(put: Callable[[str, Any], None]) -> None:
    put("NET", Net())
    net = THIS.NET
    w = net.encoder.layers[3].fc1.weight
    assert f"{MOD}.NET.encoder.layers.3.fc1.weight" in texts(holders(w))
    assert f"{MOD}.NET.encoder.norm.running_mean" in texts(holders(net.encoder.norm.running_mean))
    del net, w


def test_optimizer_state_named_by_nested_parameter(put: Callable[[str, Any], None]) -> None:
    net = Net()
    opt = torch.optim.AdamW(net.parameters())
    net.encoder.layers[3].fc1(torch.randn(2, 4)).sum().backward()
    opt.step()
    put("NET", net)
    put("OPT", opt)
    state = opt.state[net.encoder.layers[3].fc1.weight]["exp_avg_sq"]
    del net, opt
    assert (
        f"{MOD}.OPT.state[<Parameter 'encoder.layers.3.fc1.weight' (8, 4) float32>]['exp_avg_sq']"
        in texts(holders(state))
    )
    del state


def _caching_hook() -> tuple[Callable[..., None], Callable[[], Any]]:
    cache = None

    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        nonlocal cache
        cache = output.detach()

    return hook, lambda: cache


def test_forward_hook_closure(put: Callable[[str, Any], None]) -> None:
    model = nn.Linear(4, 2)
    hook, read = _caching_hook()
    handle = model.register_forward_hook(hook)
    model(torch.randn(3, 4))
    put("HOOKED", model)
    del hook, model
    paths = texts(holders(read()))
    assert f"{MOD}.HOOKED._forward_hooks[{handle.id}] -> closure 'cache'" in paths
    handle.remove()


def _train_step(model: nn.Sequential, losses: list[torch.Tensor]) -> torch.Tensor:
    h = torch.relu(model[0](torch.randn(2, 4)))
    loss = model[1](h).sum()
    losses.append(loss)
    return h


def test_tensor_held_by_autograd(put: Callable[[str, Any], None]) -> None:
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 1))
    put("LOSSES", [])
    h = _train_step(model, THIS.LOSSES)
    paths = texts(holders(h))
    assert f"{MOD}.LOSSES[0].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)" in paths
    assert f"{MOD}.LOSSES[0].grad_fn -> saved tensor of ReluBackward0 (_saved_result)" in paths
    # Once the Python object is gone, a probe on the same storage still finds the graph.
    storage = h.untyped_storage()
    del h
    probe = torch.empty(0).set_(storage)
    paths = texts(holders(probe))
    assert f"{MOD}.LOSSES[0].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1, shares storage)" in paths
    del probe, storage


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        doubled = a * 2
        ctx.save_for_backward(doubled)
        ctx.extra = doubled + 1
        return doubled * 3

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def test_custom_autograd_function_saves(put: Callable[[str, Any], None]) -> None:
    x = torch.ones(3, requires_grad=True)
    put("CUSTOM_LOSS", _Scale.apply(x * 1).sum())
    saved = texts(holders(THIS.CUSTOM_LOSS.grad_fn.next_functions[0][0].saved_tensors[0]))
    extra = texts(holders(THIS.CUSTOM_LOSS.grad_fn.next_functions[0][0].extra))
    assert saved == [f"{MOD}.CUSTOM_LOSS.grad_fn -> saved tensor of _ScaleBackward (saved_tensors[0])"]
    assert f"{MOD}.CUSTOM_LOSS.grad_fn -> _ScaleBackward ctx.extra" in extra


def test_gradient_is_named_through_its_parameter(put: Callable[[str, Any], None]) -> None:
    model = nn.Linear(3, 2)
    model(torch.randn(1, 3)).sum().backward()
    put("GRADDED", model)
    del model
    assert f"{MOD}.GRADDED.weight.grad" in texts(holders(THIS.GRADDED.weight.grad))


def _node_hook(kept: torch.Tensor) -> Callable[..., None]:
    def hook(grad_inputs: Any, grad_outputs: Any) -> None:
        assert kept is not None

    return hook


def test_held_outside_python_is_a_gc_orphan() -> None:
    # A hook on an autograd node is kept by the C++ node only: no Python object refers to it.
    x = torch.ones(2, requires_grad=True)
    y = (x * 2).sum()
    ref: list[Any] = []
    target = torch.zeros(3)
    ref.append(weakref.ref(target))
    assert y.grad_fn is not None
    y.grad_fn.register_hook(_node_hook(target))
    del target
    paths = holders(ref[0]())
    assert [p.root for p in paths] == ["gc-orphan"], texts(paths)
    assert str(paths[0]).endswith(" -> closure 'kept'")
    del y, x


# -- termination, limits, hygiene ----------------------------------------------------------------------
class Node:
    def __init__(self) -> None:
        self.next: Any = None
        self.t: Any = None


def test_reference_cycles_terminate(put: Callable[[str, Any], None]) -> None:
    ring = [Node() for _ in range(5)]
    for a, b in zip(ring, ring[1:] + ring[:1]):
        a.next = b
    ring[2].t = torch.zeros(2)
    put("RING", ring[0])
    target = ring[2].t
    del ring, a, b
    search = find_holders([target])
    assert not search.truncated
    assert f"{MOD}.RING.next.next.t" in texts(list(search.paths[0]))

    # A cycle nothing reaches: garbage the next collection frees.
    was = gc.isenabled()
    gc.disable()
    try:
        a, b = Node(), Node()
        a.next, b.next = b, a
        b.t = torch.zeros(3)
        garbage = weakref.ref(b.t)
        del a, b
        paths = holders(garbage())
    finally:
        if was:
            gc.enable()
    assert [p.root for p in paths] == ["cycle"], texts(paths)
    assert str(paths[0]) in ("<reference cycle through Node>.t", "<reference cycle through Node>.next.t")
    gc.collect()
    assert garbage() is None


def test_target_is_not_kept_alive() -> None:
    x = torch.zeros(1000)
    ref = weakref.ref(x)
    box = {"x": x}
    search = find_holders([x])
    assert search.paths[0]
    del x, box
    alive = ref() is not None
    assert not alive
    del search


def test_nothing_is_left_behind_with_gc_off() -> None:
    x = torch.zeros(1)
    find_holders([x])
    was = gc.isenabled()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for _ in range(3):
            find_holders([x])
        grown = len(gc.get_objects()) - before
    finally:
        if was:
            gc.enable()
    assert grown <= 5  # no reference cycles made per call (they would pile up while gc is off)


def test_a_python_tracer_keeps_the_locals_of_its_frames() -> None:
    # A trace function runs between CPython's copy of a frame's locals into f_locals and the copy back:
    # a snapshot emptied in between would delete the frame's locals.
    seen: list[list[str]] = []

    def traced() -> int:
        x = torch.zeros(2)
        y = 1
        return x.numel() + y

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_code is traced.__code__ and "x" in frame.f_locals and not seen:
            seen.append(texts(holders(frame.f_locals["x"])))
        return tracer

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        n = traced()
    finally:
        sys.settrace(old)
    assert n == 3
    assert seen and f"traced() in {FILE}, local 'x'" in seen[0]


def test_gc_state_is_restored() -> None:
    x = torch.zeros(1)
    assert gc.isenabled()
    holders(x)
    assert gc.isenabled()
    gc.disable()
    try:
        holders(x)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_several_targets_share_one_search(put: Callable[[str, Any], None]) -> None:
    put("TRIO", {"a": torch.zeros(1), "b": torch.zeros(2), "c": torch.zeros(3)})
    got = holders(THIS.TRIO["a"], THIS.TRIO["b"], THIS.TRIO["c"])
    assert [texts(ps) for ps in got] == [[f"{MOD}.TRIO['a']"], [f"{MOD}.TRIO['b']"], [f"{MOD}.TRIO['c']"]]
    search = find_holders([THIS.TRIO["a"], THIS.TRIO["a"]])
    assert search.paths[0] == search.paths[1]


def test_limits_are_reported(put: Callable[[str, Any], None]) -> None:
    t = torch.zeros(1)
    put("MANY", [[t] for _ in range(6)])
    search = find_holders([t], max_paths=2)
    assert len(search.paths[0]) == 2
    assert search.truncated
    assert search.reason is not None and "max_paths" in search.reason
    quick = find_holders([t], time_limit=1e-9)
    assert quick.truncated
    assert quick.reason is not None and "time_limit" in quick.reason
    with pytest.raises(ValueError):
        find_holders([t], max_paths=0)
    del t


def _helper_that_searches(x: torch.Tensor) -> list[HolderPath]:
    return holders(x)


def test_the_search_does_not_report_itself(put: Callable[[str, Any], None]) -> None:
    t = torch.zeros(2)
    put("SEEN", t)
    got = texts(_helper_that_searches(t))
    assert not [p for p in got if "holders.py" in p and FILE not in p]
    assert not [p for p in got if "find_holders() in" in p or " holders() in" in p or "run() in" in p]
    assert set(got) == {
        f"_helper_that_searches() in {FILE}, local 'x'",
        f"test_the_search_does_not_report_itself() in {FILE}, local 't'",
        f"{MOD}.SEEN",
    }
    mods = ("find", "search", "roots", "index", "autograd", "naming", "survivors")
    own = [x for m in mods for x in (f"{m}.py:", f" in {m}.py")]
    assert not [p for p in got if any(m in p for m in own)]  # the package's modules, by file name
    # What the caller excludes is not a holder either.
    box = [t]
    put("BOXED", box)
    assert f"{MOD}.BOXED[0]" not in texts(list(find_holders([t], exclude=[box]).paths[0]))
    del t, box


def test_torch_modes_of_the_caller_are_left_alone() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    x = torch.zeros(2)
    with Count():
        first = texts(holders(x))
    assert Count.ops == 0
    with torch.device("meta"):
        second = texts(holders(x))
    frame = f"test_torch_modes_of_the_caller_are_left_alone() in {FILE}, local 'x'"
    assert (first, second) == ([frame], [frame])


def test_result_objects_render_and_serialise() -> None:
    x = torch.zeros(2)
    search = find_holders([x, 3.5j])
    assert isinstance(search, HolderSearch)
    p = search.paths[0][0]
    d = p.to_dict()
    assert {k: d[k] for k in ("root", "path", "steps", "depth")} == {
        "root": "frame",
        "path": str(p),
        "steps": list(p.steps),
        "depth": 1,
    }
    assert [s["kind"] for s in d["typed_steps"]] == ["root", "frame_local"]
    assert HolderPath.from_dict(d) == p and HolderSearch.from_dict(search.to_dict()) == search
    d = search.to_dict()
    assert d["paths"][0][0]["path"] == str(p) and d["truncated"] is search.truncated
    text = str(search)
    assert text.startswith("holders of 2 objects (")
    assert f"[0] {p}" in text
    assert "[1] no holder found" in text or "[1] " in text
    assert find_holders([]).paths == ()


# -- issue 10: values everything holds, and readable printing ---------------------------------------------
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "None is a singleton"),
        (True, "True is a singleton"),
        (False, "False is a singleton"),
        (..., "Ellipsis is a singleton"),
        (NotImplemented, "NotImplemented is a singleton"),
        (0, "small ints (-5 to 256) are cached"),
        (256, "every 256 in the program is this same object"),
        (-5, "small ints"),
        ((), "the empty tuple"),
        ("", "the empty string"),
        ("a", "one-character strings are cached"),
        (b"", "bytes objects are cached"),
    ],
)
def test_values_the_whole_interpreter_shares_are_refused_with_a_reason(value: object, why: str) -> None:
    from torchmem import TorchmemError
    from torchmem.analysis.holders import HoldersTargetError

    with pytest.raises(HoldersTargetError) as info:
        holders(value)
    err = info.value
    assert isinstance(err, TorchmemError) and isinstance(err, ValueError)
    assert err.message.startswith(f"holders() cannot explain {value!r}: ")
    assert why in err.message and "arbitrary" in err.message
    assert "a tensor, module, optimizer or container" in err.hint
    with pytest.raises(HoldersTargetError, match=r"\(argument 2\)"):
        holders(torch.zeros(1), value)
    with pytest.raises(HoldersTargetError, match=r"find_holders\(\) .*\(targets\[0\]\)"):
        find_holders([value])


def test_values_that_are_not_shared_are_still_searched(put: Callable[[str, Any], None]) -> None:
    put("BIG", 10**40)
    put("WORD", "a long string nobody else holds " * 3)
    put("PAIR", (torch.zeros(1), 1))
    assert f"{MOD}.BIG" in texts(holders(THIS.BIG))
    assert f"{MOD}.WORD" in texts(holders(THIS.WORD))
    assert f"{MOD}.PAIR" in texts(holders(THIS.PAIR))


def test_printing_the_result_shows_readable_paths(
    put: Callable[[str, Any], None], capsys: pytest.CaptureFixture[str]
) -> None:
    from torchmem.analysis.holders import HolderPaths

    put("LOSSES", [torch.zeros(2)])
    put("ALIAS", {"again": THIS.LOSSES[0]})
    paths = holders(THIS.LOSSES[0])
    assert isinstance(paths, list) and isinstance(paths, HolderPaths)
    assert texts(paths) == [f"{MOD}.ALIAS['again']", f"{MOD}.LOSSES[0]"] or texts(paths) == [
        f"{MOD}.LOSSES[0]",
        f"{MOD}.ALIAS['again']",
    ]
    assert paths[0] in paths and paths == list(paths) and len(paths[:1]) == 1
    # The interactive repr reads like the README: the paths, in brackets, no dataclass fields.
    assert repr(paths) == "[" + ", ".join(texts(paths)) + "]"
    assert repr(paths[0]) == str(paths[0]) and "HolderPath(" not in repr(paths)
    # print(): one path per line.
    print(paths)
    assert capsys.readouterr().out == "\n".join(texts(paths)) + "\n"
    # Several objects: one readable list each.
    both = holders(THIS.LOSSES[0], THIS.ALIAS)
    assert isinstance(both, list) and all(isinstance(p, list) for p in both)
    assert repr(both) == f"[{paths!r}, [{MOD}.ALIAS]]"
    assert str(HolderPaths()) == "no holders found" and repr(HolderPaths()) == "[]"


def test_a_dict_another_thread_changes_meanwhile_still_names_the_holder(
    put: Callable[[str, Any], None],
) -> None:
    # A data loader, a producer thread or pytest's own I/O thread changes dicts while the search reads them:
    # naming a key must read a copy, or the search fails ("dictionary changed size during iteration") and
    # says "no holders found" for a tensor a global plainly holds.
    big: dict[Any, Any] = {i: i for i in range(20_000)}
    big["t"] = torch.zeros(2)
    put("BIG", big)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            big[-1 - i % 7] = 0
            big.pop(-1 - (i + 3) % 7, None)
            i += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    th = threading.Thread(target=churn, daemon=True)
    th.start()
    try:
        found = [texts(holders(THIS.BIG["t"])) for _ in range(4)]
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(interval)
    assert all(f"{__name__}.BIG['t']" in f for f in found), found


class _LazyImporter:
    """Cyclic garbage whose finalizer registers a module (a library's lazy import, a finalizer that logs) and
    leaves the next collection one more of itself: collections keep running other code while the search
    reads ``sys.modules``."""

    left = 0
    added: ClassVar[list[str]] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        name = f"_torchmem_test_lazy_{len(_LazyImporter.added)}"
        sys.modules[name] = types.ModuleType(name)
        _LazyImporter.added.append(name)
        if _LazyImporter.left > 0:
            _LazyImporter.left -= 1
            _LazyImporter()


def test_a_collection_whose_finalizers_import_while_the_roots_are_read_still_names_the_holder(
    put: Callable[[str, Any], None],
) -> None:
    # On Python 3.11 an allocation can run a collection, and its finalizers other Python code (a thread
    # switch too), in the middle of `list(sys.modules.items())`: "dictionary changed size during iteration",
    # and "no holders found" for a tensor a global holds (CI at `d36b584`). The roots and names are read
    # from copies that `dict.copy` takes without running any other code, with collections off.
    put("LAZY_KEPT", [torch.zeros(2)])
    old = gc.get_threshold()
    found = []
    try:
        for _ in range(3):
            gc.collect()
            _LazyImporter.left = 200
            _LazyImporter()
            gc.set_threshold(5)
            try:
                found.append(texts(holders(THIS.LAZY_KEPT[0])))
            finally:
                gc.set_threshold(*old)
            _LazyImporter.left = 0
            gc.collect()
    finally:
        gc.set_threshold(*old)
        for name in _LazyImporter.added:
            sys.modules.pop(name, None)
        _LazyImporter.added.clear()
    assert all(f"{__name__}.LAZY_KEPT[0]" in f for f in found), found


def test_a_failed_search_is_logged_with_where_it_broke(
    put: Callable[[str, Any], None], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torchmem.analysis.holders.index import HeapIndex

    def refuse(self: Any, ids: Any, fan_in: int) -> Any:
        raise RuntimeError("refused")

    put("KEPT_ONE", {"k": torch.zeros(2)})
    monkeypatch.setattr(HeapIndex, "referrers", refuse)
    with caplog.at_level("WARNING", logger="torchmem"):
        search = find_holders([THIS.KEPT_ONE["k"]])
    assert search.truncated and search.reason == "error: RuntimeError"
    assert "the search failed at test_holders.py:" in caplog.text and "in refuse()" in caplog.text
