"""What a sweep prints: each distinct error once, with the count of jobs it hit and where their results.json hold
it (in-process on fabricated summaries, and end to end with the basic and the joblib launcher); and no library
line a user cannot act on in a joblib sweep that is re-run to resume a job, which removes (and names) the temporary
files a killed save left in that job's directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import scripts

from archsweep.core.train.runs.runinfo import RunInfo
from archsweep.core.train.runs.sweep import LAUNCH_ENV, failure_line, format_errors, format_table, job_ranges

ROOT = Path(__file__).resolve().parents[1]
TINY = ["logger=csv", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1",
        "task.batch_size=8", "task.max_len=6", "task.val_batches=2", "task.test_batches=2", "trainer.max_steps=4",
        "trainer.log_every_n_steps=2", "schedule.warmup_steps=0", "eval.show_examples=0"]
MISSING = "ConfigError: task: task.path=/nonexistent/x.txt: /nonexistent/x.txt not found"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop(LAUNCH_ENV, None)
    return scripts.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)


def info(sweep: Path, job: int) -> RunInfo:
    return RunInfo(run_dir=sweep / str(job), choices={}, overrides=[], name=f"seed={job}", group=None,
                   multirun=True, sweep_dir=sweep, job_num=job)


def summary_line(sweep: Path, job: int, error: str, launch: str | None) -> None:
    row = {"job": job, "name": f"seed={job}", "status": "failed", "error": error, "run_dir": str(sweep / str(job)),
           "skipped": False, "launch": launch, "val": None, "test": None}
    with open(sweep / "summary.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def test_a_failed_job_names_the_job_that_printed_its_error_in_this_launch(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCH_ENV, "now")
    summary_line(tmp_path, 0, "ValueError: old", "before")  # an earlier launch of the same sweep directory
    assert failure_line(info(tmp_path, 1), "ValueError: old").startswith("failed: ValueError: old (details: ")
    summary_line(tmp_path, 3, "ValueError: boom", "now")
    summary_line(tmp_path, 2, "ValueError: boom", "now")
    line = failure_line(info(tmp_path, 5), "ValueError: boom")
    assert line.startswith("failed with the error job 3 printed") and "boom" not in line  # the first to write it
    assert str(tmp_path / "5" / "error.txt") in line
    assert failure_line(info(tmp_path, 5), "ValueError: other").startswith("failed: ValueError: other")
    # an error naming the job's own directory matches the same error naming another job's
    summary_line(tmp_path, 6, f"OSError: cannot write {tmp_path / '6'}/checkpoints/last.ckpt", "now")
    own = f"OSError: cannot write {tmp_path / '7'}/checkpoints/last.ckpt"
    assert failure_line(info(tmp_path, 7), own).startswith("failed with the error job 6 printed")
    monkeypatch.delenv(LAUNCH_ENV)  # no launch id (a job started outside SweepSummary): the error in full
    assert failure_line(info(tmp_path, 5), "ValueError: boom").startswith("failed: ValueError: boom")


def row(sweep: Path, job: int, error: str | None) -> dict:
    return {"job": job, "name": f"seed={job}", "status": "failed" if error else "completed", "error": error,
            "run_dir": str(sweep / str(job)), "skipped": False, "task_family": "synthetic",
            "val": None if error else {"loss": 1.0}, "test": None}


def test_the_sweep_end_lists_each_distinct_error_once_with_its_jobs_and_where_they_are_recorded(tmp_path):
    for job in (0, 1, 3):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "results.json").write_text("{}")
    rows = [row(tmp_path, 0, "ValueError: boom"), row(tmp_path, 1, "ValueError: boom"), row(tmp_path, 2, None),
            row(tmp_path, 3, "ValueError: boom"), row(tmp_path, 4, "CellConflict: another run")]
    table = format_table(rows)
    assert table.count("boom") == 0 and table.count(": error 1") == 3 and table.count(": error 2") == 1
    errors = format_errors(rows).splitlines()
    assert errors[0].startswith("error 1 (3 of 5 jobs: 0-1, 3), in the results.json of each job (e.g. "
                                f"{tmp_path / '0' / 'results.json'};")
    assert errors[1] == "  ValueError: boom"
    assert errors[2] == "error 2 (1 of 5 jobs: 4), in summary.jsonl only (the job directories were left untouched):"
    assert len(errors) == 4
    assert job_ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_sweep_prints_an_error_every_job_hit_once_with_their_count(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    extra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    out = run("-m", "task=shakespeare_char", "task.path=/nonexistent/x.txt", "seed=0,1,2", *extra,
              f"hydra.sweep.dir={sweep}", f"output_root={tmp_path}")
    assert out.returncode == 1
    assert "3 of 3 sweep jobs failed (1 distinct error(s), listed above)" in out.stderr
    text = out.stdout
    assert text.count(MISSING) == 2, text  # the first job to fail, and the list at the end
    assert text.count("failed with the error job ") == 2
    assert "error 1 (3 of 3 jobs: 0-2), in the results.json of each job" in text
    for job in range(3):
        assert MISSING in json.loads((sweep / str(job) / "results.json").read_text())["error"]


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
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = [sweep / "1" / "checkpoints" / f".last.ckpt.tmp-{ended.stdout.strip()}",  # saves killed midway
             sweep / "1" / f".metrics.csv.tmp-{ended.stdout.strip()}"]
    for path in stale:
        path.write_bytes(b"partial")
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
    (removed,) = [x for x in lines if "temporary file(s) left by an interrupted run" in x]
    assert removed.split(" ", 1)[1] == (f"[job 1 norm=post] removed 2 temporary file(s) left by an interrupted run: "
                                        f"{stale[0]}, {stale[1]}")
    assert not any(path.exists() for path in stale)
