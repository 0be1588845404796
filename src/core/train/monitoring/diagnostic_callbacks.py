"""Lightning callbacks of the training diagnostics (settings and metric keys: `train.config.diagnostics`).

- `LayerNorms`: every `every_n_steps` steps, the gradient L2 norm of each block before clipping (the squares of its
  parameters' gradients summed; under trainer=fsdp each process sums its own shard of each gradient and one
  all-reduce adds the processes' sums before the square root) and the mean per-token L2 norm of the residual stream
  after the embedding and each block (forward hooks that exist only during that step's forward). Nothing on other
  steps.
- `DivergenceMonitor`: on log steps (where the loss is read anyway) counts loss spikes and stops a diverged run.
- `AttentionDiagnostics`: at each validation, on a fixed validation batch, attention entropy per module and a
  PNG of one example's attention maps (layers x heads per attention kind), also logged to W&B.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.loggers import WandbLogger
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from archsweep.core.data.codec import Codec
from archsweep.core.eval.attention_maps import attention_figure, mean_entropy, parse_name, save_figure
from archsweep.core.train.config.diagnostics import DiagnosticsConfig
from archsweep.variants.attention.layers import capture_attention
from archsweep.variants.blocks import Stack

log = logging.getLogger("train")

BLOCK_PARAM = re.compile(r"^(?P<stack>.+)\.blocks\.(?P<layer>\d+)\.")
MAP_TOKENS = 64  # attention maps show at most this many queries and keys


def log_now(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """Write metrics to every logger at `step`, whatever Lightning's own log interval is (rank zero only)."""
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def stacks(model: nn.Module) -> list[tuple[str, Stack]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Stack)]


def grad_group(param_name: str) -> str:
    """`encoder.blocks.2.ffn.up_proj.weight` -> `encoder.2`; `decoder.embed.weight` -> `decoder.embed`;
    `head.bias` -> `head`; `encoder.final_norm.weight` -> `encoder.final_norm`."""
    m = BLOCK_PARAM.match(param_name)
    if m is not None:
        return f"{m['stack']}.{m['layer']}"
    return ".".join(param_name.split(".")[:-1][:2]) or param_name


def grad_square(grad: Tensor) -> tuple[Tensor, DeviceMesh | None]:
    """(sum of squares of the part of `grad` this process holds, as float32; the 1-D device mesh over which the other
    parts are spread, or None where this process holds all of it). A gradient fully_shard made (trainer=fsdp) is a
    DTensor split over the mesh: its local shard is summed here; one in any other layout is gathered whole."""
    if isinstance(grad, DTensor):
        if grad.device_mesh.ndim == 1 and all(p.is_shard() for p in grad.placements):
            return grad.to_local().float().square().sum(), grad.device_mesh
        grad = grad.full_tensor()
    return grad.float().square().sum(), None


def group_grad_norms(model: nn.Module) -> dict[str, Tensor]:
    """{group: L2 norm of its parameters' gradients} in model order, for the parameters that have gradients, grouped
    per block (`grad_group`); the norms stay on the device. Sharded gradients: each process sums the squares of its
    own shards per group, one all-reduce per device mesh adds the processes' sums, then the square root is taken, so
    every process returns the norms of the whole gradients (a collective: every process must call it)."""
    order: list[str] = []
    whole: dict[str, Tensor] = {}  # group -> sum of squares of the gradients held whole (or already reduced)
    shards: dict[DeviceMesh, dict[str, Tensor]] = {}  # mesh -> group -> this process's sum over its shards
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        group = grad_group(name)
        if group not in order:
            order.append(group)
        square, mesh = grad_square(param.grad)
        sums = whole if mesh is None else shards.setdefault(mesh, {})
        sums[group] = sums[group] + square if group in sums else square
    for mesh, sums in shards.items():
        total = torch.stack(list(sums.values()))
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=mesh.get_group())
        for group, square in zip(sums, total, strict=True):
            whole[group] = whole[group] + square if group in whole else square
    return {group: whole[group].sqrt() for group in order}


def token_norm(x: Tensor, mask: Tensor | None) -> Tensor:
    """x (B, T, D) -> mean L2 norm over tokens, real tokens only when mask (B, T) is given."""
    norms = torch.linalg.vector_norm(x.detach().float(), dim=-1)  # (B, T)
    if mask is None or mask.shape != norms.shape:
        return norms.mean()
    weights = mask.to(norms.dtype)
    return (norms * weights).sum() / weights.sum().clamp(min=1)


def watch_stacks(model: nn.Module, seen: dict[str, tuple[Tensor, Tensor | None]]) -> list[RemovableHandle]:
    """While the handles live, each Stack's call records {stack name: (tokens (B, T), pad_mask (B, T) or None)}."""
    handles = []
    for name, stack in stacks(model):
        def pre(module: nn.Module, args: tuple, kwargs: dict, name: str = name) -> None:
            tokens = args[0] if args else kwargs["tokens"]
            seen[name] = (tokens, kwargs.get("pad_mask", args[1] if len(args) > 1 else None))
        handles.append(stack.register_forward_pre_hook(pre, with_kwargs=True))
    return handles


def residual_hooks(model: nn.Module, out: dict[str, Tensor]) -> list[RemovableHandle]:
    """Record {`<stack>.embed` and `<stack>.<i>`: mean token norm of the hidden state after it} at each forward."""
    seen: dict[str, tuple[Tensor, Tensor | None]] = {}
    handles = watch_stacks(model, seen)
    for name, stack in stacks(model):
        points = [(f"{name}.embed", stack.emb_dropout)] + [(f"{name}.{i}", b) for i, b in enumerate(stack.blocks)]
        for key, module in points:
            def hook(module: nn.Module, args: tuple, output: Tensor, key: str = key, name: str = name) -> None:
                with torch.no_grad():
                    out[key] = token_norm(output, seen[name][1])
            handles.append(module.register_forward_hook(hook))
    return handles


class LayerNorms(L.Callback):
    def __init__(self, every_n_steps: int, residual: bool = True) -> None:
        if every_n_steps < 1:
            raise ValueError(f"diagnostics.every_n_steps={every_n_steps} must be positive to build LayerNorms")
        self.every, self.residual = every_n_steps, residual
        self.handles: list[RemovableHandle] = []
        self.resid: dict[str, Tensor] = {}

    def _due(self, trainer: L.Trainer) -> bool:
        return (trainer.global_step + 1) % self.every == 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        last_micro = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if self.residual and last_micro and self._due(trainer):
            self.handles = residual_hooks(pl_module.model, self.resid)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        self._unhook()  # activation checkpointing re-runs blocks in backward: record the forward only

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self._due(trainer):
            return
        self._unhook()
        grad_norms = group_grad_norms(pl_module.model)
        names = [f"diag/grad_norm/{group}" for group in grad_norms]
        values = [torch.stack(list(grad_norms.values())).to(pl_module.device)] if grad_norms else []
        names += [f"diag/resid_norm/{key}" for key in self.resid]
        values += [torch.stack(list(self.resid.values())).to(pl_module.device)] if self.resid else []
        numbers = torch.cat(values).tolist() if values else []  # one host-device copy of the figures
        self.resid.clear()
        log_now(trainer, dict(zip(names, numbers, strict=True)), trainer.global_step)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._unhook()

    def _unhook(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class DivergenceMonitor(L.Callback):
    """A check per log step. Non-finite loss: diverged at once. Loss above `factor` x ln(number of outputs) (the
    loss of a uniform guess, where training starts) for `patience` consecutive checks: diverged. A loss above
    `spike_factor` x the running average of earlier checks counts as a spike (`diag/loss_spikes`, cumulative).
    With `stop`, a diverged run is stopped and `pl_module.diverged` records {"step", "reason"}."""

    def __init__(self, factor: float, patience: int, spike_factor: float, stop: bool) -> None:
        self.factor, self.patience, self.spike_factor, self.stop = factor, patience, spike_factor, stop
        self.average: float | None = None  # exponential moving average of checked losses
        self.spikes = self.bad = 0

    def check(self, loss: float, step: int, n_outputs: int) -> dict[str, Any] | None:
        """Take one logged loss; returns {"step", "reason"} when it makes the run diverged."""
        if not math.isfinite(loss):
            return {"step": step, "reason": f"training loss is {loss} (not finite)"}
        if self.average is not None and loss > self.spike_factor * self.average:
            self.spikes += 1
        self.average = loss if self.average is None else 0.9 * self.average + 0.1 * loss
        threshold = self.factor * math.log(max(n_outputs, 2))
        self.bad = self.bad + 1 if loss > threshold else 0
        if self.bad >= self.patience:
            return {"step": step, "reason": f"training loss above {threshold:.4g} (factor {self.factor:g} x "
                                            f"ln({n_outputs}) outputs) at {self.bad} consecutive checks, "
                                            f"last {loss:.4g}"}
        return None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        every = trainer.log_every_n_steps
        if not every or trainer.global_step % every or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        loss = trainer.callback_metrics.get("train/loss")
        if loss is None or pl_module.diverged is not None:
            return
        found = self.check(float(loss), trainer.global_step, pl_module.n_outputs)
        pl_module.log("diag/loss_spikes", float(self.spikes), on_step=True, on_epoch=False)
        if not self.stop or not trainer.strategy.reduce_boolean_decision(found is not None, all=False):
            return
        pl_module.diverged = found or {"step": trainer.global_step, "reason": "another process diverged"}
        trainer.should_stop = True
        log.warning(f"diverged at step {trainer.global_step}: {pl_module.diverged['reason']}; stopping")

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average, "spikes": self.spikes, "bad": self.bad}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.average, self.spikes, self.bad = state_dict["average"], state_dict["spikes"], state_dict["bad"]


class AttentionDiagnostics(L.Callback):
    """Uses the explicit attention path on `rows` rows of the first validation batch (probabilities (B, H, T, T)
    per module are kept), once per validation during fit."""

    def __init__(self, task: Any, kind: str, codec: Codec | None, seed: int, entropy: bool, maps: bool,
                 run_dir: Path, rows: int = 8) -> None:
        self.task, self.kind, self.codec, self.seed = task, kind, codec, seed
        self.entropy, self.maps, self.run_dir, self.rows = entropy, maps, run_dir, rows
        self.batch: dict[str, Any] | None = None

    def _fixed_batch(self, device: torch.device) -> dict[str, Any]:
        if self.batch is None:
            first = next(iter(self.task.dataloader("val", self.kind, self.seed)))
            self.batch = {k: v[:self.rows] if isinstance(v, Tensor) else v for k, v in first.items()}
        return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in self.batch.items()}

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or pl_module.diverged is not None:
            return
        seen: dict[str, tuple[Tensor, Tensor | None]] = {}
        handles = watch_stacks(pl_module.model, seen)
        try:
            with torch.no_grad(), capture_attention(pl_module.model) as captured:
                pl_module(self._fixed_batch(pl_module.device))
        finally:
            for handle in handles:
                handle.remove()
        probs = {name: calls[0] for name, calls in captured.items() if calls}  # (B, H, Tq, Tk)
        if self.entropy:
            for name, p in probs.items():
                mask = seen.get(parse_name(name)[0], (None, None))[1]
                pl_module.log(f"diag/attn_entropy/{name}", mean_entropy(p, mask), on_epoch=True, sync_dist=False)
        if self.maps and probs and trainer.is_global_zero:
            path = self.draw(probs, seen, trainer.global_step)
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    logger.log_image("diag/attention", [str(path)], step=trainer.global_step)

    def draw(self, probs: dict[str, Tensor], seen: dict[str, tuple[Tensor, Tensor | None]], step: int) -> Path:
        """Example 0's maps, cropped to its real tokens, as <run dir>/attention/step_<step>.png."""
        layers: dict[str, list[tuple[int, Tensor]]] = {}
        labels: dict[str, tuple[list[str], list[str]]] = {}
        for name, p in probs.items():
            stack, kind, layer = parse_name(name)
            q_stack = stack
            k_stack = "encoder" if kind.endswith("cross_attn") and "encoder" in seen else stack
            q_ids, k_ids = self._row(seen, q_stack, p.shape[2]), self._row(seen, k_stack, p.shape[3])
            layers.setdefault(kind, []).append((layer, p[0, :, :len(q_ids), :len(k_ids)]))
            labels[kind] = (self._labels(q_ids, q_stack, seen), self._labels(k_ids, k_stack, seen))
        maps = {kind: [m for _, m in sorted(entries, key=lambda e: e[0])] for kind, entries in layers.items()}
        stacks = {parse_name(name)[1]: parse_name(name)[0] for name in probs}
        embedded = {kind: ("query: position (image patches, after any class token)", "key: position")
                    for kind, stack in stacks.items() if stack in seen and seen[stack][0].dim() != 2}
        fig = attention_figure(maps, labels, f"attention at step {step}, validation example 0", embedded)
        return save_figure(fig, self.run_dir / "attention" / f"step_{step}.png")

    @staticmethod
    def _row(seen: dict[str, tuple[Tensor, Tensor | None]], stack: str, width: int) -> list[int]:
        """Example 0's real token ids of a stack's input (right-padded), at most MAP_TOKENS."""
        if stack not in seen or seen[stack][0].dim() != 2:  # no token ids (an embedded input): positions
            return list(range(min(width, MAP_TOKENS)))
        tokens, mask = seen[stack]
        n = int(mask[0].sum()) if mask is not None else tokens.shape[1]
        return tokens[0, :min(n, width, MAP_TOKENS)].tolist()

    def _labels(self, ids: list[int], stack: str, seen: dict[str, tuple[Tensor, Tensor | None]]) -> list[str]:
        if stack in seen and seen[stack][0].dim() != 2:  # an embedded input (image patches): positions
            return [str(i) for i in ids]
        t = self.task
        special = {t.pad_id: "<pad>", t.bos_id: "<s>", t.eos_id: "</s>", t.sep_id: "<sep>"}
        side = "src" if stack == "encoder" else "tgt"
        if self.codec is None:
            return [special.get(i, str(i)) for i in ids]
        return [special.get(i) or self.codec.decode([i], side) or str(i) for i in ids]


def diagnostic_callbacks(diag: DiagnosticsConfig, task: Any, kind: str, codec: Codec | None, seed: int,
                         run_dir: Path, compiled: bool) -> list[L.Callback]:
    """The callbacks the `diagnostics:` settings ask for. Residual-stream hooks are left out of compiled models
    (adding and removing hooks would recompile the graph)."""
    div = diag.divergence
    callbacks: list[L.Callback] = [DivergenceMonitor(div.factor, div.patience, diag.spike_factor, div.enabled)]
    if diag.every_n_steps > 0:
        callbacks.append(LayerNorms(diag.every_n_steps, residual=not compiled))
    if diag.attention_entropy or diag.attention_maps:
        callbacks.append(AttentionDiagnostics(task, kind, codec, seed, diag.attention_entropy, diag.attention_maps,
                                              run_dir))
    return callbacks
