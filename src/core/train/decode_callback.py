"""At each validation: decode a fixed random sample of `eval.decode_samples` validation examples drawn across the
whole split (`archsweep.core.eval.evaluation.decode_sample`, the same for every run; evaluate.py's `decode_limit`
draws the same one), log exact match and BLEU from real decoding (not teacher forcing), print a few (source,
reference, prediction) triples and log them to W&B as a table (a different few at each validation, numbered by their
place in the sample, so the console never repeats itself). Only for sequence-to-sequence tasks and the kinds
that generate."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from archsweep.core.data.codec import Codec
from archsweep.core.eval.evaluation import DecodeResults, decode_batch, decode_sample
from archsweep.core.eval.generation import DecodingConfig

log = logging.getLogger("train")


class DecodeOnValidation(L.Callback):
    def __init__(self, task: Any, kind: str, codec: Codec, decoding: DecodingConfig, samples: int, show: int,
                 seed: int) -> None:
        if samples < 1:
            raise ValueError(f"eval.decode_samples={samples} must be positive (or turn decoding off with 0 "
                             f"before building the callback)")
        self.task, self.kind, self.codec, self.decoding = task, kind, codec, decoding
        self.samples, self.show, self.seed = samples, show, seed
        self.rows: list[list[int]] | None = None  # per validation batch, the rows of the sample
        self.shown = 0  # validations so far: each shows the next `show` examples of the sample

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.state.fn == "fit" and getattr(pl_module, "diverged", None)):
            return  # a diverged run's stopping validation: its weights may be NaN, and sampling would fail
        start = time.time()
        results = DecodeResults(keep_examples=self.samples)
        if self.rows is None:  # once: the validation split is fixed
            self.rows = decode_sample(self.task.dataloader("val", self.kind, self.seed), self.samples)
        for batch, rows in zip(self.task.dataloader("val", self.kind, self.seed), self.rows, strict=True):
            if not rows:
                continue
            batch = {k: v.to(pl_module.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            decode_batch(pl_module.model, batch, self.kind, self.decoding, pad_id=self.task.pad_id,
                         bos_id=self.task.bos_id, eos_id=self.task.eos_id, to_text=self.codec.decode,
                         results=results, rows=rows)
        pl_module.log("val/decoded_exact_match", results.exact_match(), on_epoch=True, sync_dist=False)
        pl_module.log("val/bleu", results.bleu(), on_epoch=True, sync_dist=False)
        when = f"step {trainer.global_step}" if trainer.state.fn == "fit" else "evaluating the best checkpoint"
        lines = [f"{when}: decoded {results.total} validation examples ({self.decoding.strategy}) in "
                 f"{time.time() - start:.1f}s: decoded exact match {results.exact_match():.4f}, "
                 f"BLEU {results.bleu():.2f}"]
        shown = self.pick(results.examples)
        lines += [f"  #{i} src: {s}\n  #{i} ref: {r}\n  #{i} out: {p}" for i, (s, r, p) in shown]
        if trainer.is_global_zero:
            log.info("\n".join(lines))
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and shown:
                logger.log_table("val/examples", columns=["source", "reference", "prediction"],
                                 data=[list(e) for _, e in shown], step=trainer.global_step)

    def pick(self, examples: list[tuple[str, str, str]]) -> list[tuple[int, tuple[str, str, str]]]:
        """The next `show` examples (index in the sample, example), wrapping around the sample."""
        if not examples or self.show < 1:
            return []
        first = self.shown * self.show
        self.shown += 1
        count = min(self.show, len(examples))
        return [((first + j) % len(examples), examples[(first + j) % len(examples)]) for j in range(count)]
