"""Nothing lost, nothing mixed up, honest exits (issue 15), with real train.py processes: a finished run's
directory is refused, launches at the same moment never share a directory, two sweeps in one directory are
refused, and SIGTERM / SIGINT stop a run with a checkpoint at the current step, `status: interrupted` and a
non-zero exit, from which it resumes exactly, in place, with its whole metrics history."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scripts
import torch
from test_run_dirs import dead_pid

pytestmark = pytest.mark.slow  # train.py subprocesses
ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=16",
        "task.max_len=8", "task.val_batches=2", "task.test_batches=2", "trainer.log_every_n_steps=2",
        "schedule.warmup_steps=5", "logger=csv", "diagnostics.attention_maps=false"]
QUICK = [*TINY, "trainer.max_steps=4", "trainer.val_check_interval=2", "eval.decode_samples=0"]
LONG = [*TINY, "trainer.max_steps=40", "trainer.val_check_interval=10"]
SLOW_CALLBACK = '''
import time
import lightning as L


class Slow(L.Callback):
    """Sleeps after every training batch, so that a test can signal a run mid-training."""

    def on_train_batch_end(self, *args, **kwargs) -> None:
        time.sleep(0.05)
'''


def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "slowdown.py").write_text(SLOW_CALLBACK)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    out = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    out.pop("WANDB_API_KEY", None)
    return out


def launch(tmp_path: Path, *args: str):
    """A run to signal or to run beside another: a Popen (served warm, tests/scripts.py)."""
    return scripts.popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout: int = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def train(tmp_path: Path, *args: str) -> tuple[int, str]:
    """A run to its end (`launch` for one to signal or to run beside another)."""
    out = scripts.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env(tmp_path),
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    return out.returncode, out.stdout


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_a_finished_run_directory_is_refused_unless_resumed_or_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    code, out = train(tmp_path, *QUICK, f"hydra.run.dir={run_dir}", "seed=0")
    assert code == 0, out[-3000:]
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    start = time.time()
    code, out = train(tmp_path, *QUICK, f"hydra.run.dir={run_dir}", "seed=1")
    refused_s = time.time() - start
    assert code == 1 and f"hydra.run.dir={run_dir} already holds a run (checkpoints/" in out, out[-3000:]
    assert "overwrite=true" in out and "Traceback" not in out
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # .hydra/ too
    print(f"refused in {refused_s:.2f} s")
    code, out = train(tmp_path, *QUICK, f"hydra.run.dir={run_dir}", "seed=1", "overwrite=true")
    assert code == 0, out[-3000:]
    assert results(run_dir)["seed"] == 1 and results(run_dir)["status"] == "completed"


def test_a_run_moved_to_another_folder_resumes_to_completion_with_its_own_checkpoints(tmp_path):
    first = tmp_path / "first"
    args = [*TINY, "trainer.val_check_interval=4", "eval.decode_samples=0"]
    code, out = train(tmp_path, *args, "trainer.max_steps=4", f"hydra.run.dir={first}")
    assert code == 0, out[-3000:]
    before = results(first)
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    first.rename(moved)  # the old folder is gone: nothing may still point into it
    code, out = train(tmp_path, *args, "trainer.max_steps=6", f"hydra.run.dir={moved}", f"ckpt_path={moved}")
    assert code == 0, out[-3000:]
    after = results(moved)
    assert after["status"] == "completed" and after["steps"] == 6
    # the final step is validated after the resume; best.ckpt is the moved folder's own whichever step it holds (a
    # best that stays the moved step-4 one is tests/test_run_dirs.py's test of RunCheckpoint)
    assert after["best_checkpoint"] == str(moved / "checkpoints" / "best.ckpt")
    assert after["val"]["loss"] != before["val"]["loss"]  # validated at step 6, not read from step 4
    assert after["last_checkpoint"] == str(moved / "checkpoints" / "last.ckpt")
    assert torch.load(moved / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert not first.exists()


def test_a_copied_run_resumes_into_its_own_checkpoints_leaving_the_original_as_it_was(tmp_path):
    original = tmp_path / "original"
    code, out = train(tmp_path, *QUICK, f"hydra.run.dir={original}")
    assert code == 0, out[-3000:]
    before = tree(original)
    copy = tmp_path / "home" / "copy"
    shutil.copytree(original, copy)  # the old folder still exists: a stale path would write or delete in it
    code, out = train(tmp_path, f"resume={copy}", "trainer.max_steps=8")
    assert code == 0, out[-3000:]
    after = results(copy)
    assert after["status"] == "completed" and after["steps"] == 8
    assert after["best_checkpoint"] == str(copy / "checkpoints" / "best.ckpt")
    assert after["last_checkpoint"] == str(copy / "checkpoints" / "last.ckpt")
    assert torch.load(copy / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    assert tree(original) == before


def test_launches_at_the_same_moment_never_share_a_directory(tmp_path):
    for _ in range(3):
        procs = [launch(tmp_path, *QUICK, f"seed={i}", "output_root=out") for i in range(2)]
        outcomes = [finish(p) for p in procs]
        assert all(code == 0 for code, _ in outcomes), [out[-2000:] for _, out in outcomes]
    run_dirs = sorted((tmp_path / "out" / "runs").iterdir())
    assert len(run_dirs) == 6 and len({d.name for d in run_dirs}) == 6
    for run_dir in run_dirs:
        res = results(run_dir)
        assert Path(res["run_dir"]).resolve() == run_dir.resolve() and res["status"] == "completed"
        assert f"seed={res['seed']}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
        steps = [int(r["step"]) for r in rows(run_dir) if r.get("train/loss")]
        assert steps == sorted(set(steps))  # one run's rows only: no step twice
        assert not (run_dir / ".lock").exists()


def test_two_launches_into_one_run_directory_one_is_refused(tmp_path):
    for round_ in range(3):
        run_dir = tmp_path / f"shared{round_}"
        procs = [launch(tmp_path, *QUICK, f"seed={i}", f"hydra.run.dir={run_dir}") for i in range(2)]
        outcomes = [finish(p) for p in procs]
        codes = sorted(code for code, _ in outcomes)
        assert codes == [0, 1], [out[-2000:] for _, out in outcomes]
        refused = next(out for code, out in outcomes if code == 1)
        assert "is in use by process" in refused or "already holds a run" in refused, refused[-2000:]
        winner = next(i for i, (code, _) in enumerate(outcomes) if code == 0)
        res = results(run_dir)
        assert res["seed"] == winner and f"seed={winner}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
        ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
        assert ckpt["archsweep"]["config"]["seed"] == winner


def test_two_sweeps_in_one_directory_one_is_refused(tmp_path):
    for round_ in range(2):
        sweep_dir = tmp_path / f"sweep{round_}"
        procs = [launch(tmp_path, "-m", *QUICK, f"seed={s}", f"hydra.sweep.dir={sweep_dir}")
                 for s in ("0,1", "5,6")]
        outcomes = [finish(p) for p in procs]
        codes = sorted(code for code, _ in outcomes)
        assert codes == [0, 1], [out[-2000:] for _, out in outcomes]
        refused = next(out for code, out in outcomes if code == 1)
        assert ("is in use by process" in refused or "holds a sweep launched with other overrides" in refused), \
            refused[-2000:]
        for job_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
            res = results(job_dir)
            config = (job_dir / "config.yaml").read_text()
            assert f"seed: {res['seed']}\n" in config
            ckpt = torch.load(job_dir / "checkpoints" / "last.ckpt", weights_only=True)
            assert ckpt["archsweep"]["config"]["seed"] == res["seed"]
        assert not (sweep_dir / ".lock").exists()


def signal_when(proc, log: Path, text: str, signum: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log.is_file() and text in log.read_text():
            proc.send_signal(signum)
            return
        assert proc.poll() is None, "the run ended before it could be signalled"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{text!r} never appeared in {log}")


def train_losses(run_dir: Path) -> list[tuple[int, str]]:
    return [(int(r["step"]), r["train/loss"]) for r in rows(run_dir) if r.get("train/loss")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_with_a_checkpoint_and_resumes_exactly_in_place(tmp_path, signum):
    reference = tmp_path / "reference"
    code, out = train(tmp_path, *LONG, f"hydra.run.dir={reference}")
    assert code == 0, out[-3000:]
    run_dir = tmp_path / "run"
    proc = launch(tmp_path, *LONG, f"hydra.run.dir={run_dir}", "+callbacks.slow._target_=slowdown.Slow")
    signal_when(proc, run_dir / "train.log", "step 14/40", signum)
    code, out = finish(proc)
    assert code == 128 + signum, out[-3000:]
    res = results(run_dir)
    step = res["interrupted"]["step"]
    assert res["status"] == "interrupted" and res["interrupted"]["signal"] == signal.Signals(signum).name
    assert 14 <= step < 40 and res["steps"] == step
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step
    assert not list((run_dir / "checkpoints").glob(".*tmp*")) and not (run_dir / ".lock").exists()
    code, out = train(tmp_path, *LONG, f"hydra.run.dir={run_dir}", f"ckpt_path={run_dir}")
    assert code == 0, out[-3000:]
    resumed = results(run_dir)
    assert resumed["status"] == "completed" and resumed["steps"] == 40
    assert train_losses(run_dir) == train_losses(reference)  # every step once, the same losses bit for bit
    assert [r["step"] for r in rows(run_dir)] == [r["step"] for r in rows(reference)]
    assert resumed["val"] == results(reference)["val"]
    assert resumed["total_flops"] == results(reference)["total_flops"]  # the running FLOP total survives the resume


def interrupt_in_a_new_directory(tmp_path: Path, root: Path, *args: str) -> tuple[Path, str]:
    """Launch a slowed-down run into a default directory under `root`, SIGTERM it at step 14; its directory and
    output."""
    proc = launch(tmp_path, *args, f"output_root={root}", "+callbacks.slow._target_=slowdown.Slow")
    deadline = time.time() + 120
    while not list(root.glob("runs/*/train.log")) and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it made its directory"
        time.sleep(0.05)
    [run_dir] = [p.parent for p in root.glob("runs/*/train.log")]
    signal_when(proc, run_dir / "train.log", "step 14/40", signal.SIGTERM)
    code, out = finish(proc)
    assert code == 143 and results(run_dir)["status"] == "interrupted", out[-3000:]
    return run_dir, out


def tree(directory: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_resume_continues_an_interrupted_run_in_its_directory_with_the_uninterrupted_losses(tmp_path):
    reference = tmp_path / "reference"
    code, out = train(tmp_path, *LONG, f"hydra.run.dir={reference}")
    assert code == 0, out[-3000:]
    root = tmp_path / "out"
    run_dir, out = interrupt_in_a_new_directory(tmp_path, root, *LONG)
    assert f"python train.py resume={run_dir}" in out  # the interrupted run says how to continue
    before = tree(run_dir)

    code, out = train(tmp_path, f"resume={run_dir}", "model.d_model=64")  # changes the model: refused
    assert code == 1 and "Traceback" not in out, out[-3000:]
    assert "  d_model: 64 -> 32\n" in out and "model.d_model=32 model.n_heads=2 model.n_layers=1" in out, out[-3000:]
    assert tree(run_dir) == before  # .hydra/, train.log and results.json as they were
    assert sorted(root.glob("runs/*")) == [run_dir]

    stale = run_dir / "checkpoints" / f".last.ckpt.tmp-{dead_pid()}"  # as a save killed midway leaves it
    stale.write_bytes(b"partial")
    code, out = train(tmp_path, f"resume={run_dir}", "threads=1")  # keeps the model: allowed
    assert code == 0, out[-3000:]
    assert sorted(root.glob("runs/*")) == [run_dir] and not stale.exists()
    assert f"removed 1 temporary file(s) left by an interrupted run: {stale}" in out  # and says so, once
    assert out.count("temporary file(s) left by an interrupted run") == 1
    resumed = results(run_dir)
    assert resumed["status"] == "completed" and resumed["steps"] == 40
    assert resumed["resumed_from"] == str(run_dir / "checkpoints" / "last.ckpt")
    assert train_losses(run_dir) == train_losses(reference)  # every step once, the same losses bit for bit
    assert [r["step"] for r in rows(run_dir)] == [r["step"] for r in rows(reference)]
    assert resumed["val"] == results(reference)["val"]


def test_the_same_command_rerun_continues_the_interrupted_run_then_starts_anew_once_it_completed(tmp_path):
    root = tmp_path / "out"
    run_dir, _ = interrupt_in_a_new_directory(tmp_path, root, *LONG)
    again = [*LONG, f"output_root={root}", "+callbacks.slow._target_=slowdown.Slow"]  # the same command
    code, out = train(tmp_path, *again)
    assert code == 0, out[-3000:]
    assert f"continuing the interrupted run in {run_dir}" in out
    assert sorted(root.glob("runs/*")) == [run_dir]
    assert results(run_dir)["status"] == "completed" and results(run_dir)["steps"] == 40
    steps = [s for s, _ in train_losses(run_dir)]
    assert steps == sorted(set(steps)) and steps[0] < 14 and steps[-1] == 39  # the whole history, each step once
    code, out = train(tmp_path, *again)  # the newest run with these overrides completed: a new run
    assert code == 0, out[-3000:]
    assert len(list(root.glob("runs/*"))) == 2 and "continuing" not in out


def test_an_interrupted_sweep_cell_resumes_with_its_whole_history(tmp_path):
    reference = tmp_path / "reference"
    code, out = train(tmp_path, *LONG, f"hydra.run.dir={reference}")
    assert code == 0, out[-3000:]
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *LONG, "seed=0", f"hydra.sweep.dir={sweep_dir}", "+callbacks.slow._target_=slowdown.Slow"]
    proc = launch(tmp_path, *args)
    signal_when(proc, sweep_dir / "0" / "train.log", "step 24/40", signal.SIGTERM)
    code, out = finish(proc)
    assert code == 143, out[-3000:]
    assert results(sweep_dir / "0")["status"] == "interrupted"
    assert not (sweep_dir / ".lock").exists() and not (sweep_dir / "0" / ".lock").exists()
    code, out = train(tmp_path, *args)
    assert code == 0, out[-3000:]
    assert "resuming the interrupted run from" in out
    assert train_losses(sweep_dir / "0") == train_losses(reference)
    assert results(sweep_dir / "0")["val"] == results(reference)["val"]


def test_a_submitit_job_signalled_as_slurm_does_is_interrupted_then_resumed_by_the_rerun(tmp_path):
    """SLURM sends SIGTERM to the job's own process before a time-out; with the submitit launcher that process is
    not the launcher's. The cell records `interrupted`, and re-running the sweep (a requeue) resumes it exactly."""
    reference = tmp_path / "reference"
    code, out = train(tmp_path, *LONG, f"hydra.run.dir={reference}")
    assert code == 0, out[-3000:]
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *LONG, "seed=0", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep_dir}",
            "+callbacks.slow._target_=slowdown.Slow"]
    proc = launch(tmp_path, *args)
    cell, deadline = sweep_dir / "0", time.time() + 180
    while not ((cell / "train.log").is_file() and "step 24/40" in (cell / "train.log").read_text()):
        assert proc.poll() is None and time.time() < deadline, "the cell never reached step 24"
        time.sleep(0.05)
    job_pid = int((cell / ".lock").read_text().split()[0])  # the submitit job's process holds the cell's lock
    assert job_pid != proc.pid
    os.kill(job_pid, signal.SIGTERM)
    code, out = finish(proc)
    res = results(cell)
    assert res["status"] == "interrupted" and res["interrupted"]["signal"] == "SIGTERM", out[-3000:]
    assert 24 <= res["interrupted"]["step"] < 40 and (cell / "checkpoints" / "last.ckpt").is_file()
    assert code != 0  # the launcher does not report the interrupted sweep as a success
    code, out = train(tmp_path, *args[:-1], "+callbacks.slow._target_=slowdown.Slow")
    assert code == 0, out[-3000:]
    assert results(cell)["status"] == "completed" and results(cell)["steps"] == 40
    assert train_losses(cell) == train_losses(reference)


def test_a_data_parallel_run_signalled_stops_interrupted_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    ddp = ["trainer=ddp", "trainer.accelerator=cpu"]
    proc = launch(tmp_path, *LONG, *ddp, f"hydra.run.dir={run_dir}", "+callbacks.slow._target_=slowdown.Slow")
    signal_when(proc, run_dir / "train.log", "step 14/40", signal.SIGTERM, timeout=180)
    code, out = finish(proc)
    assert code == 128 + signal.SIGTERM, out[-3000:]  # rank 0's: the other process ends with 0, after it or before
    res = results(run_dir)
    assert res["status"] == "interrupted" and res["interrupted"]["signal"] == "SIGTERM", out[-3000:]
    assert res["last_checkpoint"] and Path(res["last_checkpoint"]).is_file()
    code, out = train(tmp_path, f"resume={run_dir}")  # the workers start from the command line resume= became
    assert code == 0, out[-3000:]
    assert results(run_dir)["status"] == "completed" and results(run_dir)["steps"] == 40
