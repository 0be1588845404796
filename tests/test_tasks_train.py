"""Every task trains through train.py with each model kind it serves (real subprocesses, tiny sizes, a few
steps; one sweep per family of tasks so Python and Lightning start once per sweep), kinds a task cannot serve are
refused before training, and a small model learns `reverse` to a high exact match with both kinds."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import scripts

pytestmark = pytest.mark.slow  # train.py subprocesses
ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "trainer.max_steps=4",
        "trainer.val_check_interval=2", "trainer.log_every_n_steps=2", "schedule.warmup_steps=2", "logger=none"]
SYNTHETIC = "copy,reverse,sort,addition,recall,is_sorted"
EVAL = ["task.val_batches=2", "task.test_batches=2"]
# tasks with a test_long split
LONG = {"copy", "reverse", "sort", "addition", "recall", "is_sorted"}


def train(*args: str, check: bool = True, timeout: int = 900, cache: Path | None = None):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if cache is not None:
        env["ARCHSWEEP_CACHE_DIR"] = str(cache)
    out = scripts.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def sweep_jobs(sweep: Path) -> dict[tuple[str, str], dict]:
    jobs = {}
    for line in (sweep / "summary.jsonl").read_text().splitlines():
        job = json.loads(line)
        res = json.loads((sweep / str(job["job"]) / "results.json").read_text())
        jobs[(res["choices"]["task"], res["choices"]["model"])] = res
    return jobs


def check_trained(jobs: dict, expected: set[tuple[str, str]]) -> None:
    assert set(jobs) == expected
    for key, res in jobs.items():
        assert res["status"] == "completed", (key, res.get("error"))
        assert res["steps"] == 4
        synthetic = key[0] in LONG
        assert ("test_long" in res) == synthetic  # longer sequences, reported on their own
        for split in ("val", "test", "test_long") if synthetic else ("val", "test"):
            assert math.isfinite(res[split]["loss"]) and 0.0 <= res[split]["acc"] <= 1.0, key


def test_synthetic_tasks_train_with_both_sequence_kinds(tmp_path):
    sweep = tmp_path / "sweep"
    train("-m", f"task={SYNTHETIC}", "model=encoder_decoder,decoder_only", *TINY, *EVAL, "task.batch_size=8",
          "task.max_len=6", f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}")
    check_trained(sweep_jobs(sweep), {(t, k) for t in SYNTHETIC.split(",")
                                      for k in ("encoder_decoder", "decoder_only")})
    header = (sweep / "0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"test/exact_match", "test_long/exact_match", "test_long/loss"} <= set(header)


def test_encoder_only_tasks_train_and_the_others_are_refused(tmp_path):
    sweep = tmp_path / "sweep"
    train("-m", "task=copy,reverse,sort,is_sorted,shakespeare_char", "model=encoder_only", *TINY, *EVAL,
          "task.batch_size=8", f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}", cache=tmp_path / "cache")
    check_trained(sweep_jobs(sweep), {(t, "encoder_only") for t in
                                      ("copy", "reverse", "sort", "is_sorted", "shakespeare_char")})
    for task, reason in [("recall", "its output is not aligned"), ("multi30k", "a translation is not aligned")]:
        out = train(f"task={task}", "model=encoder_only", *TINY, f"output_root={tmp_path}", check=False,
                    cache=tmp_path / "cache")
        assert out.returncode == 1
        assert f"error: model: task={task} cannot feed model kind=encoder_only: {reason}" in out.stderr


@pytest.mark.parametrize("task", ["shakespeare_char", "text"])
def test_text_tasks_train_with_both_kinds(task, tmp_path):
    # A sweep over task options would check task.block_size against the default task (Hydra composes the
    # primary config first), so each file-based task gets its own sweep over the model kinds.
    sweep = tmp_path / "sweep"
    train("-m", f"task={task}", "model=encoder_decoder,decoder_only", *TINY, *EVAL, "task.block_size=16",
          "task.batch_size=4", "task.bpe_vocab_size=300", f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}",
          cache=tmp_path / "cache")
    check_trained(sweep_jobs(sweep), {(task, k) for k in ("encoder_decoder", "decoder_only")})
    if task == "shakespeare_char":
        assert "vocab_size: 71" in (sweep / "0" / "config.yaml").read_text()  # 65 characters, 6 special tokens
    # prepared once, reused by the second job (beside it: the machine's matmul peak for MFU, peak_probes.json)
    [entry] = [p for p in (tmp_path / "cache").iterdir() if p.name != "peak_probes.json"]
    saved = (sweep / "0" / "tokenizer.json").read_bytes()  # saved with the run, too
    assert saved == (entry / "tokenizer.json").read_bytes()
    assert entry.name.startswith("text-char-" if task == "shakespeare_char" else "text-bpe-")


@pytest.mark.parametrize("task", ["multi30k", "translation"])
def test_translation_tasks_train_with_both_kinds(task, tmp_path):
    sweep = tmp_path / "sweep"
    train("-m", f"task={task}", "model=encoder_decoder,decoder_only", *TINY, "task.bpe_vocab_size=400",
          "task.max_len=24", "task.batch_size=32", f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}",
          cache=tmp_path / "cache")
    check_trained(sweep_jobs(sweep), {(task, k) for k in ("encoder_decoder", "decoder_only")})


LEARN = ["norm=pre", "pos=rotary", "model.d_model=64", "model.n_layers=2", "model.dropout=0.0", "task.n_symbols=8",
         "task.min_len=2", "task.max_len=6", "task.batch_size=64", "task.val_batches=4", "task.test_batches=4",
         "trainer.max_steps=800", "trainer.val_check_interval=400", "schedule=constant", "schedule.warmup_steps=30",
         "optim.lr=2e-3", "logger=none"]


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_small_model_learns_reverse(kind, tmp_path):
    run = tmp_path / "run"
    train("task=reverse", f"model={kind}", *LEARN, f"hydra.run.dir={run}", f"output_root={tmp_path}")
    res = json.loads((run / "results.json").read_text())
    assert res["test"]["exact_match"] >= 0.9, res["test"]  # 256 held-out sequences, every token right
