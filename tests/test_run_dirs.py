"""Run-directory safety without train.py subprocesses (issue 15): directory locks and stale-lock detection, what
counts as a run, overwrite, stale temporary files, the resumed metrics history, an interrupted cell's corrupt
checkpoint, and a damaged or half-built data cache entry. tests/test_run_safety.py launches real processes."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from archsweep.core.data import cache
from archsweep.core.train.lifecycle.job import usable_checkpoint
from archsweep.core.train.monitoring.metrics_csv import MetricsCSV
from archsweep.core.train.runs.rundir import DirectoryInUse, DirectoryLock, claim_run_dir, clean_stale_temp, holds_run
from archsweep.core.train.runs.runinfo import RunInfo


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_lock_on_a_directory_is_refused_until_the_first_is_released(tmp_path):
    first = DirectoryLock(tmp_path, "run").acquire()
    assert (tmp_path / ".lock").read_text().split()[:2] == [str(os.getpid()), socket.gethostname()]
    # another process tries the same directory
    code = ("import sys; from archsweep.core.train.runs.rundir import DirectoryLock, DirectoryInUse\n"
            f"try:\n    DirectoryLock({str(tmp_path)!r}, 'run').acquire()\n"
            "except DirectoryInUse as e:\n    print(e); sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert f"is in use by process {os.getpid()}" in out.stdout and "would mix their results" in out.stdout
    first.release()
    assert not (tmp_path / ".lock").exists()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (tmp_path / ".lock").exists()  # released at exit


def dead_holder(directory: Path) -> int:
    """The pid of a process that took the directory's lock and died without releasing it."""
    code = (f"import os; from archsweep.core.train.runs.rundir import DirectoryLock\n"
            f"DirectoryLock({str(directory)!r}, 'run').acquire(); print(os.getpid(), flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and (directory / ".lock").exists(), out.stderr
    return int(out.stdout)


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    pid = dead_holder(tmp_path)
    with caplog.at_level("WARNING", logger="train"):
        lock = DirectoryLock(tmp_path, "run").acquire()
    assert f"stale lock of process {pid}" in caplog.text
    assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
    lock.release()
    assert not (tmp_path / ".lock").exists()


def test_a_lock_held_on_another_host_is_never_taken_over(tmp_path):
    dead_holder(tmp_path)
    lines = (tmp_path / ".lock").read_text().split("\n")
    lines[1] = "some-other-host"  # the holder's host: this one cannot tell whether that process lives
    (tmp_path / ".lock").write_text("\n".join(lines))
    with pytest.raises(DirectoryInUse, match=r"on host some-other-host .* remove .*\.lock"):
        DirectoryLock(tmp_path, "run").acquire()


def test_a_lock_in_the_format_before_filelock_is_refused_naming_the_file(tmp_path):
    (tmp_path / ".lock").write_text(f"{dead_pid()} {socket.gethostname()} 0 run\n")
    with pytest.raises(DirectoryInUse, match=r"does not name its holder as this version writes it .* remove "
                                              r".*\.lock"):
        DirectoryLock(tmp_path, "run").acquire()


def test_what_counts_as_a_run(tmp_path):
    assert holds_run(tmp_path) is None
    (tmp_path / ".hydra").mkdir()
    assert holds_run(tmp_path) is None  # a refused start leaves only Hydra's files ...
    (tmp_path / "results.json").write_text(json.dumps({"status": "failed"}))
    assert holds_run(tmp_path) is None  # ... and a failed results.json
    (tmp_path / "metrics.csv").write_text("step\n")
    assert holds_run(tmp_path) == "metrics.csv"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert holds_run(tmp_path) == "checkpoints/last.ckpt"


def run_cfg(**over) -> OmegaConf:
    return OmegaConf.create({"ckpt_path": None, "output_root": "outputs", "overwrite": False, **over})


def test_claiming_a_directory_that_holds_a_run(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    (tmp_path / "results.json").write_text(json.dumps({"status": "completed"}))
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"already holds a run \(checkpoints/last.ckpt\); it is kept.*"
                                         r"resume=.*overwrite=true"):
        claim_run_dir(run_cfg(), tmp_path, [])
    assert (tmp_path / "checkpoints" / "last.ckpt").read_bytes() == b"weights"
    assert not (tmp_path / ".lock").exists()  # a refusal releases the lock
    claim_run_dir(run_cfg(ckpt_path=str(tmp_path)), tmp_path, []).release()  # resuming it in place is allowed
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    claim_run_dir(run_cfg(overwrite=True), tmp_path, []).release()
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results.json").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only train.py's own outputs are removed


def test_stale_temporary_files_are_removed_and_live_ones_kept(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    stale = ckpts / f".last.ckpt.tmp-{dead_pid()}"
    live = ckpts / f".best.ckpt.tmp-{os.getppid()}"  # a running process (pytest's parent)
    results_tmp = tmp_path / "results.json.tmp"
    metrics_tmp = tmp_path / f".metrics.csv.tmp-{dead_pid()}"
    for f in (stale, live, results_tmp, metrics_tmp):
        f.write_bytes(b"partial")
    assert sorted(clean_stale_temp(tmp_path)) == sorted([stale, results_tmp, metrics_tmp])
    assert live.exists() and not stale.exists() and not results_tmp.exists() and not metrics_tmp.exists()


def test_a_metrics_rewrite_that_fails_midway_leaves_the_previous_file(tmp_path, monkeypatch):
    logger = MetricsCSV(tmp_path)
    logger.log_metrics({"train/loss": 1.0}, step=1)
    logger.save()
    before = (tmp_path / "metrics.csv").read_bytes()

    def cut(self, rows):  # the disk fills, or the process dies, while the rows are written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", cut)
    logger.log_metrics({"train/loss": 0.9, "val/loss": 1.2}, step=2)  # a new column: the file is rewritten
    with pytest.raises(OSError):
        logger.save()
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # the temporary file went with the error
    monkeypatch.undo()
    logger.save()  # the next save writes the header and every row
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [(r["step"], r["train/loss"], r["val/loss"]) for r in rows] == [("1", "1.0", ""), ("2", "0.9", "1.2")]


def test_resumed_metrics_without_a_new_column_drop_the_later_rows_and_repeat_none(tmp_path):
    """The first save of a resumed run rewrites the file whole even when its rows bring no new column (appending
    them would repeat the kept history and keep the rows after the checkpoint)."""
    with open(tmp_path / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "step", "train/loss"])
        w.writeheader()
        w.writerows([{"epoch": 0, "step": s, "train/loss": s / 10} for s in (1, 3, 5, 7, 9, 11, 13)])
    logger = MetricsCSV(tmp_path, keep_before=10)
    logger.log_metrics({"epoch": 0, "train/loss": 1.1}, step=11)
    logger.save()
    logger.log_metrics({"epoch": 0, "train/loss": 1.3}, step=13)
    logger.save()
    with open(tmp_path / "metrics.csv") as f:
        assert [(r["step"], r["train/loss"]) for r in csv.DictReader(f)] == [
            ("1", "0.1"), ("3", "0.3"), ("5", "0.5"), ("7", "0.7"), ("9", "0.9"), ("11", "1.1"), ("13", "1.3")]


def test_resumed_metrics_keep_the_rows_before_the_checkpoint_and_never_repeat_a_step(tmp_path):
    with open(tmp_path / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "step", "train/loss", "val/loss"])
        w.writeheader()
        w.writerows([{"epoch": 0, "step": s, "train/loss": s / 10} for s in (1, 3, 5, 7, 9, 11, 13)])
        w.writerow({"epoch": 0, "step": 9, "val/loss": 0.5})
    logger = MetricsCSV(tmp_path, keep_before=10)  # resumed from the checkpoint at step 10
    logger.log_metrics({"train/loss": 1.1, "train/acc": 0.5}, step=11)
    logger.save()
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["step"]), r["train/loss"]) for r in rows if r["train/loss"]] == [
        (1, "0.1"), (3, "0.3"), (5, "0.5"), (7, "0.7"), (9, "0.9"), (11, "1.1")]
    assert [r["val/loss"] for r in rows if r["val/loss"]] == ["0.5"]
    assert rows[-1]["train/acc"] == "0.5"  # a new column rewrites the header, the history stays
    logger.log_metrics({"train/loss": torch.tensor(1.5)}, step=13)  # the same columns: appended
    logger.save()
    logger.save()  # nothing new: nothing written twice
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["train/loss"], r["train/acc"]) for r in rows[-2:]] == [("11", "1.1", "0.5"),
                                                                                ("13", "1.5", "")]
    fresh = MetricsCSV(tmp_path, keep_before=None)  # a new run in the directory starts its own file
    fresh.log_metrics({"train/loss": 9.0}, step=1)
    fresh.save()
    assert len(list(csv.DictReader(open(tmp_path / "metrics.csv")))) == 1


def cell(tmp_path: Path) -> RunInfo:
    return RunInfo(run_dir=tmp_path, choices={}, overrides=[], name="cell", group=None, multirun=True, job_num=0)


def test_an_interrupted_cell_with_a_corrupt_last_checkpoint_falls_back_then_restarts(tmp_path, caplog):
    from test_safe_loading import write_checkpoint

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
    write_checkpoint(ckpts / "best.ckpt")
    with caplog.at_level("WARNING", logger="train"):
        assert usable_checkpoint(cell(tmp_path)) == ckpts / "best.ckpt"
    assert "last.ckpt is not a readable checkpoint" in caplog.text and (ckpts / "last.ckpt.corrupt").is_file()
    (ckpts / "best.ckpt").write_bytes(b"")
    caplog.clear()
    with caplog.at_level("WARNING", logger="train"):
        assert usable_checkpoint(cell(tmp_path)) is None
    assert "no checkpoint of the interrupted run loads; the cell restarts from step 0" in caplog.text


def test_a_truncated_cache_entry_is_rebuilt_and_a_dead_build_removed(tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("abc")
    builds = []

    def build(tmp: Path) -> dict:
        builds.append(tmp)
        (tmp / "tokens.bin").write_bytes(bytes(range(100)))
        return {"n": 100}

    root = tmp_path / "cache"
    entry, info = cache.prepared(root, "toy", [data], {"k": 1}, build)
    assert info["n"] == 100 and len(builds) == 1
    assert cache.prepared(root, "toy", [data], {"k": 1}, build)[0] == entry and len(builds) == 1  # reused
    with open(entry / "tokens.bin", "r+b") as f:  # a full disk or a partial copy cut it short
        f.truncate(40)
    stale = root / f".tmp-toy-0123-pid{dead_pid()}-abcd"
    stale.mkdir()
    entry2, _ = cache.prepared(root, "toy", [data], {"k": 1}, build)
    assert entry2 == entry and len(builds) == 2 and (entry / "tokens.bin").stat().st_size == 100
    err = capsys.readouterr().err
    assert "is damaged (tokens.bin not the size it was written with: truncated?); rebuilding it" in err
    assert f"removed {stale}" in err and not stale.exists()


def test_default_directories_are_unique_per_launch():
    from archsweep import conf_dir

    hydra_cfg = OmegaConf.to_container(OmegaConf.load(conf_dir() / "train.yaml").hydra, resolve=False)
    assert hydra_cfg["run"]["dir"].endswith("_${unique:}") and hydra_cfg["sweep"]["dir"].endswith("_${unique:}")
    names = {OmegaConf.create({"d": "${unique:}"}).d for _ in range(50)}
    assert len(names) == 50 and all(len(n) == 6 for n in names)


def test_restored_checkpoint_paths_are_this_runs_own_or_dropped(tmp_path):
    from archsweep.core.train.monitoring.callbacks import RunCheckpoint

    old, here = tmp_path / "old" / "checkpoints", tmp_path / "new" / "checkpoints"
    here.mkdir(parents=True)
    state = RunCheckpoint(old).state_dict() | {
        "best_model_path": str(old / "best.ckpt"), "best_model_score": 1.5, "last_model_path": str(old / "last.ckpt"),
        "kth_best_model_path": str(old / "best.ckpt"), "kth_value": 1.5, "best_k_models": {str(old / "best.ckpt"): 1.5}}
    dropped = RunCheckpoint(here)
    dropped.load_state_dict(state)  # a resume into a new folder: nothing of the old run's survives
    assert (dropped.best_model_path, dropped.best_model_score, dropped.last_model_path) == ("", None, "")
    assert dropped.best_k_models == {} and dropped.kth_best_model_path == ""
    (here / "best.ckpt").touch()
    (here / "last.ckpt").touch()
    moved = RunCheckpoint(here)
    moved.load_state_dict(state)  # the run's folder moved whole: the same files, found where they are now
    assert moved.best_model_path == str(here / "best.ckpt") and moved.best_model_score == 1.5
    assert moved.last_model_path == str(here / "last.ckpt") and moved.best_k_models == {str(here / "best.ckpt"): 1.5}
    in_place = RunCheckpoint(here)
    in_place.load_state_dict(moved.state_dict())
    assert in_place.state_dict() == moved.state_dict()
    # checkpoints written with the stock callback restore into this one
    from lightning.pytorch.callbacks import ModelCheckpoint

    stock = ModelCheckpoint(dirpath=str(here), filename="best", monitor="val/loss", mode="min")
    assert stock.state_key == in_place.state_key


def test_a_held_lock_pickles_without_its_hold(tmp_path):
    """joblib and submitit pickle the Hydra callbacks, the sweep's lock with them: the copy names the directory
    but neither holds nor releases the lock, which stays with the launching process."""
    import pickle

    from archsweep.core.train.runs.rundir import DirectoryInUse, DirectoryLock

    lock = DirectoryLock(tmp_path, "sweep").acquire()
    copy = pickle.loads(pickle.dumps(lock))
    assert copy.path == lock.path and not copy.held
    copy.release()  # a no-op: the copy never held it
    assert lock.path.exists()
    with pytest.raises(DirectoryInUse):
        DirectoryLock(tmp_path, "second launch").acquire()
    lock.release()
