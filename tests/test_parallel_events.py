"""trainer=ddp and trainer=fsdp on two CPU processes (gloo) with the default diagnostics, as the issue's user ran
them: every periodic event happens (logging, validation, checkpoint, decoding, attention entropy and maps, per-block
gradient and residual norms at step 100), a SIGKILL to every process after the first checkpoint loses nothing that
`resume=` cannot continue from, and the console speaks with one voice: one progress line per log step, none of
Lightning's `sync_dist` advice."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import scripts
from test_run_safety import ROOT, env, results, rows, train

pytestmark = pytest.mark.slow  # two train.py processes per run, twice

# a tiny decoder on the copy task; logging (every 25 steps) and the diagnostics (every 100) at their defaults. The
# default validation interval (500) exceeds the run, so validation and checkpoints come every 50 steps: at 50 (the
# checkpoint the run is killed after), at 100 (the resumed run, the step of the diagnostics) and at the final step
MAX_STEPS = 120
RUN = ["model=decoder_only", "task=copy", "model.d_model=16", "model.n_heads=2", "model.n_layers=2", "model.d_ff=32",
       "task.batch_size=4", "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "schedule.warmup_steps=10",
       "logger=csv", f"trainer.max_steps={MAX_STEPS}", "trainer.val_check_interval=50", "trainer.devices=2"]
STEP_LINE = re.compile(rf"\bstep (\d+)/{MAX_STEPS} \| loss ")


def killed_after_first_checkpoint(tmp_path: Path, run_dir: Path, *args: str, timeout: float = 300) -> str:
    """Start train.py in a process group of its own, SIGKILL the whole group (every rank) as soon as
    checkpoints/last.ckpt exists, and return what it printed."""
    console = tmp_path / "killed.txt"
    with open(console, "w") as out:
        proc = scripts.popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env(tmp_path),
                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not (run_dir / "checkpoints" / "last.ckpt").exists():
            assert proc.poll() is None, f"the run ended before its first checkpoint:\n{console.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no checkpoint in {timeout} s:\n{console.read_text()[-3000:]}"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):  # a group already gone (a run that failed) is no error here
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 30
    while group_alive(proc.pid):  # the other rank, a child of rank 0, ends with it
        assert time.monotonic() < deadline, "a rank outlived the SIGKILL"
        time.sleep(0.1)
    return console.read_text()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def one_voice(console: str) -> list[int]:
    """The steps of the console's progress lines, after checking it holds each once and no library advice."""
    steps = [int(m[1]) for m in STEP_LINE.finditer(console)]
    twice = [step for step, n in Counter(steps).items() if n > 1]
    assert not twice, f"progress lines printed more than once: {twice}\n{console[-3000:]}"
    assert "sync_dist" not in console, console[-3000:]
    assert "[rank " not in console, console[-3000:]  # no other rank had anything to say: no error
    return steps


@pytest.mark.parametrize("trainer", ["ddp", "fsdp"])
def test_a_killed_two_process_run_resumes_past_every_periodic_event_with_one_voice(trainer, tmp_path):
    start = time.monotonic()
    run_dir = tmp_path / "run"
    console = killed_after_first_checkpoint(tmp_path, run_dir, *RUN, f"trainer={trainer}", f"hydra.run.dir={run_dir}")
    assert not (run_dir / "results.json").exists()  # killed: no chance to record anything
    assert {25, 50} <= set(one_voice(console)) <= {25, 50, 75}  # maybe one more before the kill
    killed_s = time.monotonic() - start

    code, console = train(tmp_path, f"resume={run_dir}")
    assert code == 0, console[-3000:]
    assert one_voice(console) == [75, 100]  # the log steps after the checkpoint at 50, each once
    res = results(run_dir)
    assert res["status"] == "completed" and res["steps"] == MAX_STEPS and res["world_size"] == 2, res
    assert res["resumed_from"]

    metrics = rows(run_dir)
    logged = {key for row in metrics for key, value in row.items() if value}
    assert {"diag/grad_norm/decoder.embed", "diag/grad_norm/decoder.0", "diag/grad_norm/decoder.1",
            "diag/resid_norm/decoder.1", "diag/attn_entropy/decoder.blocks.1.self_attn"} <= logged
    grad_steps = {int(row["step"]) for row in metrics if row.get("diag/grad_norm/decoder.0")}
    assert grad_steps == {99}  # the 100th optimiser step, before it is taken
    val_steps = {int(row["step"]) for row in metrics if row.get("val/loss")}
    assert {49, 99, MAX_STEPS - 1} <= val_steps
    assert {p.name for p in (run_dir / "attention").glob("*.png")} >= {"step_50.png", "step_100.png"}
    assert "step 100/" in (run_dir / "train_ddp_process_1.log").read_text()  # rank 1's lines: in its own file
    print(f"{trainer}: killed after {killed_s:.0f} s, whole test {time.monotonic() - start:.0f} s")
