"""A data-parallel collective that cannot complete fails the run with our message within
trainer.collective_timeout_s, instead of waiting torch's 30 minutes; both processes end."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import pytest
import scripts

from archsweep.core.train.lifecycle.trainer import with_collective_timeout
from tests.recording_strategy import record_strategy_arguments

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=10",
        "trainer.val_check_interval=5", "trainer.log_every_n_steps=2", "schedule.warmup_steps=2", "logger=none"]


def test_ddp_strategies_get_the_timeout_and_others_are_left_alone(monkeypatch):
    from lightning.pytorch.strategies import DDPStrategy

    for name in ("ddp", "ddp_spawn"):
        record_strategy_arguments(monkeypatch, name)
    strategy = with_collective_timeout("ddp", 7)
    assert isinstance(strategy, DDPStrategy) and strategy.arguments["timeout"] == datetime.timedelta(seconds=7)
    spawn = with_collective_timeout("ddp_spawn", 3)  # the registered name's own arguments are kept
    assert spawn.arguments == {"start_method": "spawn", "timeout": datetime.timedelta(seconds=3)}
    assert with_collective_timeout("auto", 7) == "auto"
    assert with_collective_timeout("ddp", None) == "ddp"


@pytest.mark.slow
def test_a_stalled_process_fails_the_run_with_a_message_not_a_hang(tmp_path):
    # 30 s, not less: the timeout also bounds the processes' rendezvous, which a loaded machine can slow that much
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    run = tmp_path / "run"
    start = time.monotonic()
    out = scripts.run([sys.executable, "train.py", *TINY, "trainer=ddp", "trainer.accelerator=cpu",
                          "trainer.collective_timeout_s=30", "+callbacks.stall._target_=fault_callbacks.StallRank",
                          "+callbacks.stall.seconds=600", f"hydra.run.dir={run}", f"output_root={tmp_path}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert elapsed < 300  # the stalled process sleeps 600 s: it was stopped, not waited for
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "failed"
    assert "did not complete within trainer.collective_timeout_s=30 s" in results["error"], results["error"]
    assert "collective_timeout_s" in out.stderr + out.stdout
