"""Weight initialisation schemes.

- `xavier` (Vaswani et al. 2017, as in the reference tensor2tensor / Annotated Transformer code):
  Xavier-uniform for every weight matrix and embedding, zero biases.
- `gpt2` (Radford et al. 2019): normal(0, 0.02) everywhere, the matrices that write into the residual stream
  (role `hidden_out`, `roles.py`: attention out_proj, FFN down_proj) scaled by 1/sqrt(2 * n_layers), zero biases.

Every `nn.Embedding` (learned position tables, relative-bias tables) is initialised like a weight matrix. A module
with parameters of its own shape (stacked experts) initialises them itself: `init_parameters(scheme, n_layers)`
(`hooks.py`), called after these rules. Norm placements may rescale their sublayers afterwards (DeepNorm,
`norm/deepnorm.py`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from archsweep.variants.embedding import LMHead, TokenEmbedding
from archsweep.variants.roles import HIDDEN_OUT, parameter_roles


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
    for module in model.modules():
        fused = getattr(module, "init_fused", None)
        if callable(fused):
            fused(scheme)
    if scheme == "gpt2":
        std = 0.02 / math.sqrt(2 * n_layers)
        roles = parameter_roles(model, strict=False)
        for name, param in model.named_parameters():
            if roles.get(name) == HIDDEN_OUT:  # the matrices that write into the residual stream
                nn.init.normal_(param, mean=0.0, std=std)
    for module in model.modules():
        own = getattr(module, "init_parameters", None)
        if callable(own):
            own(scheme, n_layers)
