"""``torchmem run`` and ``torchmem demo`` end to end on the CPU: through main(argv) and a real subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchmem
from torchmem.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")

LEAKY = textwrap.dedent(
    """
    import sys, torch
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 16):
        loss = model(torch.randn(512, 256)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
        kept.append(model(torch.randn(512, 256)))  # LEAK: outputs kept with their graphs
    print("trained", sys.argv[1:])
    """
)


def _records(path: Path) -> list[dict[str, object]]:
    lines = path.read_text().splitlines()
    return [json.loads(x) for x in lines[1:]]


def _write(tmp_path: Path, name: str, code: str) -> Path:
    p = tmp_path / name
    p.write_text(code)
    return p


def test_run_monitors_a_script_and_names_its_leak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "train.py", LEAKY)
    cap = tmp_path / "cap.jsonl"
    code = main(["run", "-o", str(cap), "--no-status", str(script), "16"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "trained ['16']" in out  # the script's argv and stdout are its own
    assert (
        "LEAK on cpu" in err and "retained_graph" in err and "train.py:9" in err and "__main__.kept[" in err
    )
    recs = _records(cap)
    kinds = [r["type"] for r in recs]
    assert kinds.count("step") == 16
    assert "sample" in kinds and kinds[-1] == "end"
    end = recs[-1]
    assert end["exit_code"] == 0 and end["reason"] == "exit" and end["steps"] == 16
    leak = [r for r in recs if r["type"] == "leak"][-1]["report"]
    assert leak["leaking"] and leak["culprits"][0]["site"] == "train.py:9"  # type: ignore[index]


def test_exit_codes_are_passed_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "exit3.py", "import sys\nprint('bye')\nsys.exit(3)\n")
    assert main(["run", "-q", "-o", str(tmp_path / "c.jsonl"), str(script)]) == 3
    assert _records(tmp_path / "c.jsonl")[-1]["exit_code"] == 3
    failing = _write(tmp_path, "boom.py", "def f():\n    raise ValueError('boom')\nf()\n")
    assert main(["run", "-q", "-o", str(tmp_path / "d.jsonl"), str(failing)]) == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err and 'boom.py", line 3' in err
    assert "runpy" not in err and "torchmem/cli" not in err  # the traceback Python would print
    assert _records(tmp_path / "d.jsonl")[-1]["reason"] == "exception"


def test_missing_script_and_unwritable_capture_fail_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    assert "Script not found" in capsys.readouterr().err
    marker = tmp_path / "ran"
    script = _write(tmp_path, "s.py", f"open({str(marker)!r}, 'w').close()\n")
    assert main(["run", "-o", str(tmp_path / "missing-dir" / "c.jsonl"), str(script)]) != 0
    assert not marker.exists()  # the program never started
    assert main(["run", "--html", str(tmp_path / "missing-dir" / "r.html"), str(script)]) == 3
    assert not marker.exists()
    assert main(["run"]) == 2


def test_cpu_oom_is_explained_and_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(
        tmp_path,
        "oom.py",
        textwrap.dedent(
            """
            import torch, torchmem
            torchmem.limit(8 << 20, "cpu")
            held = [torch.ones(1 << 20) for _ in range(4)]   # 16 MiB > 8 MiB
            """
        ),
    )
    cap = tmp_path / "oom.jsonl"
    try:
        code = main(["run", "-o", str(cap), "--no-status", str(script)])
    finally:
        torchmem.limit(None, "cpu")  # the script's cap outlives it in this process (a real run exits)
    err = capsys.readouterr().err
    assert code == 1
    assert "OutOfMemoryError" in err
    recs = _records(cap)
    assert recs[-1]["reason"] == "oom"
    assert any(r["type"] == "oom" for r in recs)


def test_module_form_and_dataloader_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            if __name__ == "__main__":
                ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
                model = torch.nn.Linear(8, 1)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for x, y in DataLoader(ds, batch_size=8, num_workers=2):
                    (model(x) - y).square().mean().backward(); opt.step(); opt.zero_grad()
                print("workers ok")
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        code = main(["run", "-q", "--no-status", "-o", str(tmp_path / "m.jsonl"), "-m", "mypkg.train"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mypkg", None)
        sys.modules.pop("mypkg.train", None)
    assert code == 0
    assert "workers ok" in capsys.readouterr().out
    recs = _records(tmp_path / "m.jsonl")
    assert recs[-1]["steps"] == 8
    assert len({r["type"] for r in recs}) >= 4  # one writer, no lines from the forked workers


def test_step_marker_counts_a_function(tmp_path: Path) -> None:
    script = _write(
        tmp_path,
        "infer.py",
        "import torch\nm = torch.nn.Linear(4, 4)\ndef predict():\n    return m(torch.ones(2, 4))\n"
        "for _ in range(5):\n    predict()\n",
    )
    assert (
        main(
            [
                "run",
                "-q",
                "--no-status",
                "--step-marker",
                "predict",
                "-o",
                str(tmp_path / "s.jsonl"),
                str(script),
            ]
        )
        == 0
    )
    assert _records(tmp_path / "s.jsonl")[-1]["steps"] == 5


def test_run_in_a_real_subprocess_passes_the_exit_code_and_leaves_stdout_alone(tmp_path: Path) -> None:
    script = _write(tmp_path, "s.py", "import sys\nprint('hello from the script')\nsys.exit(7)\n")
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "-o", str(tmp_path / "c.jsonl"), str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 7
    assert out.stdout == "hello from the script\n"
    assert "torchmem: 0 steps" in out.stderr


def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--steps", "16", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0
    assert "LEAK" in err and "flat: no leak" in err
    assert "val_losses" in err and "train.py:" in err and "loss.item()" in err
    leaky = _records(tmp_path / "leaky.jsonl")
    assert [r for r in leaky if r["type"] == "leak"][-1]["report"]["leaking"]  # type: ignore[index]
    fixed = _records(tmp_path / "fixed.jsonl")
    assert not [r for r in fixed if r["type"] == "leak"][-1]["report"]["leaking"]  # type: ignore[index]


def test_modules_profile_is_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(
        tmp_path,
        "mlp.py",
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
            opt = torch.optim.Adam(model.parameters())
            for _ in range(4):
                model(torch.randn(32, 64)).square().mean().backward(); opt.step(); opt.zero_grad()
            """
        ),
    )
    cap = tmp_path / "mod.jsonl"
    assert main(["run", "-q", "--no-status", "--modules", "-o", str(cap), str(script)]) == 0
    mods = [r for r in _records(cap) if r["type"] == "modules"]
    assert len(mods) == 1
    rows = {r["module"]: r for r in mods[0]["rows"]}  # type: ignore[union-attr]
    assert rows["0"]["params"] == (64 * 128 + 128) * 4
    assert rows["0"]["optimizer_state"] >= 2 * (64 * 128 + 128) * 4  # Adam's two moments
    assert main(["report", str(cap)]) == 0
    assert "0" in capsys.readouterr().out


def test_ctrl_c_in_the_program_exits_130_with_a_complete_capture(tmp_path: Path) -> None:
    script = _write(tmp_path, "ctrlc.py", "import torch\nx = torch.ones(10)\nraise KeyboardInterrupt\n")
    cap = tmp_path / "k.jsonl"
    assert main(["run", "-q", "--no-status", "-o", str(cap), str(script)]) == 130
    end = _records(cap)[-1]
    assert end["type"] == "end" and end["reason"] == "keyboard_interrupt" and end["exit_code"] == 130


def test_live_status_line_on_a_terminal_and_silence_elsewhere(tmp_path: Path) -> None:
    import io

    from torchmem.run.launcher import run_session

    script = _write(
        tmp_path,
        "slow.py",
        "import time, torch\nm = torch.nn.Linear(8, 8)\no = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "keep = []\nfor _ in range(12):\n    m(torch.ones(2, 8)).sum().backward(); o.step(); o.zero_grad()\n"
        "    keep.append(torch.ones(256 * 1024))\n    time.sleep(0.05)\n",
    )
    tty = io.StringIO()
    code, _ = run_session(str(script), [str(script)], capture=str(tmp_path / "a.jsonl"), status=True, err=tty)
    assert code == 0
    text = tty.getvalue()
    assert "\r[torchmem] step " in text and "allocated" in text and "LEAK +1.00 MiB/step" in text
    quiet = io.StringIO()  # not a terminal: no status line, only the summary
    run_session(str(script), [str(script)], capture=str(tmp_path / "b.jsonl"), err=quiet)
    assert "\r" not in quiet.getvalue()


def test_a_program_that_uses_torchmem_watch_itself_runs_under_torchmem_run(tmp_path: Path) -> None:
    script = _write(
        tmp_path,
        "own.py",
        "import torch, torchmem\nwith torchmem.watch(device='cpu', warn=False) as w:\n"
        "    for _ in range(4):\n        torch.ones(10); w.step()\nprint('own watcher', w.report().steps)\n",
    )
    assert main(["run", "-q", "--no-status", "-o", str(tmp_path / "o.jsonl"), str(script)]) == 0
    assert _records(tmp_path / "o.jsonl")[-1]["exit_code"] == 0


def test_survivors_on_demand_inside_torchmem_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The program asks, in the middle of its run, what its loop allocated and still holds: the run's own
    # record answers (no watcher of its own), with the site and the holder.
    script = _write(
        tmp_path,
        "ask.py",
        textwrap.dedent(
            """
            import torch, torchmem
            model = torch.nn.Linear(256, 256)
            kept = []
            for step in range(5):
                out = model(torch.randn(128, 256))  # born here (line 6)
                out.sum().backward()
                kept.append(out)
            rep = torchmem.survivors()
            print("ON DEMAND", rep.leaking, rep.groups[0].site, rep.groups[0].verdict)
            print(rep)
            """
        ),
    )
    assert main(["run", "--no-status", "-o", str(tmp_path / "o.jsonl"), str(script)]) == 0
    out, _ = capsys.readouterr()
    line = next(x for x in out.splitlines() if x.startswith("ON DEMAND"))
    assert line == "ON DEMAND True ask.py:6 accumulates", out
    assert "held by __main__.kept[" in out, out


def test_survivors_outside_any_recording_is_a_clear_error() -> None:
    with pytest.raises(torchmem.WatchError, match="Nothing records the loop's survivors") as e:
        torchmem.survivors()
    assert "torchmem run" in str(e.value)
    with torchmem.watch(device="cpu", warn=False) as w:  # made without survivors=True
        w.step()
        with pytest.raises(torchmem.WatchError, match="survivors=True"):
            w.survivors()
        with pytest.raises(torchmem.WatchError, match="Nothing records"):
            torchmem.survivors()


OP_HEAVY = textwrap.dedent(
    """
    import torch
    torch.set_num_threads(1)
    lin = torch.nn.Linear(8, 8)  # updated by hand: an optimizer's first use imports dynamo (0.7 s)
    for step in range(10):  # few steps: the exact accounting's first steps are a large share of the run
        x = torch.randn(4, 8)
        for _ in range(1000):  # thousands of tiny ops per step: the exact accounting's worst case
            x = torch.tanh(lin(x))
        x.sum().backward()
        with torch.no_grad():
            for p in lin.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    """
)


def test_what_torchmem_cost_is_recorded_and_said_when_large(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Steps of thousands of tiny ops are several times slower while the exact accounting records the loop's
    # first steps: the run says what torchmem's own work cost, by part, in the summary and the capture.
    cap = tmp_path / "heavy.jsonl"
    assert main(["run", "--no-status", "-o", str(cap), str(_write(tmp_path, "heavy.py", OP_HEAVY))]) == 0
    _, err = capsys.readouterr()
    over = [r for r in _records(cap) if r["type"] == "overhead"]
    assert len(over) == 1
    o = over[0]
    parts = o["parts"]
    assert isinstance(parts, dict) and set(parts) == {"steps", "sampler", "ledger"}
    assert 0 < o["own_s"] < o["wall_s"]  # type: ignore[operator]
    assert abs(sum(parts.values()) - o["own_s"]) < 1e-3  # type: ignore[operator]
    assert o["ledger_steps"] >= 2 and o["ledger_known"] is True  # type: ignore[operator]
    assert o["ratio"] == pytest.approx(o["wall_s"] / (o["wall_s"] - o["own_s"]), rel=1e-3)  # type: ignore[operator]
    assert parts["ledger"] > parts["steps"]  # the recording, not the readings, is what costs here
    assert o["ratio"] >= 1.2, o  # type: ignore[operator]
    assert "note: torchmem's own work took about" in err and "exact tensor accounting" in err, err
    read = torchmem.read_capture(str(cap))
    assert len(read.overheads) == 1 and read.overheads[0].ratio == o["ratio"]
    assert any("torchmem's own work took about" in n.text for n in read.notes)


def test_a_cheap_run_records_its_cost_without_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "cheap.jsonl"
    assert main(["run", "--no-status", "-o", str(cap), str(_write(tmp_path, "train.py", LEAKY)), "6"]) == 0
    _, err = capsys.readouterr()
    o = next(r for r in _records(cap) if r["type"] == "overhead")
    assert o["steps"] == 6 and 0 <= o["own_s"] < o["wall_s"]  # type: ignore[operator]
    if o["wall_s"] < 0.5 or o["ratio"] < 1.2:  # type: ignore[operator]
        assert "torchmem's own work" not in err


SLOW_GROWTH = """
import torch
from torch import nn

model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
hist = []
for step in range(120):
    loss = model(torch.randn(8, 16)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    hist.append(torch.randn(8192))  # 32 KiB a step: below the 256 KiB/step default
"""


def test_min_growth_reports_slow_growth_the_default_calls_below_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verdict of growth below the leak threshold tells a ``torchmem run`` user the option that reports it
    (the Lightning newcomer run of session 20 was told to pass ``min_bytes_per_step``, an API argument);
    with ``--min-growth`` the same growth is a leak, named with its holder."""
    script = _write(tmp_path, "slow.py", SLOW_GROWTH)
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script)]) == 0
    err = capsys.readouterr().err
    assert "below the leak threshold" in err and "LEAK" not in err, err
    assert "`torchmem run --min-growth 16384`" in err, err
    assert (
        main(["run", "--no-status", "--min-growth", "8KiB", "-o", str(tmp_path / "b.jsonl"), str(script)])
        == 0
    )
    err = capsys.readouterr().err
    assert "LEAK on cpu" in err and "__main__.hist[" in err, err
    leak = [r for r in _records(tmp_path / "b.jsonl") if r["type"] == "leak"][-1]["report"]
    assert leak["leaking"] and leak["min_bytes_per_step"] == 8192  # type: ignore[index]


PERIODIC_VALIDATION = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
val_x = [torch.randn(128, 64) for _ in range(4)]
val_history = []
for step in range(200):
    loss = model(torch.randn(16, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:  # validation every 10 steps, without torch.no_grad()
        val = sum(model(x).square().mean() for x in val_x) / 4
        val_history.append(val)  # keeps the 4 validation graphs (~550 KiB)
"""


def test_growth_every_10_steps_is_said_as_such_and_named_with_min_growth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A validation pass every 10 steps that keeps its graphs: the memory rises in jumps with flat steps
    between them. Not "a one-time rise" nor growth that "stopped" (what the flat readings between two jumps
    made the watcher say); below the default threshold it is said with its period and the option, and with
    ``--min-growth`` it is a leak named with its line and holder."""
    script = _write(tmp_path, "periodic.py", PERIODIC_VALIDATION)
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script)]) == 0
    err = capsys.readouterr().err
    assert "below the leak threshold" in err and "LEAK" not in err, err
    # (read every ~12 steps, the jumps come at every reading: said so, not as jumps with flat steps between)
    assert re.search(r"rises (by|at every reading,) about \d+\.\d+ KiB every (9|10|11) steps", err), err
    assert "one-time" not in err and "stopped" not in err and "--min-growth" in err, err
    assert (
        main(["run", "--no-status", "--min-growth", "16KiB", "-o", str(tmp_path / "b.jsonl"), str(script)])
        == 0
    )
    err = capsys.readouterr().err
    assert "LEAK on cpu" in err and "__main__.val_history[" in err and "periodic.py:16" in err, err
    assert "one-time" not in err and "stopped" not in err, err


def test_min_growth_takes_a_positive_size_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path, "ok.py", "print('ran')\n")
    for bad in ("0", "-4KiB", "lots"):
        assert main(["run", f"--min-growth={bad}", str(script)]) == 2
        err = capsys.readouterr().err
        assert "--min-growth" in err and "a positive size such as 4KiB" in err, err
        assert "ran" not in capsys.readouterr().out


KEPT_OUTPUTS = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.LayerNorm(512), nn.Linear(512, 1000))
x = torch.randn(256, 256)
samples = []
for i in range(300):
    logits = model(x)  # no torch.no_grad(): every output has its graph
    if i % 5 == 0:
        samples.append(logits)
"""


def test_outputs_kept_every_5_steps_without_no_grad_are_a_retained_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newcomer's inference loop keeping every 5th output: the holder path ends at the output (no
    ``.grad_fn`` hop), but its graph holds the activations: a retained graph, fixed by ``torch.no_grad()``
    — not "accumulates CPU tensors: keep numbers (.item())" (said of a 1 MB output)."""
    script = _write(tmp_path, "infer.py", KEPT_OUTPUTS)
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script)]) == 0
    err = capsys.readouterr().err
    assert "LEAK on cpu" in err and "retained_graph" in err and "__main__.samples[" in err, err
    assert "torch.no_grad()" in err and "no backward() ran" in err and ".item()" not in err, err
    assert "stopped" not in err and "device_accumulation" not in err, err


LBFGS_SHORT = """
import sys, torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=10, history_size=40)
x, y = torch.randn(256, 512), torch.randn(256, 1)
snaps = []
for step in range(3):
    def closure():
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss
    opt.step(closure)
    if sys.argv[1:] == ["--keep"]:
        snaps.append(model[0].weight.detach().clone())  # 2 MiB/step, kept
"""


def test_a_short_lbfgs_run_whose_history_is_not_full_is_not_a_leak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.optim.LBFGS keeps up to history_size pairs of update directions (4 MiB each here, 10 per step):
    three steps see +40 MiB/step. It was "LEAK ... the cache `opt.state` never evicts ... the RAM runs out in
    ~570 steps"; the history stops at 40 pairs (the same program for 40 steps: flat). Must say: bounded, with
    the history's fill and its most; must not: a leak or a forecast."""
    script = _write(tmp_path, "lbfgs.py", LBFGS_SHORT)
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script)]) == 0
    err = capsys.readouterr().err
    assert "LEAK" not in err and "forecast" not in err and "never evicts" not in err, err
    assert "no leak on cpu over 3 steps" in err and "torch.optim.LBFGS's curvature history" in err, err
    assert "29 of history_size=40 pairs kept" in err and "160.63 MiB in all" in err, err
    leak = [r for r in _records(tmp_path / "a.jsonl") if r["type"] == "leak"][-1]["report"]
    assert not leak["leaking"] and leak["verdict"] == "bounded"  # type: ignore[index]


def test_growth_beyond_what_lbfgs_adds_in_a_step_stays_a_leak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run keeping a 2 MiB copy of a weight each step: the history's 40 MiB/step hides it from the
    culprits (the largest holder only), but a step adds 10 pairs at most: the rest is a leak."""
    import gc

    gc.collect()  # an earlier in-process run's optimizer (its globals in a cycle) is not this run's
    script = _write(tmp_path, "lbfgs.py", LBFGS_SHORT)
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script), "--keep"]) == 0
    err = capsys.readouterr().err
    assert "LEAK on cpu" in err and "curvature history" not in err, err
