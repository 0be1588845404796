"""`reverse`: a built-in sequence-to-sequence task, output the input tokens in reverse order.

Solvable only by attending to the right source position, so it exercises attention and positional encodings;
needs no files, and each batch is a pure function of (seed, split, batch index).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from src.core.tasks.base import SPLITS, Task


class ReverseTask(Task):
    name = "reverse"
    first_symbol = 4  # ids 0-3 are pad, bos, eos, sep

    def __init__(self, n_symbols: int, min_len: int, max_len: int, batch_size: int, val_batches: int,
                 test_batches: int, eval_seed: int) -> None:
        for field, value in [("n_symbols", n_symbols), ("min_len", min_len), ("batch_size", batch_size),
                             ("val_batches", val_batches), ("test_batches", test_batches)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"task.{field}={value!r} must be a positive integer")
        if max_len < min_len:
            raise ValueError(f"task.max_len={max_len} must be >= task.min_len={min_len}")
        self.n_symbols, self.min_len, self.max_len = n_symbols, min_len, max_len
        self.batch_size = batch_size
        self.n_batches = {"train": None, "val": val_batches, "test": test_batches}
        self.eval_seed = eval_seed
        self.vocab_size = self.first_symbol + n_symbols

    def max_input_len(self, kind: str) -> int:
        # encoder_decoder: source max_len, target max_len + EOS; decoder_only: source + SEP + target + EOS
        return {"encoder_decoder": self.max_len + 1, "decoder_only": 2 * self.max_len + 2,
                "encoder_only": self.max_len}[kind]

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        from src.core.tasks import batches

        if split not in SPLITS:
            raise ValueError(f"split={split!r} must be one of {', '.join(SPLITS)}")
        data_seed = seed if split == "train" else self.eval_seed

        def make(index: int) -> dict[str, Any]:
            return self.make_batch(batches.batch_seed(data_seed, split, index), kind)

        return batches.stream_loader(make, start, self.n_batches[split], rank, world_size)

    def make_batch(self, seed: int, kind: str) -> dict[str, Any]:
        import torch

        from src.core.tasks import batches

        gen = torch.Generator().manual_seed(seed)
        b = self.batch_size
        src_len = torch.randint(self.min_len, self.max_len + 1, (b,), generator=gen)
        width = int(src_len.max())
        col = torch.arange(width)[None, :]  # (1, S)
        real = col < src_len[:, None]  # (B, S)
        src = torch.randint(self.first_symbol, self.vocab_size, (b, width), generator=gen)
        src = src.masked_fill(~real, self.pad_id)
        backwards = (src_len[:, None] - 1 - col).clamp(min=0)  # (B, S): source index of each output position
        tgt = torch.cat([src.gather(1, backwards).masked_fill(~real, self.pad_id),
                         torch.full((b, 1), self.pad_id)], dim=1)  # (B, S + 1)
        tgt[torch.arange(b), src_len] = self.eos_id
        tgt_len = src_len + 1
        if kind == "encoder_decoder":
            return batches.encoder_decoder_batch(src, src_len, tgt, tgt_len, self.pad_id, self.bos_id)
        if kind == "decoder_only":
            return batches.decoder_only_batch(src, src_len, tgt, tgt_len, self.pad_id, self.sep_id)
        return batches.encoder_only_batch(src, src_len, tgt, self.pad_id)
