"""Multi-head attention layers (Vaswani et al. 2017, section 3.2), with grouped-query key/value heads (Ainslie
et al. 2023; one head is multi-query, Shazeer 2019): the projections around an attention kind.

Self-attention hands its queries, keys and values to the layer's `kernel` (the `attention` axis: full softmax,
sliding window, linear, Performer). Cross-attention is always full softmax attention over the encoder output.
Inside `capture_attention(model)` each layer records its attention probabilities for visualisation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from archsweep.variants.attention.base import AttentionKernel, AttnContext, attend
from archsweep.variants.attention.gates import AttentionSink, OutputGate
from archsweep.variants.cache import KVCache
from archsweep.variants.flops import Shape, children_flops, linear_flops


class Attention(nn.Module):
    """Shared sizes and output projection of self- and cross-attention."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int,
                 qk_norm: Callable[[int], nn.Module] | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.layer = layer  # index into the KV cache
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        # QK-norm (Dehghani et al. 2023; OLMo-2): queries and keys normalised per head over Dh, after rotary
        self.q_norm = qk_norm(self.head_dim) if qk_norm is not None else nn.Identity()
        self.k_norm = qk_norm(self.head_dim) if qk_norm is not None else nn.Identity()
        self.qk_norm = qk_norm is not None  # off: no Identity calls (a module call is measurable when decoding)
        self.record: list[Tensor] | None = None  # set by capture_attention

    def split_heads(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, Dh)

    def merge_heads(self, y: Tensor) -> Tensor:
        b, _, t, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))  # (B, T, D)

    def p_drop(self) -> float:
        return self.dropout if self.training else 0.0


class SelfAttention(Attention):
    """`value_residual` (ResFormer, Zhou et al. 2024, arXiv 2410.17897): every layer after the first mixes its
    values with the first layer's, v_n <- lambda1 v_n + lambda2 v_1, before attending (so the KV cache and every
    attention kind see the mixed values). "fixed": lambda1 = 1 - lambda2, lambda2 = `value_lambda` (the paper's
    1/2, 1/2); "learnable" (the paper's Learnable-ResFormer; modded-nanogpt learns them too): two scalars per
    layer, starting there; None: off. `gate` and `sink` (gates.py): an output gate per head or channel, and a sink
    logit per head in the softmax denominator; "none": off."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int,
                 kernel: AttentionKernel, qk_norm: Callable[[int], nn.Module] | None = None,
                 value_residual: str | None = None, value_lambda: float = 0.5, gate: str = "none",
                 sink: str = "none") -> None:
        super().__init__(d_model, n_heads, n_kv_heads, dropout, bias, layer, qk_norm)
        self.gate = OutputGate(d_model, n_heads, self.head_dim, gate, bias) if gate != "none" else None
        self.sink = AttentionSink(n_heads, self.head_dim, sink) if sink != "none" else None
        if kernel.projects:  # latent attention: the kind projects the input and its output itself
            self.qkv_proj = self.out_proj = None
        else:
            self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.kernel = kernel
        self.value_residual = value_residual
        lambdas = torch.tensor([1.0 - value_lambda, value_lambda])  # (lambda1, lambda2)
        if value_residual == "learnable" and layer > 0:
            self.value_lambdas = nn.Parameter(lambdas)
        else:
            self.register_buffer("value_lambdas", lambdas, persistent=False)

    def forward(self, x: Tensor, ctx: AttnContext) -> Tensor:
        ctx.sink = self.sink.logits if self.sink is not None else None
        if self.qkv_proj is None:
            return self.kernel.project_attend(x, ctx, self.p_drop(), self.record)
        q, k, v = self.split_qkv(self.qkv_proj(x))
        q, k = ctx.rotate_qk(q, k, ctx.positions)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.value_residual is not None:
            v = self.mix_values(v, ctx)
        y = self.kernel(q, k, v, ctx, self.p_drop(), self.record)  # (B, H, T, Dh)
        return self.merge_heads(y if self.gate is None else self.gate(x, y))

    def split_qkv(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, (H + 2 Hkv) Dh) -> q (B, H, T, Dh), k and v (B, Hkv, T, Dh); the same values either way."""
        h, hkv = self.n_heads, self.n_kv_heads
        if torch.is_grad_enabled():  # features first: backward concatenates the gradients in qkv's layout, no copy
            q, k, v = qkv.split([h * self.head_dim, hkv * self.head_dim, hkv * self.head_dim], dim=-1)
            return self.split_heads(q, h), self.split_heads(k, hkv), self.split_heads(v, hkv)
        # inference: one view, transpose and split (per-op cost is most of a one-token decoding step)
        q, k, v = self.split_heads(qkv, h + 2 * hkv).split([h, hkv, hkv], dim=1)
        return q, k, v

    def mix_values(self, v: Tensor, ctx: AttnContext) -> Tensor:
        """The first layer keeps its values for the others; a later one returns lambda1 v + lambda2 v_1. Values
        are mixed per token, so a decoding step needs only the first layer's values of its own new tokens."""
        if self.layer == 0:
            ctx.first_values = v  # (B, Hkv, T, Dh)
            return v
        return self.value_lambdas[0] * v + self.value_lambdas[1] * ctx.first_values

    def flops(self, shape: Shape) -> float:
        """Projections per token, and the kernel's core over the keys each query sees."""
        core = self.kernel.flops_per_token(shape.length, shape.causal, self.n_heads, self.head_dim)
        return children_flops(self, shape, skip=(self.kernel,)) + core * shape.tokens


class CrossAttention(Attention):
    """Decoder queries over encoder output ("memory"); no positional encoding acts here, as in T5."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int,
                 qk_norm: Callable[[int], nn.Module] | None = None, softcap: float | None = None) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, dropout, bias, layer, qk_norm)
        self.softcap = softcap
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=bias)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None, cache: KVCache | None) -> Tensor:
        q = self.split_heads(self.q_proj(x), self.n_heads)
        q = self.q_norm(q) if self.qk_norm else q
        if cache is not None and self.layer in cache.cross:
            k, v = cache.cross[self.layer]
        else:
            k, v = self.kv_proj(memory).chunk(2, dim=-1)
            k, v = self.k_norm(self.split_heads(k, self.n_kv_heads)), self.split_heads(v, self.n_kv_heads)
            if cache is not None:
                cache.cross[self.layer] = (k, v)
        return self.merge_heads(attend(q, k, v, mask, False, self.p_drop(), self.record, self.softcap))

    def flops(self, shape: Shape) -> float:
        """Queries and output per decoder token; keys and values per encoder position; each query scores and
        weights all `shape.memory` encoder positions (no causal mask here)."""
        memory_tokens = shape.batch * shape.memory
        core = 4.0 * self.n_heads * self.head_dim * shape.memory * shape.tokens
        return children_flops(self, shape, skip=(self.kv_proj,)) + linear_flops(self.kv_proj, memory_tokens) + core


@contextlib.contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Record attention probabilities of every attention module while the block runs.

    Yields {module name: [probabilities (B, H, Tq, Tk) for each forward call]}; names look like
    `decoder.blocks.0.self_attn`. Uses the explicit (slower) path; outputs equal the fast path. Kernel kinds
    (linear, Performer) record the weights they imply, which costs their T x T matrix.
    """
    captured: dict[str, list[Tensor]] = {}
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, Attention)]
    for name, module in modules:
        module.record = captured.setdefault(name, [])
    try:
        yield captured
    finally:
        for _, module in modules:
            module.record = None
