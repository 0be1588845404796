"""Compute accounting of a run: FLOPs per batch (the model's analytic count, `archsweep.variants.flops`), their
running total, and model-FLOP utilisation (MFU) against the device's peak.

The peak is `trainer.peak_flops` when set; on a GPU that Lightning's table of data-sheet peaks knows
(`lightning.fabric.utilities.throughput.get_available_flops`), its peak in the run's precision (TF32 where
fp32 matmuls may use it); otherwise (CPUs, other GPUs) a short matmul probe in the run's precision, cached per
machine in `peak_probes.json` in the cache directory with when it ran, the load then, the threads, the dtype and
the torch version (the older `peak_flops.json`, bare numbers with no such record, is not read). No data sheet
knows how many cores torch gets on a CPU, so there MFU is an estimate.

A CPU probe also times one thread, and its peak is never below the one-thread rate times its lanes (torch's
threads, at most the cores: what the cores could do together). A probe is suspect when it is older than 30 days,
or ran while the one-minute load average left fewer idle cores than its lanes (load > cores - lanes + 0.5), or
its threads together reached less than half the one-thread rate times the lanes; a suspect probe is taken again
at a start when the machine has the idle cores (a probe now would be suspect too, and would slow the machine's other
jobs: a parallel sweep's), up to three tries, keeping the best, and replaced by one that is trusted or reads higher.
Until then runs use it, and say it is suspect. A stale or missing probe is taken whatever the load.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops

from archsweep.core.data.tasks.forward import flop_shape
from archsweep.variants.flops import TRAIN_FACTOR, Shape, forward_flops

log = logging.getLogger(__name__)

PROBE_SIZE = 1024  # the probe multiplies two n x n matrices, n at most this,
MIN_PROBE_SIZE = 256  # at least this, and as large as one multiply in 1/64 of its time allows (fit_size)
PROBE_SECONDS = 0.5  # all threads; one thread gets half of it
PROBE_TRIES = 3  # probes taken in a row while they are suspect
MAX_AGE_S = 30 * 86400.0
MIN_SCALING = 0.5  # all threads under this share of (one thread's rate x lanes): the probe was disturbed
IDLE_MARGIN = 0.5  # the load average may exceed (cores - lanes) by this much
PROBES = "peak_probes.json"  # in the cache directory
TABLE = "Lightning's table for "  # the source of a GPU peak from get_available_flops


def probe_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision setting ("32-true", "bf16-mixed", "16-mixed", ...)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


def fit_size(seconds_per_multiply: Callable[[int], float], seconds: float) -> int:
    """The probe's matrix size: from MIN_PROBE_SIZE, doubled (8x the work) while one multiply takes under 1/64 of
    the probe's `seconds`, up to PROBE_SIZE. A device slow in the dtype (bf16 on a CPU without bf16 units, 2 s
    per 1024 x 1024 multiply) keeps the probe near its time instead of 7 multiplies of that size."""
    n = MIN_PROBE_SIZE
    while n < PROBE_SIZE and seconds_per_multiply(n) * 64 < seconds:
        n *= 2
    return n


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, seconds: float = 1.0,
                        size: int | None = None) -> tuple[float, int]:
    """(best FLOP/s of n x n matmuls over `seconds`, n): the best of short rounds (background load only slows some);
    n is `size`, or fitted to `seconds` (fit_size)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)

    def seconds_per_multiply(n: int) -> float:
        a, b = operands(n)
        a @ b  # the first multiply of a size also pays for set-up (a GPU's library initialising)
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        return time.perf_counter() - start

    n = size or fit_size(seconds_per_multiply, seconds)
    a, b = operands(n)
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
    return best, n


def measure_rates(device: torch.device, dtype: torch.dtype) -> tuple[float, float | None]:
    """(best FLOP/s with torch's threads, best FLOP/s with one thread). The second is None off the CPU, where the
    host's threads do not do the arithmetic."""
    rate, n = measure_matmul_peak(device, dtype, PROBE_SECONDS)
    if device.type != "cpu":
        return rate, None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one, _ = measure_matmul_peak(device, dtype, PROBE_SECONDS / 2, size=n)  # the same matrices' size
    finally:
        torch.set_num_threads(threads)
    return rate, one


def load_average() -> float | None:
    """The one-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def wall_clock() -> float:
    return time.time()


def cpu_cores() -> int:
    return os.cpu_count() or 1


def busy(load: float, cores: int, lanes: int) -> bool:
    """Fewer idle cores than `lanes` threads need (the module docstring's rule)."""
    return load > cores - lanes + IDLE_MARGIN


def busy_now() -> float | None:
    """The load average when the machine is too busy for a trusted probe with torch's threads now, else None."""
    load, cores = load_average(), cpu_cores()
    lanes = max(min(torch.get_num_threads(), cores), 1)
    return load if load is not None and busy(load, cores, lanes) else None


def flop_rate(flops: float) -> str:
    return f"{flops / 1e12:.3g} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.3g} GFLOP/s"


def age_text(seconds: float) -> str:
    if seconds < 60:
        return "just taken"
    unit, size = next((unit, size) for unit, size in (("d", 86400), ("h", 3600), ("min", 60)) if seconds >= size)
    return f"{seconds / size:.0f} {unit} old"


@dataclass(frozen=True)
class Probe:
    """One probe's record in peak_probes.json."""

    rate: float  # best FLOP/s with all threads
    one_thread: float | None  # best FLOP/s with one thread (CPU only)
    at: float  # wall-clock time (time.time) when it ran
    load: float | None  # one-minute load average just before
    cores: int
    threads: int
    dtype: str
    torch: str

    @property
    def lanes(self) -> int:
        """The threads that can run at once: torch's threads, at most the cores."""
        return max(min(self.threads, self.cores), 1)

    @property
    def flops(self) -> float:
        """The peak it gives: never below the one-thread rate times the lanes."""
        return max(self.rate, (self.one_thread or 0.0) * self.lanes)

    def doubt(self, now: float) -> str | None:
        """Why this probe is not to be trusted (the module docstring's rule), or None."""
        if now - self.at > MAX_AGE_S:
            return f"{age_text(now - self.at)}, over {MAX_AGE_S / 86400:.0f} days"
        if self.one_thread is None:
            return None
        if self.load is not None and busy(self.load, self.cores, self.lanes):
            return f"fewer idle cores than its {self.lanes} thread{'s' * (self.lanes > 1)}"
        if self.rate < MIN_SCALING * self.one_thread * self.lanes:
            return (f"{self.lanes} threads reached {flop_rate(self.rate)}, under {MIN_SCALING:.0%} of "
                    f"{self.lanes} x one thread's {flop_rate(self.one_thread)}")
        return None

    @classmethod
    def from_json(cls, value: Any) -> Probe | None:
        """A record of peak_probes.json; None for an entry that is not one (taken again and rewritten)."""
        if not isinstance(value, dict):
            return None
        try:
            probe = cls(**value)
        except TypeError:  # a field missing or unknown
            return None
        numbers = [probe.rate, probe.at, probe.cores, probe.threads] + \
            [v for v in (probe.one_thread, probe.load) if v is not None]
        return probe if all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers) else None


@dataclass(frozen=True)
class Peak:
    """The peak MFU is measured against, and where it comes from."""

    flops: float
    source: str  # "trainer.peak_flops", "Lightning's table for <device>", "CPU probe, 3 h old, load 0.4 on 2 cores"
    age_s: float | None = None  # of a probe, when the run used it
    estimate: bool = False  # a probe, not a data sheet: MFU against it is an estimate
    plain: str = field(default="", compare=False)  # what the figure is, in plain words, for the console

    @property
    def table(self) -> bool:
        return self.source.startswith(TABLE)

    @property
    def probed(self) -> bool:
        return self.age_s is not None

    def line(self) -> str:
        return f"peak {flop_rate(self.flops)}: {self.source}" + ("; MFU is an estimate" if self.estimate else "")

    def console(self) -> str:
        """The line at the start of training, for a reader who has not met MFU: what was measured, the figure,
        and what train/mfu means against it."""
        what = self.plain or f"speed reference: {flop_rate(self.flops)} ({self.source})"
        return f"{what}. train/mfu in the logs is the share of that speed training reaches" + \
            (" (an estimate)" if self.estimate else "")


def take_probe(device: torch.device, dtype: torch.dtype) -> Probe:
    """Probe until one is trusted, at most PROBE_TRIES times; the trusted one, else the highest."""
    best: Probe | None = None
    for _ in range(PROBE_TRIES):
        load = load_average() if device.type == "cpu" else None
        rate, one = measure_rates(device, dtype)
        probe = Probe(rate, one, wall_clock(), load, cpu_cores(), torch.get_num_threads(),
                      str(dtype).removeprefix("torch."), torch.__version__.split("+")[0])
        if probe.doubt(probe.at) is None:
            return probe
        best = probe if best is None or probe.flops > best.flops else best
    assert best is not None
    return best


def better(old: Probe | None, new: Probe) -> Probe:
    """The record to keep: the new probe when it is trusted or reads at least as high."""
    if old is None or new.doubt(new.at) is None or new.flops >= old.flops:
        return new
    return old


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


def read_cache(path: Path | None) -> dict[str, Any]:
    if path is None or not path.is_file():
        return {}
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # an unreadable cache is measured again and rewritten
    return known if isinstance(known, dict) else {}


def write_cache(path: Path | None, key: str, probe: Probe) -> None:
    if path is None:
        return
    known = read_cache(path)  # read again: another run may have added its own machine meanwhile
    known[key] = asdict(probe)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(path)
    except OSError as e:
        log.warning(f"could not cache the matmul probe in {path}: {e}")


def probe_peak(probe: Probe, device: torch.device, now: float) -> Peak:
    where = "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)
    load = f", load {probe.load:.1f} on {probe.cores} cores" if probe.load is not None else ""
    doubt = probe.doubt(now)
    age = age_text(now - probe.at)
    source = f"{where} probe, {age}{load}" + (f" (suspect: {doubt})" if doubt else "")
    when = "measured just now" if now - probe.at < 60 else f"measured {age.removesuffix(' old')} ago"
    plain = f"speed test: this {where} multiplies matrices at {flop_rate(probe.flops)} ({when}{load}" + \
        (f"; it may read low, the machine was busy: {doubt})" if doubt else ")")
    return Peak(probe.flops, source, age_s=max(now - probe.at, 0.0), estimate=True, plain=plain)


def peak_flops(device: torch.device, precision: str, override: float | None, cache: Path | None) -> Peak:
    """The peak FLOP/s of one device and where the figure comes from; a missing or suspect probe is taken again."""
    if override is not None:
        return Peak(float(override), "trainer.peak_flops")
    dtype = probe_dtype(precision)
    if device.type == "cuda":
        listed = get_available_flops(device, dtype)  # None (with a warning naming the device) if not listed
        if listed:
            name = torch.cuda.get_device_name(device)
            return Peak(float(listed), f"{TABLE}{name}", plain=f"speed reference: the {name} peaks at "
                        f"{flop_rate(listed)} in this precision (its data sheet, from Lightning's table)")
    path, key = cache / PROBES if cache is not None else None, machine_key(device, dtype)
    old, now = Probe.from_json(read_cache(path).get(key)), wall_clock()
    doubt = old.doubt(now) if old is not None else None
    if old is not None and doubt is None:
        return probe_peak(old, device, now)
    load = busy_now() if old is not None and now - old.at <= MAX_AGE_S and device.type == "cpu" else None
    if load is not None:  # a probe now would be disturbed too (and would slow this machine's other jobs)
        log.info(f"the machine is busy now (load {load:.1f} on {cpu_cores()} cores), so the saved speed test is used "
                 f"though it may read low ({doubt}); it is redone when a run starts on a quieter machine")
        return probe_peak(old, device, now)
    if old is not None:
        log.info(f"redoing this machine's speed test (for train/mfu): the saved one may be off ({doubt})")
    kept = better(old, take_probe(device, dtype))
    write_cache(path, key, kept)
    return probe_peak(kept, device, wall_clock())


def remeasure(device: torch.device, precision: str, cache: Path | None) -> Peak:
    """Probe the peak again and cache the better record (a run faster than the cached peak proves it low)."""
    dtype = probe_dtype(precision)
    path, key = cache / PROBES if cache is not None else None, machine_key(device, dtype)
    old = Probe.from_json(read_cache(path).get(key))
    new = take_probe(device, dtype)
    kept = new if old is None or new.flops >= old.flops else old
    write_cache(path, key, kept)
    return probe_peak(kept, device, wall_clock())


class Compute(L.Callback):
    """Logs `train/flops` (running total), `train/flops_per_token` (total / tokens) and `train/mfu` (FLOP/s over
    the log window, validation excluded, / peak) at each log step. A batch's FLOPs come from its shape (host
    metadata: no device sync) and are memoised per shape. The totals are kept in checkpoints, so a resumed run
    continues them."""

    def __init__(self, peak_override: float | None = None, cache: Path | None = None) -> None:
        self.peak_override, self.cache = peak_override, cache
        self.peak: Peak | None = None
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
        # one probe, on rank 0, shared with every process: probes of several processes at once would slow each other
        peak = peak_flops(pl_module.device, str(trainer.precision), self.peak_override, self.cache) \
            if trainer.is_global_zero else None
        self.peak = trainer.strategy.broadcast(peak, src=0)
        if trainer.is_global_zero:
            log.info(self.peak.console())
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
            if self.peak is not None and self.peak.flops > 0:
                pl_module.log("train/mfu", self.window_flops / spent / self.peak.flops, on_step=True, on_epoch=False)
            self.window_flops, self.window_start = 0.0, now

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.device, self.precision = pl_module.device, str(trainer.precision)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.paused = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.window_start += time.perf_counter() - self.paused  # keep validation out of the window

    def summary(self, train_s: float, world_size: int = 1) -> dict[str, Any]:
        """results.json's figures: FLOPs per token, total FLOPs of all processes (each counts its own batches),
        MFU of this fit per device (`train_s`: its training time without validation), the peak and its source."""
        peak = self.peak
        mfu = self.flops_this_fit / train_s / peak.flops if peak is not None and train_s > 0 and peak.flops > 0 \
            else None
        if peak is not None and mfu is not None and mfu > 1.0 and peak.table:
            log.warning(f"MFU {mfu:.0%} against {peak.line()}: that figure is not this device's peak; set "
                        f"trainer.peak_flops to the data sheet's dense figure")
        if peak is not None and mfu is not None and mfu > 1.0 and peak.probed:
            self.peak = remeasure(self.device, self.precision, self.cache)  # this run beat the probe
            log.warning(f"MFU {mfu:.0%} against the probed {flop_rate(peak.flops)}, which must have run while the "
                        f"machine was busy; measured again: {self.peak.line()} (train/mfu logged so far used the "
                        f"old figure)")
            peak, mfu = self.peak, self.flops_this_fit / train_s / self.peak.flops
        return {"flops_per_token": self.flops / self.tokens if self.tokens else None,
                "total_flops": self.flops * world_size, "mfu": mfu,
                "peak_flops": peak.flops if peak is not None and peak.flops else None,
                "peak_source": peak.source if peak is not None else None,
                "peak_age_s": peak.age_s if peak is not None else None,
                "mfu_estimate": peak.estimate if peak is not None else None}

    @property
    def flops_this_fit(self) -> float:
        return self.flops - self.resumed_flops

    def state_dict(self) -> dict[str, Any]:
        return {"flops": self.flops, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded = dict(state_dict)
