"""The target GPU's kernel choices: stand-ins that make a fake run (a CPU run) hold a GPU's tensors.

The fake run is a CPU run: torch picks CPU kernels. Where the GPU's pick holds different tensors, the fake
run is steered to the GPU's (only while a GPU target's fake run is on, on its thread: :func:`_gpu_kernels`):

- ``scaled_dot_product_attention``: the CUDA kernel the target would take
  (:func:`torchmem.analysis.targets.attention_backend`) is called through its aten op, whose fake (meta)
  kernel gives the outputs and autograd the saved tensors of the real one: flash/efficient keep the output
  and a logsumexp where the CPU's math path (its choice with dropout) materialises the scores; the math path
  where the GPU takes it (grouped-query heads in fp32) and the CPU does not.
- dropout: the fused ``native_dropout`` (a boolean mask saved) where the CPU's composite saves a float mask.
- ``nn.MultiheadAttention`` / ``TransformerEncoderLayer`` inference fast paths: one fused op whose
  temporaries the fake mode builds unseen; rebuilt from the ops its CUDA kernel runs (each counted).
- cuDNN's recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``): the reserve space cuDNN keeps for
  backward and its dropout state (:class:`_CudnnRNN`).
- optimizers: foreach on CUDA parameters (torch's default there), per-parameter loops on the CPU
  (:func:`_foreach_like_cuda`).
- composite ops reaching the fake mode whole (inference): decomposed under the counting mode
  (:func:`torchmem.capture.fake.ledger._ledger_mode`).

Example:
    >>> import torch
    >>> from torchmem.capture.fake.kernels import _gpu_kernels
    >>> plain = torch.nn.functional.dropout
    >>> with _gpu_kernels((9, 0)):
    ...     torch.nn.functional.dropout is plain
    False
    >>> torch.nn.functional.dropout is plain
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from torchmem.analysis.targets import attention_backend

_GPU = threading.local()
_GPU_LOCK = threading.Lock()
_GPU_USERS = [0]
_STAND_IN_ERRORS: set[str] = set()  # what a stand-in could not run (the CPU's kernel ran instead)


def _gpu_sdpa(
    sm: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``scaled_dot_product_attention`` as the CUDA kernel of a GPU of compute capability ``sm`` runs it,
    on fake tensors; ``NotImplemented`` where it does not apply (the CPU's own choice runs)."""
    q, k, v = query, key, value
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_nested for t in (q, k, v)):
        return NotImplemented
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        return NotImplemented
    b, hq, lq, d = (int(x) for x in q.shape)
    hk, lk, dv = int(k.shape[1]), int(k.shape[2]), int(v.shape[3])
    if hq != hk and not enable_gqa:
        return NotImplemented
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    strides = [int(t.stride(-1)) for t in (q, k, v)] + (
        [int(attn_mask.stride(-1))] if attn_mask is not None else []
    )
    backend = attention_backend(
        sm,
        dtype=str(q.dtype).removeprefix("torch."),
        q_heads=hq,
        kv_heads=hk,
        head_dim=d,
        v_head_dim=dv,
        q_len=lq,
        kv_len=lk,
        mask=attn_mask is not None,
        causal=bool(is_causal),
        grad=grad,
        last_dim_contiguous=all(st == 1 for st in strides),
    )
    aten = torch.ops.aten
    if backend == "flash":
        pad = (-d) % 8  # the CUDA wrapper pads the head dim to a multiple of 8 (copies)
        sc = scale if scale is not None else d**-0.5
        if pad:
            q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
        flash = aten._scaled_dot_product_flash_attention
        out = flash(q, k, v, dropout_p, bool(is_causal), False, scale=sc)[0]
        return out[..., :dv] if pad else out
    if backend == "efficient":
        bias = attn_mask
        if bias is not None:
            if bias.dtype == torch.bool:  # the CUDA wrapper turns a boolean mask into an additive one
                bias = torch.zeros(bias.shape, dtype=q.dtype, device=bias.device).masked_fill(
                    bias.logical_not(), float("-inf")
                )
            elif bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            tail = (-int(bias.shape[-1])) % 16  # and pads its last dim to 16 elements (a copy)
            if tail:
                bias = torch.nn.functional.pad(bias, (0, tail))[..., : int(bias.shape[-1])]
            bias = bias.expand(b, hq, lq, lk)
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, grad, dropout_p, bool(is_causal), scale=scale
        )[0]
    return _math_sdpa(q, k, v, attn_mask, dropout_p, bool(is_causal), scale, hq // hk if hq != hk else 1)


def _math_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    groups: int,
) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` as CUDA runs it (torch 2.4-2.11, ``attention.cpp``): q and k
    scaled by the square root of the scale, the scores, the mask added in place, ``_safe_softmax``, and the
    dropout through CUDA's fused ``native_dropout`` (a boolean mask; the composite on the fake run's CPU
    tensors saves a float one). Its saved tensors are the real path's: the scaled q, the copied k and v of
    the batched matmuls, the probabilities, the mask and the dropped probabilities."""
    d = int(q.shape[-1])
    sc = scale if scale is not None else d**-0.5
    f = abs(sc) ** 0.5
    query = q * (-f if sc < 0 else f)
    mask = attn_mask
    if is_causal:
        lq, lk = int(q.shape[-2]), int(k.shape[-2])
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask.dtype == torch.bool:  # convert_boolean_attn_mask
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            mask.logical_not(), float("-inf")
        )
    if groups > 1:  # pre_process_group_query_attention_input
        k, v = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
    attn = torch.matmul(query, k.transpose(-2, -1) * f)
    if mask is not None:
        attn.add_(mask)
    safe = getattr(torch.ops.aten, "_safe_softmax", None)
    attn = safe(attn, -1) if safe is not None else torch.softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.ops.aten.native_dropout(attn, float(dropout_p), True)[0]
    return torch.matmul(attn, v)


def _gpu_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """``dropout`` as CUDA runs it: the fused ``native_dropout``, which saves a boolean mask (1 byte per
    element); the CPU's composite saves a mask of the input's dtype (4 bytes in fp32)."""
    if (
        not training
        or inplace
        or not isinstance(input, torch.Tensor)
        or not 0.0 < float(p) < 1.0
        or input.numel() == 0
        or not input.is_floating_point()
    ):
        return NotImplemented
    return torch.ops.aten.native_dropout(input, float(p), True)[0]


def _gpu_mha(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> Any:
    """``nn.MultiheadAttention``'s inference fast path (``_native_multi_head_attention``) as its CUDA
    kernel runs self-attention without a mask: one QKV GEMM, fused attention on views of it, the output
    projection. The fused op's temporaries are then tensors the ledger sees."""
    F = torch.nn.functional
    if need_weights or mask is not None or query is not key or key is not value:
        return NotImplemented
    if not isinstance(query, torch.Tensor) or query.dim() != 3 or query.is_nested:
        return NotImplemented
    b, n = int(query.shape[0]), int(query.shape[1])
    qkv = F.linear(query, qkv_weight, qkv_bias)
    q, k, v = (c.view(b, n, num_head, embed_dim // num_head).transpose(1, 2) for c in qkv.chunk(3, -1))
    y = F.scaled_dot_product_attention(q, k, v)  # the stand-in: the GPU's kernel
    del q, k, v, qkv
    return F.linear(y.transpose(1, 2).reshape(b, n, embed_dim), proj_weight, proj_bias), None


def _gpu_encoder_layer(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> Any:
    """``nn.TransformerEncoderLayer``'s inference fast path (``_transformer_encoder_layer_fwd``) as its
    CUDA kernel runs it: the attention above, residual adds and ReLU in place, GELU not."""
    F = torch.nn.functional
    if mask is not None or not isinstance(src, torch.Tensor) or src.dim() != 3 or src.is_nested:
        return NotImplemented
    shape = (int(embed_dim),)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    att = _gpu_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, None, False)
    if att is NotImplemented:
        return NotImplemented
    x = att[0]
    del att
    x.add_(src)
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    pre = x
    if norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    h = F.linear(x, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else h.relu_()
    x = F.linear(h, ffn_weight_2, ffn_bias_2)
    del h
    x.add_(pre)
    del pre
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    return x


# cuDNN's recurrent layers (nn.LSTM, nn.GRU, nn.RNN on CUDA in fp32/fp16): one kernel per call that keeps, for
# backward, a reserve space the CPU's kernels do not have (they save each layer's input and output, or every
# gate of every step for the GRU). Its size (cudnnGetRNNTempSpaceSizes), per layer and direction, in elements
# of time steps x batch x hidden: the LSTM's four gates and its cell state (5), the GRU's six terms (6), the
# plain RNN's activation (1); plus each layer's output but the last's (the last is the returned output), and
# with dropout between layers, one bit per element of those outputs. Measured on the H100 (cuDNN 9.19, torch
# 2.11: the uint8 tensor _cudnn_rnn saves, over cells, 1-3 layers, both directions, inputs of 128-1024,
# hidden 256-1024, benchmarks/estimate_accuracy.py), exact to 256 bytes (its alignment); it is also cuDNN
# 7's reported reserve for a 4-layer LSTM and GRU (23 and 27 units, pytorch/pytorch#2895) and a 1-layer
# bidirectional GRU (12 units, SeanNaren/deepspeech.pytorch#172). Training with dropout also makes cuDNN's
# dropout state, one buffer per GPU that stays for the process (and is saved with each call): 6,488,064
# bytes on the H100.
_RNN_MODES = {"lstm": (4, 5), "gru": (3, 6), "rnn_tanh": (1, 1), "rnn_relu": (1, 1)}  # gates, reserve units
_CUDNN_DROPOUT_STATE = 6_488_064


def _cudnn_reserve_units(mode: str, layers: int, directions: int) -> int:
    """cuDNN's training reserve space in units of ``steps x batch x hidden`` elements (see above), without
    the dropout bits."""
    per_layer = _RNN_MODES[mode][1]
    return directions * (per_layer * layers + (layers - 1))


def _cudnn_reserve_bytes(
    mode: str, layers: int, directions: int, steps: int, batch: int, hidden: int, element: int, dropout: bool
) -> int:
    """cuDNN's training reserve space in bytes: :func:`_cudnn_reserve_units` elements, and with dropout a
    bit per element of the layer outputs it drops."""
    elements = steps * batch * hidden
    bits = directions * (layers - 1) * elements if dropout else 0
    return _cudnn_reserve_units(mode, layers, directions) * elements * element + -(-bits // 8)


def _cudnn_dropout_state(like: torch.Tensor) -> torch.Tensor:
    """cuDNN's dropout state of this fake run, made on first use and kept until the run ends (as the real
    one stays for the process)."""
    held = getattr(_GPU, "held", None)
    if held is None:
        held = _GPU.held = {}
    state = held.get("cudnn_dropout_state")
    if state is None:
        state = held["cudnn_dropout_state"] = like.new_empty((_CUDNN_DROPOUT_STATE,), dtype=torch.uint8)
    return state  # type: ignore[no-any-return]


class _CudnnRNN(torch.autograd.Function):
    """``_cudnn_rnn`` and its backward as they hold memory, on fake tensors: what cuDNN allocates (the
    seq-first copies of a batch-first input and output gradient, the output, the final states, the reserve
    space kept for backward, the input, state and flat weight gradients), none of its arithmetic."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        spec: tuple[Any, ...],
        input: torch.Tensor,
        hx: torch.Tensor,
        cx: Any,
        *weights: torch.Tensor,
    ) -> Any:
        mode, hidden, layers, directions, batch_first, train, dropout = spec
        steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        x = input.transpose(0, 1).contiguous() if batch_first else input.contiguous()  # seq-first
        y = input.new_empty((steps, batch, directions * hidden))
        hy = hx.new_empty(hx.shape)
        cy = cx.new_empty(cx.shape) if isinstance(cx, torch.Tensor) else None
        del x
        size = (
            _cudnn_reserve_bytes(
                mode, layers, directions, steps, batch, hidden, input.element_size(), dropout and layers > 1
            )
            if train
            else 0
        )
        reserve = input.new_empty((size,), dtype=torch.uint8)
        state = _cudnn_dropout_state(input) if train and dropout else None
        ctx.spec = spec
        ctx.weights_like = [(w.numel(), w.shape) for w in weights]
        ctx.save_for_backward(input, hx, cx if isinstance(cx, torch.Tensor) else None, y, reserve, state)
        out = y.transpose(0, 1) if batch_first else y
        return out, hy, cy

    @staticmethod
    def backward(ctx: Any, dout: Any, dhy: Any, dcy: Any) -> Any:
        input, hx, cx, _y, _reserve, _state = ctx.saved_tensors
        weights_like = ctx.weights_like
        batch_first = ctx.spec[4]
        x = input.transpose(0, 1).contiguous() if batch_first else input.contiguous()
        dy = (dout.transpose(0, 1) if batch_first else dout).contiguous()
        dx = x.new_empty(x.shape)
        del x, dy
        dhx = hx.new_empty(hx.shape)
        dcx = cx.new_empty(cx.shape) if cx is not None else None
        flat = input.new_zeros((sum(int(n) for n, _ in weights_like),))
        grads, at = [], 0
        for n, shape in weights_like:
            grads.append(flat[at : at + n].view(shape))
            at += n
        return (None, dx.transpose(0, 1) if batch_first else dx, dhx, dcx, *grads)


def _gpu_rnn(mode: str) -> Callable[..., Any]:
    """``torch._VF.<mode>`` (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``) as CUDA runs it through cuDNN
    for fp32/fp16 inputs (bf16 and packed sequences keep the CPU's kernels)."""
    gates = _RNN_MODES[mode][0]

    def run(
        input: Any,
        hx: Any,
        params: Any = None,
        has_biases: Any = True,
        num_layers: Any = 1,
        dropout: Any = 0.0,
        train: Any = False,
        bidirectional: Any = False,
        batch_first: Any = False,
    ) -> Any:
        if not isinstance(input, torch.Tensor) or (isinstance(hx, torch.Tensor) and mode == "lstm"):
            return NotImplemented
        if not isinstance(params, (list, tuple)) or input.dim() != 3:
            return NotImplemented  # a packed sequence (batch_sizes in second place) or another call
        if input.dtype not in (torch.float32, torch.float16):
            return NotImplemented
        h, c = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
        directions = 2 if bidirectional else 1
        per_layer = 4 if has_biases else 2
        if len(params) != per_layer * int(num_layers) * directions or not isinstance(h, torch.Tensor):
            return NotImplemented  # projections (proj_size) or an unexpected layout
        hidden = int(h.shape[-1])
        if int(params[0].shape[0]) != gates * hidden:
            return NotImplemented
        drop = bool(train) and float(dropout) > 0.0
        spec = (mode, hidden, int(num_layers), directions, bool(batch_first), bool(train), drop)
        out, hy, cy = _CudnnRNN.apply(spec, input, h, c, *params)
        return (out, hy, cy) if mode == "lstm" else (out, hy)

    return run


# Names replaced while a GPU target's fake run is on: (module, name) -> what the GPU runs (NotImplemented
# where that does not apply), for the original's arguments.
_GPU_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch.nn.functional", "scaled_dot_product_attention"): _gpu_sdpa,
    ("torch.nn.functional", "dropout"): _gpu_dropout,
    ("torch", "_native_multi_head_attention"): _gpu_mha,
    ("torch", "_transformer_encoder_layer_fwd"): _gpu_encoder_layer,
    **{("torch._VF", mode): _gpu_rnn(mode) for mode in _RNN_MODES},
}
_ORIGINALS: dict[tuple[str, str], Any] = {}
_OWN: dict[tuple[str, str], bool] = {}  # whether the name was the module's own attribute


def _module(name: str) -> Any:
    return {"torch.nn.functional": torch.nn.functional, "torch._VF": torch._VF}.get(name, torch)


_CANNOT_RUN = (AttributeError, TypeError, NotImplementedError, RuntimeError)


def _cannot_run(exc: BaseException) -> bool:
    """Whether ``exc`` says the GPU's kernel cannot run here (an op, a signature or a fake kernel this torch
    lacks), so that torch's own may run instead.

    Not what code the stand-in calls back raises through it: autograd's saved-tensor hooks run inside
    its ops, and activation checkpointing's recompute raises from them on purpose (a plain ``Exception``,
    ``_StopRecomputationError``, once every tensor the forward saved is recomputed; a ``CheckpointError``
    on a mismatch). Running torch's own kernel after that saves its tensors a second time: checkpoint's
    ``AssertionError: Unexpected state: target_frame.early_stop is set`` (GPT-2, whose blocks end in a
    dropout, with ``checkpoint=``)."""
    if not isinstance(exc, _CANNOT_RUN) or type(exc).__module__.startswith("torch.utils.checkpoint"):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            return False
        tb = tb.tb_next
    return True


def _stand_in(where: tuple[str, str]) -> Callable[..., Any]:
    gpu = _GPU_FUNCTIONS[where]
    needs_sm = gpu is _gpu_sdpa

    def hook(*args: Any, **kwargs: Any) -> Any:
        """Stands in for a torch function while a GPU target's fake run is on: on that run's thread,
        what the GPU runs; anywhere else (and on any failure), torch's own."""
        original = _ORIGINALS[where]
        sm = getattr(_GPU, "sm", None)
        if sm is not None:
            try:
                out = gpu(sm, *args, **kwargs) if needs_sm else gpu(*args, **kwargs)
            except Exception as exc:
                if not _cannot_run(exc):  # raised through the stand-in (a saved-tensor hook): not ours
                    raise
                # an op or a signature this torch lacks: the CPU's choice, said once
                _STAND_IN_ERRORS.add(f"{where[1]}: {type(exc).__name__}: {str(exc)[:200]}")
                out = NotImplemented
            if out is not NotImplemented:
                return out
        return original(*args, **kwargs)

    hook.__name__ = where[1]
    hook.__torchmem_stand_in__ = True  # type: ignore[attr-defined]
    return hook


@contextmanager
def _gpu_kernels(sm: tuple[int, int] | None) -> Iterator[None]:
    """While on (this thread): the fake run takes the target GPU's kernels (see above). No-op for
    ``sm=None`` (a CPU-ledger comparison)."""
    if sm is None:
        yield
        return
    with _GPU_LOCK:
        if _GPU_USERS[0] == 0:
            for where in _GPU_FUNCTIONS:
                current = getattr(_module(where[0]), where[1], None)
                if current is None or getattr(current, "__torchmem_stand_in__", False):
                    continue
                _ORIGINALS[where] = current
                _OWN[where] = where[1] in vars(_module(where[0]))
                setattr(_module(where[0]), where[1], _stand_in(where))
        _GPU_USERS[0] += 1
    prev = getattr(_GPU, "sm", None)
    _GPU.sm = sm
    held = getattr(_GPU, "held", None)
    _GPU.held = {}  # buffers a GPU library keeps for the process (cuDNN's dropout state): this run's
    try:
        yield
    finally:
        _GPU.sm = prev
        _GPU.held = held
        with _GPU_LOCK:
            _GPU_USERS[0] -= 1
            if _GPU_USERS[0] == 0:
                for where, original in list(_ORIGINALS.items()):
                    if _OWN.get(where, True):
                        setattr(_module(where[0]), where[1], original)
                    else:  # torch._VF serves its functions through __getattr__: the stand-in goes
                        delattr(_module(where[0]), where[1])
                _ORIGINALS.clear()
                _OWN.clear()


def _foreach_like_cuda(opt: Any) -> None:
    """torch's optimizers default to their foreach (multi-tensor) implementation for CUDA parameters and
    to per-parameter loops on the CPU; the foreach one holds a temporary the size of the parameters (e.g.
    Adam's ``sqrt(exp_avg_sq)`` for all of them at once). Set it where the user left the default."""
    for group in getattr(opt, "param_groups", ()):
        default = "foreach" in group and group["foreach"] is None
        if default and not group.get("fused") and not group.get("differentiable"):
            group["foreach"] = True
