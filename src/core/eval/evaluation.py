"""Metrics that need decoding: whole-sequence exact match and BLEU (Papineni et al. 2002, as SacreBLEU computes
it; Post 2018), from the same batches training uses.

A batch of either form is turned back into prompts and references: an `encoder_decoder` batch decodes from its
source; a `decoder_only` (prefix LM) batch decodes from its tokens up to the separator, and its labels hold the
reference. Plain PyTorch and torchmetrics; no Lightning.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from archsweep.core.data.tasks.base import IGNORE_INDEX
from archsweep.core.eval.generation import DecodingConfig, generate
from archsweep.variants.model import CAUSAL, SOURCE_TARGET, form_of, kinds_of


def strip(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    """Tokens before the first end token, without padding."""
    out = []
    for token in ids:
        if token == eos_id:
            break
        if token != pad_id:
            out.append(token)
    return out


def prompts_and_references(batch: dict[str, Any], kind: str) -> tuple[Tensor, Tensor, list[list[int]]]:
    """(inputs (B, L), mask (B, L), reference token lists) for decoding a training batch."""
    labels = batch["labels"]
    references = [row[row != IGNORE_INDEX].tolist() for row in labels]
    if form_of(kind) == SOURCE_TARGET:
        src = batch["src"]
        mask = batch["src_mask"] if batch["src_mask"] is not None else torch.ones_like(src, dtype=torch.bool)
        return src, mask, references
    if form_of(kind) != CAUSAL:
        raise ValueError(f"kind={kind} does not generate; decoding metrics need a source-target or causal kind "
                         f"({', '.join(kinds_of((SOURCE_TARGET, CAUSAL)))})")
    tokens = batch["tokens"]
    labelled = labels != IGNORE_INDEX
    first = labelled.float().argmax(1)  # position of the separator: it predicts the first target token
    prompt_len = first + 1
    width = int(prompt_len.max())
    mask = torch.arange(width, device=tokens.device)[None, :] < prompt_len[:, None]
    return tokens[:, :width], mask, references


@dataclass
class DecodeResults:
    """Running exact match and BLEU over decoded examples, with the first few kept for display."""

    keep_examples: int = 5
    exact: int = 0
    total: int = 0
    hypotheses: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    examples: list[tuple[str, str, str]] = field(default_factory=list)  # (source, reference, prediction)

    def add(self, source: str, reference: list[int], prediction: list[int], ref_text: str, hyp_text: str) -> None:
        self.exact += int(reference == prediction)
        self.total += 1
        self.hypotheses.append(hyp_text)
        self.references.append(ref_text)
        if len(self.examples) < self.keep_examples:
            self.examples.append((source, ref_text, hyp_text))

    def exact_match(self) -> float:
        return self.exact / max(self.total, 1)

    def bleu(self) -> float:
        from torchmetrics.text import SacreBLEUScore

        if not self.hypotheses:
            return 0.0
        return 100.0 * float(SacreBLEUScore()(self.hypotheses, [[r] for r in self.references]))


SAMPLE_SEED = 0  # the decoded sample of a split is the same for every run, whatever its training seed


def decode_sample(batches: Iterable[dict[str, Any]], size: int | None) -> list[list[int]]:
    """Which rows of each batch of a split to decode: all of them (`size` None, or at least the split's length),
    else `size` examples drawn at random (seeded by SAMPLE_SEED) from the whole split, so that the sample spans
    every length even when batches are sorted by length. Training's val/bleu and evaluate.py's `decode_limit`
    use it alike, so both decode the same examples."""
    sizes = [int(b["labels"].shape[0]) for b in batches]
    total = sum(sizes)
    chosen = set(range(total)) if size is None or size >= total else set(random.Random(SAMPLE_SEED).sample(
        range(total), size))
    rows, start = [], 0
    for n in sizes:
        rows.append([i - start for i in range(start, start + n) if i in chosen])
        start += n
    return rows


def longest_reference(batch: dict[str, Any], rows: list[int] | None = None) -> int:
    """Tokens in the longest reference (its end token included) among `rows` of a batch (default: all)."""
    labelled = (batch["labels"] if rows is None else batch["labels"][rows]) != IGNORE_INDEX
    return int(labelled.sum(1).max()) if labelled.shape[0] else 0


@torch.no_grad()
def decode_batch(model: nn.Module, batch: dict[str, Any], kind: str, cfg: DecodingConfig, *, pad_id: int,
                 bos_id: int, eos_id: int, to_text: Callable[[list[int], str], str], results: DecodeResults,
                 limit: int | None = None, rows: list[int] | None = None,
                 max_new_tokens: int | None = None) -> list[bool]:
    """Decode the rows `rows` of one batch (default: all, or the first `limit`) and add their examples to
    `results`; returns each decoded row's exact match, in the order of `rows`. Each row decodes `max_new_tokens`
    tokens at most; None: `cfg.max_new_tokens`, raised to the longest reference + 1 so every reference fits."""
    inputs, mask, references = prompts_and_references(batch, kind)
    if rows is not None:
        inputs, mask, references = inputs[rows], mask[rows], [references[i] for i in rows]
    if limit is not None:
        inputs, mask, references = inputs[:limit], mask[:limit], references[:limit]
    if not references:
        return []
    if max_new_tokens is None:
        max_new_tokens = max(cfg.max_new_tokens, max(len(r) for r in references) + 1)
    cfg = dataclasses.replace(cfg, max_new_tokens=max_new_tokens)
    out = generate(model, inputs, mask, cfg, eos_id=eos_id, pad_id=pad_id, bos_id=bos_id)
    exact = []
    for row in range(inputs.shape[0]):
        reference = strip(references[row], eos_id, pad_id)
        prediction = strip(out.tokens[row, 0].tolist(), eos_id, pad_id)
        source = inputs[row][mask[row]].tolist()
        source = strip(source[:-1] if form_of(kind) == CAUSAL else source, eos_id, pad_id)  # no separator
        results.add(to_text(source, "src"), reference, prediction, to_text(reference, "tgt"),
                    to_text(prediction, "tgt"))
        exact.append(reference == prediction)
    return exact
