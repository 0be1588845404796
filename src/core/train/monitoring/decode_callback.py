"""At each validation: decode a fixed random sample of `eval.decode_samples` validation examples drawn across the
whole split (`archsweep.core.eval.evaluation.decode_sample`, the same for every run; evaluate.py's `decode_limit`
draws the same one), log exact match and BLEU from real decoding (not teacher forcing), print a few (source,
reference, prediction) triples and log them to W&B as a table (a different few at each validation, numbered by their
place in the sample, so the console never repeats itself). Only for sequence-to-sequence tasks and the kinds
that generate.

The work is bounded, so that a short run stays short: each example decodes `eval.decode_max_new_tokens` tokens at
most (null: its batch's longest reference + 1, which decides exact match: a longer output cannot equal the
reference), and once `eval.decode_time_s` has passed the remaining batches of the sample are skipped; the console
line then says how many of the sample were decoded, and the metrics cover those."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from archsweep.core.data.codec import Codec
from archsweep.core.eval.evaluation import DecodeResults, decode_batch, decode_sample, longest_reference
from archsweep.core.eval.generation import DecodingConfig

log = logging.getLogger("train")


class DecodeOnValidation(L.Callback):
    def __init__(self, task: Any, kind: str, codec: Codec, decoding: DecodingConfig, samples: int, show: int,
                 seed: int, max_new_tokens: int | None = None, time_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if samples < 1:
            raise ValueError(f"eval.decode_samples={samples} must be positive (or turn decoding off with 0 "
                             f"before building the callback)")
        self.task, self.kind, self.codec, self.decoding = task, kind, codec, decoding
        self.samples, self.show, self.seed = samples, show, seed
        self.max_new_tokens, self.time_s, self.clock = max_new_tokens, time_s, clock
        self.rows: list[list[int]] | None = None  # per validation batch, the rows of the sample
        self.shown = 0  # validations so far: each shows the next `show` examples of the sample

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.state.fn == "fit" and getattr(pl_module, "diverged", None)):
            return  # a diverged run's stopping validation: its weights may be NaN, and sampling would fail
        start = self.clock()
        if self.rows is None:  # once: the validation split is fixed
            self.rows = decode_sample(self.task.dataloader("val", self.kind, self.seed), self.samples)
        results, most_tokens = self.decode(pl_module, start)
        pl_module.log("val/decoded_exact_match", results.exact_match(), on_epoch=True, sync_dist=False)
        pl_module.log("val/bleu", results.bleu(), on_epoch=True, sync_dist=False)
        when = f"step {trainer.global_step}" if trainer.state.fn == "fit" else "evaluating the best checkpoint"
        sample = sum(len(r) for r in self.rows)
        count = f"{results.total} validation examples" if results.total == sample else \
            f"{results.total} of {sample} validation examples"
        how = f"{self.decoding.strategy}, at most {most_tokens} new tokens"
        if results.total < sample:
            how += f"; time bound eval.decode_time_s={self.time_s:g} reached"
        lines = [f"{when}: decoded {count} ({how}) in {self.clock() - start:.1f}s: decoded exact match "
                 f"{results.exact_match():.4f}, BLEU {results.bleu():.2f}"]
        shown = self.pick(results.examples)
        lines += [f"  #{i} src: {s}\n  #{i} ref: {r}\n  #{i} out: {p}" for i, (s, r, p) in shown]
        if trainer.is_global_zero:
            log.info("\n".join(lines))
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and shown:
                logger.log_table("val/examples", columns=["source", "reference", "prediction"],
                                 data=[list(e) for _, e in shown], step=trainer.global_step)

    def decode(self, pl_module: L.LightningModule, start: float) -> tuple[DecodeResults, int]:
        """(results, the most new tokens a batch decoded) of the sample's batches decoded before the time bound."""
        results, most_tokens = DecodeResults(keep_examples=self.samples), 0
        for batch, rows in zip(self.task.dataloader("val", self.kind, self.seed), self.rows, strict=True):
            if not rows:
                continue
            if self.time_s is not None and results.total and self.clock() - start >= self.time_s:
                break
            batch = {k: v.to(pl_module.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            tokens = self.max_new_tokens or longest_reference(batch, rows) + 1
            most_tokens = max(most_tokens, tokens)
            decode_batch(pl_module.model, batch, self.kind, self.decoding, pad_id=self.task.pad_id,
                         bos_id=self.task.bos_id, eos_id=self.task.eos_id, to_text=self.codec.decode,
                         results=results, rows=rows, max_new_tokens=tokens)
        return results, most_tokens

    def pick(self, examples: list[tuple[str, str, str]]) -> list[tuple[int, tuple[str, str, str]]]:
        """The next `show` examples (index in the sample, example), wrapping around the sample."""
        if not examples or self.show < 1:
            return []
        first = self.shown * self.show
        self.shown += 1
        count = min(self.show, len(examples))
        return [((first + j) % len(examples), examples[(first + j) % len(examples)]) for j in range(count)]
