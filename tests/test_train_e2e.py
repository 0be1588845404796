"""train.py end to end: real subprocesses with real overrides, then read what they wrote (run directories,
metrics.csv, results.json, checkpoints, and W&B's offline run files through the shared reader)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scripts
import torch
import torch.nn.functional as F
from torch import nn
from wandb_reader import read_run

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.data.tasks.synthetic import ReverseTask
from archsweep.core.model.checkpoint import atomic_save, load_model
from archsweep.core.model.config import AXES
from archsweep.variants.plugins import PLUGIN

pytestmark = pytest.mark.slow  # train.py subprocesses
ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=20",
        "trainer.val_check_interval=10", "trainer.log_every_n_steps=2", "schedule.warmup_steps=5"]
RESULT_KEYS = {"status", "error", "diverged", "test_long", "by_length", "by_context",
               "name", "group", "run_dir", "choices", "overrides", "seed", "params", "steps", "train",
               "val", "test", "best_checkpoint", "last_checkpoint", "tokens_per_s", "train_time_s", "val_time_s",
               "fit_time_s", "eval_time_s", "wall_time_s", "time_to_first_step_s", "world_size", "resumed_from",
               "wandb_run_id", "peak_memory_mib",
               "flops_per_token", "total_flops", "mfu", "peak_flops", "peak_source", "peak_age_s", "mfu_estimate",
               "task_family", "interrupted", "paused", "compare", "budget", "budgets", "version", "active_params"}
METRICS = {"loss", "ppl", "acc", "exact_match"}
# train.yaml's groups: the axes (norm, norm_type, pos, ffn, attention), each built-in plug-in's, the rest
GROUPS = {"model", *AXES, *PLUGIN.names(), "task", "optim", "schedule", "trainer", "logger", "decoding", "callbacks",
          "experiment", "hparams_search"}



def train(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    out = scripts.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def train_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def wandb_runs(run_dir: Path) -> list[tuple[str, dict]]:
    """(run id, what W&B recorded) for each offline run file under run_dir."""
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    return [(f.stem.removeprefix("run-"), read_run(str(f))) for f in files]


def val_loss_of(model: nn.Module, task: ReverseTask) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in task.dataloader("val", "encoder_decoder", seed=0):
            logits = task.forward_fn("encoder_decoder")(model, batch)
            labels = batch["labels"]
            total += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                                     reduction="sum").item()
            count += int((labels != IGNORE_INDEX).sum())
    return total / count


def test_single_run_writes_its_directory(tmp_path):
    run_dir = tmp_path / "run"
    train(*TINY, f"hydra.run.dir={run_dir}", f"output_root={tmp_path}")
    res = results(run_dir)
    assert set(res) == RESULT_KEYS
    assert res["status"] == "completed" and res["steps"] == 20 and res["world_size"] == 1
    assert res["task_family"] == "synthetic"  # reversal; compare.py's defaults follow it
    assert res["compare"] == {"tune": [], "baseline": None, "metric": None, "detect": None, "sequential": False,
                              "max_seeds": 10, "seed_batch": 2, "transfer": None}  # train.yaml's compare: block
    assert res["budget"] is None and res["budgets"] is None  # no budget.flops/tokens, no schedule.branches
    assert set(res["val"]) == METRICS | {"decoded_exact_match", "bleu"} and set(res["test"]) == METRICS
    assert set(res["choices"]) == GROUPS
    assert res["choices"]["model"] == "encoder_decoder" and res["choices"]["norm"] == "post"
    assert res["tokens_per_s"] > 0 and res["wall_time_s"] > res["fit_time_s"] + res["eval_time_s"]
    assert res["fit_time_s"] > res["train_time_s"] + res["val_time_s"] and min(res["train_time_s"], res["val_time_s"],
                                                                             res["eval_time_s"]) > 0
    assert 50 < res["peak_memory_mib"] < 20_000  # this process's peak resident set during the run, in MiB
    assert res["peak_source"].startswith("CPU probe, ") and res["peak_age_s"] >= 0 and res["mfu_estimate"] is True
    assert 0 < res["mfu"] < 1 and res["peak_flops"] > 0
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert "vocab_size: 20" in (run_dir / "config.yaml").read_text()  # filled in from the task
    assert max(train_losses(run_dir)) == 19  # metrics.csv counts steps from 0, as Lightning does

    # The checkpoint alone rebuilds the plain model, which reproduces the recorded validation loss.
    model = load_model(res["best_checkpoint"])
    assert isinstance(model, nn.Module) and type(model).__module__.startswith("archsweep.variants")
    assert sum(p.numel() for p in model.parameters()) == res["params"]
    task = ReverseTask(n_symbols=16, min_len=4, max_len=8, batch_size=16, val_batches=2, test_batches=2,
                       eval_seed=1234)
    assert val_loss_of(model, task) == pytest.approx(res["val"]["loss"], rel=1e-4)

    [(run_id, run)] = wandb_runs(run_dir)
    assert run_id == res["wandb_run_id"]
    assert run["config"]["model"] == "encoder_decoder" and run["config"]["pos"] == "sinusoidal"
    assert run["config"]["cfg"]["model"]["d_model"] == 32 and run["config"]["params"] == res["params"]
    assert {"model=encoder_decoder", "norm=post", "pos=sinusoidal", "ffn=relu", "task=reverse"} <= set(run["tags"])
    assert any("train/loss" in h for h in run["history"])
    assert run["summary"]["test/exact_match"] == pytest.approx(res["test"]["exact_match"])


def test_same_seed_repeats_and_resume_matches_an_uninterrupted_run(tmp_path):
    full, first, rest = tmp_path / "full", tmp_path / "first", tmp_path / "rest"
    common = [*TINY, f"output_root={tmp_path}", "logger.project=resume"]
    train(*common, f"hydra.run.dir={full}")
    train(*common, "trainer.max_steps=10", f"hydra.run.dir={first}")
    # `last`: the newest run with the same overrides (the step budget aside)
    train(*common, "ckpt_path=last", f"hydra.run.dir={rest}")

    uninterrupted, before, after = train_losses(full), train_losses(first), train_losses(rest)
    assert sorted(before) == [s for s in sorted(uninterrupted) if s < 10]
    assert before == {s: v for s, v in uninterrupted.items() if s < 10}  # same seed, same losses
    assert sorted(after) == [s for s in sorted(uninterrupted) if s >= 10]
    assert after == {s: v for s, v in uninterrupted.items() if s >= 10}  # resumed: optimiser, schedule, data, RNG
    assert results(rest)["val"] == results(full)["val"]
    assert results(rest)["resumed_from"] == str(first / "checkpoints" / "last.ckpt")

    [(first_id, _)] = wandb_runs(first)
    [(rest_id, resumed)] = wandb_runs(rest)
    assert rest_id == first_id  # reattached to the same W&B run
    assert min(h["trainer/global_step"] for h in resumed["history"] if "train/loss" in h) >= 10


def test_multirun_gives_one_wandb_run_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    train("-m", *TINY, "norm=pre,post", "seed=3", f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}")
    runs = {}
    for job in ("0", "1"):
        res = results(sweep / job)
        assert res["status"] == "completed"
        [(run_id, run)] = wandb_runs(sweep / job)
        assert run_id == res["wandb_run_id"]
        runs[res["choices"]["norm"]] = (run_id, run)
    assert set(runs) == {"pre", "post"}
    (pre_id, pre), (post_id, post) = runs["pre"], runs["post"]
    assert pre_id != post_id
    assert (pre["name"], post["name"]) == ("norm=pre", "norm=post")  # named by what varies in the sweep
    assert pre["group"] == post["group"] == "sweep-sweep"
    for norm, (_, run) in runs.items():
        assert run["config"]["norm"] == norm and f".norm.{norm}." in run["config"]["cfg"]["model"]["norm"]["_target_"]
        assert run["config"]["model"] == "encoder_decoder" and run["config"]["seed"] == 3
        assert f"norm={norm}" in run["tags"] and "model=encoder_decoder" in run["tags"]
        assert run["config"]["cfg"]["model"]["d_model"] == 32
    summary = [json.loads(x) for x in (sweep / "summary.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in summary) == ["completed", "completed"]


def test_failing_job_does_not_stop_its_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    out = train("-m", *TINY, "logger=csv", "model.n_heads=3,2", f"hydra.sweep.dir={sweep}",
                f"output_root={tmp_path}", check=False)
    assert out.returncode != 0  # the sweep reports its failure, after running every job
    bad, good = results(sweep / "0"), results(sweep / "1")
    assert bad["status"] == "failed" and "n_heads=3 must divide d_model=32" in bad["error"]
    assert "n_heads=3 must divide" in (sweep / "0" / "error.txt").read_text()
    assert good["status"] == "completed" and good["steps"] == 20
    summary = {r["job"]: r for r in map(json.loads, (sweep / "summary.jsonl").read_text().splitlines())}
    assert summary[0]["status"] == "failed" and "n_heads=3" in summary[0]["error"]
    assert summary[1]["status"] == "completed"
    assert "1 of 2 sweep jobs failed" in out.stderr


def test_ddp_on_two_cpu_processes_in_a_sweep(tmp_path):
    # Two jobs: the second must start its own workers, not reuse what Lightning left from the first.
    sweep = tmp_path / "sweep"
    train("-m", *TINY, "trainer.max_steps=10", "trainer.val_check_interval=5", "trainer=ddp",
          "trainer.accelerator=cpu", "logger=none", "seed=0,1", f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}")
    for job in ("0", "1"):
        res = results(sweep / job)
        assert res["status"] == "completed" and res["world_size"] == 2 and res["steps"] == 10
        assert res["peak_source"].startswith("CPU probe, ") and 0 < res["mfu"] < 1  # rank 0's probe, shared
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
        assert (sweep / job / "train_ddp_process_1.log").is_file()  # the second process ran this job


def test_bf16_activation_checkpointing_tensorboard_decoder_only(tmp_path):
    run_dir = tmp_path / "run"
    train(*TINY, "model=decoder_only", "pos=rotary", "norm=pre", "trainer.precision=bf16-mixed",
          "model.activation_checkpointing=true", "label_smoothing=0.1", "logger=tensorboard",
          f"hydra.run.dir={run_dir}", f"output_root={tmp_path}")
    res = results(run_dir)
    assert res["status"] == "completed" and res["choices"]["model"] == "decoder_only"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert train_losses(run_dir) and all(v == v for v in train_losses(run_dir).values())


def test_checkpoint_write_never_corrupts_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({"step": 1}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind
