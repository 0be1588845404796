"""`addition`: the sum of two multi-digit numbers, digit by digit (carries propagate across the whole answer).

Source `a + b`, target the digits of a + b; operand lengths are drawn independently from [min_len, max_len] digits
(test_long: max_len + 1 .. long_max_len), leading digits non-zero. Digits are written most significant first, or
least significant first with `reverse_digits: true` (then every output digit depends only on digits already seen
and one carry, which is known to be far easier for causal models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from src.core.tasks.synthetic import SyntheticTask, pad

if TYPE_CHECKING:
    from torch import Generator, Tensor


class AdditionTask(SyntheticTask):
    name = "addition"

    def __init__(self, base: int, min_len: int, max_len: int, batch_size: int, val_batches: int, test_batches: int,
                 eval_seed: int, long_max_len: int | None = None, reverse_digits: bool = False) -> None:
        if not isinstance(base, int) or not 2 <= base <= 36:
            raise ValueError(f"task.base={base!r} must be an integer in [2, 36]")
        self.base, self.reverse_digits = base, reverse_digits
        self.plus_id = self.first_symbol + base
        super().__init__(base + 1, min_len, max_len, batch_size, val_batches, test_batches, eval_seed, long_max_len)

    def longest(self) -> tuple[int, int]:
        return 2 * self.long_max_len + 1, self.long_max_len + 1

    def symbol(self, token: int) -> str:
        return "+" if token == self.plus_id else "0123456789abcdefghijklmnopqrstuvwxyz"[token - self.first_symbol]

    def decode(self, ids, side: str = "tgt") -> str:
        return super().decode(ids).replace(" ", "")

    def digits(self, n: int) -> list[int]:
        out = []
        while True:
            n, d = divmod(n, self.base)
            out.append(d)
            if n == 0:
                break
        return out if self.reverse_digits else out[::-1]  # least significant first, unless reversed back

    def examples(self, gen: Generator, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        import torch

        b, base = self.batch_size, self.base
        lens = torch.randint(lo, hi + 1, (b, 2), generator=gen)
        raw = torch.randint(0, base, (b, 2, hi), generator=gen)  # digits, most significant first
        lead = torch.randint(1, base, (b, 2), generator=gen)
        rows_src, rows_tgt = [], []
        for i in range(b):
            ops = []
            for j in range(2):
                n = int(lens[i, j])
                ds = raw[i, j, :n].tolist()
                if n > 1:
                    ds[0] = int(lead[i, j])
                ops.append(sum(d * base ** (n - 1 - k) for k, d in enumerate(ds)))
            src = self.digits(ops[0]) + [-1] + self.digits(ops[1])
            rows_src.append([self.plus_id if d < 0 else self.first_symbol + d for d in src])
            rows_tgt.append([self.first_symbol + d for d in self.digits(ops[0] + ops[1])])
        return (*pad(rows_src, self.pad_id), *pad(rows_tgt, self.pad_id))

