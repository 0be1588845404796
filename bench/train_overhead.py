"""train.py's training throughput against a bare PyTorch loop over the same model and data, in one process,
plus the start-up latencies of the command line.

    python bench/train_overhead.py                      # the default config (what `python train.py` trains)
    python bench/train_overhead.py model=decoder_only   # any train.py overrides
    python bench/train_overhead.py --steps 300 --rounds 3

The framework side runs Lightning exactly as train.py sets it up (LitModel, the Progress callback, checkpoint
callback, the diagnostics callbacks, CSV + W&B offline loggers, atomic checkpoint IO); validation is pushed past
the measured steps.
Both sides time the same steps after a warm-up; rounds alternate bare/framework and the best round counts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import OmegaConf

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.model.build import build_model
from archsweep.core.train.config.diagnostics import check_diagnostics
from archsweep.core.train.lifecycle.checks import build_task, check_training, model_config
from archsweep.core.train.lifecycle.trainer import TaskData
from archsweep.core.train.lit import LitModel
from archsweep.core.train.monitoring.callbacks import AtomicCheckpointIO, Progress, RunCheckpoint
from archsweep.core.train.monitoring.diagnostic_callbacks import diagnostic_callbacks
from archsweep.core.train.monitoring.loggers import LogRun, finish_wandb, make_loggers
from archsweep.core.train.optimisers.optim import make_optimizer, make_scheduler

ROOT = Path(__file__).resolve().parents[1]


class StepTimer(L.Callback):
    """Wall time from the start of batch `warmup` to the end of the last batch."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.seconds = warmup, 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.start


def bare_loop(cfg, task, model_cfg, steps: int, warmup: int) -> float:
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg)
    optimizer = make_optimizer(model, OmegaConf.to_container(cfg.optim))
    scheduler = make_scheduler(optimizer, OmegaConf.to_container(cfg.schedule, resolve=True))
    forward = task.forward_fn(model_cfg.kind)
    clip = cfg.trainer.gradient_clip_val
    model.train()
    start = 0.0
    for i, batch in enumerate(task.dataloader("train", model_cfg.kind, cfg.seed)):
        if i == warmup:
            start = time.perf_counter()
        if i == steps:
            break
        logits = forward(model, batch)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=cfg.label_smoothing)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def framework(cfg, task, model_cfg, steps: int, warmup: int, run_dir: Path) -> float:
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    lit = LitModel(model, task.forward_fn(model_cfg.kind), resolved["optim"], resolved["schedule"],
                   cfg.label_smoothing, cfg.seed, {"config": resolved})
    logger_cfg = {**resolved["logger"], **({"mode": "offline"} if "mode" in resolved["logger"] else {})}
    loggers = make_loggers(logger_cfg, LogRun(run_dir, "bench", None, [], {}, "bench0001"))
    timer = StepTimer(warmup)
    ckpt = RunCheckpoint(run_dir / "checkpoints")
    args = {**resolved["trainer"], "max_steps": steps, "val_check_interval": steps + 1, "limit_val_batches": 0}
    for ours in ("peak_flops", "collective_timeout_s"):  # trainer settings of ours, not Lightning's (fit.make_trainer)
        args.pop(ours, None)
    diagnostics = diagnostic_callbacks(check_diagnostics(cfg), task, model_cfg.kind, None, cfg.seed, run_dir,
                                       compiled=False)  # as train.py runs them (norms every 100 steps, divergence)
    trainer = L.Trainer(**args, logger=loggers, callbacks=[ckpt, Progress(time.time()), timer, *diagnostics,
                                                    LearningRateMonitor(logging_interval="step")],
                        plugins=[AtomicCheckpointIO()], default_root_dir=str(run_dir))
    trainer.fit(lit, datamodule=TaskData(task, model_cfg.kind, cfg.seed))
    finish_wandb()
    return timer.seconds


def cli_seconds(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "WANDB_MODE": "offline"})
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=opts.overrides)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    check_training(cfg)
    timed = opts.steps - opts.warmup
    bare, fw = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(opts.rounds):
            bare.append(bare_loop(cfg, task, model_cfg, opts.steps, opts.warmup))
            fw.append(framework(cfg, task, model_cfg, opts.steps, opts.warmup, Path(tmp) / f"r{r}"))
        help_s, _ = cli_seconds("--help")
        refused_s, refused = cli_seconds("model.n_heads=3", f"output_root={tmp}")
        assert refused.returncode != 0
        _, first = cli_seconds(*opts.overrides, "trainer.max_steps=2", "trainer.val_check_interval=2",
                               f"hydra.run.dir={tmp}/first", f"output_root={tmp}")
        first_step = float(OmegaConf.load(f"{tmp}/first/results.json")["time_to_first_step_s"])
    b, f = min(bare), min(fw)
    print(f"\nconfig: {' '.join(opts.overrides) or '(defaults)'}; {timed} timed steps, best of {opts.rounds} rounds, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(f"| {'loop':<22} | {'ms/step':>8} | {'steps/s':>8} | {'overhead':>8} |")
    print(f"| {'-' * 22} | {'-' * 8} | {'-' * 8} | {'-' * 8} |")
    print(f"| {'bare PyTorch':<22} | {1000 * b / timed:8.2f} | {timed / b:8.1f} | {'':>8} |")
    print(f"| {'train.py (Lightning)':<22} | {1000 * f / timed:8.2f} | {timed / f:8.1f} | {100 * (f / b - 1):7.1f}% |")
    print(f"\nrounds (s): bare {', '.join(f'{x:.2f}' for x in bare)}; framework {', '.join(f'{x:.2f}' for x in fw)}")
    print(f"\n| {'command line':<42} | {'seconds':>7} |")
    print(f"| {'-' * 42} | {'-' * 7} |")
    print(f"| {'python train.py --help':<42} | {help_s:7.2f} |")
    print(f"| {'python train.py model.n_heads=3 (refused)':<42} | {refused_s:7.2f} |")
    print(f"| {'python train.py -> first training step':<42} | {first_step:7.2f} |")


if __name__ == "__main__":
    main()
