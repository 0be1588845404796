"""Checks of the seed, optimiser and trainer settings that Lightning or torch would otherwise reject late (after
the heavy imports, with a ZeroDivisionError or IndexError) or accept silently (a negative clip value turns
clipping off). Each message names the field, the value and the fix. Light: no torch, Lightning or CUDA calls."""

from __future__ import annotations

import glob
import logging
import os
import sys
from typing import Any

from omegaconf import DictConfig, ListConfig

log = logging.getLogger("train")
SEED_MAX = 2**32 - 1  # what numpy and Lightning's seed_everything take


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_seed(seed: Any) -> None:
    if not _is_int(seed) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed={seed!r} must be a whole number from 0 to {SEED_MAX}, e.g. seed=0")


def check_optimiser(optim: DictConfig) -> None:
    betas = optim.get("betas")
    if (not isinstance(betas, (list, tuple, ListConfig)) or len(betas) != 2
            or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas)):
        raise ValueError(f"optim.betas={_show(betas)} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.98]")
    decay = optim.get("weight_decay")
    if not _is_number(decay) or decay < 0:
        raise ValueError(f"optim.weight_decay={decay!r} must be a number >= 0 (0: no weight decay)")
    if not isinstance(optim.get("decay_embeddings", False), bool):
        raise ValueError(f"optim.decay_embeddings={optim.get('decay_embeddings')!r} must be true or false")
    eps = optim.get("eps")
    if eps is not None and (not _is_number(eps) or eps <= 0):
        raise ValueError(f"optim.eps={eps!r} must be a positive number, e.g. 1e-9")
    if optim.get("name") == "muon":
        check_muon(optim)


MUON_SCALINGS = ("reference", "moonlight")  # as muon.py's SCALINGS and NS_DTYPES (which import torch)
MUON_NS_DTYPES = ("float32", "bfloat16")


def check_muon(optim: DictConfig) -> None:
    momentum = optim.get("momentum")
    if not _is_number(momentum) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"optim.momentum={momentum!r} must be a number in [0, 1) (Muon's reference: 0.95)")
    if not isinstance(optim.get("nesterov"), bool):
        raise ValueError(f"optim.nesterov={optim.get('nesterov')!r} must be true or false")
    steps = optim.get("ns_steps")
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"optim.ns_steps={steps!r} must be a positive whole number of Newton-Schulz iterations "
                         f"(the reference's 5; fewer leave the update's singular values far from 1)")
    if optim.get("ns_dtype") not in MUON_NS_DTYPES:
        raise ValueError(f"optim.ns_dtype={optim.get('ns_dtype')!r} must be one of {', '.join(MUON_NS_DTYPES)} "
                         f"(bfloat16 as the reference does on GPU)")
    if optim.get("scaling") not in MUON_SCALINGS:
        raise ValueError(f"optim.scaling={optim.get('scaling')!r} must be one of {', '.join(MUON_SCALINGS)}: "
                         f"reference = max(1, rows/cols)^0.5, moonlight = 0.2 sqrt(max(rows, cols))")
    adamw_lr = optim.get("adamw_lr")
    if not _is_number(adamw_lr) or adamw_lr <= 0:
        raise ValueError(f"optim.adamw_lr={adamw_lr!r} must be a positive learning rate for the parameters Muon does "
                         f"not take (embeddings, head, norms, biases), e.g. 2e-3")


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, ListConfig) else repr(value)


def check_trainer(trainer: DictConfig) -> None:
    accumulate = trainer.get("accumulate_grad_batches", 1)
    if not _is_int(accumulate) or accumulate < 1:
        raise ValueError(f"trainer.accumulate_grad_batches={accumulate!r} must be a positive whole number of "
                         f"batches per optimiser step (1: no accumulation)")
    clip = trainer.get("gradient_clip_val")
    if clip is not None and (not _is_number(clip) or clip < 0):
        raise ValueError(f"trainer.gradient_clip_val={clip!r} must be a number >= 0, or null to disable clipping "
                         f"(a negative value would disable it silently)")
    algorithm = trainer.get("gradient_clip_algorithm", "norm")
    if clip and algorithm not in ("norm", "value"):
        raise ValueError(f"trainer.gradient_clip_algorithm={algorithm!r} must be norm or value")
    check_devices(trainer.get("devices", "auto"))
    check_accelerator(trainer.get("accelerator", "auto"))


def check_devices(devices: Any) -> None:
    fix = "a positive number of devices, -1 (all), auto, or a list of device ids such as [0,1]"
    if devices == "auto" or devices == -1:
        return
    if _is_int(devices):
        if devices < 1:
            raise ValueError(f"trainer.devices={devices} must be {fix}")
        return
    if isinstance(devices, (list, tuple, ListConfig)):
        if not devices or not all(_is_int(d) and d >= 0 for d in devices):
            raise ValueError(f"trainer.devices={_show(devices)} must be {fix}")
        return
    if isinstance(devices, str) and devices.replace(",", "").strip().isdigit():  # "2", or ids "0,1"
        if "," not in devices and int(devices) == 0:
            raise ValueError(f"trainer.devices='0' must be {fix} (GPU 0 alone: trainer.devices=[0])")
        return
    raise ValueError(f"trainer.devices={devices!r} must be {fix}")


def gpu_present() -> bool:
    """Whether this machine shows a GPU, judged without torch: NVIDIA or ROCm device files on Linux, unless
    CUDA_VISIBLE_DEVICES hides them; any other platform is given the benefit of the doubt."""
    if not sys.platform.startswith("linux"):
        return True
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def check_accelerator(accelerator: Any) -> None:
    if accelerator in ("gpu", "cuda") and not gpu_present():
        raise ValueError(f"trainer.accelerator={accelerator} (trainer=gpu) but this machine has no visible GPU "
                         f"(no /dev/nvidia* device, or CUDA_VISIBLE_DEVICES hides them); train on the CPU with "
                         f"trainer=cpu, or leave trainer.accelerator=auto")


def check_warmup(schedule: DictConfig, max_steps: int) -> None:
    warmup = schedule.get("warmup_steps", 0)
    if _is_int(warmup) and _is_int(max_steps) and 0 < max_steps < warmup:
        log.warning(f"schedule.warmup_steps={warmup} exceeds trainer.max_steps={max_steps}: the learning rate never "
                    f"reaches optim.lr (it stops at {max_steps / warmup:.0%} of it); lower schedule.warmup_steps "
                    f"(e.g. to {max(1, max_steps // 10)}) or raise trainer.max_steps")


def check_ddp_validation(trainer: DictConfig, task: Any) -> None:
    """Data-parallel validation needs a batch for every process: with fewer, the processes that get none wait
    forever at the first validation's collective."""
    if not str(trainer.get("strategy", "auto")).startswith("ddp"):
        return
    devices = trainer.get("devices", 1)
    if isinstance(devices, (list, tuple, ListConfig)):
        devices = len(devices)
    if not _is_int(devices) or devices < 1:
        return  # auto / -1: known only to Lightning
    processes = devices * int(trainer.get("num_nodes", 1) or 1)
    val_batches = (getattr(task, "n_batches", None) or {}).get("val")
    if _is_int(val_batches) and val_batches < processes:
        raise ValueError(f"task.val_batches={val_batches} is fewer than the {processes} data-parallel processes "
                         f"(trainer.devices={devices}, trainer.num_nodes={trainer.get('num_nodes', 1)}); each "
                         f"process validates its own batches, so set task.val_batches>={processes} or use fewer "
                         f"devices")
