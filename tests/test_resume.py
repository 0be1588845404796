"""`train.py resume=<run dir>` and the same command re-run after an interrupt, as command lines (before Hydra
composes), and a refused start undone (core/train/runs/resume.py, rundir.withdraw). tests/test_run_safety.py runs them
with real train.py processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from archsweep.core.train.lifecycle.checks import other_model
from archsweep.core.train.runs import rundir
from archsweep.core.train.runs.resume import expand, interrupted_rerun

SAVED = ["model.d_model=32", "trainer.max_steps=40", "+callbacks.slow._target_=slowdown.Slow"]


def make_run(run_dir: Path, overrides: list[str], status: str | None = "interrupted", ckpt: bool = True) -> Path:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
    if ckpt:
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    if status is not None:
        (run_dir / "results.json").write_text(json.dumps({"status": status, "steps": 14}))
    return run_dir


def test_resume_becomes_the_saved_overrides_the_extras_and_the_run_directory(tmp_path):
    run = make_run(tmp_path / "run", [*SAVED, f"ckpt_path={tmp_path}/older", "resume=elsewhere"])
    argv, note = expand([f"resume={run}", "trainer.max_steps=80", "logger=csv"], "outputs")
    # how the run itself was resumed is not carried over; an extra replaces the saved value of its key
    assert argv == ["model.d_model=32", "+callbacks.slow._target_=slowdown.Slow", "trainer.max_steps=80",
                    "logger=csv", f"resume={run}", f"ckpt_path={run}", f"hydra.run.dir={run}"]
    assert note == f"resuming the run in {run}"
    assert expand(["resume=null", "seed=1"], "outputs") == (["seed=1"], None)


@pytest.mark.parametrize("setup,extra,message", [
    ("missing", [], r"resume=.*/run: no such directory; give the run directory an interrupted run printed"),
    ("no_overrides", [], r"resume=.*/run: not a train.py run directory \(.*/run/.hydra/overrides.yaml is missing"),
    ("no_checkpoint", [], r"no checkpoints/last.ckpt there \(the run stopped before its first checkpoint\); start "
                          r"it again with: python train.py model.d_model=32 trainer.max_steps=40 \+callbacks"),
    ("interrupted", ["hydra.run.dir=/tmp/x"], r"with hydra.run.dir=/tmp/x: resume= continues that one run, in its "
                                              r"own directory, from its last checkpoint; leave hydra.run.dir=/tmp/x"),
    ("interrupted", ["ckpt_path=last"], r"leave ckpt_path=last out"),
    ("interrupted", ["seed=1"], r"with seed=1: that changes the data the run trains on \(it was started with the "
                                r"config default for seed\); .* leave seed=1 out, or start a new run from its weights "
                                r"with: python train.py model.d_model=32 .* seed=1 init_from=.*/run$"),
    ("interrupted", ["task.max_len=20"], r"with task.max_len=20: that changes the data the run trains on"),
    ("interrupted", ["task=copy"], r"with task=copy: that changes the data"),
    ("completed", [], r"that run completed its 14 steps; to train it further add trainer.max_steps=<more than 14>"),
    ("completed", ["trainer.max_steps=14"], r"that run completed its 14 steps"),
])
def test_resume_refusals_name_the_directory_and_the_fix(tmp_path, setup, extra, message):
    run = tmp_path / "run"
    if setup == "no_overrides":
        run.mkdir()
    elif setup != "missing":
        make_run(run, SAVED, status="completed" if setup == "completed" else "interrupted",
                 ckpt=setup != "no_checkpoint")
    with pytest.raises(ValueError, match=message):
        expand([f"resume={run}", *extra], "outputs")


def test_extras_that_keep_the_data_or_repeat_a_saved_override_are_taken(tmp_path):
    run = make_run(tmp_path / "run", [*SAVED, "seed=3"])
    extras = ["seed=3", "task.data_dir=/mnt/moved/data", "task.val_batches=2"]
    argv, _ = expand([f"resume={run}", *extras], "outputs")
    assert all(a in argv for a in extras)


def test_a_completed_run_is_extended_when_more_steps_are_asked_for(tmp_path):
    run = make_run(tmp_path / "run", SAVED, status="completed")
    argv, _ = expand([f"resume={run}", "trainer.max_steps=80"], "outputs")
    assert "trainer.max_steps=80" in argv and "trainer.max_steps=40" not in argv


def test_the_same_command_continues_the_newest_run_with_its_overrides_only_when_interrupted(tmp_path):
    runs = tmp_path / "runs"
    command = [*SAVED, f"output_root={tmp_path}"]
    older = make_run(runs / "a", command)
    other = make_run(runs / "c", [*command, "seed=1"])  # other overrides: never chosen
    newest = make_run(runs / "b", command)
    for i, run in enumerate((older, newest, other)):  # modification time orders the runs, not the name
        t = time.time() - 100 + i
        os.utime(run / ".hydra" / "overrides.yaml", (t, t))
    assert interrupted_rerun(list(reversed(command)), "outputs") == newest  # the order of the overrides is free
    argv, note = expand(command, "outputs")
    assert argv[-3:] == [f"resume={newest}", f"ckpt_path={newest}", f"hydra.run.dir={newest}"]
    assert f"continuing the interrupted run in {newest} (the newest run with these overrides" in note

    (newest / "results.json").write_text(json.dumps({"status": "completed"}))
    assert interrupted_rerun(command, "outputs") is None  # the newest finished: the command starts a new run
    assert expand(command, "outputs") == (command, None)
    for argv in (["-m", *command], [*command, "ckpt_path=last"], [*command, "overwrite=true"]):
        assert interrupted_rerun(argv, "outputs") is None


def test_a_named_run_directory_is_continued_when_it_holds_an_interrupted_run_of_the_same_overrides(tmp_path):
    run = make_run(tmp_path / "run", SAVED)
    argv, note = expand([*SAVED, f"hydra.run.dir={run}", "hydra.job.name=train"], "outputs")
    assert argv == [*SAVED, "hydra.job.name=train", f"resume={run}", f"ckpt_path={run}", f"hydra.run.dir={run}"]
    assert "the hydra.run.dir given" in note
    assert interrupted_rerun([*SAVED, "seed=2", f"hydra.run.dir={run}"], "outputs") is None  # refused later


def test_a_refused_start_removes_the_directory_it_made_and_restores_one_that_existed(tmp_path):
    made = tmp_path / "out" / "runs" / "new"
    before = rundir.Before(made)
    made.mkdir(parents=True)
    (made / "train.log").write_text("refused\n")
    rundir.STARTS[made.resolve()] = before
    rundir.withdraw(made)
    assert not (tmp_path / "out").exists()  # the folders made for it too

    run = make_run(tmp_path / "run", SAVED)
    (run / "train.log").write_text("step 14/40\n")
    before = rundir.Before(run)
    (run / ".hydra" / "overrides.yaml").write_text("- model.d_model=64\n")  # Hydra's rewrite for this start
    (run / ".hydra" / "config.yaml").write_text("new: 1\n")
    with open(run / "train.log", "a") as f:
        f.write("refused\n")
    rundir.STARTS[run.resolve()] = before
    rundir.withdraw(run)
    assert OmegaConf.load(run / ".hydra" / "overrides.yaml") == SAVED
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["overrides.yaml"]
    assert (run / "train.log").read_text() == "step 14/40\n"
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == b"weights"
    rundir.withdraw(tmp_path / "never-claimed")  # a directory this process did not claim: nothing happens


def test_a_checkpoint_of_another_model_is_refused_with_the_fields_and_the_saved_overrides(tmp_path):
    run = make_run(tmp_path / "run", [*SAVED, "resume=elsewhere"])
    now = {"kind": "encoder_decoder", "d_model": 64, "n_heads": 4}
    stored = {"kind": "decoder_only", "d_model": 32, "n_heads": 4}
    message = other_model(run / "checkpoints" / "last.ckpt", now, stored, None)
    assert "(now -> checkpoint):\n  kind: encoder_decoder -> decoder_only\n  d_model: 64 -> 32\n" in message
    assert "n_heads" not in message
    assert (f"the run was started with: {' '.join(SAVED)}\nresume it with: python train.py resume={run} (the same "
            f"overrides, read from {run}/.hydra/overrides.yaml)") in message

    message = other_model(run / "checkpoints" / "last.ckpt", now, stored, str(run), [*SAVED, "model.d_model=64"])
    assert message.startswith(f"resume={run}: the overrides added to the run's (model.d_model=64) change its model")
    assert f"resume= takes the run's saved overrides ({' '.join(SAVED)})" in message

    loose = tmp_path / "loose.ckpt"  # a checkpoint outside a run directory: no overrides to offer
    assert f"its run directory {tmp_path} records no overrides" in other_model(loose, now, stored, None)
