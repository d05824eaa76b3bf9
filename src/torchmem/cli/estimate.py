"""``torchmem estimate``: will a model fit on a GPU — answered on any machine, without the GPU.

The model runs under fake tensors (:func:`torchmem.capture.fake.estimate_fake`); it is given as
``torchvision:resnet50``, a Hugging Face ``config.json`` (or the folder holding it; no weights are needed),
or ``module:function`` returning a model (``path/to/file.py:function`` also works).

Examples::

    torchmem estimate torchvision:resnet50 --batch 256 --target A100-40GB
    torchmem estimate llama-7b/config.json --batch 4 --seq 2048 --dtype bf16 --target H100 --fsdp 8
    torchmem estimate mypkg.models:build --input-shape 3,224,224 --batch 64 --json

Exit code 0 when it fits, 3 when it does not (so scripts can test it), 1-2 on errors.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError
from torchmem.analysis.targets import target_names
from torchmem.cli import int_at_least

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="will a model fit on a GPU: a device-free estimate (fake tensors) of its peak memory",
        description="Estimates a training or inference step's peak memory on a target GPU, without a GPU.",
    )
    p.add_argument(
        "model", help="torchvision:NAME, a Hugging Face config.json (or its folder), or module:function"
    )
    p.add_argument("--batch", type=int_at_least(1), default=8, help="per-GPU batch size (default 8)")
    p.add_argument(
        "--seq", type=int_at_least(1), default=512, help="sequence length for token models (default 512)"
    )
    p.add_argument(
        "--input-shape", help="one sample's shape for image/other models, e.g. 3,224,224 (default for vision)"
    )
    p.add_argument(
        "--vocab", type=int_at_least(1), help="module:function models: token inputs of this vocabulary size"
    )
    p.add_argument("--optimizer", default="adamw", help="torch.optim name, or 'none' (default adamw)")
    p.add_argument("--dtype", default="fp32", choices=sorted(_DTYPES), help="weights' dtype (default fp32)")
    p.add_argument("--amp", choices=["bf16", "fp16"], help="autocast forward in this dtype")
    p.add_argument("--target", default="H100-80GB", help=f"GPU: {', '.join(target_names())}, or a size")
    p.add_argument("--fsdp", type=int_at_least(1), metavar="N", help="FSDP2 over N GPUs (per-rank estimate)")
    p.add_argument("--ddp", type=int_at_least(1), metavar="N", help="DDP over N GPUs")
    p.add_argument("--zero", type=int, choices=[1, 2, 3], help="ZeRO stage (with --gpus)")
    p.add_argument("--gpus", type=int_at_least(1), default=None, help="number of GPUs for --zero")
    p.add_argument(
        "--checkpoint", nargs="*", help="checkpoint these modules (no names: every repeated block)"
    )
    p.add_argument("--grad-accum", type=int_at_least(1), default=1, help="micro-batches per optimizer step")
    p.add_argument("--inference", action="store_true", help="estimate an inference step instead of training")
    p.add_argument(
        "--generate", type=int_at_least(0), default=0, metavar="TOKENS", help="inference: generate TOKENS"
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _missing(package: str, spec: str) -> FitArgumentError:
    return FitArgumentError(
        f"{spec!r} needs {package}, which is not installed.", f"Install it: pip install {package}"
    )


def _hf_config(path: str) -> Any:
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise _missing("transformers", path) from exc
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    file = path if not os.path.isdir(path) else os.path.join(path, "config.json")
    if os.path.basename(file) == "config.json":
        return AutoConfig.from_pretrained(folder)
    with open(file, encoding="utf-8") as fh:
        data = json.load(fh)
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise FitArgumentError(f"{path} has no model_type: not a Hugging Face config.", "")
    return AutoConfig.for_model(model_type, **data)


def _hf_factory(cfg: Any) -> tuple[Callable[[], torch.nn.Module], str]:
    from transformers import AutoModel, AutoModelForCausalLM

    archs = list(getattr(cfg, "architectures", None) or [])
    causal = any(a.endswith("ForCausalLM") for a in archs) or (
        not archs and getattr(cfg, "model_type", "") in ("llama", "mistral", "gpt2", "qwen2", "gemma", "phi")
    )

    def build() -> torch.nn.Module:
        auto = AutoModelForCausalLM if causal else AutoModel
        return auto.from_config(cfg)  # type: ignore[no-any-return]

    return build, "causal" if causal else "encoder"


def _inputs_for(kind: str, cfg: Any, args: argparse.Namespace) -> Callable[[int], Any]:
    seq = int(args.seq)
    if kind in ("causal", "encoder") and getattr(cfg, "vocab_size", None):
        if kind == "causal" and not args.inference:

            def tokens_labels(bs: int) -> Any:
                ids = torch.zeros(bs, seq, dtype=torch.long)
                return {"input_ids": ids, "labels": ids}

            return tokens_labels

        def tokens(bs: int) -> Any:
            return {"input_ids": torch.zeros(bs, seq, dtype=torch.long)}

        return tokens
    shape = _shape(args.input_shape, cfg)

    def pixels(bs: int) -> Any:
        x = torch.empty(bs, *shape)
        return {"pixel_values": x} if kind in ("causal", "encoder") else x

    return pixels


def _shape(text: str | None, cfg: Any = None) -> tuple[int, ...]:
    if text:
        try:
            return tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
        except ValueError as exc:
            raise FitArgumentError(
                f"--input-shape {text!r} is not a list of ints.", "E.g. 3,224,224"
            ) from exc
    size = getattr(cfg, "image_size", None) or 224
    channels = getattr(cfg, "num_channels", None) or 3
    return (int(channels), int(size), int(size))


def resolve_model(spec: str, args: argparse.Namespace) -> tuple[Callable[[], torch.nn.Module], Any, str]:
    """``(factory, inputs factory, name)`` for a CLI model spec."""
    if spec.startswith("torchvision:"):
        name = spec.split(":", 1)[1]
        if importlib.util.find_spec("torchvision") is None:
            raise _missing("torchvision", spec)
        models = importlib.import_module("torchvision.models")
        ctor: Any = getattr(models, name, None)
        if ctor is None:
            raise FitArgumentError(f"torchvision.models has no {name!r}.", "E.g. torchvision:resnet50")

        def build() -> torch.nn.Module:
            return ctor(weights=None)  # type: ignore[no-any-return]

        build.__name__ = name
        return build, _inputs_for("image", None, args), name
    if spec.endswith(".json") or os.path.isdir(spec):
        if not os.path.exists(spec):
            raise FitArgumentError(f"{spec} does not exist.", "Give the path of a config.json.")
        cfg = _hf_config(spec)
        factory, kind = _hf_factory(cfg)
        archs = list(getattr(cfg, "architectures", None) or [])
        factory.__name__ = archs[0] if archs else type(cfg).__name__.replace("Config", "")
        if getattr(cfg, "vocab_size", None) is None:
            kind = "vision"
        return factory, _inputs_for(kind if kind != "vision" else "encoder", cfg, args), type(cfg).__name__
    if ":" in spec:
        mod_name, fn_name = spec.rsplit(":", 1)
        if mod_name.endswith(".py"):
            loader = importlib.util.spec_from_file_location("_torchmem_estimate_model", mod_name)
            if loader is None or loader.loader is None:
                raise FitArgumentError(f"cannot import {mod_name}.", "")
            mod = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(mod)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            try:
                mod = importlib.import_module(mod_name)
            except ImportError as exc:
                raise FitArgumentError(
                    f"cannot import {mod_name!r}: {exc}", "Check the module path."
                ) from exc
        fn = getattr(mod, fn_name, None)
        if fn is None or not callable(fn):
            raise FitArgumentError(f"{mod_name} has no function {fn_name!r}.", "")
        if args.vocab:
            cfg = argparse.Namespace(vocab_size=args.vocab)
            return fn, _inputs_for("encoder", cfg, args), fn_name
        return fn, _inputs_for("image", None, args), fn_name
    raise FitArgumentError(
        f"cannot read the model {spec!r}.",
        "Give torchvision:NAME, a Hugging Face config.json, or module:function.",
    )


def run(args: argparse.Namespace) -> int:
    from torchmem.capture.fake import estimate_fake

    factory, inputs, name = resolve_model(args.model, args)
    strategy, world = None, 1
    if args.fsdp:
        strategy, world = "fsdp", args.fsdp
    elif args.ddp:
        strategy, world = "ddp", args.ddp
    elif args.zero:
        strategy, world = f"zero{args.zero}", args.gpus or 1
    ckpt: Any = None
    if args.checkpoint is not None:
        ckpt = args.checkpoint or True
    optimizer = None if args.optimizer.lower() == "none" else args.optimizer
    est = estimate_fake(
        factory,
        inputs,
        optimizer=optimizer,
        batch_sizes=[args.batch],
        training=not args.inference,
        target=args.target,
        dtype=_DTYPES[args.dtype] if args.dtype not in ("fp32", "float32") else None,
        amp=_DTYPES[args.amp] if args.amp else None,
        checkpoint=ckpt,
        grad_accum=args.grad_accum,
        sharding=strategy,
        world_size=world,
        generate_tokens=args.generate if args.inference else 0,
    )
    if args.json:
        d = est.to_dict()
        d["verdict"] = est.verdict
        d["model_spec"] = args.model
        print(json.dumps(d, indent=1, default=str))
    else:
        print(f"{args.model} ({name})")
        print(str(est))
    return 0 if est.fits else 3
