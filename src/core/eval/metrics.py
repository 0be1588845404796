"""Teacher-forced metrics, one implementation for training's validation/test and for evaluate.py: token-level
loss (NLL without smoothing) and perplexity, token accuracy, whole-sequence exact match, bits per byte of a
language model, and the same counts by source length.

Each is a torchmetrics `Metric` whose states are sums (`dist_reduce_fx="sum"`), so `compute()` under DDP sums
every process's counts, and updating stays on the device (no host sync until `compute`). A batch is reduced
once to per-row statistics (`row_stats`), which every metric reads:

    stats = row_stats(logits, labels)                    # (B, T, V), (B, T) -> per row nll, hits, tokens, exact
    split = SplitMetrics(); split.update(stats, labels)  # -> {"loss", "ppl", "acc", "exact_match"}
    SplitMetrics(task.token_bytes(kind))                 # ... and "bpb" for a language model
    table = LengthTable(max_len); table.update(stats, src_len)

Bits per byte (`bpb`) is the summed loss of the labelled tokens in bits over the UTF-8 bytes of the text those
tokens stand for, counted exactly over the windows evaluated with the task's bytes-per-id table. Unlike the loss
per token it does not depend on how the text was cut into tokens, so models with different tokenizers compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from archsweep.core.data.tasks.base import IGNORE_INDEX


def token_hits(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T, V), (B, T) -> (top prediction right, position labelled), both (B, T) bool."""
    labelled = labels != IGNORE_INDEX
    return (logits.argmax(-1) == labels) & labelled, labelled


@dataclass(frozen=True)
class RowStats:
    nll: Tensor  # (B,) summed token NLL, float32
    hits: Tensor  # (B,) labelled tokens whose top prediction is the label
    tokens: Tensor  # (B,) labelled tokens
    exact: Tensor  # (B,) bool: every labelled token right (teacher-forced exact match, unless replaced)


def row_stats(logits: Tensor, labels: Tensor) -> RowStats:
    """Per-row statistics of one batch; logits are cast to float32 first."""
    logits = logits.float()
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                          reduction="none").view(labels.shape).sum(1)
    hit, labelled = token_hits(logits, labels)
    return RowStats(nll, hit.sum(1), labelled.sum(1), (hit | ~labelled).all(1))


def perplexity(loss: Tensor) -> Tensor:
    return torch.exp(loss)


class _Sums(Metric):
    """A metric made of scalar counters that add up across batches and processes."""

    full_state_update = False
    counters: tuple[tuple[str, torch.dtype], ...] = ()

    def __init__(self) -> None:
        super().__init__()
        for name, dtype in self.counters:
            self.add_state(name, torch.zeros((), dtype=dtype), dist_reduce_fx="sum")


class TokenLoss(_Sums):
    """Mean NLL per labelled token; `perplexity(compute())` is the perplexity."""

    counters = (("nll", torch.float32), ("tokens", torch.long))

    def update(self, stats: RowStats) -> None:
        self.nll += stats.nll.sum()
        self.tokens += stats.tokens.sum()

    def compute(self) -> Tensor:
        return self.nll / self.tokens


class TokenAccuracy(_Sums):
    """Share of labelled tokens whose top prediction is the label."""

    counters = (("hits", torch.long), ("tokens", torch.long))

    def update(self, stats: RowStats) -> None:
        self.hits += stats.hits.sum()
        self.tokens += stats.tokens.sum()

    def compute(self) -> Tensor:
        return self.hits / self.tokens.clamp(min=1)


class ExactMatch(_Sums):
    """Share of rows whose every labelled token (EOS included) is right; `rows` counts the examples."""

    counters = (("exact", torch.long), ("rows", torch.long))

    def update(self, stats: RowStats) -> None:
        self.exact += stats.exact.sum()
        self.rows += stats.exact.numel()

    def compute(self) -> Tensor:
        return self.exact / self.rows.clamp(min=1)


class BitsPerByte(_Sums):
    """Summed NLL of the labelled tokens in bits over the UTF-8 bytes they stand for. `token_bytes` (V,) gives the
    bytes of each id (`Task.token_bytes`); it is a buffer that moves with the module and is not saved."""

    counters = (("nll", torch.float32), ("bytes", torch.long))

    def __init__(self, token_bytes: Tensor) -> None:
        super().__init__()
        self.register_buffer("token_bytes", token_bytes.long(), persistent=False)

    def update(self, stats: RowStats, labels: Tensor) -> None:
        labelled = labels != IGNORE_INDEX
        self.nll += stats.nll.sum()
        self.bytes += self.token_bytes[labels.where(labelled, 0)].masked_fill(~labelled, 0).sum()

    def compute(self) -> Tensor:
        return self.nll / math.log(2) / self.bytes  # no byte: inf, or nan without a token


class SplitMetrics(nn.Module):
    """The teacher-forced metrics of one split: loss, ppl, acc, exact_match, and bpb given the task's bytes per
    token id (results.json's `val`/`test` keys)."""

    def __init__(self, token_bytes: Tensor | None = None) -> None:
        super().__init__()
        self.loss, self.acc, self.exact_match = TokenLoss(), TokenAccuracy(), ExactMatch()
        self.bpb = BitsPerByte(token_bytes) if token_bytes is not None else None

    def update(self, stats: RowStats, labels: Tensor | None = None) -> None:
        """`labels` (B, T), the ones `stats` were computed from, are needed with bits per byte."""
        for metric in (self.loss, self.acc, self.exact_match):
            metric.update(stats)
        if self.bpb is not None:
            if labels is None:
                raise ValueError("SplitMetrics counts bits per byte: pass the batch's labels to update(stats, labels)")
            self.bpb.update(stats, labels)

    def compute(self) -> dict[str, Tensor]:
        loss = self.loss.compute()
        out = {"loss": loss, "ppl": perplexity(loss), "acc": self.acc.compute(),
               "exact_match": self.exact_match.compute()}
        return out if self.bpb is None else {**out, "bpb": self.bpb.compute()}

    def reset(self) -> None:
        for metric in (self.loss, self.acc, self.exact_match, self.bpb):
            if metric is not None:
                metric.reset()


LENGTH_COUNTS = ("rows", "exact", "hits", "tokens", "nll")


class LengthTable(Metric):
    """The same counts per source length 0..max_len, as fixed-size tensors indexed by length (so processes sum
    them elementwise). `max_len` is the task's longest input (`Task.max_input_len(kind)`); a longer row is counted
    in an overflow slot, and `compute` refuses the table then (the check costs no sync during updates)."""

    full_state_update = False

    def __init__(self, max_len: int) -> None:
        super().__init__()
        if max_len < 0:
            raise ValueError(f"max_len={max_len} must be >= 0 (the longest source length to count)")
        self.max_len = max_len
        for name in LENGTH_COUNTS:
            dtype = torch.float32 if name == "nll" else torch.long
            self.add_state(name, torch.zeros(max_len + 2, dtype=dtype), dist_reduce_fx="sum")  # + overflow slot

    def update(self, stats: RowStats, src_len: Tensor) -> None:
        index = src_len.to(self.rows.device, torch.long).clamp(0, self.max_len + 1)
        self.rows.index_add_(0, index, torch.ones_like(index))
        self.exact.index_add_(0, index, stats.exact.long())
        self.hits.index_add_(0, index, stats.hits.long())
        self.tokens.index_add_(0, index, stats.tokens.long())
        self.nll.index_add_(0, index, stats.nll.float())

    def compute(self) -> dict[str, Tensor]:
        """{count name: (max_len + 1,) CPU tensor indexed by source length}."""
        over = int(self.rows[-1])
        if over:
            raise ValueError(f"{over} rows have a source longer than max_len={self.max_len}; build LengthTable "
                             f"with the task's longest input (Task.max_input_len)")
        return {name: getattr(self, name)[:-1].cpu() for name in LENGTH_COUNTS}


def summary(rows: int, exact: float, hits: float, tokens: float, nll: float) -> dict[str, float]:
    """n, loss, ppl, acc, exact_match from summed counts (an evaluate.py bucket)."""
    loss = nll / tokens if tokens else float("nan")
    return {"n": rows, "loss": loss, "ppl": float(perplexity(torch.tensor(loss))), "acc": hits / max(tokens, 1),
            "exact_match": exact / max(rows, 1)}


def by_length(counts: dict[str, Tensor]) -> dict[str, dict[str, float]]:
    """{"<length>": {"n", "exact_match", "acc"}} for the lengths that have rows, ascending (results.json)."""
    table = {}
    for n in torch.nonzero(counts["rows"]).flatten().tolist():
        rows, exact, hits, tokens = (int(counts[k][n]) for k in ("rows", "exact", "hits", "tokens"))
        table[str(n)] = {"n": rows, "exact_match": exact / rows, "acc": hits / max(tokens, 1)}
    return table


def length_buckets(counts: dict[str, Tensor], buckets: int) -> list[tuple[int, int, dict[str, float]]]:
    """(first, last length, summary) of `buckets` equal-width ranges between the shortest and the longest source
    seen; empty ranges are left out."""
    seen = torch.nonzero(counts["rows"]).flatten().tolist()
    if not seen:
        return []
    lo, hi = seen[0], seen[-1]
    width = max(1, -(-(hi - lo + 1) // buckets))
    out = []
    for start in range(lo, hi + 1, width):
        last = min(start + width - 1, hi)
        sums = {k: counts[k][start: last + 1].sum() for k in LENGTH_COUNTS}
        if sums["rows"]:
            out.append((start, last, summary(int(sums["rows"]), int(sums["exact"]), int(sums["hits"]),
                                             int(sums["tokens"]), float(sums["nll"]))))
    return out
