"""Callbacks of image classification runs (data form IMAGE; added by fit.py):

- `ClassMetrics`: top-5 accuracy (`val/top5_acc`, `test/top5_acc`; where there are more than 5 classes) and, for
  each test split after training, the confusion matrix: `<run dir>/confusion_matrix_<split>.png` and `.json`
  (rows: true class, columns: predicted), also logged to W&B. Top-1 accuracy is the split's `acc` (one label per
  image). torchmetrics, updated on the device from the logits LitModel's steps return.
- `PatchAttentionMaps`: at each validation during fit, the attention of the class token (or, with mean pooling,
  the attention each patch receives) over the patches, per layer and averaged over heads, drawn on the first
  validation images: `<run dir>/attention/patches_step_<step>.png`, also logged to W&B.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from archsweep.core.eval.attention_maps import parse_name, save_figure
from archsweep.core.eval.image_maps import attention_overlay_figure, confusion_figure, patch_attention, to_display
from archsweep.variants.attention.layers import capture_attention

TOP_K = 5


def log_image(trainer: L.Trainer, key: str, path: Path, step: int) -> None:
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key, [str(path)], step=step)


class ClassMetrics(L.Callback):
    def __init__(self, n_classes: int, class_names: list[str], run_dir: Path) -> None:
        self.n_classes, self.class_names, self.run_dir = n_classes, class_names, run_dir
        self.top_k = MulticlassAccuracy(n_classes, top_k=TOP_K, average="micro") if n_classes > TOP_K else None
        self.confusion: dict[int, MulticlassConfusionMatrix] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.top_k is not None:
            self.top_k = self.top_k.to(pl_module.device)

    @staticmethod
    def _flat(outputs: Tensor, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        return outputs[:, 0].detach(), batch["labels"][:, 0]  # (B, K), (B,)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Tensor,
                                batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.top_k is not None:
            self.top_k.update(*self._flat(outputs, batch))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_top_k(pl_module, "val")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        splits = pl_module.test_splits
        self.confusion = {i: MulticlassConfusionMatrix(self.n_classes).to(pl_module.device) for i in range(len(splits))}

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Tensor,
                          batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        logits, labels = self._flat(outputs, batch)
        if self.top_k is not None and dataloader_idx == 0:
            self.top_k.update(logits, labels)
        self.confusion[dataloader_idx].update(logits, labels)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        splits = pl_module.test_splits
        self._log_top_k(pl_module, splits[0])
        for i, metric in self.confusion.items():
            matrix = metric.compute().cpu()  # (K, K), summed over processes
            if trainer.is_global_zero:
                self._write(trainer, splits[i], matrix)

    def _log_top_k(self, pl_module: L.LightningModule, split: str) -> None:
        if self.top_k is not None:
            pl_module.log(f"{split}/top{TOP_K}_acc", self.top_k.compute(), on_epoch=True, sync_dist=False,
                          add_dataloader_idx=False)
            self.top_k.reset()

    def _write(self, trainer: L.Trainer, split: str, matrix: Tensor) -> None:
        stem = self.run_dir / f"confusion_matrix_{split}"
        stem.with_suffix(".json").write_text(json.dumps(
            {"split": split, "classes": self.class_names, "rows_true_cols_predicted": matrix.tolist()}) + "\n")
        right = int(matrix.diag().sum())
        total = int(matrix.sum())
        fig = confusion_figure(matrix, self.class_names, f"{split} confusion matrix: {right} of {total} right "
                                                         f"(accuracy {right / max(total, 1):.3f}), step "
                                                         f"{trainer.global_step}")
        path = save_figure(fig, stem.with_suffix(".png"))
        log_image(trainer, f"{split}/confusion_matrix", path, trainer.global_step)


class PatchAttentionMaps(L.Callback):
    """On the first `rows` images of the first validation batch (a fixed set across validations)."""

    def __init__(self, task: Any, kind: str, seed: int, run_dir: Path, rows: int = 4) -> None:
        self.task, self.kind, self.seed, self.run_dir, self.rows = task, kind, seed, run_dir, rows
        self.batch: dict[str, Any] | None = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return  # every process runs the forward (a sharded model gathers its blocks from all); rank 0 draws
        if self.batch is None:
            first = next(iter(self.task.dataloader("val", self.kind, self.seed)))
            self.batch = {k: v[:self.rows] if isinstance(v, Tensor) else v for k, v in first.items()}
        batch = {k: v.to(pl_module.device) if isinstance(v, Tensor) else v for k, v in self.batch.items()}
        model = pl_module.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), capture_attention(model) as captured:
                logits = pl_module(batch)[:, 0]  # (B, K)
        finally:
            model.train(was_training)
        if not trainer.is_global_zero:
            return
        layers = sorted((parse_name(name)[2], calls[0]) for name, calls in captured.items() if calls)
        maps = [patch_attention(p, model.n_prefix, model.patch_grid).cpu() for _, p in layers]
        names = self.task.class_names
        labels = [f"true {names[t]}, predicted {names[p]}" for t, p in
                  zip(batch["labels"][:, 0].tolist(), logits.argmax(-1).tolist(), strict=True)]
        what = "class token's attention" if model.n_prefix else "attention received (mean pooling)"
        fig = attention_overlay_figure(to_display(batch["images"], self.task.mean, self.task.std), maps,
                                       f"{what} over the patches, step {trainer.global_step}", labels)
        path = save_figure(fig, self.run_dir / "attention" / f"patches_step_{trainer.global_step}.png")
        log_image(trainer, "diag/patch_attention", path, trainer.global_step)


def image_callbacks(task: Any, kind: str, seed: int, run_dir: Path, maps: bool) -> list[L.Callback]:
    """The callbacks of an image task's run; attention maps when the diagnostics ask for them."""
    callbacks: list[L.Callback] = [ClassMetrics(task.n_classes, list(task.class_names), run_dir)]
    if maps:
        callbacks.append(PatchAttentionMaps(task, kind, seed, run_dir))
    return callbacks
