"""Compute as a controlled variable: match_flops, budget.flops / budget.tokens, the peak behind MFU, and what a
run logs (metrics.csv, W&B, results.json)."""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
from pathlib import Path

import pytest
import scripts
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from wandb_reader import read_run

from archsweep.core.model.build import build_model, flops_per_token
from archsweep.core.train.config.schemas import check_schemas
from archsweep.core.train.config.setup import ConfigError
from archsweep.core.train.lifecycle.checks import apply_budget, build_task, model_config
from archsweep.core.train.monitoring import compute
from archsweep.core.train.runs.results import Results
from archsweep.variants.flops import TRAIN_FACTOR, forward_flops

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
LM = ("model=decoder_only", "task=shakespeare_char")


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def solved(*overrides: str):
    cfg = compose_train(*overrides)
    task = build_task(cfg)
    return cfg, task, model_config(cfg, task)


@pytest.mark.parametrize("attention", ["sliding_window", "linear"])
def test_match_flops_holds_flops_per_token_to_the_reference(attention):
    over = (*LM, "task.block_size=256", "model.max_seq_len=256", f"attention={attention}")
    cfg, task, matched = solved(*over, "match_flops={attention: full}")
    _, _, reference = solved(*over, "attention=full")
    _, _, plain = solved(*over)
    shape = task.flop_shape("decoder_only")
    want = flops_per_token(reference, shape)
    assert flops_per_token(plain, shape) < 0.98 * want  # the variant alone is cheaper, so the match has work to do
    assert matched.d_ff > plain.d_ff and cfg.model.d_ff == matched.d_ff  # recorded in the resolved config
    assert flops_per_token(matched, shape) == pytest.approx(want, rel=0.02)


def test_match_flops_takes_a_number_and_a_named_field():
    cfg, task, matched = solved(*LM, "match_flops=2e6", "match_field=n_layers")
    assert flops_per_token(matched, task.flop_shape("decoder_only")) == pytest.approx(2e6, rel=0.25)
    assert matched.n_layers != 4 and matched.d_ff == 256


@pytest.mark.parametrize("override, message", [
    ("match_flops=-1", "must be a positive number of FLOPs per token"),
    ("match_flops=10", "below the .* FLOPs per token this model has with d_ff=1"),
    ("match_field=colour", "solves one of d_ff"),
    ("match_count=some", "match_count='some' is not a known count; valid: total, active"),
])
def test_match_flops_refuses_bad_targets(override, message):
    extra = () if override.startswith("match_flops") else ("match_flops=2e6",)
    with pytest.raises(ConfigError, match=message):
        solved(*LM, override, *extra)


def test_match_flops_and_match_params_together_are_refused():
    with pytest.raises(ConfigError, match="both set"):
        solved(*LM, "match_flops=2e6", "match_params=100000")


@pytest.mark.parametrize("width", [32, 64, 96])
def test_budget_flops_gives_every_width_the_same_compute(width):
    cfg, task, model_cfg = solved(*LM, f"model.d_model={width}", "budget.flops=5e11")
    apply_budget(cfg, model_cfg, task)
    per_step = TRAIN_FACTOR * forward_flops(build_model(model_cfg), task.flop_shape("decoder_only"))
    assert cfg.trainer.max_steps * per_step == pytest.approx(5e11, rel=0.02)


def test_budget_tokens_counts_accumulation_and_processes():
    cfg, task, model_cfg = solved(*LM, "budget.tokens=96000", "trainer.accumulate_grad_batches=2",
                                  "trainer=ddp", "trainer.devices=2")
    apply_budget(cfg, model_cfg, task)
    assert cfg.trainer.max_steps == round(96000 / (12 * 64 * 2 * 2))


def per_step_flops(task, model_cfg) -> float:
    return TRAIN_FACTOR * forward_flops(build_model(model_cfg), task.flop_shape("decoder_only"))


@pytest.mark.parametrize("unit", ["flops", "tokens"])
def test_a_budget_below_one_step_runs_one_step_and_says_what_it_spends(unit, caplog):
    cfg, task, model_cfg = solved(*LM, f"budget.{unit}=1")
    with caplog.at_level(logging.INFO, logger="train"):
        budget = apply_budget(cfg, model_cfg, task)
    per_step = per_step_flops(task, model_cfg) if unit == "flops" else 12 * 64
    assert cfg.trainer.max_steps == 1 and budget.per_step == pytest.approx(per_step, rel=0.02)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    cost = f"{budget.per_step:.4g} FLOPs" if unit == "flops" else "768 tokens"
    assert warning.startswith(f"budget.{unit}=1 is below one step ({cost} per step); trainer.max_steps=1 spends "
                              f"{cost}, {budget.per_step:.3g}x the budget")
    record = budget.record(1)
    assert record["requested"] == 1 and record["spent"] == budget.per_step and record["steps"] == 1


def test_whole_steps_that_miss_the_budget_by_more_than_a_few_percent_say_by_how_much(caplog):
    cfg, task, model_cfg = solved(*LM, "budget.tokens=1152")  # 1.5 steps of 768 tokens -> 2 steps
    with caplog.at_level(logging.INFO, logger="train"):
        budget = apply_budget(cfg, model_cfg, task)
    assert cfg.trainer.max_steps == 2 and budget.record(2)["spent_vs_requested"] == pytest.approx(1 / 3)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == ("budget.tokens=1152 at 768 tokens per step: trainer.max_steps=2 spends 1,536 tokens, +33.3% "
                       "from the budget (whole steps)")
    caplog.clear()
    cfg, task, model_cfg = solved(*LM, "budget.tokens=7834")  # 10.2 steps -> 10: 2% under, within the slack
    with caplog.at_level(logging.INFO, logger="train"):
        apply_budget(cfg, model_cfg, task)
    assert cfg.trainer.max_steps == 10 and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "budget.tokens=7834 at 768 tokens per step: trainer.max_steps=10" in caplog.text


def test_bad_budgets_are_refused():
    """budget: a schema (archsweep.core.train.config.schemas): the type while composing, the rules right after."""
    with pytest.raises(ConfigCompositionException) as caught:
        compose_train(*LM, "budget.tokens=abc")
    assert "full_key: budget.tokens" in str(caught.value.__cause__)
    with pytest.raises(ValueError, match=r"budget.flops=0.0 must be a positive number"):
        check_schemas(compose_train(*LM, "budget.flops=0"))
    with pytest.raises(ValueError, match="budget.flops and budget.tokens both set"):
        check_schemas(compose_train(*LM, "budget.flops=1e12", "budget.tokens=1e6"))


def test_peak_comes_from_the_override_the_data_sheet_or_a_cached_probe(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    assert compute.peak_flops(cpu, "32-true", 1e12, tmp_path) == compute.Peak(1e12, "trainer.peak_flops")
    assert compute.peak_flops(cpu, "32-true", 1e12, tmp_path).console() == ("speed reference: 1 TFLOP/s "
        "(trainer.peak_flops). train/mfu in the logs is the share of that speed training reaches")
    # a GPU that Lightning's table lists (get_available_flops): its dense peak in the run's precision
    monkeypatch.setattr(compute.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(compute.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fake_gpu = torch.device("cuda", 0)
    listed = compute.peak_flops(fake_gpu, "bf16-mixed", None, tmp_path)
    assert listed == compute.Peak(989.4e12, "Lightning's table for NVIDIA H100 80GB HBM3")
    assert not listed.estimate and listed.line() == "peak 989 TFLOP/s: Lightning's table for NVIDIA H100 80GB HBM3"
    assert listed.console() == ("speed reference: the NVIDIA H100 80GB HBM3 peaks at 989 TFLOP/s in this precision "
                                "(its data sheet, from Lightning's table). train/mfu in the logs is the share of that "
                                "speed training reaches")
    assert compute.peak_flops(fake_gpu, "32-true", None, tmp_path).flops == 66.9e12
    monkeypatch.setattr(compute.torch, "get_float32_matmul_precision", lambda: "high")
    assert compute.peak_flops(fake_gpu, "32-true", None, tmp_path).flops == 494.7e12  # fp32 matmuls on TF32 cores
    probes = quiet_machine(monkeypatch, rate=5e10, one_thread=5e10 / THREADS)
    probed = compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert probed.flops == 5e10 and probed.source == "CPU probe, just taken, load 0.2 on 8 cores" and probed.estimate
    assert probed.line() == "peak 50 GFLOP/s: CPU probe, just taken, load 0.2 on 8 cores; MFU is an estimate"
    assert probed.console() == ("speed test: this CPU multiplies matrices at 50 GFLOP/s (measured just now, load 0.2 "
                                "on 8 cores). train/mfu in the logs is the share of that speed training reaches (an "
                                "estimate)")
    again = compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert again.flops == 5e10 and probes == [torch.float32]  # measured once per machine
    compute.peak_flops(cpu, "bf16-mixed", None, tmp_path)
    assert probes == [torch.float32, torch.bfloat16]  # another precision is another peak
    monkeypatch.setattr(compute.torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    with pytest.warns(UserWarning, match="FLOPs not found for 'NVIDIA B200'"):  # not in Lightning's table: probed
        gpu_probe = compute.peak_flops(fake_gpu, "bf16-mixed", None, tmp_path)
    assert gpu_probe.flops == 5e10 and gpu_probe.source == "NVIDIA B200 probe, just taken" and gpu_probe.estimate
    (tmp_path / compute.PROBES).write_text("{not json")
    assert compute.peak_flops(cpu, "32-true", None, tmp_path).flops == 5e10  # a corrupt cache is measured again
    assert probes == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]


THREADS = 2  # torch's threads in the probe tests
HOUR = 3600.0


class Machine:
    """A faked clock, load average and matmul probe (compute.measure_rates) on an 8-core machine."""

    def __init__(self, monkeypatch, rate: float, one_thread: float, load: float = 0.2) -> None:
        self.rate, self.one_thread, self.load, self.now = rate, one_thread, load, 1.75e9
        self.probes: list[torch.dtype] = []
        monkeypatch.setattr(compute, "measure_rates", self.measure)
        monkeypatch.setattr(compute, "wall_clock", lambda: self.now)
        monkeypatch.setattr(compute, "load_average", lambda: self.load)
        monkeypatch.setattr(compute, "cpu_cores", lambda: 8)
        monkeypatch.setattr(compute.torch, "get_num_threads", lambda: THREADS)

    def measure(self, device: torch.device, dtype: torch.dtype) -> tuple[float, float | None]:
        self.probes.append(dtype)
        return self.rate, self.one_thread if device.type == "cpu" else None


def quiet_machine(monkeypatch, rate: float, one_thread: float) -> list[torch.dtype]:
    return Machine(monkeypatch, rate, one_thread).probes


def cached_probe(cache: Path) -> dict:
    (record,) = json.loads((cache / compute.PROBES).read_text()).values()
    return record


def test_a_probe_taken_under_load_is_not_trusted_and_is_replaced_on_a_quiet_machine(tmp_path, monkeypatch):
    """The issue's figures: 26.6 GFLOP/s with the machine busy, 49.4 with one thread, 104 when quiet."""
    cpu = torch.device("cpu")
    machine = Machine(monkeypatch, rate=26.6e9, one_thread=40e9, load=9.0)  # 9 runnable tasks on 8 cores
    busy = compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert len(machine.probes) == compute.PROBE_TRIES  # tried again while suspect, then kept the best
    assert busy.flops == 40e9 * THREADS  # never below one thread's rate x the threads
    assert busy.source == "CPU probe, just taken, load 9.0 on 8 cores (suspect: fewer idle cores than its 2 threads)"
    record = cached_probe(tmp_path)
    assert record["load"] == 9.0 and record["at"] == machine.now and record["threads"] == THREADS
    assert record["dtype"] == "float32" and record["torch"] == torch.__version__.split("+")[0]
    machine.now += 3 * HOUR
    machine.rate, machine.one_thread, machine.load = 104e9, 49.4e9, 0.4  # quiet now
    quiet = compute.peak_flops(cpu, "32-true", None, tmp_path)  # the suspect record is taken again
    assert quiet.flops == 104e9 and quiet.source == "CPU probe, just taken, load 0.4 on 8 cores"
    assert len(machine.probes) == compute.PROBE_TRIES + 1  # trusted at the first try
    machine.now += 3 * HOUR
    later = compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert later == compute.Peak(104e9, "CPU probe, 3 h old, load 0.4 on 8 cores", 3 * HOUR, estimate=True)
    assert len(machine.probes) == compute.PROBE_TRIES + 1  # a trusted record is used as it is


def test_a_suspect_probe_waits_for_a_quiet_start_to_be_taken_again(tmp_path, monkeypatch, caplog):
    """On a machine that stays busy (a parallel sweep's jobs), each run would probe three times, slowing the other
    jobs, for a figure as suspect as the cached one: the cached one is used, said to be suspect, until a start
    finds the idle cores."""
    cpu = torch.device("cpu")
    machine = Machine(monkeypatch, rate=26.6e9, one_thread=40e9, load=9.0)
    compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert len(machine.probes) == compute.PROBE_TRIES
    machine.now += HOUR
    with caplog.at_level(logging.INFO, logger=compute.__name__):
        still = compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert len(machine.probes) == compute.PROBE_TRIES  # not taken while the machine is busy
    assert still.flops == 80e9 and still.source == \
        "CPU probe, 1 h old, load 9.0 on 8 cores (suspect: fewer idle cores than its 2 threads)"
    assert "the machine is busy now (load 9.0 on 8 cores), so the saved speed test is used though it may read low " \
           "(fewer idle cores than its 2 threads); it is redone when a run starts on a quieter machine" in caplog.text
    assert still.console().startswith("speed test: this CPU multiplies matrices at 80 GFLOP/s (measured 1 h ago, load "
                                      "9.0 on 8 cores; it may read low, the machine was busy: fewer idle cores than "
                                      "its 2 threads). train/mfu")
    machine.rate, machine.one_thread, machine.load = 104e9, 49.4e9, 6.4  # 6.4 of 8 cores busy: 2 threads fit
    assert compute.peak_flops(cpu, "32-true", None, tmp_path).source == "CPU probe, just taken, load 6.4 on 8 cores"
    assert len(machine.probes) == compute.PROBE_TRIES + 1
    machine.now += 31 * 86400  # stale: taken whatever the load
    machine.load = 9.0
    assert compute.peak_flops(cpu, "32-true", None, tmp_path).source.startswith("CPU probe, just taken, load 9.0")


def test_a_probe_far_below_one_thread_times_the_threads_is_suspect(tmp_path, monkeypatch):
    machine = Machine(monkeypatch, rate=26.6e9, one_thread=49.4e9)  # an idle load, yet 2 threads < 1 thread
    peak = compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path)
    assert peak.flops == pytest.approx(98.8e9) and len(machine.probes) == compute.PROBE_TRIES
    assert "suspect: 2 threads reached 26.6 GFLOP/s, under 50% of 2 x one thread's 49.4 GFLOP/s" in peak.source
    machine.rate = 60e9  # 61% of 2 x 49.4: a real machine's scaling, trusted
    assert compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path).source == \
        "CPU probe, just taken, load 0.2 on 8 cores"


def test_a_stale_or_recordless_probe_is_taken_again(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    machine = Machine(monkeypatch, rate=100e9, one_thread=50e9)
    key = compute.machine_key(cpu, torch.float32)
    (tmp_path / "peak_flops.json").write_text(json.dumps({key: 26.6e9}))  # the older cache: no record, not read
    assert compute.peak_flops(cpu, "32-true", None, tmp_path).flops == 100e9
    machine.now += 29 * 86400
    assert compute.peak_flops(cpu, "32-true", None, tmp_path).source.startswith("CPU probe, 29 d old")
    assert len(machine.probes) == 1
    machine.now += 2 * 86400  # 31 days: stale
    machine.rate = 90e9  # a lower but trusted probe replaces the stale one
    assert compute.peak_flops(cpu, "32-true", None, tmp_path) == \
        compute.Peak(100e9, "CPU probe, just taken, load 0.2 on 8 cores", 0.0, estimate=True)  # 2 x 50e9 floor
    assert len(machine.probes) == 2 and cached_probe(tmp_path)["rate"] == 90e9
    for broken in (26.6e9, {**cached_probe(tmp_path), "rate": "fast"}, {"rate": 26.6e9}):  # not a record
        (tmp_path / compute.PROBES).write_text(json.dumps({key: broken}))
        compute.peak_flops(cpu, "32-true", None, tmp_path)  # taken again and rewritten
        assert cached_probe(tmp_path)["rate"] == 90e9
    assert len(machine.probes) == 5


def test_threads_beyond_the_cores_count_as_the_cores(tmp_path, monkeypatch):
    machine = Machine(monkeypatch, rate=100e9, one_thread=50e9)
    monkeypatch.setattr(compute, "cpu_cores", lambda: 2)
    monkeypatch.setattr(compute.torch, "get_num_threads", lambda: 4)  # oversubscribed: 4 threads on 2 cores
    peak = compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path)
    assert peak == compute.Peak(100e9, "CPU probe, just taken, load 0.2 on 2 cores", 0.0, estimate=True)
    assert len(machine.probes) == 1  # trusted on an idle machine: 2 x one thread, not 4 x
    machine.load = 1.0  # one of the two cores busy
    machine.now += 31 * 86400
    assert "suspect: fewer idle cores than its 2 threads" in \
        compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path).source


def test_a_suspect_probe_reading_lower_keeps_the_better_record(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    machine = Machine(monkeypatch, rate=104e9, one_thread=49.4e9)
    compute.peak_flops(cpu, "32-true", None, tmp_path)
    machine.now += 31 * 86400
    machine.rate, machine.one_thread, machine.load = 26.6e9, 20e9, 9.0
    kept = compute.peak_flops(cpu, "32-true", None, tmp_path)
    assert kept.flops == 104e9 and "31 d old" in kept.source and "suspect" in kept.source
    assert cached_probe(tmp_path)["load"] == 0.2  # the old record stays, to be probed again next time


def test_results_name_the_peak_its_source_and_age(tmp_path, monkeypatch):
    machine = Machine(monkeypatch, rate=104e9, one_thread=49.4e9)
    compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path)  # cached by an earlier run
    machine.now += 3 * HOUR
    meter = compute.Compute(None, tmp_path)
    meter.peak = compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path)
    meter.flops, meter.tokens = 52e9, 1000
    Results(status="completed", **meter.summary(train_s=2.0)).write(tmp_path / "results.json")
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["peak_flops"] == 104e9 and written["mfu"] == pytest.approx(0.25)
    assert written["peak_source"] == "CPU probe, 3 h old, load 0.2 on 8 cores"
    assert written["peak_age_s"] == 3 * HOUR and written["mfu_estimate"] is True
    assert Results.read(tmp_path / "results.json").peak_source == written["peak_source"]


def test_the_probe_measures_a_real_rate():
    rate, size = compute.measure_matmul_peak(torch.device("cpu"), torch.float32, seconds=0.2)
    assert 1e8 < rate < 1e14 and size in (256, 512, 1024)


@pytest.mark.parametrize("flops,size", [(1e9, 256), (2e10, 512), (2e11, 1024), (1e15, 1024)])
def test_the_probe_size_fits_one_multiply_in_a_64th_of_its_time(flops, size):
    """A device's rate in the dtype (1 GFLOP/s: bf16 on a CPU without bf16 units) sets the probe's matrices: the
    largest n with a multiply under 0.5 s / 64 (2 n^3 FLOPs), at least 256, at most 1024."""
    asked = []

    def seconds_per_multiply(n: int) -> float:
        asked.append(n)
        return 2 * n ** 3 / flops

    assert compute.fit_size(seconds_per_multiply, 0.5) == size
    assert asked == [n for n in (256, 512) if n <= size]  # each size timed once, 1024 never


def test_a_run_logs_flops_and_mfu_to_metrics_wandb_and_results(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "ARCHSWEEP_CACHE_DIR": str(tmp_path)}
    env.pop("WANDB_API_KEY", None)
    args = [*LM, "trainer.max_steps=8", "trainer.log_every_n_steps=2", "trainer.val_check_interval=4",
            "task.val_batches=2", "task.test_batches=2", "diagnostics.every_n_steps=0", "eval.decode_samples=0",
            "trainer.peak_flops=1e11", "budget.tokens=6000",  # 7.8 steps of 12 x 64 tokens: 8
            f"hydra.run.dir={tmp_path / 'run'}", f"output_root={tmp_path}"]
    out = scripts.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    _, task, model_cfg = solved(*LM)
    per_token = flops_per_token(model_cfg, task.flop_shape("decoder_only"))
    assert results["flops_per_token"] == pytest.approx(per_token)
    assert results["total_flops"] == pytest.approx(per_token * 12 * 64 * 8)  # 8 steps of 12 x 64 tokens
    assert results["peak_flops"] == 1e11 and 0 < results["mfu"] < 1
    assert results["peak_source"] == "trainer.peak_flops" and results["peak_age_s"] is None
    assert results["mfu_estimate"] is False
    assert results["budget"] == {"unit": "tokens", "requested": 6000, "per_step": 768, "max_steps": 8, "steps": 8,
                                 "spent": 6144, "spent_vs_requested": pytest.approx(0.024)}
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    logged = [r for r in rows if r.get("train/mfu")]
    assert [int(r["step"]) for r in logged] == [1, 3, 5, 7]  # every log step (steps are 0-based in the csv)
    assert float(logged[-1]["train/flops"]) == pytest.approx(results["total_flops"])
    assert all(0 < float(r["train/mfu"]) < 1 for r in logged)
    (run_file,) = run.glob("wandb/offline-run-*/run-*.wandb")
    history = read_run(run_file)["history"]
    assert {"train/mfu", "train/flops", "train/flops_per_token"} <= {k for row in history for k in row}


def test_a_run_faster_than_the_cached_peak_measures_it_again(tmp_path, monkeypatch):
    """A run that beats a probe (MFU over 100%) proves it low: it is taken again, and the cache keeps the best."""
    machine = Machine(monkeypatch, rate=1e9, one_thread=0.5e9)
    meter = compute.Compute(None, tmp_path)
    meter.peak = compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path)
    assert meter.peak.flops == 1e9
    meter.flops, meter.tokens = 4e9, 1000  # 4e9 FLOPs in 1 s: 400% of the stale peak
    machine.rate = 8e9
    summary = meter.summary(train_s=1.0)
    assert summary["peak_flops"] == 8e9 and summary["mfu"] == pytest.approx(0.5)
    assert compute.peak_flops(torch.device("cpu"), "32-true", None, tmp_path).flops == 8e9  # cached for later runs
    machine.rate = 2e9
    assert compute.remeasure(torch.device("cpu"), "32-true", tmp_path).flops == 8e9  # a lower probe keeps it
