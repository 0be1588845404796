"""The train wing's rules across fields: what no one group's schema can see (schemas.py checks each group's types
and ranges). Each rule takes the composed config and the task, raises ValueError naming the fields, their values
and the fix, or logs a warning; `check_rules` runs them before the model is built and before Lightning is imported
(light: no torch, Lightning or CUDA calls), except AFTER_IMPORTS, which ask Lightning."""

from __future__ import annotations

import glob
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from archsweep.core.data.tasks.base import Task
from archsweep.core.train.config.wsd import branch_at, branch_plan, check_phases

log = logging.getLogger("train")
FSDP_STRATEGY = "fsdp2"  # conf/trainer/fsdp.yaml (core/train/launch/shard.py); Lightning's own name `fsdp` means FSDP1
SHARDED_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")  # what Lightning's ModelParallelStrategy takes, less
# 16-true (float16 without a loss scaler)


def data_parallel(strategy: object) -> bool:
    """Whether trainer.strategy runs one process per device with the data split among them: ddp* or fsdp2."""
    return str(strategy).startswith("ddp") or strategy == FSDP_STRATEGY


def gpu_present() -> bool:
    """Whether this machine shows a GPU, judged without torch: NVIDIA or ROCm device files on Linux, unless
    CUDA_VISIBLE_DEVICES hides them; any other platform is given the benefit of the doubt."""
    if not sys.platform.startswith("linux"):
        return True
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def accelerator_present(cfg: DictConfig, task: Task) -> None:
    """trainer.accelerator against this machine."""
    accelerator = cfg.trainer.get("accelerator", "auto")
    if accelerator in ("gpu", "cuda") and not gpu_present():
        raise ValueError(f"trainer.accelerator={accelerator} (trainer=gpu) but this machine has no visible GPU "
                         f"(no /dev/nvidia* device, or CUDA_VISIBLE_DEVICES hides them); train on the CPU with "
                         f"trainer=cpu, or leave trainer.accelerator=auto")


def warmup_within_training(cfg: DictConfig, task: Task) -> None:
    """schedule.warmup_steps against trainer.max_steps: a warning (the run works, but never reaches optim.lr)."""
    warmup, max_steps = cfg.schedule.get("warmup_steps", 0), cfg.trainer.max_steps
    if 0 < max_steps < warmup:
        log.warning(f"schedule.warmup_steps={warmup} exceeds trainer.max_steps={max_steps}: the learning rate never "
                    f"reaches optim.lr (it stops at {max_steps / warmup:.0%} of it); lower schedule.warmup_steps "
                    f"(e.g. to {max(1, max_steps // 10)}) or raise trainer.max_steps")


def decay_after_warmup(cfg: DictConfig, task: Task) -> None:
    """A schedule that decays until schedule.total_steps (cosine) against the warm-up, once a budget has set
    trainer.max_steps (its schema checked the values the yaml gave)."""
    total, warmup = cfg.schedule.get("total_steps"), cfg.schedule.get("warmup_steps", 0)
    if total is not None and total <= warmup:
        raise ValueError(f"schedule.total_steps={total} (trainer.max_steps={cfg.trainer.max_steps}) must exceed "
                         f"schedule.warmup_steps={warmup}; raise the budget or trainer.max_steps, or lower the "
                         f"warm-up")


def decay_phases(cfg: DictConfig, task: Task) -> None:
    """A warmup-stable-decay schedule (and each budget branch of it) against its warm-up, once a budget has set
    trainer.max_steps (its schema checked the values the yaml gave)."""
    fraction = cfg.schedule.get("decay_fraction")
    if fraction is None or cfg.schedule.get("total_steps") is None:
        return
    check_phases(cfg.schedule.get("warmup_steps", 0), cfg.schedule.total_steps, fraction,
                 list(cfg.schedule.get("branches") or []))


def branches_on_one_process(cfg: DictConfig, task: Task) -> None:
    """Budget branches are fitted one after the other inside the job; a data-parallel job's processes would have
    to start each branch together, which fit.py does not do."""
    branches = cfg.schedule.get("branches")
    if branches and data_parallel(cfg.trainer.get("strategy", "auto")):
        raise ValueError(f"schedule.branches={list(branches)} with trainer.strategy={cfg.trainer.strategy}: budget "
                         f"branches run on one device only; drop the branches (one run per budget), or train on one "
                         f"device (trainer=cpu or trainer=gpu)")


def pause_at_a_branch(cfg: DictConfig, task: Task) -> None:
    """pause_at against schedule.branches: a run pauses at the decay start of one of its budgets below 1.0, a step
    its training reaches (run again once a budget has set trainer.max_steps)."""
    at = cfg.get("pause_at")
    if at is None:
        return
    branches = [float(f) for f in cfg.schedule.get("branches") or []]
    below = [f for f in branches if f < 1.0]
    if not below:
        raise ValueError(f"pause_at={at} needs budget branches to pause at: schedule=wsd with schedule.branches "
                         f"listing it, e.g. schedule=wsd 'schedule.branches=[{at},1.0]'; or pause_at=null")
    total, max_steps = cfg.schedule.total_steps, cfg.trainer.max_steps
    branch = branch_at(branch_plan(total, cfg.schedule.decay_fraction, below), at)
    if branch is None or branch.fraction >= 1.0:
        raise ValueError(f"pause_at={at} is not one of schedule.branches={branches}; pause at one of "
                         f"{', '.join(f'{f:g}' for f in below)}, or set pause_at=null to train to the end")
    if branch.decay_start >= max_steps:
        raise ValueError(f"pause_at={at} pauses at step {branch.decay_start} (the decay start of its "
                         f"{branch.steps}-step budget of schedule.total_steps={total}), which trainer.max_steps="
                         f"{max_steps} never reaches; pause at an earlier budget, or set schedule.total_steps to "
                         f"trainer.max_steps")


def sharding_supports(cfg: DictConfig, task: Task) -> None:
    """trainer=fsdp against what cannot be sharded: each refusal names the fix."""
    if cfg.trainer.get("strategy") != FSDP_STRATEGY:
        return
    where = f"trainer.strategy={FSDP_STRATEGY} (trainer=fsdp)"
    if processes(cfg.trainer) is None:
        raise ValueError(f"trainer.devices={cfg.trainer.devices} with {where}: the processes to shard over must be "
                         f"counted; give a number, e.g. trainer.devices=8")
    if cfg.get("compile"):
        raise ValueError(f"compile=true with {where}: the whole-model compile breaks at each sharded block and "
                         f"recompiles the blocks past torch's limit, then runs them uncompiled; drop compile=true, or "
                         f"use trainer=ddp compile=true where the model fits one device")
    if cfg.optim.get("name") == "muon":
        raise ValueError(f"optim=muon with {where}: Muon orthogonalises whole weight matrices, which FSDP splits "
                         f"across the processes; use trainer=ddp with Muon, or optim=adamw")
    if cfg.eval.get("context_lengths") is not None:
        raise ValueError(f"eval.context_lengths with {where}: that evaluation runs in one process, and the sharded "
                         f"model needs all of them; drop eval.context_lengths and run evaluate.py "
                         f"eval.context_lengths=[...] on the run's checkpoint")
    if cfg.trainer.get("precision") not in SHARDED_PRECISIONS:
        raise ValueError(f"trainer.precision={cfg.trainer.precision} with {where}: choose one of "
                         f"{', '.join(SHARDED_PRECISIONS)} (bf16-mixed on GPUs)")


def processes(trainer: DictConfig) -> int | None:
    """Data-parallel processes (devices x nodes) when the strategy is ddp or fsdp2 and the count is known (auto, -1:
    only Lightning knows it); else None."""
    if not data_parallel(trainer.get("strategy", "auto")):
        return None
    devices = trainer.get("devices", 1)
    if isinstance(devices, str) and devices.replace(",", "").strip().isdigit():
        devices = len(devices.split(",")) if "," in devices else int(devices)
    count = len(devices) if not isinstance(devices, (int, str)) else devices
    if not isinstance(count, int) or count < 1:
        return None  # auto / -1: known only to Lightning
    return count * int(trainer.get("num_nodes", 1) or 1)


def ddp_validation_batches(cfg: DictConfig, task: Task) -> None:
    """Data-parallel validation needs a batch for every process: with fewer, the processes that get none wait
    forever at the first validation's collective."""
    count = processes(cfg.trainer)
    if count is None:
        return
    known = getattr(task, "n_batches", None)  # a {split: count} of the synthetic tasks, a method of the image tasks
    val_batches = known("val") if callable(known) else (known or {}).get("val")
    if isinstance(val_batches, int) and val_batches < count:
        raise ValueError(f"task.val_batches={val_batches} is fewer than the {count} data-parallel processes "
                         f"(trainer.devices={cfg.trainer.devices}, trainer.num_nodes={cfg.trainer.get('num_nodes', 1)}"
                         f"); each process validates its own batches, so set task.val_batches>={count} or use fewer "
                         f"devices")


def context_lengths_need_text(cfg: DictConfig, task: Task) -> None:
    """eval.context_lengths against the task: only a running text can be cut at other context lengths."""
    if cfg.eval.get("context_lengths") is not None and type(task).token_stream is Task.token_stream:
        raise ValueError(f"eval.context_lengths: task={task.name} is made of separate examples, not a running text; "
                         f"evaluation at other context lengths needs a language-model task (text, shakespeare_char); "
                         f"remove eval.context_lengths")


def precision_known(cfg: DictConfig, task: Task) -> None:
    """trainer.precision against the values lightning.Trainer's signature declares (asked, not copied: the list
    changes between Lightning versions). It imports Lightning, so it runs once the heavy imports are made, before
    the data and the model are built; Lightning's own refusal would come later, as a traceback."""
    import inspect
    import typing

    import lightning

    def values(annotation: object) -> list[object]:
        args = typing.get_args(annotation)
        return [v for a in args for v in values(a)] if args else [annotation]

    known = [v for v in values(inspect.signature(lightning.Trainer).parameters["precision"].annotation)
             if v is not type(None)]
    precision = cfg.trainer.get("precision")
    if known and precision not in known:
        names = ", ".join(dict.fromkeys(str(v) for v in known))
        raise ValueError(f"trainer.precision={precision!r} is not a precision Lightning knows; choose one of {names} "
                         f"(e.g. trainer.precision=bf16-mixed on a GPU)")


def config_groups() -> set[str]:
    """The config groups (conf/ and the folders of $ARCHSWEEP_CONFIG_PATH): norm, pos, optim, ..."""
    from archsweep import conf_dir
    from archsweep.core.data.tasks.known import EXTRA_CONF_ENV

    folders = [conf_dir(), *(Path(f) for f in os.environ.get(EXTRA_CONF_ENV, "").split(os.pathsep) if f)]
    return {g.name for folder in folders if folder.is_dir() for g in folder.iterdir() if g.is_dir()}


def tuned_keys_exist(cfg: DictConfig, task: Task) -> None:
    """compare.tune names keys of this config, or groups (a typo would make compare.py refuse the sweep after it
    ran)."""
    missing = object()
    for key in (cfg.get("compare") or {}).get("tune") or []:
        if OmegaConf.select(cfg, key, default=missing) is missing and key not in config_groups():
            raise ValueError(f"compare.tune names {key}, which this config does not have; give a key it sets, e.g. "
                             f"compare.tune=[optim.lr] (python train.py --cfg job shows the keys)")


Rule = Callable[[DictConfig, Task], None]
RULES: tuple[Rule, ...] = (accelerator_present, warmup_within_training, decay_after_warmup, decay_phases,
                           branches_on_one_process, pause_at_a_branch, sharding_supports, ddp_validation_batches,
                           context_lengths_need_text, tuned_keys_exist)
AFTER_IMPORTS: tuple[Rule, ...] = (precision_known,)  # need Lightning: run by job.py after the heavy imports


def check_rules(cfg: DictConfig, task: Task, rules: tuple[Rule, ...] = RULES) -> None:
    for rule in rules:
        rule(cfg, task)
