"""The LightningModule: knows no architecture. It receives a built `nn.Module` and the task's function that
runs it on a batch, and owns the loss, the optimiser, the schedule and the metrics.

The training step avoids host-device synchronisation: losses and norms are logged as tensors (Lightning turns
them into numbers only on log steps), and accuracy and gradient norm are computed on log steps only.

At test time each split's exact match and token accuracy are also counted by source length (`by_length`), where
the batches carry `src_len`; that is where positional encodings differ on longer-than-training inputs.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.text import Perplexity

from archsweep.core.train.optim import make_optimizer, make_scheduler
from archsweep.core.data.tasks.base import IGNORE_INDEX


def step_seed(seed: int, step: int, micro: int, rank: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{step}/{micro}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def row_stats(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, V), (B, T) -> per row: correct tokens (B,), labelled tokens (B,), exact match (B,) as float."""
    labelled = labels != IGNORE_INDEX
    hit = (logits.argmax(-1) == labels) & labelled
    return hit.sum(1), labelled.sum(1), (hit | ~labelled).all(dim=1).float()


def token_stats(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, V), (B, T) -> correct tokens, labelled tokens, whole-row exact matches (B,) as float."""
    hits, count, exact = row_stats(logits, labels)
    return hits.sum(), count.sum(), exact


class EvalMetrics(nn.Module):
    """Token-weighted loss (NLL, no smoothing), perplexity, token accuracy and exact match for one split."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = MeanMetric()
        self.ppl = Perplexity(ignore_index=IGNORE_INDEX)
        self.acc = MeanMetric()
        self.exact_match = MeanMetric()

    def update(self, logits: Tensor, labels: Tensor) -> None:
        logits = logits.float()
        hits, count, exact = token_stats(logits, labels)
        nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        self.loss.update(nll, count)
        self.ppl.update(logits, labels)
        self.acc.update(hits / count.clamp(min=1), count)
        self.exact_match.update(exact)

    def items(self) -> list[tuple[str, Any]]:
        return [("loss", self.loss), ("ppl", self.ppl), ("acc", self.acc), ("exact_match", self.exact_match)]


class LengthMetrics:
    """Exact match and token accuracy by source length for one split, counted on the CPU (test time only)."""

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # rows, exact, hits, tokens

    def update(self, logits: Tensor, labels: Tensor, src_len: Tensor) -> None:
        hits, count, exact = row_stats(logits, labels)
        for n, e, h, c in zip(*(t.tolist() for t in (src_len, exact, hits, count)), strict=True):
            row = self.counts[int(n)]
            row[0], row[1], row[2], row[3] = row[0] + 1, row[1] + int(e), row[2] + h, row[3] + c

    def gather(self) -> None:
        """Sum the counts of all data-parallel processes."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, dict(self.counts))
        self.counts = defaultdict(lambda: [0, 0, 0, 0])
        for part in parts:
            for n, values in part.items():
                self.counts[n] = [a + b for a, b in zip(self.counts[n], values, strict=True)]

    def result(self) -> dict[str, dict[str, float]]:
        """{"<length>": {"n", "exact_match", "acc"}}, lengths ascending (string keys, as in results.json)."""
        return {str(n): {"n": rows, "exact_match": exact / rows, "acc": hits / max(tokens, 1)}
                for n, (rows, exact, hits, tokens) in sorted(self.counts.items())}


class LitModel(L.LightningModule):
    def __init__(self, model: nn.Module, forward_fn: Callable[[nn.Module, dict], Tensor], optim: dict[str, Any],
                 schedule: dict[str, Any], label_smoothing: float, seed: int, meta: dict[str, Any],
                 test_splits: tuple[str, ...] = ("test",)) -> None:
        super().__init__()
        self.model, self.forward_fn = model, forward_fn
        self.optim_cfg, self.schedule_cfg = optim, schedule
        self.label_smoothing, self.seed = label_smoothing, seed
        self.meta = meta  # resolved config and run identity, stored in every checkpoint
        self.val_metrics, self.test_splits = EvalMetrics(), tuple(test_splits)
        self.test_metrics = nn.ModuleList(EvalMetrics() for _ in self.test_splits)  # one per test split
        self.test_lengths = {split: LengthMetrics() for split in self.test_splits}
        self.by_length: dict[str, dict[str, dict[str, float]]] = {}  # split -> length -> metrics, after test
        self.n_outputs = 2  # classes each position chooses from (logits' last dim), read by the divergence check
        self.diverged: dict[str, Any] | None = None  # {"step", "reason"}, set by DivergenceMonitor

    def forward(self, batch: dict[str, Any]) -> Tensor:
        return self.forward_fn(self.model, batch)

    def _log_step(self) -> bool:
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        # Dropout randomness is a function of (seed, step, rank), so a resumed run draws what an uninterrupted
        # one would, whatever else consumed random numbers in between (validation, dataloader start-up).
        micro = batch_idx % self.trainer.accumulate_grad_batches
        seed = step_seed(self.seed, self.global_step, micro, self.global_rank)
        if self.device.type == "cpu":  # torch.manual_seed would also queue lazy CUDA/XPU seeding, with a stack trace
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        logits = self(batch)  # (B, T, V)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=self.label_smoothing)
        if self._log_step():  # Lightning writes step metrics only on log steps; logging others is wasted work
            self.n_outputs = logits.shape[-1]
            self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, batch_size=labels.shape[0])
            hits, count, _ = token_stats(logits.detach(), labels)
            self.log("train/acc", hits / count.clamp(min=1), on_step=True, on_epoch=False)
            self.log("train/lr", self.lr_schedulers().get_last_lr()[0], on_step=True, on_epoch=False)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._log_step():  # before clipping: the norm the gradient had
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads), on_step=True, on_epoch=False)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, "val")

    def on_test_epoch_start(self) -> None:
        self.test_lengths = {split: LengthMetrics() for split in self.test_splits}

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.test_splits[dataloader_idx]
        logits = self._evaluate(batch, self.test_metrics[dataloader_idx], split)
        if "src_len" in batch:
            self.test_lengths[split].update(logits, batch["labels"], batch["src_len"])

    def on_test_epoch_end(self) -> None:
        for lengths in self.test_lengths.values():
            lengths.gather()
        self.by_length = {split: m.result() for split, m in self.test_lengths.items() if m.counts}

    def _evaluate(self, batch: dict[str, Any], metrics: EvalMetrics, split: str) -> Tensor:
        logits = self(batch)
        metrics.update(logits, batch["labels"])
        for name, metric in metrics.items():
            self.log(f"{split}/{name}", metric, on_step=False, on_epoch=True, batch_size=batch["labels"].shape[0],
                     add_dataloader_idx=False)
        return logits

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = make_optimizer(self.model, self.optim_cfg)
        scheduler = make_scheduler(optimizer, self.schedule_cfg)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["archsweep"] = {**self.meta, "model_config": self.model.config.to_dict()}
