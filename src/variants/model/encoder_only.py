"""`encoder_only` (Devlin et al. 2019, BERT): one bidirectional stack with a token-level head (masked-token
prediction) and a pooled sequence head (classification): the first token through dense + tanh as BERT does,
or the mean over real tokens."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archsweep.variants.blocks import Stack
from archsweep.variants.embedding import LMHead
from archsweep.variants.flops import Shape, forward_flops
from archsweep.variants.model import BIDIRECTIONAL, KIND
from archsweep.variants.model.base import ModelKind, Parts
from archsweep.variants.plugins.base import OutputPlugins
from archsweep.variants.roles import HEAD

POOLINGS = ("cls", "mean")  # first token through dense + tanh (BERT), or the mean over real tokens


@KIND.register("encoder_only")
class EncoderOnly(ModelKind):
    form = BIDIRECTIONAL

    def roles(self) -> dict[str, str]:
        return {"classifier.weight": HEAD}

    @classmethod
    def assemble(cls, parts: Parts) -> EncoderOnly:
        s = parts.sizes
        embed = parts.embedding(s["vocab_size"])
        head = parts.head(embed)
        stack = parts.stack("stack", embed, s["n_layers"], causal=False, cross=False)
        return cls(stack, head, s["d_model"], s["n_classes"], s["pooling"], parts.output_plugins())

    @classmethod
    def check(cls, sizes, options) -> None:
        if sizes["pooling"] not in POOLINGS:
            raise ValueError(f"pooling={sizes['pooling']!r} is not a known option; valid options: "
                             f"{', '.join(POOLINGS)}")

    def __init__(self, encoder: Stack, head: LMHead, d_model: int, n_classes: int, pooling: str,
                 plugins: OutputPlugins | None = None) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head
        self.pooling = pooling
        self.pool_proj = nn.Linear(d_model, d_model) if pooling == "cls" else None
        self.classifier = nn.Linear(d_model, n_classes)
        self.class_plugins = plugins if plugins is not None else OutputPlugins()  # as the token head's

    def encode(self, tokens: Tensor, pad_mask: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        """doc_ids (B, T): a token attends only within its document; positions restart per document."""
        return self.encoder(tokens, pad_mask=pad_mask, doc_ids=doc_ids)  # (B, T, D)

    def forward(self, tokens: Tensor, pad_mask: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        """Token-level logits (B, T, V)."""
        return self.head(self.encode(tokens, pad_mask, doc_ids))

    def classify(self, tokens: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """Sequence-level logits (B, n_classes)."""
        hidden = self.encode(tokens, pad_mask)
        if self.pool_proj is not None:
            pooled = torch.tanh(self.pool_proj(hidden[:, 0]))  # (B, D)
        elif pad_mask is None:
            pooled = hidden.mean(dim=1)
        else:
            weights = pad_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.class_plugins(self.classifier(pooled))

    def flops(self, shape: Shape) -> float:
        """The stack, then the token head at every position, or (`shape.pooled`, `classify`) the pooling and the
        classifier once per sequence."""
        if not shape.pooled:
            return forward_flops(self.encoder, shape) + forward_flops(self.head, shape)
        once = Shape(shape.batch, 1)
        pool = forward_flops(self.pool_proj, once) if self.pool_proj is not None else 0.0
        return forward_flops(self.encoder, shape) + pool + forward_flops(self.classifier, once)
