"""Turning sequence pairs into the batch each model kind takes, on the CPU, plus the generic batch stream.

A pair batch is src (B, S) and tgt (B, T), right-padded, with lengths src_len (B,) and tgt_len (B,); tgt ends
with EOS. Masks are True at real tokens and are set to None when a batch has no padding, so attention can use
its fast causal kernel; that decision is made here, on the CPU, never in the training step. Every batch keeps
`src_len` (real source tokens per row) for metrics by source length.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from archsweep.core.data.tasks.base import IGNORE_INDEX
from archsweep.variants.model.decoder_only import pack_prefix_lm

Batch = dict[str, Any]


def length_mask(lengths: Tensor, width: int) -> Tensor | None:
    """(B,) lengths -> (B, width) bool mask True at real tokens, or None when every row is full."""
    if bool((lengths == width).all()):
        return None
    return torch.arange(width)[None, :] < lengths[:, None]


def encoder_decoder_batch(src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor, pad_id: int,
                          bos_id: int) -> Batch:
    """Teacher forcing: the decoder reads BOS + tgt[:-1] and predicts tgt."""
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], bos_id), tgt[:, :-1]], dim=1)  # (B, T)
    labels = tgt.masked_fill(tgt == pad_id, IGNORE_INDEX)
    return {"src": src, "src_mask": length_mask(src_len, src.shape[1]), "tgt_in": tgt_in,
            "tgt_mask": length_mask(tgt_len, tgt.shape[1]), "labels": labels, "src_len": src_len,
            "n_tokens": int(src_len.sum() + tgt_len.sum())}


def decoder_only_batch(src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor, pad_id: int,
                       sep_id: int) -> Batch:
    """Prefix LM: `src SEP tgt` in one row, loss on the target tokens only."""
    src_mask = torch.arange(src.shape[1])[None, :] < src_len[:, None]
    tgt_mask = torch.arange(tgt.shape[1])[None, :] < tgt_len[:, None]
    tokens, labels, pad_mask = pack_prefix_lm(src, tgt, src_mask, tgt_mask, sep_id, pad_id, IGNORE_INDEX)
    lengths = pad_mask.sum(1)
    return {"tokens": tokens, "pad_mask": length_mask(lengths, tokens.shape[1]), "labels": labels,
            "src_len": src_len, "n_tokens": int(lengths.sum())}


def encoder_only_batch(src: Tensor, src_len: Tensor, tgt: Tensor, pad_id: int) -> Batch:
    """Token tagging for tasks whose target aligns with the source position by position (tgt = aligned + EOS)."""
    width = src.shape[1]
    labels = tgt[:, :width].masked_fill(src == pad_id, IGNORE_INDEX)  # (B, S); drops the EOS column
    return {"tokens": src, "pad_mask": length_mask(src_len, width), "labels": labels, "src_len": src_len,
            "n_tokens": int(src_len.sum())}


def batch_seed(seed: int, split: str, index: int) -> int:
    """A 63-bit seed that depends only on (seed, split, batch index): data position is a plain counter."""
    digest = hashlib.blake2b(f"{seed}/{split}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class BatchStream(IterableDataset):
    """Batch number i of this process is `make(i * world_size + rank)`, for i from `start` (resume) up to
    `n_batches` (None: endless)."""

    def __init__(self, make: Callable[[int], Batch], start: int, n_batches: int | None, rank: int,
                 world_size: int) -> None:
        super().__init__()
        self.make, self.start, self.n_batches = make, start, n_batches
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[Batch]:
        i = self.start
        while self.n_batches is None or i * self.world_size + self.rank < self.n_batches:
            yield self.make(i * self.world_size + self.rank)
            i += 1


def stream_loader(make: Callable[[int], Batch], start: int, n_batches: int | None, rank: int,
                  world_size: int) -> DataLoader:
    # batch_size=None: the dataset yields whole batches. Its own generator keeps iterator creation from
    # drawing on the global RNG.
    return DataLoader(BatchStream(make, start, n_batches, rank, world_size), batch_size=None,
                      generator=torch.Generator().manual_seed(0))
