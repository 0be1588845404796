"""Multi-head attention layers (Vaswani et al. 2017, section 3.2), with grouped-query key/value heads (Ainslie
et al. 2023; one head is multi-query, Shazeer 2019): the projections around an attention kind.

Self-attention hands its queries, keys and values to the layer's `kernel` (the `attention` axis: full softmax,
sliding window, linear, Performer). Cross-attention is always full softmax attention over the encoder output.
Inside `capture_attention(model)` each layer records its attention probabilities for visualisation.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor, nn

from archsweep.variants.attention.base import AttentionKernel, AttnContext, attend
from archsweep.variants.cache import KVCache
from archsweep.variants.flops import Shape, children_flops, linear_flops
from archsweep.variants.param.base import ForwardScales
from archsweep.variants.plugins.base import AttentionPlugin, hooks_of
from archsweep.variants.roles import HIDDEN_OUT


class Attention(nn.Module):
    """Shared sizes, output projection and plug-ins (`plugins/base.py`: `AttentionPlugin`) of self- and
    cross-attention. The plug-ins are registered before the input projections, so they initialise in that order."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int,
                 plugins: Mapping[str, AttentionPlugin] | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.layer = layer  # index into the KV cache
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.plugins = nn.ModuleDict(plugins or {})
        hooks = hooks_of(self.plugins, AttentionPlugin)  # names per hook: no plug-in, no call
        self.qk_hooks, self.value_hooks, self.output_hooks = hooks["qk"], hooks["values"], hooks["output"]
        self.score_hooks, self.sink_hook = hooks["score_mod"], hooks["sink"]
        if len(self.sink_hook) > 1:
            raise ValueError(f"plug-ins {' and '.join(self.sink_hook)} both add a sink logit; choose one")
        self.record: list[Tensor] | None = None  # set by capture_attention
        self.score_scale = 1.0  # a parametrisation's factor on the scores (`scale_forward`), applied to the queries

    def split_heads(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, Dh)

    def merge_heads(self, y: Tensor) -> Tensor:
        b, _, t, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))  # (B, T, D)

    def p_drop(self) -> float:
        return self.dropout if self.training else 0.0

    def roles(self) -> dict[str, str]:
        return {"out_proj.weight": HIDDEN_OUT} if self.out_proj is not None else {}

    def scale_forward(self, scales: ForwardScales) -> None:
        self.score_scale = scales.scores

    def scale_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The score factor split evenly between queries and keys (the scores are the same as from scaling the
        queries alone; a kernel feature map (Performer) then sees keys and queries of one size at every width)."""
        if self.score_scale == 1.0:
            return q, k
        root = self.score_scale ** 0.5
        return q * root, k * root

    def norm_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        for name in self.qk_hooks:
            q, k = self.plugins[name].qk(q, k)
        return q, k

    def score_mod(self) -> Callable[[Tensor], Tensor] | None:
        """The plug-ins' `score_mod`, one after another; None when no plug-in has one (SDPA's fast path)."""
        if not self.score_hooks:
            return None
        if len(self.score_hooks) == 1:
            return self.plugins[self.score_hooks[0]].score_mod
        mods = [self.plugins[name].score_mod for name in self.score_hooks]
        return functools.partial(_chain, mods)


def _chain(mods: list[Callable[[Tensor], Tensor]], scores: Tensor) -> Tensor:
    for mod in mods:
        scores = mod(scores)
    return scores


class SelfAttention(Attention):
    """Self-attention of the chosen kind (`kernel`), with its plug-ins called at their hooks: `qk` after the
    rotation, `values` before attending, `score_mod` and `sink` inside the kernel, `output` before the output
    projection."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int,
                 kernel: AttentionKernel, plugins: Mapping[str, AttentionPlugin] | None = None) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, dropout, bias, layer, plugins)
        if kernel.projects:  # latent attention: the kind projects the input and its output itself
            self.qkv_proj = self.out_proj = None
        else:
            self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.kernel = kernel

    def forward(self, x: Tensor, ctx: AttnContext) -> Tensor:
        ctx.sink = self.plugins[self.sink_hook[0]].sink() if self.sink_hook else None
        ctx.score_mod = self.score_mod()
        if self.qkv_proj is None:
            return self.kernel.project_attend(x, ctx, self.p_drop(), self.record)
        q, k, v = self.split_qkv(self.qkv_proj(x))
        q, k = ctx.rotate_qk(q, k, ctx.positions)
        if self.qk_hooks:
            q, k = self.norm_qk(q, k)
        q, k = self.scale_qk(q, k)
        for name in self.value_hooks:
            v = self.plugins[name].values(v, ctx)
        y = self.kernel(q, k, v, ctx, self.p_drop(), self.record)  # (B, H, T, Dh)
        for name in self.output_hooks:
            y = self.plugins[name].output(x, y)
        return self.merge_heads(y)

    def value_output_weights(self) -> list[Tensor]:
        """The matrices that make values and the output (DeepNorm scales them): the value rows of the fused
        projection and out_proj; a kind that projects itself says its own."""
        if self.qkv_proj is None:
            return self.kernel.value_output_weights()
        return [self.qkv_proj.weight[(self.n_heads + self.n_kv_heads) * self.head_dim:], self.out_proj.weight]

    @torch.no_grad()
    def init_fused(self, scheme: str) -> None:
        """Xavier (the 2017 paper's scheme): the fused q, k, v rows get the fans of separate projections."""
        if scheme == "xavier" and self.qkv_proj is not None:
            q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            for part in self.qkv_proj.weight.split([q, kv, kv]):
                nn.init.xavier_uniform_(part)

    def split_qkv(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, (H + 2 Hkv) Dh) -> q (B, H, T, Dh), k and v (B, Hkv, T, Dh); the same values either way."""
        h, hkv = self.n_heads, self.n_kv_heads
        if torch.is_grad_enabled():  # features first: backward concatenates the gradients in qkv's layout, no copy
            q, k, v = qkv.split([h * self.head_dim, hkv * self.head_dim, hkv * self.head_dim], dim=-1)
            return self.split_heads(q, h), self.split_heads(k, hkv), self.split_heads(v, hkv)
        # inference: one view, transpose and split (per-op cost is most of a one-token decoding step)
        q, k, v = self.split_heads(qkv, h + 2 * hkv).split([h, hkv, hkv], dim=1)
        return q, k, v

    def flops(self, shape: Shape) -> float:
        """Projections per token, and the kernel's core over the keys each query sees."""
        core = self.kernel.flops_per_token(shape.length, shape.causal, self.n_heads, self.head_dim)
        return children_flops(self, shape, skip=(self.kernel,)) + core * shape.tokens


class CrossAttention(Attention):
    """Decoder queries over encoder output ("memory"); no positional encoding acts here, as in T5. Plug-ins built
    for it (`cross`) act at `qk` and `score_mod`."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int,
                 plugins: Mapping[str, AttentionPlugin] | None = None) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, dropout, bias, layer, plugins)
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=bias)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None, cache: KVCache | None) -> Tensor:
        q = self.split_heads(self.q_proj(x), self.n_heads)
        if cache is not None and self.layer in cache.cross:
            k, v = cache.cross[self.layer]  # projected once per sequence; the plug-ins act on every call
        else:
            k, v = self.kv_proj(memory).chunk(2, dim=-1)
            k, v = self.split_heads(k, self.n_kv_heads), self.split_heads(v, self.n_kv_heads)
            if cache is not None:
                cache.cross[self.layer] = (k, v)
        if self.qk_hooks:
            q, k = self.norm_qk(q, k)
        q, k = self.scale_qk(q, k)
        return self.merge_heads(attend(q, k, v, mask, False, self.p_drop(), self.record, self.score_mod()))

    def value_output_weights(self) -> list[Tensor]:
        return [self.kv_proj.weight[self.n_kv_heads * self.head_dim:], self.out_proj.weight]

    @torch.no_grad()
    def init_fused(self, scheme: str) -> None:
        """Xavier: the fused k, v rows get the fans of separate projections."""
        if scheme == "xavier":
            for part in self.kv_proj.weight.chunk(2):
                nn.init.xavier_uniform_(part)

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
