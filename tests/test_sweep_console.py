"""What a sweep prints: no library line a user cannot act on in a joblib sweep that is re-run to resume a job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["logger=csv", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1",
        "task.batch_size=8", "task.max_len=6", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=4",
        "trainer.log_every_n_steps=2", "schedule.warmup_steps=0", "eval.show_examples=0"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)


def test_a_joblib_sweep_re_run_to_resume_prints_no_library_line_a_user_cannot_act_on(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "norm=pre,post", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}"]
    first = run(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    results = sweep / "1" / "results.json"
    interrupted = {**json.loads(results.read_text()), "status": "interrupted",
                   "interrupted": {"signal": "SIGTERM", "step": 4, "exit_code": 143}}
    results.write_text(json.dumps(interrupted))  # as a job stopped by a scheduler leaves it: resumed on a re-run
    second = run(*args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    lines = [x for x in (first.stdout + first.stderr + second.stdout + second.stderr).splitlines()]
    text = "\n".join(lines)
    for noise in ("Checkpoint directory", "was configured so validation", "Launching jobs", "Joblib.Parallel",
                  "#0 :", "#1 :", "Restored all states", "[HYDRA]"):
        assert noise not in text, noise
    assert not [x for x in lines if re.fullmatch(r"(\d\d:\d\d:\d\d )?\[job [^]]*\]\s*", x)], text  # none empty
    # what a user needs stays
    assert text.count(f"sweep in {sweep}") == 2
    assert f"[job 0 norm=pre] run 'norm=pre' in {sweep / '0'}" in text
    assert "validating every 1 steps instead" in text  # 4 steps: why validation runs at every step
    assert f"[job 1 norm=post] resuming the interrupted run from {sweep / '1' / 'checkpoints' / 'last.ckpt'}" in text
    assert f"[job 0 norm=pre] completed earlier in {sweep / '0'}; skipped" in text
    assert text.count("2 of 2 jobs completed") == 2
    assert json.loads(results.read_text())["status"] == "completed"
