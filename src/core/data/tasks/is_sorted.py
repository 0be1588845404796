"""`is_sorted`: sequence classification, the encoder_only task of its own. Is the sequence in non-decreasing
order? Half the examples are sorted; the other half are sorted sequences with one adjacent pair of different
tokens swapped, so the answer hinges on comparing neighbours, by content and position. encoder_only reads
`[BOS] tokens` and classifies from its pooled head (model.n_classes=2); encoder_decoder and decoder_only answer
with one token, `yes` or `no`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from archsweep.core.data.tasks.synthetic import SyntheticTask
from archsweep.core.model.config import ModelConfig
from archsweep.variants.flops import Shape
from archsweep.variants.model import BIDIRECTIONAL, FORMS, form_of

if TYPE_CHECKING:
    from torch import Generator, Tensor, nn


def forward_classify(model: nn.Module, batch: dict[str, Any]) -> Tensor:
    return model.classify(batch["tokens"], batch["pad_mask"])[:, None, :]  # (B, 1, n_classes)


class IsSortedTask(SyntheticTask):
    name = "is_sorted"
    forms = FORMS
    family = "classification"
    aligned = True  # served by encoder_only, as a classifier
    n_classes = 2

    def __init__(self, n_symbols: int, min_len: int, max_len: int, batch_size: int, val_batches: int,
                 test_batches: int, eval_seed: int, long_max_len: int | None = None) -> None:
        if not isinstance(n_symbols, int) or n_symbols < 2:
            raise ValueError(f"task.n_symbols={n_symbols!r} must be at least 2")
        if min_len < 2:
            raise ValueError(f"task.min_len={min_len} must be at least 2 (a shorter sequence is always sorted)")
        super().__init__(n_symbols + 2, min_len, max_len, batch_size, val_batches, test_batches, eval_seed,
                         long_max_len)
        self.n_content = n_symbols
        self.no_id, self.yes_id = self.first_symbol + n_symbols, self.first_symbol + n_symbols + 1

    def model_fields(self) -> dict[str, Any]:
        return {**super().model_fields(), "n_classes": self.n_classes}

    def check_model(self, cfg: ModelConfig) -> None:
        super().check_model(cfg)
        if form_of(cfg.kind) == BIDIRECTIONAL and cfg.n_classes != self.n_classes:
            raise ValueError(f"model.n_classes={cfg.n_classes} does not match task={self.name}, which has "
                             f"{self.n_classes} classes (sorted or not); set model.n_classes={self.n_classes}")

    def longest(self) -> tuple[int, int]:
        return self.long_max_len + 1, 1  # encoder_only reads a leading BOS

    def symbol(self, token: int) -> str:
        return {self.no_id: "no", self.yes_id: "yes"}.get(token, str(token - self.first_symbol))

    def forward_fn(self, kind: str) -> Callable[[nn.Module, dict[str, Any]], Tensor]:
        return forward_classify if form_of(kind) == BIDIRECTIONAL else super().forward_fn(kind)

    def flop_shape(self, kind: str) -> Shape:
        shape = super().flop_shape(kind)
        return shape.replace(pooled=True) if form_of(kind) == BIDIRECTIONAL else shape  # BOS + source, one label

    def examples(self, gen: Generator, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        import torch

        b = self.batch_size
        src_len = torch.randint(lo, hi + 1, (b,), generator=gen)
        width = int(src_len.max())
        real = torch.arange(width)[None, :] < src_len[:, None]  # (B, S)
        draw = torch.randint(self.first_symbol, self.first_symbol + self.n_content, (b, width), generator=gen)
        src = draw.masked_fill(~real, self.vocab_size).sort(dim=1).values  # sorted, padding last
        spoil = torch.rand(b, generator=gen) < 0.5
        weights = (src[:, 1:] != src[:, :-1]) & real[:, 1:]  # (B, S - 1): swappable neighbour pairs
        none = ~weights.any(1, keepdim=True)  # all tokens equal: nothing to swap (the row stays sorted)
        at = torch.multinomial((weights | none).float(), 1, generator=gen)[:, 0]  # (B,)
        rows = torch.arange(b)[spoil & weights.any(1)]
        left, right = src[rows, at[rows]], src[rows, at[rows] + 1]
        src[rows, at[rows]], src[rows, at[rows] + 1] = right, left
        src = src.masked_fill(~real, self.pad_id)
        ordered = ((src[:, 1:] >= src[:, :-1]) | ~real[:, 1:]).all(dim=1)  # (B,) the honest label
        tgt = torch.where(ordered, self.yes_id, self.no_id)[:, None]  # (B, 1)
        return src, src_len, tgt, torch.ones(b, dtype=torch.long)

    def make_batch(self, seed: int, kind: str, split: str = "train") -> dict[str, Any]:
        if form_of(kind) != BIDIRECTIONAL:
            return super().make_batch(seed, kind, split)
        import torch

        from archsweep.core.data.tasks import batches

        gen = torch.Generator().manual_seed(seed)
        src, src_len, answer, _ = self.examples(gen, *self.lengths(split))
        tokens = torch.cat([torch.full_like(src[:, :1], self.bos_id), src], dim=1)  # (B, 1 + S): BOS as CLS
        lengths = src_len + 1
        return {"tokens": tokens, "pad_mask": batches.length_mask(lengths, tokens.shape[1]),
                "labels": (answer == self.yes_id).long(), "src_len": src_len, "n_tokens": int(lengths.sum())}
