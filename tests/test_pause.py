"""pause_at: a run with budget branches stops at one budget's decay start, fits the branches up to it and records
status paused; continued (resume=, or a sweep re-run) to a later budget and to its end, it is the run that never
paused, bit for bit on this CPU; a run asked for a budget it has reached already trains nothing. The rules and the
bookkeeping are checked in this process, the runs with real train.py processes (tests/test_branches.py builds its
runs the same way)."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from test_run_safety import train

from archsweep.core.data.paths import SHARED_DATA
from archsweep.core.report import compare, terminal
from archsweep.core.train.config import rules
from archsweep.core.train.config.schemas import check_schemas
from archsweep.core.train.lifecycle.checks import build_task
from archsweep.core.train.lifecycle.job import objective_value
from archsweep.core.train.runs.results import Results, paused_beyond
from archsweep.core.train.runs.resume import interrupted_rerun, resume_args
from archsweep.core.train.runs.runinfo import is_setting
from archsweep.core.train.runs.sweep import earlier_run

CONF = Path(__file__).resolve().parents[1] / "conf"
NEEDS_DATA = pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare.txt").is_file(), reason="no ../shared/data")
# validations at steps 16 and 32 (and 40, the end): the pause at 0.25 (step 8) falls between two validations, the
# pause at 0.5 (step 16) on one
RUN = ["model=decoder_only", "task=shakespeare_char", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
       "model.d_ff=64", "task.val_batches=2", "task.test_batches=2", "trainer.log_every_n_steps=4", "logger=csv",
       "diagnostics.attention_maps=false", "eval.decode_samples=0", "trainer.val_check_interval=16",
       "schedule=wsd", "schedule.warmup_steps=5", "threads=1", "trainer.max_steps=40",
       "schedule.branches=[0.25,0.5,1.0]"]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return cfg, build_task(cfg)


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def rows(run_dir: Path) -> list[tuple[str, str, str]]:
    """metrics.csv's (step, train/loss, val/loss), in the file's order."""
    with open(run_dir / "metrics.csv") as f:
        return [(r["step"], r["train/loss"], r["val/loss"]) for r in csv.DictReader(f)]


def ckpt_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


# --- the rules, before training ---

def test_pause_at_must_be_a_branch_below_one_of_a_wsd_run_that_reaches_it():
    wsd = ("schedule=wsd", "schedule.warmup_steps=5", "trainer.max_steps=40")
    rules.pause_at_a_branch(*composed(*wsd, "schedule.branches=[0.25,0.5,1.0]", "pause_at=0.5"))
    rules.check_rules(*composed(*wsd, "schedule.branches=[0.25,0.5,1.0]", "pause_at=0.25"))
    with pytest.raises(ValueError, match=re.escape("pause_at=0.3 is not one of schedule.branches=[0.25, 0.5]; "
                                                   "pause at one of 0.25, 0.5, or set pause_at=null")):
        rules.pause_at_a_branch(*composed(*wsd, "schedule.branches=[0.25,0.5]", "pause_at=0.3"))
    with pytest.raises(ValueError, match=re.escape("pause_at=0.25 needs budget branches to pause at: schedule=wsd "
                                                   "with schedule.branches listing it")):
        rules.pause_at_a_branch(*composed("pause_at=0.25"))  # the default schedule has no branches
    with pytest.raises(ValueError, match=re.escape("pause_at=0.25 needs budget branches")):
        rules.pause_at_a_branch(*composed(*wsd, "schedule.branches=[1.0]", "pause_at=0.25"))
    # schedule.total_steps beyond trainer.max_steps: the decay start of the 0.5 budget (step 40) is never reached
    with pytest.raises(ValueError, match=re.escape("pause_at=0.5 pauses at step 40 (the decay start of its 50-step "
                                                   "budget of schedule.total_steps=100), which trainer.max_steps=40 "
                                                   "never reaches")):
        rules.pause_at_a_branch(*composed(*wsd, "schedule.total_steps=100", "schedule.branches=[0.25,0.5]",
                                          "pause_at=0.5"))


@pytest.mark.parametrize("value,message", [
    ("1.0", "pause_at=1.0 must be a budget fraction below 1.0, one of schedule.branches (e.g. pause_at=0.25), or "
            "null to train to the end"),
    ("0", "pause_at=0.0 must be a budget fraction below 1.0"),
    ("soon", "pause_at: Value 'soon' of type 'str' could not be converted to Float"),
])
def test_a_pause_at_that_is_no_fraction_below_one_is_refused_naming_the_field(value, message):
    cfg, _ = composed("schedule=wsd", "schedule.branches=[0.25,1.0]", f"pause_at={value}")
    with pytest.raises(ValueError, match=re.escape(message)):
        check_schemas(cfg)


def test_pause_at_is_a_setting_not_what_a_run_trains():
    assert is_setting("pause_at")  # a sweep re-run or a resume with another pause_at is the same run, the same cell


# --- the bookkeeping: sweeps, re-runs, the objective, compare.py ---

def paused(at: float, step: int, budgets: list[dict]) -> dict:
    return Results(status="paused", paused={"at": at, "step": step}, steps=step, budgets=budgets,
                   total_flops=1e9 * step, seed=0, overrides=["seed=0"]).to_dict()


BUDGETS = [{"fraction": 0.25, "steps": 10, "decay_start": 8, "val/loss": 3.8},
           {"fraction": 0.5, "steps": 20, "decay_start": 16, "val/loss": 3.5}]


def test_results_read_back_a_paused_run():
    data = paused(0.5, 16, BUDGETS)
    assert data["status"] == "paused" and data["paused"] == {"at": 0.5, "step": 16} and "val" not in data
    back = Results.from_dict(json.loads(json.dumps(data)))
    assert back.paused == {"at": 0.5, "step": 16} and back.splits == {} and back.budgets == BUDGETS
    with pytest.raises(ValueError, match="'paused' is a list, expected an object"):
        Results.from_dict({**data, "paused": [0.5]})


def test_a_run_paused_at_or_beyond_a_budget_has_reached_it():
    at_half = paused(0.5, 16, BUDGETS)
    assert paused_beyond(at_half, 0.25) and paused_beyond(at_half, 0.5)
    assert not paused_beyond(at_half, 0.75) and not paused_beyond(at_half, None)  # None: the end
    assert not paused_beyond({"status": "completed"}, 0.25)  # finished is the caller's other rule
    assert not paused_beyond(None, 0.25)


def test_a_sweep_cell_paused_is_skipped_up_to_its_budget_and_resumed_beyond_it(tmp_path):
    (tmp_path / "config.yaml").write_text("seed: 0\npause_at: 0.25\n")
    (tmp_path / "results.json").write_text(json.dumps(paused(0.5, 16, BUDGETS)))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"state")
    for asked in (0.25, 0.5):  # a later rung's pause_at in the config does not make it another cell
        state, found = earlier_run(tmp_path, {"seed": 0, "pause_at": asked})
        assert state == "finished" and found["paused"] == {"at": 0.5, "step": 16}
    for asked in (0.75, None):
        state, found = earlier_run(tmp_path, {"seed": 0, "pause_at": asked})
        assert state == "resume" and found["status"] == "paused"
    (tmp_path / "checkpoints" / "last.ckpt").unlink()
    assert earlier_run(tmp_path, {"seed": 0, "pause_at": None}) == ("new", None)


def test_the_objective_of_a_run_with_pause_at_is_its_budget_branchs(caplog):
    run = paused(0.5, 16, BUDGETS)
    assert objective_value(run, "val/loss", 0.25) == 3.8 and objective_value(run, "val/loss", 0.5) == 3.5
    completed = {**run, "status": "completed", "val": {"loss": 3.4}}
    assert objective_value(completed, "val/loss", 0.5) == 3.5  # a later rung of a finished run: its branch
    assert objective_value(completed, "val/loss") == 3.4
    with caplog.at_level(logging.ERROR, logger="train"):
        assert math.isnan(objective_value(run, "val/acc", 0.5))
    assert "objective='val/acc': the run recorded no such metric; available: val/loss" in caplog.text


def saved_run(run_dir: Path, overrides: list[str], res: dict) -> Path:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"state")
    (run_dir / "results.json").write_text(json.dumps(res))
    return run_dir


def test_the_same_command_again_does_not_continue_a_paused_run_and_resume_does(tmp_path):
    """A paused run is a command that ended as asked: the plain re-run starts a new run, as after a completed one;
    resume=<dir> with a later pause_at continues it, and with a pause_at it has reached is let through (job.py
    returns the results as they are), as it is for a completed run."""
    command = ["seed=0", "pause_at=0.25"]
    run_dir = saved_run(tmp_path / "runs" / "a", command, paused(0.25, 8, BUDGETS[:1]))
    assert interrupted_rerun(command, str(tmp_path)) is None
    assert interrupted_rerun(["seed=0", "pause_at=0.5"], str(tmp_path)) is None  # another command line
    args = resume_args(run_dir, ["pause_at=0.5"])
    assert args[:2] == ["seed=0", "pause_at=0.5"] and f"ckpt_path={run_dir}" in args
    done = saved_run(tmp_path / "runs" / "b", command, {**paused(0.25, 8, BUDGETS), "status": "completed"})
    assert "pause_at=0.25" in resume_args(done, ["pause_at=0.25"])
    with pytest.raises(ValueError, match="that run completed its 8 steps"):
        resume_args(done, ["pause_at=null"])


def test_compare_reads_a_sweep_with_a_paused_run_without_counting_it_completed(tmp_path):
    sweep = tmp_path / "sweep"
    completed = {**paused(0.5, 16, BUDGETS), "status": "completed", "paused": None, "steps": 40,
                 "val": {"loss": 3.4}, "test": {"loss": 3.3}}
    for job, res, pause_at in (("0", completed, "null"), ("1", paused(0.5, 16, BUDGETS), "0.5")):
        saved_run(sweep / job, ["seed=0", f"pause_at={pause_at}"], {**res, "choices": {"model": "decoder_only"}})
        (sweep / job / "metrics.csv").write_text("epoch,step,train/loss,val/loss\n0,15,3.6,\n0,15,,3.5\n")
    report = compare([sweep])
    [cell] = report.cells  # pause_at is a setting: both runs are the one cell
    assert [r.run_dir.name for r in cell.of("completed")] == ["0"] and cell.seeds == 1
    assert [r.status for r in cell.runs if r.run_dir.name == "1"] in ([], ["paused"])  # left out, or kept apart
    assert cell.stats["val/loss"].mean == 3.4
    terminal(report)


# --- real runs ---

@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The run that never pauses, with branches at 0.25, 0.5 and 1.0 of its 40 steps."""
    root = tmp_path_factory.mktemp("reference")
    code, out = train(root, *RUN, f"hydra.run.dir={root / 'run'}")
    assert code == 0, out[-3000:]
    return root / "run"


@NEEDS_DATA
@pytest.mark.slow
def test_a_bad_pause_at_stops_train_py_before_training_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    code, out = train(tmp_path, *RUN, "pause_at=0.3", f"hydra.run.dir={run_dir}")
    assert code == 1 and "Traceback" not in out, out[-3000:]
    assert ("error: pause_at=0.3 is not one of schedule.branches=[0.25, 0.5, 1.0]; pause at one of 0.25, 0.5, or "
            "set pause_at=null to train to the end") in out
    assert "step " not in out and not run_dir.exists()


@NEEDS_DATA
@pytest.mark.slow
def test_a_run_paused_twice_then_continued_is_the_run_that_never_paused(tmp_path, reference):
    ref = results(reference)
    per_step = ref["total_flops"] / 40
    run_dir = tmp_path / "run"
    code, out = train(tmp_path, *RUN, "pause_at=0.25", f"hydra.run.dir={run_dir}")
    assert code == 0, out[-3000:]
    res = results(run_dir)
    assert res["status"] == "paused" and res["steps"] == 8 and res["paused"] == {"at": 0.25, "step": 8}
    assert res["budgets"] == ref["budgets"][:1]  # its branch, as the whole run records it
    assert res["total_flops"] == per_step * 8 and "val" not in res and res["best_checkpoint"] is None
    assert ckpt_step(run_dir / "checkpoints" / "last.ckpt") == 8
    assert not (run_dir / "checkpoints" / "paused.ckpt").exists()
    assert "evaluating" not in out and "budget branch 0.25" in out
    assert (f"paused after budget 0.25 at step 8 (its branch's val/loss {ref['budgets'][0]['val/loss']:.4f}; "
            f"{per_step * 8:.4g} training FLOPs so far); to continue: python train.py resume={run_dir} pause_at=0.5 "
            f"(a later budget) or pause_at=null (to the end)") in out

    code, out = train(tmp_path, f"resume={run_dir}", "pause_at=0.5")  # from step 8 to 16, validated there
    assert code == 0, out[-3000:]
    res = results(run_dir)
    assert res["status"] == "paused" and res["paused"] == {"at": 0.5, "step": 16}
    assert res["budgets"] == ref["budgets"][:2] and res["total_flops"] == per_step * 16
    assert out.count("budget branch ") == 1  # 0.25 was recorded: only 0.5 is fitted
    assert ckpt_step(run_dir / "checkpoints" / "last.ckpt") == 16

    code, out = train(tmp_path, f"resume={run_dir}", "pause_at=null")  # to the end, as an unpaused run ends
    assert code == 0, out[-3000:]
    res = results(run_dir)
    assert res["status"] == "completed" and res["steps"] == 40 and res["paused"] is None
    assert "budget branch " not in out  # both branches recorded while paused
    assert res["budgets"] == ref["budgets"] and res["total_flops"] == ref["total_flops"]
    for key in ("val", "test", "train"):
        assert res[key] == ref[key], key
    assert rows(run_dir) == rows(reference)  # every logged step once, the same losses to the last digit


@NEEDS_DATA
@pytest.mark.slow
def test_a_run_stopped_in_its_paused_branch_fits_it_without_training_and_then_keeps_its_results(tmp_path, reference):
    """A stop during the 0.5 branch of a run paused there leaves it interrupted at step 16 with that branch
    unrecorded (made here by editing what such a stop leaves); continued, it fits the branch and trains nothing,
    its last.ckpt as it was; asked for an earlier budget, it returns its results as they are."""
    run_dir = tmp_path / "run"
    code, out = train(tmp_path, *RUN, "pause_at=0.5", f"hydra.run.dir={run_dir}")
    assert code == 0, out[-3000:]
    state = json.loads((run_dir / "branches" / "budgets.json").read_text())
    state["budgets"] = [b for b in state["budgets"] if b["fraction"] != 0.5]
    (run_dir / "branches" / "budgets.json").write_text(json.dumps(state))
    stopped = {**results(run_dir), "status": "interrupted", "paused": None, "budgets": None,
               "interrupted": {"signal": "SIGTERM", "step": 16, "exit_code": 143}}
    (run_dir / "results.json").write_text(json.dumps(stopped))
    last = (run_dir / "checkpoints" / "last.ckpt").read_bytes()

    code, out = train(tmp_path, f"resume={run_dir}")  # its saved pause_at=0.5
    assert code == 0, out[-3000:]
    res = results(run_dir)
    assert res["status"] == "paused" and res["steps"] == 16 and res["budgets"] == results(reference)["budgets"][:2]
    assert res["total_flops"] == results(reference)["total_flops"] / 40 * 16  # the totals its checkpoint carries
    assert out.count("budget branch ") == 1 and "step 17/" not in out
    assert (run_dir / "checkpoints" / "last.ckpt").read_bytes() == last

    before = (run_dir / "results.json").read_bytes()
    code, out = train(tmp_path, f"resume={run_dir}", "pause_at=0.25")
    assert code == 0, out[-3000:]
    assert f"{run_dir} is paused at budget 0.5, at or beyond pause_at=0.25: nothing to train" in out
    assert "budget branch" not in out and (run_dir / "results.json").read_bytes() == before


@NEEDS_DATA
@pytest.mark.slow
def test_a_sweep_re_run_does_not_redo_a_rung_and_continues_to_the_next(tmp_path, reference):
    sweep = tmp_path / "sweep"
    job = sweep / "0"
    sweep_args = ["-m", *RUN, "seed=0", f"hydra.sweep.dir={sweep}"]
    code, out = train(tmp_path, *sweep_args, "pause_at=0.25")
    assert code == 0, out[-3000:]  # a paused job is no failure
    assert "0 of 1 jobs completed, 1 paused" in out and "re-run the sweep with a later pause_at" in out
    assert results(job)["status"] == "paused" and results(job)["budgets"] == results(reference)["budgets"][:1]
    last = job / "checkpoints" / "last.ckpt"
    kept = (last.read_bytes(), last.stat().st_mtime_ns, (job / "results.json").read_bytes())

    code, out = train(tmp_path, *sweep_args, "pause_at=0.25")  # the same rung again, as after a kill
    assert code == 0, out[-3000:]
    assert "paused earlier in" in out and "finished earlier, skipped" in out
    assert "budget branch" not in out and "step 4/40" not in out
    assert (last.read_bytes(), last.stat().st_mtime_ns, (job / "results.json").read_bytes()) == kept

    code, out = train(tmp_path, *sweep_args, "pause_at=0.5")  # the next rung continues the same run
    assert code == 0, out[-3000:]
    assert f"resuming the paused run from {last}" in out
    res = results(job)
    assert res["status"] == "paused" and res["paused"] == {"at": 0.5, "step": 16}
    assert res["budgets"] == results(reference)["budgets"][:2]
    steps = [int(s) for s, loss, _ in rows(job) if loss]
    assert steps == sorted(set(steps)) and steps[-1] == 15  # steps 1..16, each logged once
