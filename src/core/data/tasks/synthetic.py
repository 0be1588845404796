"""Built-in sequence-to-sequence tasks generated from the seed (no files): `copy`, `reverse`, `sort`, and the base
class of `addition`, `recall` and `is_sorted`.

Every batch is a pure function of (seed, split, batch index). Besides train/val/test (lengths in
[min_len, max_len]) each task has a `test_long` split with lengths in [max_len + 1, long_max_len], longer than any
seen in training: length generalisation is where positional encodings differ.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from archsweep.core.data.tasks.base import Task
from archsweep.variants.flops import Shape
from archsweep.variants.model import BIDIRECTIONAL, CAUSAL, SOURCE_TARGET, form_of

if TYPE_CHECKING:
    from torch import Generator, Tensor

SYNTHETIC_SPLITS = ("train", "val", "test", "test_long")


def check_positive(**values: Any) -> None:
    for field, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"task.{field}={value!r} must be a positive integer")


class SyntheticTask(Task):
    """Source tokens are drawn uniformly from `n_symbols` content symbols (ids from 4; 0-3 are pad, bos, eos, sep);
    a subclass says what the target is (`target`) or draws whole examples itself (`examples`)."""

    name = "synthetic"
    family = "synthetic"
    first_symbol = 4
    aligned = False  # target = one token per source position: encoder_only can tag the source
    test_splits = ("test", "test_long")

    def __init__(self, n_symbols: int, min_len: int, max_len: int, batch_size: int, val_batches: int,
                 test_batches: int, eval_seed: int, long_max_len: int | None = None) -> None:
        check_positive(n_symbols=n_symbols, min_len=min_len, max_len=max_len, batch_size=batch_size,
                       val_batches=val_batches, test_batches=test_batches)
        if max_len < min_len:
            raise ValueError(f"task.max_len={max_len} must be >= task.min_len={min_len}")
        long_max_len = 2 * max_len if long_max_len is None else long_max_len
        if not isinstance(long_max_len, int) or long_max_len <= max_len:
            raise ValueError(f"task.long_max_len={long_max_len!r} must be an integer > task.max_len={max_len}: "
                             f"the test_long split holds lengths max_len + 1 .. long_max_len (null: 2 * max_len)")
        self.n_symbols, self.min_len, self.max_len, self.long_max_len = n_symbols, min_len, max_len, long_max_len
        self.batch_size, self.eval_seed = batch_size, eval_seed
        self.n_batches = {"train": None, "val": val_batches, "test": test_batches, "test_long": test_batches}
        self.vocab_size = self.first_symbol + n_symbols
        if not self.aligned:
            self.forms = (SOURCE_TARGET, CAUSAL)

    def why_not(self, kind: str) -> str:
        return ("its output is not aligned position by position with its input, so an encoder-only tagger cannot "
                "produce it (encoder_only serves copy, reverse, sort, is_sorted, and masked tokens on text)")

    def lengths(self, split: str) -> tuple[int, int]:
        return (self.max_len + 1, self.long_max_len) if split == "test_long" else (self.min_len, self.max_len)

    def longest(self) -> tuple[int, int]:
        """Longest source and target (EOS excluded) over all splits."""
        return self.long_max_len, self.long_max_len

    def max_input_len(self, kind: str) -> int:
        src, tgt = self.longest()
        return {SOURCE_TARGET: max(src, tgt + 1), CAUSAL: src + tgt + 2, BIDIRECTIONAL: src}[form_of(kind)]

    def flop_shape(self, kind: str) -> Shape:
        """Training batches are padded to their longest row, about max_len (long_max_len is for test_long)."""
        shape, scale = super().flop_shape(kind), self.max_len / self.long_max_len
        return shape.replace(length=max(1, round(shape.length * scale)), memory=round(shape.memory * scale))

    def symbol(self, token: int) -> str:
        return str(token - self.first_symbol)

    def decode(self, ids: Iterable[int], side: str = "tgt") -> str:
        """Ids up to the first EOS as text, special tokens dropped (space-separated symbols); source and target
        share one vocabulary, so `side` changes nothing."""
        out = []
        for i in map(int, ids):
            if i == self.eos_id:
                break
            if i >= self.first_symbol:
                out.append(self.symbol(i))
        return " ".join(out)

    def dataloader(self, split: str, kind: str, seed: int, start: int = 0, rank: int = 0,
                   world_size: int = 1) -> Iterable[dict[str, Any]]:
        from archsweep.core.data.tasks import batches

        if split not in SYNTHETIC_SPLITS:
            raise ValueError(f"split={split!r} must be one of {', '.join(SYNTHETIC_SPLITS)}")
        data_seed = seed if split == "train" else self.eval_seed

        def make(index: int) -> dict[str, Any]:
            return self.make_batch(batches.batch_seed(data_seed, split, index), kind, split)

        return batches.stream_loader(make, start, self.n_batches[split], rank, world_size)

    def make_batch(self, seed: int, kind: str, split: str = "train") -> dict[str, Any]:
        import torch

        from archsweep.core.data.tasks import batches

        gen = torch.Generator().manual_seed(seed)
        src, src_len, tgt, tgt_len = self.examples(gen, *self.lengths(split))
        tgt = torch.cat([tgt, torch.full_like(tgt[:, :1], self.pad_id)], dim=1)  # (B, T + 1): room for EOS
        tgt[torch.arange(len(tgt)), tgt_len] = self.eos_id
        tgt_len = tgt_len + 1
        form = form_of(kind)
        if form == SOURCE_TARGET:
            return batches.encoder_decoder_batch(src, src_len, tgt, tgt_len, self.pad_id, self.bos_id)
        if form == CAUSAL:
            return batches.decoder_only_batch(src, src_len, tgt, tgt_len, self.pad_id, self.sep_id)
        return batches.encoder_only_batch(src, src_len, tgt, self.pad_id)

    def examples(self, gen: Generator, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """src (B, S) with lengths (B,), target (B, T) without EOS with lengths (B,); padded with pad_id."""
        import torch

        b = self.batch_size
        src_len = torch.randint(lo, hi + 1, (b,), generator=gen)
        width = int(src_len.max())
        real = torch.arange(width)[None, :] < src_len[:, None]  # (B, S)
        src = torch.randint(self.first_symbol, self.vocab_size, (b, width), generator=gen)
        src = src.masked_fill(~real, self.pad_id)
        return src, src_len, self.target(src, src_len, real), src_len

    def target(self, src: Tensor, src_len: Tensor, real: Tensor) -> Tensor:
        raise NotImplementedError


class CopyTask(SyntheticTask):
    """Output the input: needs attention to the aligned source position, nothing more."""

    name = "copy"
    aligned = True

    def target(self, src: Tensor, src_len: Tensor, real: Tensor) -> Tensor:
        return src.clone()


class ReverseTask(SyntheticTask):
    """Output the input backwards: attention must find the mirrored position."""

    name = "reverse"
    aligned = True

    def target(self, src: Tensor, src_len: Tensor, real: Tensor) -> Tensor:
        import torch

        col = torch.arange(src.shape[1])[None, :]  # (1, S)
        backwards = (src_len[:, None] - 1 - col).clamp(min=0)  # (B, S): source index of each output position
        return src.gather(1, backwards).masked_fill(~real, self.pad_id)


class SortTask(SyntheticTask):
    """Output the input tokens in ascending order: attention by content, not only by position."""

    name = "sort"
    aligned = True

    def target(self, src: Tensor, src_len: Tensor, real: Tensor) -> Tensor:
        ordered = src.masked_fill(~real, self.vocab_size).sort(dim=1).values  # padding sorts last
        return ordered.masked_fill(~real, self.pad_id)


def pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Lists of ids -> right-padded (B, max length) tensor and lengths (B,)."""
    import torch

    lengths = torch.tensor([len(r) for r in rows])
    out = torch.full((len(rows), int(lengths.max())), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out, lengths
