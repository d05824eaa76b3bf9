"""What the names and calls of PyTorch code mean to the checks: the value kinds of the local data flow, the
tables of names (model-like callees, methods whose result keeps or drops the autograd graph, torch calls that
make fresh tensors, trackers and meters, rank variables) and the small readers of syntax every part uses
(``a.b.c`` of an attribute chain, a call's keyword, a constant). Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
import re

# -- value kinds of the local data flow ---------------------------------------------------------------------
TENSOR = 2  # a tensor that may carry an autograd graph
SAFE = 1  # a number, a string, a detached tensor, a result computed without autograd
UNKNOWN = 0

_MODEL_NAMES = re.compile(
    r"^(?:model|net|network|module|encoder|decoder|generator|discriminator|critic|actor|classifier|backbone"
    r"|policy|student|ddp_model|netg|netd|g_?net|d_?net|\w+_model|model_\w+|\w+_net|\w+_network"
    r"|\w+_encoder|\w+_decoder)$",
    re.IGNORECASE,
)
_LOSS_NAMES = re.compile(r"loss|criterion", re.IGNORECASE)
OPT_NAMES = re.compile(r"opt", re.IGNORECASE)
SCHEDULER_NAMES = re.compile(r"sched", re.IGNORECASE)  # `optimizer_scheduler`: not an optimizer
# Methods whose result holds no autograd graph.
SAFE_METHODS = frozenset(
    {
        "item", "tolist", "detach", "detach_", "numpy", "numel", "size", "dim", "argmax", "argmin", "argsort",
        "nonzero", "eq", "ne", "lt", "gt", "le", "ge", "long", "int", "bool", "byte", "short", "isnan",
        "isinf", "isfinite", "count_nonzero", "element_size", "nelement", "stride", "data_ptr", "equal",
        "allclose", "isclose", "__len__", "get_device", "requires_grad_", "backward", "round", "floor",
        "ceil", "sign", "logical_and", "logical_or", "logical_not", "any", "all", "unique", "multinomial",
    }
)  # fmt: skip
# Methods whose result carries the receiver's graph (when the receiver carries one).
GRAPH_METHODS = frozenset(
    {
        "sum", "mean", "float", "double", "half", "bfloat16", "to", "cpu", "cuda", "clone", "view", "reshape",
        "squeeze", "unsqueeze", "flatten", "contiguous", "abs", "pow", "sqrt", "exp", "log", "mul", "add",
        "div", "sub", "max", "min", "norm", "softmax", "log_softmax", "sigmoid", "tanh", "relu", "permute",
        "transpose", "expand", "expand_as", "repeat", "type", "type_as", "index_select", "gather",
        "masked_select", "masked_fill", "squeeze_", "unsqueeze_", "view_as", "reshape_as", "prod", "std",
        "var", "logsumexp", "clamp", "clip", "neg", "square", "t", "narrow", "select", "diag", "trace",
        "matmul", "mm", "bmm", "dot", "forward",
    }
)  # fmt: skip
SAFE_ATTRS = frozenset(
    {
        "data", "shape", "device", "dtype", "grad", "requires_grad", "is_cuda", "ndim", "layout",
        "is_leaf", "names", "itemsize", "nbytes",
    }
)  # fmt: skip
SAFE_BUILTINS = frozenset({"float", "int", "bool", "str", "len", "repr", "format", "round", "isinstance"})
# torch.* calls that make a tensor without a graph (or not a tensor at all).
TORCH_FRESH = frozenset(
    {
        "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "randn", "rand", "randint",
        "randperm", "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like",
        "full_like", "rand_like", "randn_like", "randint_like", "device", "is_tensor", "numel", "argmax",
        "argmin", "argsort", "eq", "ne", "lt", "gt", "le", "ge", "equal", "allclose", "isclose", "isnan",
        "isinf", "isfinite", "no_grad", "inference_mode", "manual_seed", "load", "save", "Generator",
        "count_nonzero", "nonzero", "unique", "bucketize", "searchsorted", "multinomial", "bernoulli",
        "poisson", "empty_strided",
    }
)  # fmt: skip
TORCH_ROOTS = frozenset({"torch", "F", "functional", "nn", "fn"})
# NumPy's usual names: what a call of theirs returns is an array or a scalar, never a tensor with a graph
# (NumPy raises on a tensor that requires grad)
NUMPY_ROOTS = frozenset({"np", "numpy"})
_NO_GRAD_CTX = frozenset({"no_grad", "inference_mode"})
_NO_GRAD_SUFFIXES = ("_no_grad", "_inference_mode")
_NO_GRAD_CLASS_SUFFIXES = ("NoGrad", "InferenceMode")
_EVAL_WORDS = frozenset(
    {
        "eval", "evaluate", "evaluation", "validate", "validation", "valid", "val", "predict",
        "prediction", "predictions", "inference", "infer", "generate", "generation", "test", "testing",
    }
)  # fmt: skip
# The first word of a function that makes, moves or uses a model: its result is not the model's output.
_VERBS = frozenset(
    {
        "get", "build", "create", "make", "load", "init", "initialize", "setup", "prepare", "wrap", "unwrap",
        "instantiate", "construct", "new", "save", "restore", "freeze", "unfreeze", "compile", "validate",
        "evaluate", "eval", "train", "test", "run", "update", "print", "log", "count", "check", "register",
        "export", "convert", "apply", "copy", "clone", "set", "reset", "is", "has", "find", "fetch",
        "download", "from", "to", "push", "merge", "quantize", "replace", "patch", "configure", "add",
    }
)  # fmt: skip
# The last word of a name about a loss rather than computing one.
_ABOUT_LOSS = frozenset(
    {
        "scale", "scaler", "scaling", "weight", "weights", "name", "names", "type", "types", "dict", "keys",
        "key", "cls", "class", "config", "cfg", "args", "kwargs", "history", "hist", "meter", "list",
        "log", "logs", "value", "values", "str", "fmt", "items", "coef", "coeff", "factor", "ratio",
        "mask", "masks", "reduction", "fn_name", "spec", "registry", "map", "mapping", "dir", "path",
    }
)  # fmt: skip
_NOT_EVAL_WORDS = frozenset({"step", "train", "training", "fit", "loss", "split", "data", "dataset", "set"})
DATASET_METHODS = frozenset({"__getitem__", "__getitems__", "__iter__"})
_BACKWARD_BY_ARG = frozenset({"accelerator", "autograd", "engine", "model_engine", "fabric", "self"})
# Deep-learning frameworks other than torch: a file that imports one and nothing of torch's world has graphs,
# `autograd` and `backward()` of its own.
OTHER_FRAMEWORKS = frozenset(
    {"mxnet", "tensorflow", "keras", "tf_keras", "jax", "flax", "paddle", "mindspore", "oneflow", "chainer"}
)
TORCH_WORLD = frozenset(
    {
        "torch", "torchvision", "torchaudio", "torchtext", "lightning", "pytorch_lightning",
        "lightning_fabric", "transformers", "accelerate", "timm", "deepspeed", "diffusers", "peft", "trl",
        "torch_geometric", "dgl", "fairseq", "ignite", "detectron2", "mmengine", "composer", "torchmetrics",
        "functorch",
    }
)  # fmt: skip
# Libraries whose models run without torch's autograd (a compiled OpenVINO model, an ONNX Runtime session).
# Adversarial-attack libraries: their attacks backward a loss to the input (advertorch's `perturb`, ART's
# `generate`, torchattacks' `atk(x, y)`), so a loop that runs one needs autograd on (round R, ReMoS).
ATTACK_LIBRARIES = frozenset(
    {"advertorch", "torchattacks", "foolbox", "art", "cleverhans", "autoattack", "deeprobust"}
)
FOREIGN_RUNTIMES = frozenset(
    {
        "openvino", "onnxruntime", "tensorflow", "tf", "jax", "flax", "tensorrt", "tflite_runtime",
        "coremltools", "paddle", "mindspore", "mxnet", "keras", "ncnn", "tritonclient",
    }
)  # fmt: skip
RANK_VARS = frozenset({"LOCAL_RANK", "RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"})
ARGS_NAMES = frozenset({"args", "opt", "opts", "cfg", "config", "hparams", "FLAGS", "flags"})
METER_NAMES = re.compile(r"meter|avg|average", re.IGNORECASE)
TRACKER_ROOTS = frozenset({"wandb", "run", "accelerator", "experiment", "tracker", "mlflow", "neptune"})
SINK_METHODS = frozenset({"log", "log_metrics", "log_metric", "add_scalar", "add_scalars", "log_dict"})


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def last_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _root_name(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def keyword_arg(call: ast.Call, name: str) -> ast.keyword | None:
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def is_const_in(node: ast.AST, values: frozenset[str]) -> bool:
    return isinstance(node, ast.Constant) and node.value in values


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in spaced.lower().split("_") if w]


def is_eval_name(name: str) -> bool:
    """Whether a function name reads as evaluation (``evaluate``, ``val_epoch``, ``test``, ``infer``)."""
    words = _words(name)
    return (
        bool(words) and any(w in _EVAL_WORDS for w in words) and not any(w in _NOT_EVAL_WORDS for w in words)
    )


def is_model_callee(func: ast.AST) -> bool:
    """Whether a call's callee names a model (``model(x)``, ``self.net(x)``, ``anything.forward(x)``).

    A name that starts with a verb (``get_model``, ``build_encoder``, ``prepare_model``,
    ``validate_network``) is a function that makes or uses a model, not the model."""
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        return True
    name = last_name(func)
    if not name or name == "self" or _MODEL_NAMES.match(name) is None:
        return False
    words = _words(name)
    head = name.split("_", 1)[0]
    acronym = len(head) > 1 and head.isupper()  # `ADD_model` (qlib's ADD network, round M): a name, no verb
    if len(words) > 1 and ((words[0] in _VERBS and not acronym) or "to" in words or "from" in words):
        # a verb first (`get_model`), or a conversion (`ir_model_to_olive_model`, `model_abbr_from_cfg`)
        return False
    if isinstance(func, ast.Attribute):  # self.generator(z), model.encoder(x); not writer.generator(...)
        root = _root_name(func)
        return root in ("self", "cls") or _MODEL_NAMES.match(root) is not None
    return True


def is_loss_callee(func: ast.AST) -> bool:
    """Whether a callee computes a loss (``criterion``, ``loss_fn``, ``F.nll_loss``, ``compute_loss``), not
    something about a loss (``compute_loss_scale``, ``loss_weight``, ``get_loss_names``)."""
    name = last_name(func)
    if not name or _LOSS_NAMES.search(name) is None or name.startswith(("get_", "set_")):
        return False
    words = _words(name)
    return not words or words[-1] not in _ABOUT_LOSS


def optimizer_step(call: ast.Call) -> bool:
    """``opt.step()`` or ``scaler.step(optimizer)``: a call named ``step`` on a receiver named like an
    optimizer (not a scheduler: ``self.model_optimizer_scheduler.step()``, round Z), or given one."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "step"):
        return False
    recv = last_name(func.value)
    if OPT_NAMES.search(recv) and not SCHEDULER_NAMES.search(recv):
        return True
    return bool(call.args) and OPT_NAMES.search(last_name(call.args[0])) is not None


def optimizer_steps(node: ast.AST) -> list[ast.Call]:
    """The optimizer steps (:func:`optimizer_step`) written in ``node``, nested functions included."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and optimizer_step(n)]


def stepped_optimizers(node: ast.AST) -> list[str]:
    """The receivers of the optimizer steps written in ``node`` (``optimizer`` of ``optimizer.step()``)."""
    return [
        container_key(c.func.value) or "" for c in optimizer_steps(node) if isinstance(c.func, ast.Attribute)
    ]


def no_grad_item(expr: ast.AST) -> int:
    """1 when a ``with`` item (or decorator) turns autograd off, -1 when it may (a variable), else 0."""
    if isinstance(expr, ast.IfExp):
        # `with torch.no_grad() if not requires_grad else dummy_context_mgr():` (StudioGAN, round Y):
        # off on one arm, so perhaps
        arms = (no_grad_item(expr.body), no_grad_item(expr.orelse))
        return 1 if arms == (1, 1) else -1 if any(arms) else 0
    call = expr if isinstance(expr, ast.Call) else None
    func = call.func if call is not None else expr
    name = last_name(func)
    if name in _NO_GRAD_CTX:
        if name == "inference_mode" and call is not None and call.args and is_const(call.args[0], False):
            return 0
        return 1
    if name.endswith(_NO_GRAD_CLASS_SUFFIXES):
        # A project's class named after the switch it applies (physicsnemo's
        # `@StaticCaptureEvaluateNoGrad(model=model, logger=log)`, round X): its arguments configure it
        return 1
    if name.endswith(_NO_GRAD_SUFFIXES):
        # A project's own wrapper named after the switch it wraps (yolov5's `smart_inference_mode()`:
        # `torch.inference_mode()` or `torch.no_grad()` by torch version): off; with arguments
        # (`maybe_no_grad(flag)`), perhaps.
        return -1 if call is not None and (call.args or call.keywords) else 1
    if name == "set_grad_enabled" and call is not None and call.args:
        if is_const(call.args[0], False):
            return 1
        return 0 if is_const(call.args[0], True) else -1
    return 0


def container_key(node: ast.AST) -> str | None:
    """The container a store reaches: ``metrics`` for ``metrics["loss"]`` and ``d[k][j]``, ``self.h`` for
    ``self.h``; None when the base is not a name or an attribute chain."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
        ):
            node = node.func.value  # stats.setdefault("loss", []).append(loss)
        else:
            return dotted(node)


#: Module hooks: each call adds one more hook to the module (it stays until its handle is removed).
HOOK_METHODS = frozenset(
    {
        "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
        "register_full_backward_pre_hook", "register_backward_hook", "register_module_forward_hook",
        "register_module_forward_pre_hook", "register_module_full_backward_hook",
    }
)  # fmt: skip


def node_line(node: ast.AST) -> int:
    return int(getattr(node, "lineno", 0))


def is_dataset_class(cls: ast.ClassDef) -> bool:
    return any(last_name(b).endswith("Dataset") for b in cls.bases)


def short(node: ast.AST | None, limit: int = 40) -> str:
    if node is None:
        return "?"
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node the parser makes
        return "?"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def freezes(value: ast.expr) -> bool:
    """A call chain with ``.requires_grad_(False)`` in it."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        if value.func.attr == "requires_grad_" and turns_off_grad(value):
            return True
        value = value.func.value
    return False


def turns_off_grad(call: ast.Call) -> bool:
    """``requires_grad_(False)`` / ``requires_grad_(requires_grad=False)`` (no argument means True)."""
    arg = call.args[0] if call.args else getattr(keyword_arg(call, "requires_grad"), "value", None)
    return is_const(arg, False)


def target_names(target: ast.AST) -> set[str]:
    """The names a for target binds (``i``, ``(k, (a, b))``, ``*rest``), without a full ``ast.walk``."""
    if target.__class__ is ast.Name:
        return {target.id}  # type: ignore[attr-defined]
    out: set[str] = set()
    todo = [target]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, (ast.Tuple, ast.List)):
            todo.extend(n.elts)
        elif isinstance(n, ast.Starred):
            todo.append(n.value)
    return out


def names_in(expr: ast.AST) -> set[str]:
    """Every ``a`` and ``a.b.c`` named inside an expression."""
    out: set[str] = set()
    for n in ast.walk(expr):
        if isinstance(n, (ast.Name, ast.Attribute)):
            key = dotted(n)
            if key is not None:
                out.add(key)
    return out
