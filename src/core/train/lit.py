"""The LightningModule: knows no architecture. It receives a built `nn.Module` and the task's function that
runs it on a batch, and owns the loss, the optimiser, the schedule and the metrics.

The training step adds the auxiliary losses the model's modules report for its forward (a router's balancing loss,
PaLM's z-loss in the output head; `archsweep.variants.hooks`), logged as `train/aux/<name>`; on log steps it logs
the modules' own figures (`diagnostics`, as `diag/<name>`), and it calls their `step_update` once per optimiser
step, after the last backward. It avoids
host-device synchronisation: losses and norms are logged as tensors (Lightning turns
them into numbers only on log steps), and accuracy and gradient norm are computed on log steps only. Validation
and test use the metrics of `archsweep.core.eval.metrics` (the ones evaluate.py uses): updated on the device at
each step, computed (summed over processes) and logged at the epoch's end.

At test time each split's exact match and token accuracy are also counted by source length (`by_length`), where
the batches carry `src_len`; that is where positional encodings differ on longer-than-training inputs.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.core.data.tasks.base import IGNORE_INDEX
from archsweep.core.eval.metrics import LengthTable, SplitMetrics, by_length, row_stats, token_hits
from archsweep.core.model.legacy import reorder_optimizer_state
from archsweep.core.train.launch.shard import shard_model
from archsweep.core.train.optimisers.optim import make_optimizer, make_scheduler
from archsweep.variants.hooks import call_event, collect_aux_losses, collect_diagnostics


def step_seed(seed: int, step: int, micro: int, rank: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{step}/{micro}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class LitModel(L.LightningModule):
    def __init__(self, model: nn.Module, forward_fn: Callable[[nn.Module, dict], Tensor], optim: dict[str, Any],
                 schedule: dict[str, Any], label_smoothing: float, seed: int, meta: dict[str, Any],
                 test_splits: tuple[str, ...] = ("test",), longest_input: int | None = None,
                 token_bytes: Tensor | None = None) -> None:
        super().__init__()
        self.model, self.forward_fn = model, forward_fn
        self.optim_cfg, self.schedule_cfg = optim, schedule
        self.label_smoothing, self.seed = label_smoothing, seed
        self.meta = meta  # resolved config and run identity, stored in every checkpoint
        # with the task's bytes per token id (a language model: Task.token_bytes), each split also logs bpb
        self.val_metrics, self.test_splits = SplitMetrics(token_bytes), tuple(test_splits)
        self.test_metrics = nn.ModuleList(SplitMetrics(token_bytes) for _ in self.test_splits)  # one per test split
        # the by-length tables' size: the task's longest input for this kind (default: the model's max_seq_len)
        self.longest_input = longest_input or model.config.max_seq_len
        self.test_lengths: dict[str, LengthTable] = {}  # split -> counts by source length, during test
        self.by_length: dict[str, dict[str, dict[str, float]]] = {}  # split -> length -> metrics, after test
        self.n_outputs = 2  # classes each position chooses from (logits' last dim), read by the divergence check
        self.diverged: dict[str, Any] | None = None  # {"step", "reason"}, set by DivergenceMonitor

    def forward(self, batch: dict[str, Any]) -> Tensor:
        return self.forward_fn(self.model, batch)

    def configure_model(self) -> None:
        # trainer=fsdp: Lightning's ModelParallelStrategy has set up a device mesh; shard each block over it
        if self.device_mesh is not None:
            shard_model(self.model, self.device_mesh["data_parallel"], self.trainer.precision == "bf16-mixed")
            # A parameter no loss reaches (encoder_only's pooling on a token task) has no optimiser state, which a
            # strict sharded load refuses. The model's own keys need no strictness here: job.py has checked that
            # the checkpoint holds this model's config.
            self.strict_loading = False

    def _log_step(self) -> bool:
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> int | None:
        if self.stop_asked():
            return -1  # Lightning's way to leave the epoch before this batch trains; the fit then ends
        # Dropout randomness is a function of (seed, step, rank), so a resumed run draws what an uninterrupted
        # one would, whatever else consumed random numbers in between (validation, dataloader start-up).
        micro = batch_idx % self.trainer.accumulate_grad_batches
        seed = step_seed(self.seed, self.global_step, micro, self.global_rank)
        if self.device.type == "cpu":  # torch.manual_seed would also queue lazy CUDA/XPU seeding, with a stack trace
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def stop_asked(self) -> bool:
        """Whether a callback asked for a stop before this batch (`trainer.should_stop` set in its
        on_train_batch_start: pause_at's `PauseAt`) that Lightning will honour (min_steps and min_epochs met): the
        batch is not trained. A stop asked at the end of a batch ends the fit before the next one starts."""
        loop = self.trainer.fit_loop
        return (self.trainer.should_stop and self.global_step >= (loop.min_steps or 0)
                and self.current_epoch >= (loop.min_epochs or 0))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        logits = self(batch)  # (B, T, V)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=self.label_smoothing)
        aux = collect_aux_losses(self.model, labels != IGNORE_INDEX)  # the modules' own losses of this forward
        if self._log_step():  # Lightning writes step metrics only on log steps; logging others is wasted work
            self.n_outputs = logits.shape[-1]
            self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, batch_size=labels.shape[0])
            for name, (_, value) in aux.items():  # unweighted; train/loss stays the cross-entropy alone
                self.log(f"train/aux/{name}", value.detach(), on_step=True, on_epoch=False)
            hit, labelled = token_hits(logits.detach(), labels)  # as TokenAccuracy counts them
            self.log("train/acc", hit.sum() / labelled.sum().clamp(min=1), on_step=True, on_epoch=False)
        for weight, value in aux.values():
            loss = loss + weight * value
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._log_step():  # before clipping: the norm the gradient had
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads), on_step=True, on_epoch=False)
            for name, value in collect_diagnostics(self.model).items():  # the modules' own figures of this step
                self.log(f"diag/{name}", value, on_step=True, on_epoch=False)
        call_event(self.model, "before_optimizer_step")  # step_update, after every backward (hooks.py)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        logits = self(batch)
        self.val_metrics.update(row_stats(logits, batch["labels"]), batch["labels"])
        return logits  # for callbacks' on_validation_batch_end (metrics of their own; not kept by Lightning)

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        call_event(self.model, "train_batch_end")

    def on_validation_epoch_end(self) -> None:
        self._log_split("val", self.val_metrics)
        call_event(self.model, "validation_epoch_end")

    def on_test_epoch_start(self) -> None:
        self.test_lengths = {split: LengthTable(self.longest_input).to(self.device) for split in self.test_splits}

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        split = self.test_splits[dataloader_idx]
        logits = self(batch)
        stats = row_stats(logits, batch["labels"])
        self.test_metrics[dataloader_idx].update(stats, batch["labels"])
        if "src_len" in batch:
            self.test_lengths[split].update(stats, batch["src_len"])
        return logits

    def on_test_epoch_end(self) -> None:
        for split, metrics in zip(self.test_splits, self.test_metrics, strict=True):
            self._log_split(split, metrics)
        with warnings.catch_warnings():  # every process computes every table (a collective under DDP), even
            warnings.filterwarnings("ignore", message="The ``compute`` method")  # one its batches never filled
            tables = {split: by_length(table.compute()) for split, table in self.test_lengths.items()}
        self.by_length = {split: table for split, table in tables.items() if table}

    def _log_split(self, split: str, metrics: SplitMetrics) -> None:
        """Log a split's metrics and start the next epoch afresh. `compute` has summed the counts of all processes,
        so every process logs the same values (sync_dist would only average equal numbers)."""
        for name, value in metrics.compute().items():
            self.log(f"{split}/{name}", value, on_step=False, on_epoch=True, sync_dist=False,
                     add_dataloader_idx=False)
        metrics.reset()

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = make_optimizer(self.model, self.optim_cfg)
        scheduler = make_scheduler(optimizer, self.schedule_cfg)
        # the name LearningRateMonitor (fit.py) logs under: train/lr/pg1, train/lr/pg2, ... one per parameter group
        schedule = {"scheduler": scheduler, "interval": "step", "name": "train/lr"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def on_train_start(self) -> None:
        # A restored fit's rates are its schedule's at the restored step. The checkpoint holds the rates of the
        # schedule that wrote it, which a budget branch (total_steps = its budget) or a resume with another
        # trainer.max_steps replaces; for the same schedule this sets the rates they already have.
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
                for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs,
                                               scheduler.lr_lambdas, strict=True):
                    group["lr"] = base * factor(scheduler.last_epoch)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of a model built before the plug-ins registered some parameters in another order: its
        optimizer state is put in today's order (core/model/legacy.py)."""
        old_order = checkpoint.get("archsweep", {}).get("legacy_order")
        if old_order is None or not checkpoint.get("optimizer_states"):
            return
        names = {id(p): f"model.{n}" for n, p in self.model.named_parameters()}
        fresh = make_optimizer(self.model, self.optim_cfg)  # only its groups are read: which parameters, in order
        groups = [[names[id(p)] for p in g["params"]] for g in fresh.param_groups]
        checkpoint["optimizer_states"][0] = reorder_optimizer_state(checkpoint["optimizer_states"][0], groups,
                                                                    old_order)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["archsweep"] = {**self.meta, "model_config": self.model.config.to_dict()}
