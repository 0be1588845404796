"""results.json: one schema for what a run reports, written by training (fit.py, job.py) and read by the report wing
(core/report/runs.py) and the sweep bookkeeping (sweep.py).

The file is a JSON object with every field of `Results`, the metrics of each evaluated split ("val", "test",
"test_long", ...) as top-level objects beside them. `version` says which schema wrote it; a file without one is
version 1 (before the schema had a number: the same fields, some missing), and reads with the missing fields None.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from archsweep.core.train.config.wsd import FRACTION_TOLERANCE

RESULTS = "results.json"
VERSION = 4  # 4: status paused and `paused`; 3: compare, budget, budgets (2: the schema numbered; 1: before)
STATUSES = ("completed", "failed", "diverged", "interrupted", "paused")
# JSON objects, or null
OBJECTS = ("choices", "diverged", "interrupted", "paused", "train", "by_length", "by_context", "compare", "budget")


@dataclass
class Results:
    status: str  # completed | failed | diverged | interrupted | paused
    error: str | None = None  # a failed run's exception, `Type: message`
    name: str | None = None  # the overrides that set the run apart ("defaults" for none)
    group: str | None = None
    run_dir: str | None = None
    choices: dict[str, Any] | None = None  # config group -> option
    overrides: list[str] | None = None
    seed: Any = None
    params: int | None = None  # trainable parameters, all of them
    active_params: int | None = None  # those one token uses (less than params for a mixture of experts)
    steps: int | None = None  # optimiser steps taken
    budget: dict[str, Any] | None = None  # budget.flops / budget.tokens: {"unit", "requested", "per_step",
    # "max_steps", "steps", "spent", "spent_vs_requested"} (spent: the steps taken at per_step, by the budget's count)
    task_family: str | None = None  # lm, translation, classification, synthetic: compare.py's defaults follow it
    diverged: dict[str, Any] | None = None  # {"step", "reason"} when the divergence check stopped the run
    interrupted: dict[str, Any] | None = None  # {"signal", "step", "exit_code"} of a run stopped by a signal
    paused: dict[str, Any] | None = None  # {"at": the budget fraction (pause_at), "step"} of a run paused there
    train: dict[str, Any] | None = None  # {"loss": last logged training loss, "loss_spikes"}
    splits: dict[str, dict[str, float]] = field(default_factory=dict)  # split -> metric -> value (top-level keys)
    by_length: dict[str, Any] | None = None  # split -> source length -> {"n", "exact_match", "acc"}
    by_context: dict[str, Any] | None = None  # eval.context_lengths: {"split", "train_length", "rows", "ppl_ratio"}
    budgets: list[dict[str, Any]] | None = None  # schedule.branches: per budget {"fraction", "steps", "decay_start",
    # "tokens", "flops" (training FLOPs of its steps), "branch_train_flops" (its own decay's; None: the run itself),
    # "val/<metric>": validated at the end of its decay (the run itself: its val metrics)}, fewest steps first
    best_checkpoint: str | None = None
    last_checkpoint: str | None = None
    resumed_from: str | None = None
    wandb_run_id: str | None = None
    tokens_per_s: float | None = None
    flops_per_token: float | None = None
    total_flops: float | None = None
    mfu: float | None = None
    peak_flops: float | None = None
    peak_source: str | None = None  # "trainer.peak_flops", "Lightning's table for <device>", "CPU probe, 3 h old, ..."
    peak_age_s: float | None = None  # of a probed peak when the run used it (None: not a probe)
    mfu_estimate: bool | None = None  # MFU against a probe (a CPU's), not a data sheet
    peak_memory_mib: float | None = None  # of rank 0's process; see core/train/monitoring/memory.py
    train_time_s: float | None = None  # training without validation
    val_time_s: float | None = None  # the validations during the fit (decoding included)
    fit_time_s: float | None = None  # Trainer.fit: training, its validations, Lightning's own work
    eval_time_s: float | None = None  # the final evaluation after the fit (best checkpoint; by-context)
    wall_time_s: float | None = None  # from the job's start: a single run's process start, a sweep job's own start
    time_to_first_step_s: float | None = None  # from the same start
    world_size: int | None = None
    compare: dict[str, Any] | None = None  # the config's `compare:` block {tune, baseline, metric}: how to read a sweep
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}, expected one of {', '.join(STATUSES)}")
        for key in OBJECTS:
            value = getattr(self, key)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{key!r} is a {type(value).__name__}, expected an object")
        if self.budgets is not None and not (isinstance(self.budgets, list)
                                             and all(isinstance(b, dict) for b in self.budgets)):
            raise ValueError(f"'budgets' is a {type(self.budgets).__name__}, expected a list of objects")
        for split, metrics in self.splits.items():
            if not isinstance(metrics, dict):
                raise ValueError(f"{split!r} is a {type(metrics).__name__}, expected an object of metrics")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field, the splits as top-level keys in their place."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key == "splits":
                out.update(value)
            else:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Results:
        """A results.json object of this version or an earlier one; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        version = data.get("version", 1)
        if not isinstance(version, int) or version > VERSION:
            raise ValueError(f"version={version!r}: written by a newer archsweep (this one reads versions up to "
                             f"{VERSION}); update archsweep to read it")
        for split in ("val", "test"):  # every run evaluates these; another key may be a split or a retired field
            if data.get(split) is not None and not isinstance(data[split], dict):
                raise ValueError(f"{split!r} is a {type(data[split]).__name__}, expected an object")
        known = {f.name for f in fields(cls)} - {"splits"}
        splits = {k: v for k, v in data.items() if k not in known and isinstance(v, dict)}
        return cls(**{k: v for k, v in data.items() if k in known and k != "version"}, splits=splits,
                   version=version)

    @classmethod
    def read(cls, path: str | Path) -> Results:
        """OSError, UnicodeDecodeError or ValueError (json.JSONDecodeError is one) when it cannot be read."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        """Written to a temporary file and renamed into place: a reader never sees half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        tmp.replace(path)

    def value(self, key: str) -> Any:
        """A final figure by key: 'val/loss', 'test_long/exact_match', 'train/loss', 'by_context/ppl_ratio' (an
        object's entry), 'tokens_per_s', 'params' (a field); None where the run has none."""
        head, _, name = key.partition("/")
        if name:
            container = self.splits.get(head) if head in self.splits else getattr(self, head, None)
            return container.get(name) if isinstance(container, dict) else None
        if head in self.splits or head == "splits":
            return None
        return getattr(self, head, None) if head in {f.name for f in fields(self)} else None


def paused_beyond(results: dict[str, Any] | None, pause_at: float | None) -> bool:
    """Whether results.json `results` is a run paused at the budget `pause_at` or a later one: continued with that
    pause_at, it has nothing to train (None, the end: never)."""
    paused = (results or {}).get("paused") if (results or {}).get("status") == "paused" else None
    at = paused.get("at") if isinstance(paused, dict) else None
    return pause_at is not None and isinstance(at, (int, float)) and at >= pause_at - FRACTION_TOLERANCE
