"""A stand-in for train.py under `hydra/sweeper=halving` (tests/test_halving.py): each job writes the results.json a
run with `pause_at` writes, with a planted validation loss, and no training. The loss at budget fraction f of a job
with learning rate lr is (log10(lr) - log10(BEST[cell]))^2 + 0.1 / f + 0.001 * seed, so each cell's best rate is
known and holds at every rung; FLOPS_PER_STEP x steps is what each job records as spent. Every launch appends a line
to <sweep dir>/launches.jsonl; ARCHSWEEP_TEST_KILL=<job>:<pause_at> ends the whole sweep (SIGKILL) at that job's
launch, as a kill would, once."""

from __future__ import annotations

import json
import math
import os
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.archsweep_halving import halving_sweeper

BEST = {"a": 1e-3, "b": 1e-2}
WORSE = {"a": 0.0, "b": 0.1}  # cell b's loss at its best rate is this much above cell a's (the final test loss)
FLOPS_PER_STEP = 1e6


@dataclass
class Schedule:
    name: str = "wsd"
    branches: list[float] = field(default_factory=list)


@dataclass
class App:
    cell: str = "a"
    seed: int = 0
    pause_at: float | None = None
    optim: dict = field(default_factory=lambda: {"lr": 1e-3})
    trainer: dict = field(default_factory=lambda: {"max_steps": 90})
    schedule: Schedule = field(default_factory=Schedule)
    compare: dict = field(default_factory=dict)


ConfigStore.instance().store(name="halving_app", node=App)


def loss(cell: str, lr: float, seed: int, fraction: float) -> float:
    return (math.log10(lr) - math.log10(BEST[cell])) ** 2 + 0.1 / fraction + 0.001 * seed


def test_loss(cell: str, lr: float, seed: int) -> float:
    """The end's loss, with a cell's offset and a seed's noise (the same for every cell)."""
    return loss(cell, lr, seed, 1.0) + WORSE[cell] + random.Random(f"{cell}{seed}").gauss(0.0, 0.01)


@hydra.main(config_path=None, config_name="halving_app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    sweep_dir = run_dir.parent
    with open(sweep_dir / "launches.jsonl", "a") as f:
        f.write(json.dumps({"job": run_dir.name, "pause_at": cfg.pause_at}) + "\n")
    kill = os.environ.get("ARCHSWEEP_TEST_KILL")
    marker = sweep_dir / "killed"
    if kill == f"{run_dir.name}:{cfg.pause_at}" and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    path = run_dir / "results.json"
    before = json.loads(path.read_text()) if path.is_file() else {"budgets": []}
    fractions = [float(b) for b in cfg.schedule.branches]
    end = 1.0 if cfg.pause_at is None else float(cfg.pause_at)
    steps = round(end * cfg.trainer.max_steps)
    budgets = list(before["budgets"])
    for fraction in fractions:
        if fraction <= end and not any(b["fraction"] == fraction for b in budgets):
            budgets.append({"fraction": fraction, "steps": round(fraction * cfg.trainer.max_steps),
                            "val/loss": loss(cfg.cell, cfg.optim.lr, cfg.seed, fraction),
                            "branch_train_flops": 0.2 * fraction * cfg.trainer.max_steps * FLOPS_PER_STEP})
    results = {"status": "completed" if cfg.pause_at is None else "paused", "steps": steps, "seed": cfg.seed,
               "total_flops": steps * FLOPS_PER_STEP, "budgets": budgets,
               "paused": None if cfg.pause_at is None else {"at": float(cfg.pause_at), "step": steps},
               "overrides": [o for o in HydraConfig.get().overrides.task if not o.startswith("pause_at=")],
               "compare": OmegaConf.to_container(cfg.compare) or None}
    if cfg.pause_at is None:
        end = test_loss(cfg.cell, cfg.optim.lr, cfg.seed)
        results |= {"val": {"loss": loss(cfg.cell, cfg.optim.lr, cfg.seed, 1.0)}, "test": {"loss": end}}
    path.write_text(json.dumps(results))
    return loss(cfg.cell, cfg.optim.lr, cfg.seed, end)


if __name__ == "__main__":
    halving_sweeper.register()
    main()
