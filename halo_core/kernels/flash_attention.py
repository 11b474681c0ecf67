"""FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL) for transformers' own ``attn_implementation: flash_attention_4``.

transformers names FA4 ``flash_attention_4`` and runs it through ``flash_attn.cute``'s autograd function. That road
costs a compiled step two things: dynamo cannot trace the CuTe DSL's compiled callables, so under ``compile_layers``
each decoder layer breaks into several graphs around attention, and transformers asks the position ids whether
documents are packed with a host read-back in every layer. This module is the fix: FA4's forward and backward as
PyTorch custom operators (output shapes given to the tracer), and ``attention_forward``, which takes one causal
sequence a row with no padding mask through them and hands every other case (padding masks, packed documents,
sliding windows, dropout, soft-capping) to transformers' function unchanged. ``runtime.use_attention`` registers it
under transformers' name for a run with the key: on one H100 (``bench/attention_in_model.py``, benchmarks.md) a
compiled 3B-MoE step ran 1.24x transformers' road at 4,096 tokens and 1.02x at 32,768, with the same hidden states;
``unavailable_reason`` is the check before start.
"""

from importlib import metadata, util
from typing import Optional

import torch

IMPLEMENTATION = "flash_attention_4"
DISTRIBUTION = "flash-attn-4"
#: FlashAttention-4's backward runs on compute capability 9.x (Hopper) and newer.
MIN_CAPABILITY = (9, 0)

#: Whether a row may hold several packed documents (then position ids decide, in transformers' function).
_packed_documents = True


@torch.library.custom_op("halo::flash_attention_4", mutates_args=(), device_types="cuda")
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: Optional[torch.Tensor], scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, S, H, D] query, [B, S, Hkv, D] key and value (grouped heads allowed) -> output [B, S, H, D], log-sum-exp [B, H, S]."""
    from flash_attn.cute.interface import _flash_attn_fwd

    out, lse = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, learnable_sink=sink, return_lse=True)[:2]
    return out, lse


@_forward.register_fake
def _(q, k, v, sink, scale, causal):
    b, s, h, _ = q.shape
    return q.new_empty(b, s, h, v.shape[-1]), q.new_empty(b, h, s, dtype=torch.float32)


@torch.library.custom_op("halo::flash_attention_4_backward", mutates_args=(), device_types="cuda")
def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
              sink: Optional[torch.Tensor], scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of query, key, value and the sinks (an empty tensor when there are none)."""
    from flash_attn.cute.interface import _flash_attn_bwd

    grads = _flash_attn_bwd(q, k, v, out, dout.contiguous(), lse, scale, causal, learnable_sink=sink)
    dsink = grads[3] if sink is not None else q.new_empty(0)
    return grads[0], grads[1], grads[2], dsink


@_backward.register_fake
def _(dout, q, k, v, out, lse, sink, scale, causal):
    dsink = torch.empty_like(sink) if sink is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


def _setup_context(ctx, inputs, output):
    q, k, v, sink, scale, causal = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], sink)
    ctx.scale, ctx.causal = scale, causal


def _backward_rule(ctx, dout, dlse):
    q, k, v, out, lse, sink = ctx.saved_tensors
    dq, dk, dv, dsink = _backward(dout, q, k, v, out, lse, sink, ctx.scale, ctx.causal)
    return dq, dk, dv, (dsink if sink is not None else None), None, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None, is_causal: Optional[bool] = None,
                      s_aux: Optional[torch.Tensor] = None, **kwargs):
    """transformers' attention-function signature ([B, H, S, D] in, [B, S, H, D] out); FA4 through the operators above
    for one unpadded causal sequence a row, else transformers' ``flash_attention_forward`` with the same arguments."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (attention_mask is not None or dropout or sliding_window or softcap or not causal or query.shape[2] != key.shape[2]
            or kwargs.get("cu_seq_lens_q") is not None or (_packed_documents and kwargs.get("position_ids") is not None)):
        from transformers.integrations.flash_attention import flash_attention_forward

        return flash_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                       sliding_window=sliding_window, softcap=softcap, is_causal=is_causal, s_aux=s_aux, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    sink = s_aux.to(query.dtype) if s_aux is not None else None  # as transformers hands FA its sinks
    out, _ = _forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), sink, scale, True)
    return out, None


def register(packed_documents: bool) -> None:
    """Put ``attention_forward`` under ``flash_attention_4`` in transformers' attention registry (process-wide)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    global _packed_documents
    _packed_documents = packed_documents
    ALL_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, attention_forward)


def unavailable_reason() -> Optional[str]:
    """Why ``flash_attention_4`` cannot run here, or ``None``. Reads the device's properties, which creates no CUDA
    context (the launcher's workers come from a fork server)."""
    if not torch.cuda.is_available():
        return "it needs a CUDA GPU of compute capability 9.0 or newer (Hopper); none is visible here"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        return f"FlashAttention-4 needs compute capability 9.0 or newer (Hopper), and this GPU is {capability[0]}.{capability[1]}"
    try:
        metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"{DISTRIBUTION} is not installed; pip install 'halo-core[fa4]'"
    if util.find_spec("flash_attn") is None:
        return f"{DISTRIBUTION} is installed but flash_attn does not import from this Python"
    return None
