"""Weight initialisation schemes.

- `xavier` (Vaswani et al. 2017, as in the reference tensor2tensor / Annotated Transformer code):
  Xavier-uniform for every weight matrix and embedding, zero biases.
- `gpt2` (Radford et al. 2019): normal(0, 0.02) everywhere, residual output projections (attention out_proj,
  FFN down_proj) scaled by 1/sqrt(2 * n_layers), zero biases.

Every `nn.Embedding` (learned position tables, relative-bias tables) is initialised like a weight matrix. A module
with parameters of its own shape (stacked experts) initialises them itself: `init_parameters(scheme, n_layers)`
(`hooks.py`), called after these rules. Norm placements may rescale their sublayers afterwards (DeepNorm,
`norm/deepnorm.py`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from archsweep.variants.attention.layers import CrossAttention, SelfAttention
from archsweep.variants.embedding import LMHead, TokenEmbedding


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
        elif isinstance(module, nn.Embedding):
            matrix(module.weight)
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
    for module in model.modules():
        own = getattr(module, "init_parameters", None)
        if callable(own):
            own(scheme, n_layers)


@torch.no_grad()
def _split_fused_xavier(model: nn.Module) -> None:
    """Fused q/k/v (and k/v) projections get Xavier fans of separate projections, as the paper's model has."""
    for module in model.modules():
        if isinstance(module, SelfAttention) and module.qkv_proj is not None:  # latent attention has none
            q, kv = module.n_heads * module.head_dim, module.n_kv_heads * module.head_dim
            for part in module.qkv_proj.weight.split([q, kv, kv]):
                nn.init.xavier_uniform_(part)
        elif isinstance(module, CrossAttention):
            for part in module.kv_proj.weight.chunk(2):
                nn.init.xavier_uniform_(part)
