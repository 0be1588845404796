"""`addition`: the sum of two multi-digit numbers, digit by digit (carries propagate across the whole answer).

Source `a + b`, target the digits of a + b; operand lengths are drawn independently from [min_len, max_len] digits
(test_long: max_len + 1 .. long_max_len), leading digits non-zero. Digits are written most significant first, or
least significant first with `reverse_digits: true` (then every output digit depends only on digits already seen
and one carry, which is known to be far easier for causal models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from archsweep.core.data.tasks.synthetic import SyntheticTask

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

    def examples(self, gen: Generator, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Vectorised over the batch: digits are drawn, added column by column with carries, and laid out."""
        import torch

        b, base = self.batch_size, self.base
        lens = torch.randint(lo, hi + 1, (b, 2), generator=gen)  # (B, 2) digits per operand
        msf = torch.randint(0, base, (b, 2, hi), generator=gen)  # most significant first, first `lens` columns
        lead = torch.randint(1, base, (b, 2), generator=gen)
        msf[:, :, 0] = torch.where(lens > 1, lead, msf[:, :, 0])  # no leading zero
        col = torch.arange(hi)
        lsf = msf.gather(2, (lens[..., None] - 1 - col).clamp(min=0)).masked_fill(col >= lens[..., None], 0)
        total = torch.zeros(b, hi + 1, dtype=torch.long)  # (B, hi + 1) sum, least significant first
        carry = torch.zeros(b, dtype=torch.long)
        for k in range(hi):
            column = lsf[:, 0, k] + lsf[:, 1, k] + carry
            total[:, k], carry = column % base, column // base
        total[:, hi] = carry
        nonzero = total != 0
        sum_len = torch.where(nonzero.any(1), hi + 1 - nonzero.flip(1).int().argmax(1), 1)  # (B,)
        operands = lsf if self.reverse_digits else msf  # (B, 2, hi), left-aligned in writing order
        la, lb = lens[:, :1], lens[:, 1:]
        width = int((lens.sum(1) + 1).max())
        pos = torch.arange(width).expand(b, width)  # (B, W)
        a_part = operands[:, 0].gather(1, pos.clamp(max=hi - 1))
        b_part = operands[:, 1].gather(1, (pos - la - 1).clamp(0, hi - 1))
        src = torch.where(pos < la, a_part, b_part) + self.first_symbol
        src = src.masked_fill(pos == la, self.plus_id).masked_fill(pos >= la + 1 + lb, self.pad_id)
        tpos = torch.arange(hi + 1).expand(b, hi + 1)
        order = tpos if self.reverse_digits else (sum_len[:, None] - 1 - tpos).clamp(min=0)
        tgt = (total.gather(1, order) + self.first_symbol).masked_fill(tpos >= sum_len[:, None], self.pad_id)
        tgt = tgt[:, :int(sum_len.max())]
        return src, lens.sum(1) + 1, tgt, sum_len
