"""``torchmem estimate``: will a model fit on a GPU — answered on any machine, without the GPU.

The model runs under fake tensors (:func:`torchmem.capture.fake.estimate_fake`); it is given as
``torchvision:resnet50``, a Hugging Face ``config.json`` (or the folder holding it; no weights are needed),
or ``module:function`` returning a model (``path/to/file.py:function`` also works).

Examples::

    torchmem estimate torchvision:resnet50 --batch 256 --target A100-40GB
    torchmem estimate llama-7b/config.json --batch 4 --seq 2048 --dtype bf16 --target H100 --fsdp 8
    torchmem estimate mypkg.models:build --input-shape 3,224,224 --batch 64 --json

Exit code 0 when it fits, 3 when it does not (so scripts can test it); 2 for a wrong command line (the
message names the option) or a model that raises (its own traceback is printed, torchmem's frames left
out); 1 for other errors.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem._warn import TORCHMEM_DIR, module_dir
from torchmem.analysis.estimate import FitArgumentError
from torchmem.analysis.targets import resolve_target, target_names
from torchmem.capture.fake.options import DEFAULT_TARGET
from torchmem.cli import UsageError, int_at_least

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
        "--decoder-seq",
        type=int_at_least(1),
        metavar="N",
        help="encoder-decoder models (T5, BART): the decoder's length, labels in training (default --seq)",
    )
    p.add_argument(
        "--input-shape", help="one sample's shape for image/other models, e.g. 3,224,224 (default for vision)"
    )
    p.add_argument(
        "--vocab", type=int_at_least(1), help="module:function models: token inputs of this vocabulary size"
    )
    p.add_argument(
        "--optimizer", type=_optimizer, default="adamw", help="torch.optim name, or 'none' (default adamw)"
    )
    p.add_argument("--dtype", default="fp32", choices=sorted(_DTYPES), help="weights' dtype (default fp32)")
    p.add_argument("--amp", choices=["bf16", "fp16"], help="autocast forward in this dtype")
    p.add_argument(
        "--target", type=_target, default=DEFAULT_TARGET, help=f"GPU: {', '.join(target_names())}, or a size"
    )
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


def _target(text: str) -> str:
    """``--target``: a GPU of the table or a size (argparse names the option in the error, exit 2)."""
    try:
        resolve_target(text)
    except FitArgumentError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message} {exc.hint}".strip()) from None
    return text


def _optimizer(text: str) -> str:
    """``--optimizer``: a ``torch.optim`` optimizer's name (any case), or ``none``."""
    names = {n.lower() for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)}
    if text.lower() != "none" and text.lower() not in names:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a torch.optim optimizer: use e.g. adamw, adam, sgd, or none"
        )
    return text


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


_CAUSAL_TYPES = ("llama", "mistral", "gpt2", "qwen2", "gemma", "phi")


def _hf_factory(cfg: Any) -> tuple[Callable[[], torch.nn.Module], str]:
    """The model a config describes (the class its ``architectures`` names, e.g. ``GPT2LMHeadModel`` with
    its LM head; else ``AutoModelForCausalLM`` for decoder model types, ``AutoModelForSeq2SeqLM`` for
    encoder-decoders, ``AutoModel`` otherwise) and its kind: ``"causal"``, ``"seq2seq"`` or ``"encoder"``."""
    import transformers
    from transformers.models.auto import modeling_auto

    archs = list(getattr(cfg, "architectures", None) or [])
    cls: Any = getattr(transformers, archs[0], None) if archs else None
    name = archs[0] if cls is not None else ""
    causal_names = set(getattr(modeling_auto, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", {}).values())
    seq2seq_names = set(getattr(modeling_auto, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", {}).values())
    if name:
        causal = name in causal_names or name.endswith(("ForCausalLM", "LMHeadModel"))
        seq2seq = name in seq2seq_names or (
            name.endswith("ForConditionalGeneration") and cfg.is_encoder_decoder
        )
    else:
        seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
        causal = not seq2seq and getattr(cfg, "model_type", "") in _CAUSAL_TYPES
        cls = (
            transformers.AutoModelForSeq2SeqLM
            if seq2seq
            else transformers.AutoModelForCausalLM
            if causal
            else transformers.AutoModel
        )

    def build() -> torch.nn.Module:
        make = getattr(cls, "from_config", None) or getattr(cls, "_from_config", None)
        return make(cfg) if make is not None else cls(cfg)  # type: ignore[no-any-return]

    return build, "seq2seq" if seq2seq else "causal" if causal else "encoder"


def _inputs_for(kind: str, cfg: Any, args: argparse.Namespace) -> Callable[[int], Any]:
    seq = int(args.seq)
    if kind == "seq2seq":  # the encoder's --seq tokens, the decoder's --decoder-seq (labels in training)
        dseq = int(getattr(args, "decoder_seq", None) or seq)

        def encoder_decoder(bs: int) -> Any:
            ids = torch.zeros(bs, seq, dtype=torch.long)
            target = torch.zeros(bs, dseq, dtype=torch.long)
            if args.inference:
                return {"input_ids": ids, "decoder_input_ids": target}
            return {"input_ids": ids, "labels": target}

        return encoder_decoder
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
            kind = "encoder"  # pixels
        return factory, _inputs_for(kind, cfg, args), type(cfg).__name__
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


class ModelError(UsageError):
    """The model given to ``torchmem estimate`` raised (building it, making its inputs, or in its step): the
    user's traceback is printed, without torchmem's frames; exit code 2 (a model that cannot be used)."""


def _is_models(exc: BaseException) -> bool:
    """Whether ``exc`` came out of the model's own code: a frame of its traceback is neither torchmem's nor
    torch's (the user's file, a model library). Otherwise it is torchmem's (or torch's) and its full
    traceback stands."""
    torch_dir = module_dir("torch")
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        f = os.path.abspath(name)
        ours = f.startswith(TORCHMEM_DIR + os.sep) or bool(torch_dir and f.startswith(torch_dir + os.sep))
        stdlib = name.startswith("<") or os.path.dirname(f) == os.path.dirname(os.__file__)
        if not ours and not stdlib:
            return True
        tb = tb.tb_next
    return False


def _model_failed(exc: BaseException, spec: str) -> ModelError:
    """Print the model's traceback (torchmem's frames left out, as ``torchmem run`` prints a program's) and
    return the one-line error that ends the command."""
    from torchmem.run.program import user_traceback

    seen: set[int] = set()
    chain: list[BaseException] = [exc]
    while chain:
        x = chain.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        try:
            x.__traceback__ = user_traceback(x.__traceback__, None)
        except Exception:  # a traceback that cannot be rebuilt is printed as it is
            pass
        chain += [c for c in (x.__cause__, x.__context__) if c is not None]
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    text = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return ModelError(
        f"the model {spec} raised {what}",
        "The traceback above is the model's (torchmem's frames left out); fix the model or its inputs "
        "(--batch, --seq, --input-shape, --vocab).",
    )


def run(args: argparse.Namespace) -> int:
    try:
        factory, inputs, name = resolve_model(args.model, args)
        est = _estimate(args, factory, inputs)
    except FitArgumentError as exc:
        if getattr(exc, "param", None) == "checkpoint":  # a module name given to --checkpoint
            raise UsageError(exc.message.replace("checkpoint=", "--checkpoint ", 1), exc.hint) from None
        raise
    except TorchmemError:
        raise
    except Exception as exc:
        if not _is_models(exc):
            raise
        raise _model_failed(exc, args.model) from None
    if args.json:
        d = est.to_dict()
        d["verdict"] = est.verdict
        d["model_spec"] = args.model
        print(json.dumps(d, indent=1, default=str))
    else:
        print(f"{args.model} ({name})")
        print(str(est))
    return 0 if est.fits else 3


def _estimate(args: argparse.Namespace, factory: Callable[[], torch.nn.Module], inputs: Any) -> Any:
    from torchmem.capture.fake import estimate_fake

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
    return estimate_fake(
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
