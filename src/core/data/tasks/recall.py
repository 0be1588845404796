"""`recall`: associative recall. The source lists key-value pairs, then `?` and one of the keys; the target is
that key's value. Only content-based attention solves it (find the earlier occurrence of the query key, read the
token after it); the number of pairs is the length, drawn from [min_len, max_len] (test_long: longer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from archsweep.core.data.tasks.synthetic import SyntheticTask

if TYPE_CHECKING:
    from torch import Generator, Tensor


class RecallTask(SyntheticTask):
    name = "recall"

    def __init__(self, n_symbols: int, min_len: int, max_len: int, batch_size: int, val_batches: int,
                 test_batches: int, eval_seed: int, long_max_len: int | None = None) -> None:
        # n_symbols keys, n_symbols values, and the query marker
        super().__init__(2 * n_symbols + 1, min_len, max_len, batch_size, val_batches, test_batches, eval_seed,
                         long_max_len)
        self.n_keys = n_symbols
        if self.long_max_len > n_symbols:
            raise ValueError(f"task.long_max_len={self.long_max_len} (pairs in the longest test_long example) must "
                             f"not exceed task.n_symbols={n_symbols}, the number of distinct keys; raise n_symbols "
                             f"or lower max_len/long_max_len")
        self.query_id = self.first_symbol + 2 * n_symbols

    def longest(self) -> tuple[int, int]:
        return 2 * self.long_max_len + 2, 1

    def symbol(self, token: int) -> str:
        i = token - self.first_symbol
        return "?" if token == self.query_id else (f"k{i}" if i < self.n_keys else f"v{i - self.n_keys}")

    def examples(self, gen: Generator, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        import torch

        b, k = self.batch_size, self.n_keys
        n_pairs = torch.randint(lo, hi + 1, (b,), generator=gen)
        keys = torch.rand(b, k, generator=gen).argsort(dim=1)[:, :hi] + self.first_symbol  # (B, hi) distinct
        values = torch.randint(0, k, (b, hi), generator=gen) + self.first_symbol + k
        asked = (torch.rand(b, generator=gen) * n_pairs).long()  # (B,) which pair is queried
        width = 2 * int(n_pairs.max()) + 2
        src = torch.full((b, width), self.pad_id)
        pairs = torch.stack([keys, values], dim=2).flatten(1)  # (B, 2 hi): k v k v ...
        rows = torch.arange(b)
        for i in range(b):
            n = int(n_pairs[i])
            src[i, :2 * n] = pairs[i, :2 * n]
        src[rows, 2 * n_pairs] = self.query_id
        src[rows, 2 * n_pairs + 1] = keys[rows, asked]
        tgt = values[rows, asked][:, None]  # (B, 1)
        return src, 2 * n_pairs + 2, tgt, torch.ones(b, dtype=torch.long)
