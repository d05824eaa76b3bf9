"""``torchmem estimate``: model specs (HF config.json, module:function, torchvision), options, errors."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from torchmem.cli import main

_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


@pytest.fixture
def llama_config(tmp_path: Path) -> Path:
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_LLAMA))
    return path


@pytest.fixture(scope="module")
def llama_on_t4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict[str, Any]]:
    """The Llama config.json, and ``torchmem estimate`` of it at batch 2, seq 64 on a T4 with ``--json``:
    its exit code and JSON (two tests read the same estimate)."""
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(_LLAMA))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["estimate", str(path), "--batch", "2", "--seq", "64", "--target", "T4", "--json"])
    return path, rc, json.loads(out.getvalue())


def test_hf_config_json(llama_on_t4: tuple[Path, int, dict[str, Any]]) -> None:
    _, rc, d = llama_on_t4
    assert rc == 0 and d["fits"] is True and d["target"] == "T4"
    assert d["verdict"].startswith("fits on T4") and d["batch_size"] == 2
    n = 512 * 64 * 2 + 2 * (4 * 64 * 64 // 4 * 3 + 3 * 64 * 128) + 64 * 5  # embeddings, head, layers, norms
    assert d["parameters"] >= n * 4 * 0.95
    assert d["largest_batch_size"] > 2


def test_fsdp_and_dtype_options(
    llama_on_t4: tuple[Path, int, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    config, _, one = llama_on_t4
    main(
        [
            "estimate",
            str(config),
            "--batch",
            "2",
            "--seq",
            "64",
            "--target",
            "T4",
            "--json",
            "--fsdp",
            "4",
            "--dtype",
            "bf16",
        ]
    )
    four = json.loads(capsys.readouterr().out)
    assert four["strategy"] == "fsdp" and four["world_size"] == 4
    assert four["parameters"] < one["parameters"] / 6  # a quarter, in bf16
    assert four["overhead"] > one["overhead"]  # NCCL


def test_does_not_fit_table(llama_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", str(llama_config), "--batch", "64", "--seq", "256", "--target", "0.05GiB"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "does not fit on 0.05 GiB GPU" in out
    assert "changes that make it fit" in out or "nothing torchmem tried fits" in out


def test_module_function(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = tmp_path / "mymodels.py"
    mod.write_text(
        "import torch\n"
        "def mlp():\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))\n"
    )
    rc = main(["estimate", f"{mod}:mlp", "--input-shape", "3,8,8", "--batch", "4", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["rows"][0]["batch_size"] == 4
    sys.modules.pop("_torchmem_estimate_model", None)


def test_torchvision_missing_says_how_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    rc = main(["estimate", "torchvision:resnet50"])
    err = capsys.readouterr().err
    assert rc != 0 and "pip install torchvision" in err


def test_bad_target_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(tmp_path / "nope.json")]) != 0
    assert "does not exist" in capsys.readouterr().err
    mod = tmp_path / "m.py"
    mod.write_text("import torch\ndef f():\n    return torch.nn.Linear(4, 4)\n")
    assert main(["estimate", f"{mod}:f", "--input-shape", "4", "--target", "B9000"]) != 0
    assert "Unknown target" in capsys.readouterr().err


_GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "vocab_size": 512,
    "n_positions": 128,
}


@pytest.fixture
def gpt2_folder(tmp_path: Path) -> Path:
    """A folder named gpt2 holding a small GPT-2's config.json (dropout on, as GPT-2's has it)."""
    pytest.importorskip("transformers")
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_GPT2))
    return folder


@pytest.mark.parametrize(
    "options",
    [
        ["--target", "2GiB"],  # does not fit: every change is tried (checkpointing crashed here)
        ["--target", "T4", "--checkpoint"],
        ["--target", "NVIDIA GeForce RTX 4090", "--checkpoint", "transformer.h.1"],
        ["--target", "L4", "--inference", "--generate", "32"],
    ],
    ids=["size", "checkpoint", "checkpoint-one", "generate"],
)
def test_gpt2_with_dropout_never_crashes(
    gpt2_folder: Path, options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["estimate", str(gpt2_folder), "--batch", "8", "--seq", "64", *options, "--json"])
    captured = capsys.readouterr()
    assert rc in (0, 3), captured.err
    d = json.loads(captured.out)
    assert d["fits"] is (rc == 0)
    assert not any(n.startswith("could not evaluate") for n in d["notes"]), d["notes"]
    if "--checkpoint" in options:
        assert d["checkpointed"]


def test_a_model_that_raises_prints_its_own_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchmem._warn import TORCHMEM_DIR

    mod = tmp_path / "broken.py"
    mod.write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        return self.check(self.lin(x))\n"
        "    def check(self, y):\n"
        "        raise ValueError('the model refuses this input')\n"
        "def build():\n"
        "    return Net()\n"
    )
    rc = main(["estimate", f"{mod}:build", "--input-shape", "8", "--batch", "4"])
    err = capsys.readouterr().err
    sys.modules.pop("_torchmem_estimate_model", None)
    assert rc == 2
    trace, _, tail = err.partition("ValueError: the model refuses this input\n")
    assert trace.startswith("Traceback (most recent call last):")
    assert f'"{mod}", line 7, in forward' in trace and f'"{mod}", line 9, in check' in trace
    assert TORCHMEM_DIR not in trace  # torchmem's frames left out
    assert tail.startswith("torchmem: error: the model") and "raised ValueError" in tail


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--batch", "0"], "argument --batch"),
        (["--seq", "-1"], "argument --seq"),
        (["--grad-accum", "0"], "argument --grad-accum"),
        (["--fsdp", "0"], "argument --fsdp"),
        (["--target", "B9000"], "argument --target"),
        (["--optimizer", "adamz"], "argument --optimizer"),
        (["--checkpoint", "nope"], "--checkpoint 'nope' names no module"),
    ],
)
def test_bad_values_name_the_option_and_exit_2(
    tmp_path: Path, options: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = tmp_path / "fine.py"
    mod.write_text("import torch\ndef f():\n    return torch.nn.Linear(4, 4)\n")
    rc = main(["estimate", f"{mod}:f", "--input-shape", "4", *options])
    err = capsys.readouterr().err
    sys.modules.pop("_torchmem_estimate_model", None)
    assert rc == 2 and named in err, err
    assert "batch_sizes" not in err and "grad_accum" not in err and "checkpoint=" not in err


def test_config_builds_its_architecture_and_seq2seq_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps(_GPT2))
    # GPT2LMHeadModel, with its LM head and the loss on labels (AutoModel built GPT2Model: no head, no loss)
    rc = main(
        ["estimate", str(gpt2), "--batch", "2", "--seq", "32", "--checkpoint", "transformer.h.1", "--json"]
    )
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["model"] == "GPT2LMHeadModel" and d["checkpointed"] == ["transformer.h.1"]
    t5 = tmp_path / "t5"
    t5.mkdir()
    t5_cfg = {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "d_model": 64,
        "d_ff": 128,
        "d_kv": 16,
        "num_layers": 1,
        "num_heads": 4,
        "vocab_size": 512,
        "decoder_start_token_id": 0,
    }
    (t5 / "config.json").write_text(json.dumps(t5_cfg))
    for extra in (["--checkpoint"],):
        rc = main(
            ["estimate", str(t5), "--batch", "2", "--seq", "32", "--decoder-seq", "16", *extra, "--json"]
        )
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert json.loads(out.out)["model"] == "T5ForConditionalGeneration"
