"""The coordinate check, in numbers (`archsweep-coordcheck <overrides>`): does every module's output keep its size as
the model widens?

The model the overrides compose is built at several widths (d_model times 1, 2, 4, 8 by default; d_ff and a
ViT's head_hidden in proportion; heads, layers and the rest as set), each trained a few steps on the task's own
batches at the configured learning rate (constant: no warm-up, no dropout), from several seeds. On one fixed
batch, every module's output is recorded at initialisation and after the last step. Printed per module and width:
the root mean square of the output after training, and of its change since initialisation, averaged over the
seeds, with the spread of each (largest over smallest across widths).

The change is what a width-transferring parametrisation holds constant (Yang et al. 2022, Tensor Programs V:
every layer's update moves its output by the same amount at every width; the "coordinate check" of their figure
5 and of the `mup` package, judged there by eye). The output itself need not stay put: under muP the logits of a
tied head start smaller the wider the model, by design. So the verdict reads the change: under a parametrisation
that transfers (`param=mup`) the check fails when a module's change spreads more than `threshold` (1.5x) across the
widths; under the standard one it names the modules whose change grows with the width.

The modules whose output no parameter moves (a sinusoidal table) are listed as fixed and not judged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.core.data.tasks.base import IGNORE_INDEX, Task
from archsweep.core.model.build import ModelConfig, build_model, parametrisation
from archsweep.core.train.optimisers.optim import make_optimizer
from archsweep.variants.hooks import call_event, collect_aux_losses
from archsweep.variants.param.base import scaled_widths

FIXED = 1e-6  # a change below this share of the output's own size, at every width: a module no parameter moves


@dataclass
class ModuleRecord:
    """Per width (in order): the output's RMS after training and its change's RMS, averaged over seeds."""

    rms: list[float] = field(default_factory=list)
    change: list[float] = field(default_factory=list)

    @property
    def fixed(self) -> bool:
        return all(c <= FIXED * max(r, 1e-30) for r, c in zip(self.rms, self.change, strict=True))

    @staticmethod
    def spread_of(values: list[float]) -> float:
        low, high = min(values), max(values)
        return high / low if low > 0 else math.inf

    @property
    def spread(self) -> float:
        return self.spread_of(self.change)

    @property
    def rms_spread(self) -> float:
        return self.spread_of(self.rms)

    @property
    def grows(self) -> bool:
        """The change grows with the width: its largest at the widest model, and more than 1.5x its smallest."""
        return self.change[-1] == max(self.change) and self.spread > 1.5


@dataclass
class CoordCheck:
    widths: list[int]
    param: str
    transfers: bool
    threshold: float
    steps: int
    seeds: int
    modules: dict[str, ModuleRecord]

    def judged(self) -> dict[str, ModuleRecord]:
        return {name: rec for name, rec in self.modules.items() if not rec.fixed}

    def failures(self) -> list[str]:
        """Under a transferring parametrisation: the modules whose change spreads more than the threshold."""
        if not self.transfers:
            return []
        return [name for name, rec in self.judged().items() if rec.spread > self.threshold]

    def growing(self) -> list[str]:
        return [name for name, rec in self.judged().items() if rec.grows]

    def passed(self) -> bool:
        return not self.failures()


def width_config(cfg: ModelConfig, width: int) -> ModelConfig:
    """`cfg` at d_model = `width`, the fields that grow with it in proportion (d_ff, head_hidden), without dropout."""
    return dataclasses.replace(cfg, **scaled_widths(cfg.sizes(), width), dropout=0.0, attn_dropout=0.0,
                               emb_dropout=0.0)


def record_outputs(model: nn.Module) -> tuple[dict[str, list[Tensor]], list[Any]]:
    """Forward hooks (torch's public hook API) that keep every module's tensor outputs of a forward, by name."""
    outputs: dict[str, list[Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def keep(_module: nn.Module, _args: Any, out: Any, name: str = name) -> None:
            if isinstance(out, Tensor) and out.is_floating_point():
                outputs.setdefault(name, []).append(out.detach().float().clone())

        handles.append(module.register_forward_hook(keep))
    return outputs, handles


def probe(model: nn.Module, forward_fn: Any, batch: dict[str, Any]) -> dict[str, Tensor]:
    """Every module's outputs on `batch` (all calls of a module, flattened into one vector)."""
    outputs, handles = record_outputs(model)
    try:
        with torch.no_grad():
            forward_fn(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat([o.flatten() for o in outs]) for name, outs in outputs.items()}


def rms(x: Tensor) -> float:
    return float(x.pow(2).mean().sqrt())


def train_and_measure(cfg: ModelConfig, task: Task, optim: dict[str, Any], steps: int, seed: int
                      ) -> dict[str, tuple[float, float]]:
    """{module: (RMS of its output after `steps` steps, RMS of the change since init)} for one width and seed."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.train()
    forward_fn = task.forward_fn(cfg.kind)
    optimizer = make_optimizer(model, optim)
    batches = iter(task.dataloader("train", cfg.kind, seed=seed))
    fixed = next(batches)
    before = probe(model, forward_fn, fixed)
    for step in range(steps):
        batch = fixed if step == 0 else next(batches)
        logits = forward_fn(model, batch)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        for weight, value in collect_aux_losses(model, labels != IGNORE_INDEX).values():
            loss = loss + weight * value
        loss.backward()
        call_event(model, "before_optimizer_step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    after = probe(model, forward_fn, fixed)
    return {name: (rms(out), rms(out - before[name])) for name, out in after.items()
            if name in before and before[name].shape == out.shape}


def coordcheck(cfg: ModelConfig, task: Task, optim: dict[str, Any], widths: Sequence[int], steps: int = 4,
               seeds: int = 3, threshold: float = 1.5, progress: Any = None) -> CoordCheck:
    """Train `cfg` at each width for `steps` steps from `seeds` seeds and record every module (see the module
    docstring). `optim`: the resolved `optim` group; the schedule is not used (a constant rate)."""
    if len(widths) < 2:
        raise ValueError(f"widths={list(widths)}: the coordinate check compares at least two widths (4 or more "
                         f"to judge a trend)")
    configs = [width_config(cfg, w).validate() for w in widths]
    sums: dict[str, list[list[float]]] = {}
    for i, (width, wcfg) in enumerate(zip(widths, configs, strict=True)):
        for seed in range(seeds):
            if progress is not None:
                progress(f"width {width} ({i + 1}/{len(widths)}), seed {seed + 1}/{seeds}")
            for name, (out, change) in train_and_measure(wcfg, task, optim, steps, seed).items():
                entry = sums.setdefault(name, [[0.0] * len(widths), [0.0] * len(widths), [0] * len(widths)])
                entry[0][i] += out
                entry[1][i] += change
                entry[2][i] += 1
    modules = {name: ModuleRecord([s / n for s, n in zip(outs, counts, strict=True)],
                                  [s / n for s, n in zip(changes, counts, strict=True)])
               for name, (outs, changes, counts) in sums.items() if all(counts)}
    param = parametrisation(cfg)
    return CoordCheck(list(widths), cfg.choice("param"), param.transfers_width, threshold, steps, seeds, modules)


def report(check: CoordCheck) -> str:
    """The table and the verdict, as printed."""
    w = max([len("module"), *(len(n) for n in check.modules)])
    head = "".join(f"{f'd={x}':>10}" for x in check.widths)
    lines = [f"coordinate check: param={check.param}, {check.steps} steps, {check.seeds} seeds, widths "
             f"{', '.join(map(str, check.widths))}",
             "", f"{'change since init (RMS)':<{w}}{head}{'spread':>9}"]
    for name, rec in check.modules.items():
        values = "".join(f"{v:>10.3g}" for v in rec.change)
        spread = "fixed" if rec.fixed else f"{rec.spread:.2f}x"
        mark = " <" if name in check.failures() else (" ^" if not check.transfers and rec.grows else "")
        lines.append(f"{name:<{w}}{values}{spread:>9}{mark}")
    lines += ["", f"{'output after training (RMS)':<{w}}{head}{'spread':>9}"]
    for name, rec in check.modules.items():
        values = "".join(f"{v:>10.3g}" for v in rec.rms)
        lines.append(f"{name:<{w}}{values}{rec.rms_spread:>8.2f}x")
    judged, failed, growing = check.judged(), check.failures(), check.growing()
    worst = max(judged.items(), key=lambda kv: kv[1].spread, default=None)
    lines.append("")
    if check.transfers:
        if failed:
            lines.append(f"FAILED: {len(failed)} of {len(judged)} modules change by more than {check.threshold}x "
                         f"more at one width than at another ({', '.join(failed[:6])}"
                         f"{', ...' if len(failed) > 6 else ''}); param={check.param} does not hold them")
        elif worst is not None:
            lines.append(f"passed: every one of {len(judged)} modules changes by the same amount within "
                         f"{check.threshold}x across the widths (widest spread {worst[1].spread:.2f}x, {worst[0]})")
    else:
        lines.append(f"param={check.param} does not transfer across widths (nothing judged): {len(growing)} of "
                     f"{len(judged)} modules change more the wider the model (marked ^)")
    return "\n".join(lines)


def plot(check: CoordCheck, path: str | Path) -> Path:
    """The change since init against the width, one line per module (log-log), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for name, rec in check.judged().items():
        ax.plot(check.widths, rec.change, marker="o", linewidth=1, alpha=0.7, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("d_model")
    ax.set_ylabel(f"RMS of the output's change after {check.steps} steps")
    ax.set_title(f"coordinate check, param={check.param}")
    if len(check.judged()) <= 16:
        ax.legend(fontsize=6)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
