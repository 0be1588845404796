"""Compute accounting of a run: FLOPs per batch (the model's analytic count, `archsweep.variants.flops`), their
running total, and model-FLOP utilisation (MFU) against the device's peak.

The peak is `trainer.peak_flops` when set; on a GPU that Lightning's table of data-sheet peaks knows
(`lightning.fabric.utilities.throughput.get_available_flops`), its peak in the run's precision (TF32 where
fp32 matmuls may use it); otherwise (CPUs, other GPUs) the best rate of a short matmul probe in the run's
precision, measured once per machine and cached (`peak_flops.json` in the cache directory). On a CPU the probe is
the honest ceiling: no data sheet knows how many cores torch gets.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops

from archsweep.core.data.tasks.forward import flop_shape
from archsweep.variants.flops import TRAIN_FACTOR, Shape, forward_flops

log = logging.getLogger(__name__)

PROBE_SIZE = 1024  # the probe multiplies two PROBE_SIZE x PROBE_SIZE matrices
DATA_SHEET = "data sheet (Lightning's table)"


def probe_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision setting ("32-true", "bf16-mixed", "16-mixed", ...)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, seconds: float = 1.0) -> float:
    """Best FLOP/s of square matmuls over `seconds` (the best of short rounds: background load only slows some)."""
    n = PROBE_SIZE
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        sync()
        best = max(best, 4 * 2 * n ** 3 / (time.perf_counter() - start))
    return best


def machine_key(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = cpu_name()
    return f"{device.type}|{name}|threads={torch.get_num_threads()}|{str(dtype).removeprefix('torch.')}|" \
           f"torch {torch.__version__.split('+')[0]}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_flops(device: torch.device, precision: str, override: float | None, cache: Path | None) -> tuple[float, str]:
    """(peak FLOP/s of one device, where the figure comes from)."""
    if override is not None:
        return float(override), "trainer.peak_flops"
    dtype = probe_dtype(precision)
    if device.type == "cuda":
        listed = get_available_flops(device, dtype)  # None (with a warning naming the device) if not listed
        if listed:
            return float(listed), f"{torch.cuda.get_device_name(device)} {DATA_SHEET}"
    known, path, key = _cached(device, dtype, cache)
    if key in known:
        return float(known[key]), f"matmul probe (cached in {path})"
    return remeasure(device, precision, cache), "matmul probe"


def _cached(device: torch.device, dtype: torch.dtype, cache: Path | None) -> tuple[dict[str, float], Path | None, str]:
    key = machine_key(device, dtype)
    path = cache / "peak_flops.json" if cache is not None else None
    known: dict[str, float] = {}
    if path is not None and path.is_file():
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}  # an unreadable cache is measured again and rewritten
    return known, path, key


def remeasure(device: torch.device, precision: str, cache: Path | None) -> float:
    """Probe the peak again and cache the best rate seen on this machine (a probe taken while other jobs ran
    reads low; a later one on a quiet machine replaces it)."""
    dtype = probe_dtype(precision)
    known, path, key = _cached(device, dtype, cache)
    peak = max(measure_matmul_peak(device, dtype), float(known.get(key, 0.0)))
    if path is not None:
        known[key] = peak
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(path)
        except OSError as e:
            log.warning(f"could not cache the matmul probe in {path}: {e}")
    return peak


class Compute(L.Callback):
    """Logs `train/flops` (running total), `train/flops_per_token` (total / tokens) and `train/mfu` (FLOP/s over
    the log window, validation excluded, / peak) at each log step. A batch's FLOPs come from its shape (host
    metadata: no device sync) and are memoised per shape. The totals are kept in checkpoints, so a resumed run
    continues them."""

    def __init__(self, peak_override: float | None = None, cache: Path | None = None) -> None:
        self.peak_override, self.cache = peak_override, cache
        self.peak, self.peak_source = 0.0, ""
        self.flops = 0.0  # training FLOPs so far (3 x forward)
        self.tokens = 0
        self.resumed_flops = 0.0  # of those, the ones before a resume (loaded from the checkpoint)
        self.loaded: dict[str, Any] | None = None  # state from a checkpoint; taken up only when fitting starts
        self.window_flops, self.window_start, self.paused = 0.0, 0.0, 0.0
        self.memo: dict[Shape, float] = {}
        self.device, self.precision = torch.device("cpu"), "32-true"  # of the fit, for a probe after it

    def batch_flops(self, model: torch.nn.Module, batch: dict[str, Any]) -> float:
        shape = flop_shape(batch)
        if shape not in self.memo:
            self.memo[shape] = TRAIN_FACTOR * forward_flops(model, shape)
        return self.memo[shape]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.loaded is not None:  # a resumed fit continues the totals (validate/test restores do not count)
            self.flops = self.resumed_flops = float(self.loaded.get("flops", 0.0))
            self.tokens = int(self.loaded.get("tokens", 0))
            self.loaded = None
        self.peak, self.peak_source = peak_flops(pl_module.device, str(trainer.precision), self.peak_override,
                                                 self.cache)
        if trainer.is_global_zero:
            log.info(f"MFU against {self.peak / 1e12:.3g} TFLOP/s per device ({self.peak_source})")
        self.window_start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        flops = self.batch_flops(pl_module.model, batch)
        self.flops += flops
        self.window_flops += flops
        self.tokens += batch["n_tokens"]
        every = trainer.log_every_n_steps
        if every and trainer.global_step % every == 0 and (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            now = time.perf_counter()
            spent = max(now - self.window_start, 1e-9)
            pl_module.log("train/flops", self.flops, on_step=True, on_epoch=False)
            pl_module.log("train/flops_per_token", self.flops / max(self.tokens, 1), on_step=True, on_epoch=False)
            if self.peak > 0:
                pl_module.log("train/mfu", self.window_flops / spent / self.peak, on_step=True, on_epoch=False)
            self.window_flops, self.window_start = 0.0, now

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.device, self.precision = pl_module.device, str(trainer.precision)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.paused = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.window_start += time.perf_counter() - self.paused  # keep validation out of the window

    def summary(self, train_s: float, world_size: int = 1) -> dict[str, float | None]:
        """results.json's figures: FLOPs per token, total FLOPs of all processes (each counts its own batches),
        MFU of this fit per device (`train_s`: its training time without validation)."""
        mfu = self.flops_this_fit / train_s / self.peak if train_s > 0 and self.peak > 0 else None
        if mfu is not None and mfu > 1.0 and DATA_SHEET in self.peak_source:
            log.warning(f"MFU {mfu:.0%} against {self.peak / 1e12:.3g} TFLOP/s ({self.peak_source}): that figure is "
                        f"not this device's peak; set trainer.peak_flops to the data sheet's dense figure")
        if mfu is not None and mfu > 1.0 and self.peak_override is None and self.peak_source != "" and \
                DATA_SHEET not in self.peak_source:
            old = self.peak  # a cached probe taken under load: this run beat it, so measure again
            self.peak = remeasure(self.device, self.precision, self.cache)
            log.warning(f"MFU {mfu:.0%} against the cached peak {old / 1e9:.1f} GFLOP/s, which must have been probed "
                        f"while the machine was busy; measured again: {self.peak / 1e9:.1f} GFLOP/s (train/mfu "
                        f"logged so far used the old figure)")
            mfu = self.flops_this_fit / train_s / self.peak
        return {"flops_per_token": self.flops / self.tokens if self.tokens else None,
                "total_flops": self.flops * world_size, "mfu": mfu, "peak_flops": self.peak or None}

    @property
    def flops_this_fit(self) -> float:
        return self.flops - self.resumed_flops

    def state_dict(self) -> dict[str, Any]:
        return {"flops": self.flops, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded = dict(state_dict)
