"""`torchrun --nproc_per_node=2 train.py ...` with two CPU processes: one run directory (rank 0's, which the other
rank takes through torchrun's store), rank 0's train.log and the other rank's train_ddp_process_1.log in it, one voice
on the console (rank 0's progress lines, once each), the diagnostics (gradient norms from the shards under fsdp,
attention maps), and a `resume=` that every rank expands as rank 0 does."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_fsdp import RUN
from test_run_safety import ROOT, results, rows

pytestmark = pytest.mark.slow  # torchrun starts two train.py processes


def torchrun(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "train.py"), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("trainer", ["ddp", "fsdp"])
def test_torchrun_makes_one_run_with_every_rank_logged(trainer, tmp_path):
    # the diagnostics every 4 steps rather than 100 (tests/test_parallel_events.py runs past their default step)
    short = [*RUN, "trainer.max_steps=8", "trainer.val_check_interval=4", f"trainer={trainer}",
             f"output_root={tmp_path}", "diagnostics.every_n_steps=4", "diagnostics.attention_maps=true"]
    out = torchrun(tmp_path, *short)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # the default directory (time, random digits): one for both ranks
    res = results(run_dir)
    assert res["status"] == "completed" and res["world_size"] == 2 and res["steps"] == 8
    progress = re.findall(r"\bstep (\d+)/8 \| loss ", out.stdout + out.stderr)
    assert progress == ["2", "4", "6", "8"], out.stdout[-3000:]  # rank 0's lines only, once each
    assert "sync_dist" not in out.stdout + out.stderr
    grad_steps = [int(r["step"]) for r in rows(run_dir) if r.get("diag/grad_norm/decoder.0")]
    assert grad_steps == [3, 7], grad_steps  # the 4th and 8th optimiser steps
    assert sorted(p.name for p in (run_dir / "attention").iterdir()) == ["step_4.png", "step_8.png"]
    assert "step 8/8" in (run_dir / "train.log").read_text()
    assert "step 8/8" in (run_dir / "train_ddp_process_1.log").read_text()  # rank 1's own log, kept
    assert sorted(p.name for p in run_dir.glob(".hydra*")) == [".hydra"]  # rank 0's config record only
    if trainer == "fsdp":  # continued: the other rank takes rank 0's expansion of resume=
        out = torchrun(tmp_path, f"resume={run_dir}", "trainer.max_steps=12")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
        res = results(run_dir)
        assert res["status"] == "completed" and res["steps"] == 12 and res["resumed_from"]
