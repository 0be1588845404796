"""Weight initialisation schemes.

- `xavier` (Vaswani et al. 2017, as in the reference tensor2tensor / Annotated Transformer code):
  Xavier-uniform for every weight matrix and embedding, zero biases.
- `gpt2` (Radford et al. 2019): normal(0, 0.02) everywhere, residual output projections (attention out_proj,
  FFN down_proj) scaled by 1/sqrt(2 * n_layers), zero biases.
- DeepNorm (Wang et al. 2022) additionally scales FFN, value and output projections by beta, on top of either.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from archsweep.variants.attention import CrossAttention, SelfAttention
from archsweep.variants.embedding import LMHead, TokenEmbedding
from archsweep.variants.ffn import FeedForward, GatedFeedForward
from archsweep.variants.pos import LearnedPosition, RelativeBias


def deepnorm_constants(kind: str, n_layers: int, n_decoder_layers: int) -> dict[str, tuple[float, float]]:
    """(alpha, beta) per stack, from DeepNet (Wang et al. 2022), figure 2."""
    if kind != "encoder_decoder":
        return {"stack": ((2 * n_layers) ** 0.25, (8 * n_layers) ** -0.25)}
    n, m = n_layers, n_decoder_layers
    return {
        "encoder": (0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
    }


def init_weights(model: nn.Module, scheme: str, n_layers: int) -> None:
    def matrix(weight: torch.Tensor) -> None:
        if scheme == "xavier":
            nn.init.xavier_uniform_(weight)
        else:
            nn.init.normal_(weight, mean=0.0, std=0.02)

    for module in model.modules():
        if isinstance(module, nn.Linear):
            matrix(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, TokenEmbedding):
            matrix(module.weight)
        elif isinstance(module, LearnedPosition):
            matrix(module.table.weight)
        elif isinstance(module, RelativeBias):
            matrix(module.bias.weight)
        elif isinstance(module, LMHead):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    if scheme == "xavier":
        _split_fused_xavier(model)
    if scheme == "gpt2":
        std = 0.02 / math.sqrt(2 * n_layers)
        for name, param in model.named_parameters():
            if name.endswith(("out_proj.weight", "down_proj.weight")):
                nn.init.normal_(param, mean=0.0, std=std)


@torch.no_grad()
def _split_fused_xavier(model: nn.Module) -> None:
    """Fused q/k/v (and k/v) projections get Xavier fans of separate projections, as the paper's model has."""
    for module in model.modules():
        if isinstance(module, SelfAttention):
            q, kv = module.n_heads * module.head_dim, module.n_kv_heads * module.head_dim
            for part in module.qkv_proj.weight.split([q, kv, kv]):
                nn.init.xavier_uniform_(part)
        elif isinstance(module, CrossAttention):
            for part in module.kv_proj.weight.chunk(2):
                nn.init.xavier_uniform_(part)


@torch.no_grad()
def scale_for_deepnorm(stack: nn.Module, beta: float) -> None:
    """Scale the value, output and FFN projections of one stack by beta (queries and keys keep gain 1)."""
    for module in stack.modules():
        if isinstance(module, SelfAttention):
            v_start = (module.n_heads + module.n_kv_heads) * module.head_dim
            module.qkv_proj.weight[v_start:].mul_(beta)
            module.out_proj.weight.mul_(beta)
        elif isinstance(module, CrossAttention):
            module.kv_proj.weight[module.n_kv_heads * module.head_dim:].mul_(beta)
            module.out_proj.weight.mul_(beta)
        elif isinstance(module, (FeedForward, GatedFeedForward)):
            for linear in module.modules():
                if isinstance(linear, nn.Linear):
                    linear.weight.mul_(beta)
