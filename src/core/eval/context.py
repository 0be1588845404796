"""Language-model loss at evaluation contexts other than the training one, the measure behind "which positional
encoding generalises to longer inputs?" (Press et al. 2022 evaluate this way).

Two modes over one running text (a split's token stream, or its first `max_tokens` tokens):

- non-overlapping: consecutive windows of `length` tokens, every target scored. Early tokens of each window
  have little context, so the figure mixes all context sizes up to `length`.
- sliding (`stride` s): windows of `length` tokens starting every s tokens; the first window scores all its
  targets, every later one only its last s, so each target is scored once with at least length - s tokens of
  context (the ALiBi codebase's evaluation; Hugging Face's "perplexity of fixed-length models"). s = length is
  exactly the non-overlapping mode; s = 1 gives every target the full context (slowest).

Only full windows are used, so every length sees the same kind of window. A model that cannot run at a length
(a learned position table shorter than it) gets a row saying so instead of a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from archsweep.variants.model import CAUSAL, form_of

if TYPE_CHECKING:  # torch is imported where it is used, so train.py can check the settings before loading it
    from torch import Tensor, nn


def not_applicable(model: nn.Module, length: int) -> str | None:
    """Why `model` cannot be evaluated at `length`, or None if it can."""
    cfg = model.config
    if form_of(cfg.kind) != CAUSAL:
        return (f"kind={cfg.kind} reads (source, target) pairs or predicts per position; evaluation at other "
                f"contexts runs a causal language model over a running text")
    limit = cfg.position_limit()
    if limit is not None and length > limit:
        return (f"pos={cfg.choice('pos')} has a table of {limit} positions (model.max_seq_len); it cannot read "
                f"{length} tokens")
    return None


def windows(n_tokens: int, length: int, stride: int | None) -> tuple[list[int], int]:
    """Start offsets of the full windows (length inputs + 1 target each) over n_tokens, and the number of
    targets scored per window after the first (which scores all `length`)."""
    step = length if stride is None else stride
    starts = list(range(0, n_tokens - length, step))
    return starts, min(step, length)


def context_loss(model: nn.Module, stream: Tensor, length: int, stride: int | None = None, batch_size: int = 8,
                 token_bytes: Tensor | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Mean next-token loss of a causal LM over `stream` (N,) at context `length`; see the module docstring.

    Returns {length, mode, stride, tokens, loss, ppl, bits_per_token, bpb (if token_bytes: UTF-8 bytes per token
    id; bits over the bytes of the targets scored, as the val/bpb of training), applicable: True}, or {length,
    applicable: False, reason}."""
    import torch
    import torch.nn.functional as F

    reason = not_applicable(model, length)
    starts, new = windows(len(stream), length, stride)
    if reason is None and not starts:
        reason = f"the evaluation text has {len(stream)} tokens, fewer than one window of {length} + 1"
    if reason is not None:
        return {"length": length, "applicable": False, "reason": reason}
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    grad_was = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    nats = torch.zeros((), dtype=torch.float64, device=device)
    n_bytes = torch.zeros((), dtype=torch.long, device=device)
    count = 0
    scored = torch.zeros(length, dtype=torch.bool, device=device)
    scored[length - new:] = True
    try:
        for first in range(0, len(starts), batch_size):
            index = torch.tensor(starts[first:first + batch_size])[:, None] + torch.arange(length + 1)
            rows = stream[index].to(device=device, dtype=torch.long)  # (b, length + 1)
            inputs, targets = rows[:, :-1], rows[:, 1:]
            loss = F.cross_entropy(model(inputs).float().transpose(1, 2), targets, reduction="none")  # (b, L)
            keep = scored.expand_as(loss).clone()
            if first == 0:
                keep[0] = True  # the first window scores every target
            nats += loss[keep].double().sum()
            if token_bytes is not None:
                n_bytes += token_bytes.to(device)[targets[keep]].sum()
            count += int(keep.sum())
            if progress is not None and (first // batch_size) % 50 == 49:
                progress(f"  length {length}: {first + batch_size}/{len(starts)} windows")
    finally:
        model.train(was_training)
        torch.set_grad_enabled(grad_was)
    mean = float(nats) / count
    row = {"length": length, "mode": "non_overlapping" if new == length else "sliding",
           "stride": new, "tokens": count, "loss": mean, "ppl": math.exp(min(mean, 700.0)),
           "bits_per_token": mean / math.log(2), "applicable": True}
    if token_bytes is not None:
        row["bpb"] = float(nats) / math.log(2) / max(int(n_bytes), 1)
    return row


def context_table(model: nn.Module, stream: Tensor, lengths: list[int], stride: int | None, batch_size: int = 8,
                  token_bytes: Tensor | None = None,
                  progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Rows of `context_loss` for every length: non-overlapping, and sliding too when `stride` is given."""
    check_lengths(lengths, stride)
    rows = []
    for length in lengths:
        for mode_stride in ([None] if stride is None or stride >= length else [None, stride]):
            row = context_loss(model, stream, length, mode_stride, batch_size, token_bytes, progress)
            rows.append(row)
            if progress is not None:
                progress(format_row(row))
            if not row["applicable"]:
                break
    return rows


def check_lengths(lengths: Any, stride: Any) -> None:
    """Refuse bad settings with the field and the fix."""
    if not isinstance(lengths, (list, tuple)) or not lengths or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        raise ValueError(f"eval.context_lengths={lengths!r} must be a non-empty list of positive token counts, "
                         f"e.g. [64,128,256]")
    if stride is not None and (not isinstance(stride, int) or isinstance(stride, bool) or stride < 1):
        raise ValueError(f"eval.stride={stride!r} must be a positive number of tokens (or null: non-overlapping "
                         f"windows only)")


def format_row(row: dict[str, Any]) -> str:
    if not row["applicable"]:
        return f"  length {row['length']:>6}: not applicable ({row['reason']})"
    mode = "non-overlapping" if row["mode"] == "non_overlapping" else f"sliding, stride {row['stride']}"
    bpb = f", {row['bpb']:.3f} bits/byte" if "bpb" in row else ""
    return (f"  length {row['length']:>6} ({mode}): loss {row['loss']:.4f}, ppl {row['ppl']:.3f}{bpb}, "
            f"{row['tokens']:,} tokens")


def extrapolation_ratio(rows: list[dict[str, Any]], train_length: int) -> float | None:
    """ppl at the longest applicable length over ppl at the training length (non-overlapping rows)."""
    usable = {r["length"]: r["ppl"] for r in rows if r["applicable"] and r["mode"] == "non_overlapping"}
    if train_length not in usable or len(usable) < 2:
        return None
    return usable[max(usable)] / usable[train_length]


def evaluate_contexts(model: nn.Module, task: Any, split: str, lengths: list[int], stride: int | None,
                      max_tokens: int | None, batch_size: int = 8,
                      progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """The by-context table of a language model on `split` of `task` (its first `max_tokens` tokens): rows per
    length, the training length (the task's context) and ppl(longest) / ppl(training length)."""
    import numpy as np
    import torch

    check_lengths(lengths, stride)
    stream = task.token_stream(split)
    if stream is None:
        raise ValueError(f"eval.context_lengths: task={task.name} is made of separate examples, not a running text; "
                         f"evaluation at other context lengths needs a language-model task (text, shakespeare_char)")
    if max_tokens is not None:
        stream = stream[:max_tokens]
    stream = torch.from_numpy(np.asarray(stream).astype(np.int64))
    token_bytes = task.token_bytes(model.config.kind)
    train_length = task.max_input_len(model.config.kind)
    if progress is not None:
        progress(f"evaluating {split} at contexts {', '.join(map(str, lengths))} (trained at {train_length}) over "
                 f"{len(stream):,} tokens")
    rows = context_table(model, stream, list(lengths), stride, batch_size, token_bytes, progress)
    return {"split": split, "train_length": train_length, "tokens": len(stream), "rows": rows,
            "ppl_ratio": extrapolation_ratio(rows, train_length)}
