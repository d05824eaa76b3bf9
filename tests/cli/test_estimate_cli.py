"""``torchmem estimate``: model specs (HF config.json, module:function, torchvision), options, errors."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

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


def test_hf_config_json(llama_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", str(llama_config), "--batch", "2", "--seq", "64", "--target", "T4", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["fits"] is True and d["target"] == "T4"
    assert d["verdict"].startswith("fits on T4") and d["batch_size"] == 2
    n = 512 * 64 * 2 + 2 * (4 * 64 * 64 // 4 * 3 + 3 * 64 * 128) + 64 * 5  # embeddings, head, layers, norms
    assert d["parameters"] >= n * 4 * 0.95
    assert d["largest_batch_size"] > 2


def test_fsdp_and_dtype_options(llama_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["estimate", str(llama_config), "--batch", "2", "--seq", "64", "--json"])
    one = json.loads(capsys.readouterr().out)
    main(
        [
            "estimate",
            str(llama_config),
            "--batch",
            "2",
            "--seq",
            "64",
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
    assert "does not fit on 0.05 GiB GPU" in out and "changes, most saved first" in out


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
